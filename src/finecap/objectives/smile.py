"""SMILE: semipermeable maximum likelihood (Yue et al., NeurIPS 2023, Eq. 1-4, Sec. 3.3-3.4, Algorithm 1).

At every position the softmax runs only over a subset of the vocabulary (logits outside it set to -inf) and the loss
is the cross-entropy of the label under that restricted softmax (Eq. 2-3). Subset modes:

- ``sequence`` (SMILE): the ids occurring in the target sequence, V_D = {w_i | w_i in D}.
- ``reverse`` (Sec. 3.4): the complement of V_D plus the current label, V_{S_i} = {w not in V_D} ∪ {w_i}.
- ``random`` (Sec. 3.4): ``random_k`` ids drawn uniformly without replacement from the whole vocabulary, redrawn per
  sequence, plus the current label. (The paper's released code applied the sequence mask in this mode by mistake;
  here the random subset really is used, and a test checks it.) The paper draws "10 words (the average caption
  length of MSCOCO) from the entire vocabulary" "for a given target sequence": ``random_k=10`` is that number (the
  released code's ``sample_num``, ``BLIP/models/model.py``, commented out there), a fixed size rather than each
  caption's |V_D|. That code draws its 10 ids with replacement anew at every position and leaves out id 0 (BERT's
  ``[PAD]``); here one subset serves the whole sequence, as the paper's text says, drawn from every id, special
  ones too (the paper's "entire vocabulary"). In training each caption's draw is seeded by
  ``(run.seed, step, dataset index)`` (:func:`finecap.decode.step_seeds`), so the subsets do not depend on the
  process count or accumulation (one generator per process drew the same subsets on every process).
- ``full``: the whole vocabulary, i.e. plain MLE.

Initial-context restriction (Sec. 3.3): ``first_token="mle"`` scores the first caption token over the full
vocabulary (Algorithm 1's ``logits_mask[:, 0, :] = True``; the default), ``"shift"`` replaces the first token by an
alternative and keeps the subset restriction there, ``"none"`` applies the subset at the first position too. The
paper shifts each first token to *its own* alternative, its WordPiece form ("a" to "##a"; the released code:
``'##' + token``): ``shift_form="subword"`` does that (:func:`subword_alternatives`; a token whose ``##`` form the
vocabulary lacks becomes the unknown token, as ``convert_tokens_to_ids`` makes it there). ``shift_form="token"``
(finecap's, for vocabularies without sub-word forms: GPT-2's, the world's) puts the one id ``shift_token_id`` first in
every caption, whatever its first word, so a caption's first word ("two", "the") is lost from its target. Mixing
(Eq. 4): ``loss = λ·MLE + (1-λ)·SMILE`` with ``λ = mle_weight``.

First-token shifting replaces the first token of the *caption*, teacher-forced input and label alike
(:func:`shift_first_tokens`, applied by :class:`SmileObjective` before the forward): the released code shifts
``text.input_ids`` before the targets are made from them (``BLIP/models/model.py``, commented out there:
``input_ids[i, prompt_length] = '##' + token``). The shifted model therefore emits the shift token first at inference
and reads it as the context of the second token, as it did in training. Its captions' text is written without it
(:func:`~finecap.models.first_token.unshift_table`, set on the captioner by
:func:`~finecap.models.first_token.decode_unshifted` and in training :func:`training_shift`,
from the run's configuration or the record its ``captioner.json`` keeps, which carries the shift with the weights
to an RL run started from them, an export and any later loader): a
``##`` form as its word ("##a dog" as "a dog"), ``shift_token_id`` left out, so that caption lacks its first word
(the released code cuts the prompt's characters off the decoded text, taking a one-letter first word with it).
Until 2026-11-24 finecap shifted the
label only: the model learned to emit the shift token first (on a quick world, first in 100 % of the test captions)
but never read it as an input, so every caption went on from a context it had not been trained on.
:func:`smile_loss` on its own shifts the labels it is given (for a caller that scores unshifted labels); given labels
already shifted, it changes nothing.

Choices the paper leaves open, made here:
- "First token" is the first non-ignored label of each row (position 0 for right-padded captions).
- With ``first_token="shift"`` the subset of the SMILE term is built from the shifted labels (the released code shifts
  the target before masking); in :class:`SmileObjective` the MLE term of Eq. 4 scores the shifted caption too (one
  teacher-forced pass: the shifted caption is the target sequence), in :func:`smile_loss` alone the labels given.
- ``include_eos=False`` removes the end-of-sequence id from V_D except at positions whose label it is (the label
  must always be in its own subset, or the loss would be infinite).
- Losses are means over non-ignored positions of the whole batch (token-level average, as CrossEntropyLoss).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from finecap.config import SmileConfig
from finecap.contract import is_copy
from finecap.data.targets import IGNORE_INDEX
from finecap.decode import step_seeds
from finecap.models.first_token import shift_of, start_shift, subword_alternatives
from finecap.objectives.base import ObjectiveOutput, unwrap
from finecap.objectives.mle import mle_loss
from finecap.objectives.token_means import TokenMeanObjective

log = logging.getLogger(__name__)


def _first_positions(valid: torch.Tensor) -> torch.Tensor:
    """Index of the first True of each row of ``valid`` (B, T); rows without one get T (no position)."""
    T = valid.shape[1]
    idx = torch.arange(T, device=valid.device).expand_as(valid)
    return torch.where(valid, idx, torch.full_like(idx, T)).min(dim=1).values  # (B,)


def shift_first_tokens(batch: dict, shift: int | torch.Tensor, ignore_index: int = IGNORE_INDEX) -> dict:
    """``batch`` with the first caption token of each row (its first non-ignored label) replaced by its alternative
    in ``input_ids`` and in ``labels`` (SMILE's first-token shifting as the released code makes it): ``shift``, one
    token id for every row, or a ``(V,)`` table of each token's alternative (:func:`subword_alternatives`); new
    tensors, the batch given is unchanged. Every backbone aligns ``input_ids`` with ``labels``
    (:mod:`finecap.models.base`), so the two change at the same position. ``ValueError`` for a first token the table
    has no alternative for (-1).

    >>> out = shift_first_tokens({"input_ids": torch.tensor([[7, 8, 4]]), "labels": torch.tensor([[7, 8, 4]])}, 2)
    >>> out["input_ids"].tolist(), out["labels"].tolist()
    ([[2, 8, 4]], [[2, 8, 4]])
    """
    labels = batch["labels"]  # (B, T)
    first = _first_positions(labels != ignore_index)  # (B,)
    rows = torch.arange(labels.shape[0], device=labels.device)[first < labels.shape[1]]  # rows with a caption token
    first = first[first < labels.shape[1]]
    new: int | torch.Tensor = shift
    if isinstance(shift, torch.Tensor):
        firsts = labels[rows, first]  # (R,)
        table = shift.to(labels.device)
        known = firsts < len(table)
        new = torch.where(known, table[firsts.clamp(max=len(table) - 1)], torch.full_like(firsts, -1))  # (R,)
        if bool((new < 0).any()):
            bad = int(firsts[new < 0][0])
            raise ValueError(f"smile.shift_form=subword: first token id {bad} has no sub-word alternative (the "
                             "tokenizer has no unknown token to stand in); use smile.shift_form=token")  # fmt: skip
    out = dict(batch)
    for key in ("input_ids", "labels"):
        shifted = batch[key].clone()  # (B, T)
        shifted[rows, first] = new
        out[key] = shifted
    return out


def first_token_shift(smile: SmileConfig, captioner: Any) -> int | torch.Tensor:
    """What :func:`shift_first_tokens` shifts with under ``smile.first_token=shift``: ``smile.shift_token_id``, or
    with ``smile.shift_form=subword`` the table of ``captioner.tokenizer``'s sub-word forms
    (:func:`subword_alternatives`)."""
    if smile.shift_form == "subword":
        return subword_alternatives(captioner.tokenizer)
    return smile.shift_token_id


def subset_mask(
    labels: torch.Tensor,
    vocab_size: int,
    smile: SmileConfig | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    eos_token_id: int | None = None,
    draws: torch.Generator | torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask (B, T, V): True where a vocabulary id takes part in the softmax at that position, for the
    options ``smile.subset``, ``smile.include_eos`` and ``smile.random_k`` (default: the section's defaults).

    Every valid position's own label is always inside its subset. Ignored positions get a full row (their loss is
    dropped anyway). ``subset=random`` draws from ``draws``: a generator, or (B,) seeds, each row drawn from a
    generator of its own seed (torch's global generator when ``None``).

    >>> labels = torch.tensor([[2, 0, -100]])
    >>> subset_mask(labels, 4)[0, 0].tolist()
    [True, False, True, False]
    """
    smile = smile or SmileConfig()
    B, T = labels.shape
    valid = labels != ignore_index  # (B, T)
    safe = torch.where(valid, labels, torch.zeros_like(labels))  # (B, T)
    label_onehot = F.one_hot(safe, vocab_size).bool() & valid.unsqueeze(-1)  # (B, T, V)
    if smile.subset == "full":
        return torch.ones(B, T, vocab_size, dtype=torch.bool, device=labels.device)
    if smile.subset == "random":
        if isinstance(draws, torch.Tensor):
            rows = [torch.rand(vocab_size, generator=torch.Generator().manual_seed(int(r))) for r in draws]
            scores = torch.stack(rows).to(labels.device)  # (B, V)
        else:
            scores = torch.rand(B, vocab_size, generator=draws, device="cpu").to(labels.device)  # (B, V)
        k = min(smile.random_k, vocab_size)
        chosen = torch.zeros(B, vocab_size, dtype=torch.bool, device=labels.device)
        chosen.scatter_(1, scores.topk(k, dim=1).indices, True)  # k distinct random ids per sequence
        mask = chosen.unsqueeze(1) | label_onehot  # (B, T, V)
    else:
        in_seq = label_onehot.any(dim=1)  # (B, V): V_D of each sequence
        if not smile.include_eos and eos_token_id is not None:
            in_seq[:, eos_token_id] = False
        allowed = in_seq if smile.subset == "sequence" else ~in_seq  # reverse: the complement of V_D
        mask = allowed.unsqueeze(1) | label_onehot  # (B, T, V): plus the current label
    return mask | ~valid.unsqueeze(-1)


def smile_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    smile: SmileConfig | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    eos_token_id: int | None = None,
    draws: torch.Generator | torch.Tensor | None = None,
    alternatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean SMILE loss over non-ignored positions; ``logits[:, t]`` predicts ``labels[:, t]``; the options are the
    ``smile`` section's (:class:`~finecap.config.SmileConfig`, checked when it is built; default: its defaults).
    ``alternatives``: the ``(V,)`` table of first-token forms that ``smile.shift_form=subword`` shifts with
    (:func:`subword_alternatives`; required there).

    ``loss = mle_weight · CE(full vocabulary) + (1 - mle_weight) · CE(restricted softmax)`` (Eq. 4).

    >>> logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    >>> round(smile_loss(logits, torch.tensor([[0]]), SmileConfig(first_token="none")).item(), 6)  # {0}: -log 1
    0.0
    """
    smile = smile or SmileConfig()
    B, T, V = logits.shape
    valid = labels != ignore_index  # (B, T)
    n = valid.sum().clamp(min=1)
    first = _first_positions(valid)  # (B,)
    rows = torch.arange(B, device=labels.device)
    has_first = first < T

    smile_labels = labels
    if smile.first_token == "shift":  # SmileConfig requires smile.shift_token_id or shift_form=subword then
        shift = smile.shift_token_id if smile.shift_form == "token" else alternatives
        if shift is None:
            raise ValueError("smile_loss: smile.shift_form=subword needs alternatives= (subword_alternatives)")
        smile_labels = shift_first_tokens({"labels": labels, "input_ids": labels}, shift, ignore_index)["labels"]

    mask = subset_mask(smile_labels, V, smile, ignore_index=ignore_index, eos_token_id=eos_token_id,
                       draws=draws)  # fmt: skip  # (B, T, V)
    if smile.first_token == "mle":
        mask[rows[has_first], first[has_first]] = True  # first-token MLE: full vocabulary at the first position
    restricted = logits.masked_fill(~mask, float("-inf"))  # (B, T, V)
    loss = mle_loss(restricted, smile_labels, ignore_index, reduction="sum") / n
    if smile.mle_weight == 0.0:
        return loss
    mle = mle_loss(logits, labels, ignore_index, reduction="sum") / n
    return smile.mle_weight * mle + (1.0 - smile.mle_weight) * loss


@dataclass
class SmileObjective(TokenMeanObjective):
    """``objective(model, batch)``: SMILE on teacher-forced logits with the options of ``smile`` (the section);
    logs the MLE loss of the same batch too (``mle_loss``, a per-token metric: a step logs its mean over every
    process's tokens, :mod:`finecap.objectives.token_means`). ``seed`` (``run.seed``) seeds the random subsets: per
    caption from ``(seed, step, index)`` in training (module docstring), else from one generator."""

    smile: SmileConfig = field(default_factory=SmileConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        TokenMeanObjective.__init__(self)  # the dataclass's __init__ calls no base's
        self._generator = torch.Generator().manual_seed(self.seed)
        self._shift: int | torch.Tensor | None = None  # first_token=shift: what the first token becomes

    def state_dict(self) -> dict:
        """The random-subset generator, so ``--resume`` continues the same draws."""
        return {"generator": self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self._generator.set_state(state["generator"])

    def __call__(self, model, batch):
        captioner = unwrap(model)
        alternatives = None
        if self.smile.first_token == "shift":  # the caption's first token, input and label (module docstring)
            if self._shift is None:
                self._shift = first_token_shift(self.smile, captioner)
            batch = shift_first_tokens(batch, self._shift)
            alternatives = self._shift if isinstance(self._shift, torch.Tensor) else None
        logits = model(batch)  # (B, T, V)
        labels = batch["labels"]  # (B, T)
        # the caption's end token (a VLM's turn end: not always the tokenizer's EOS)
        eos = captioner.eos_token_id if hasattr(captioner, "eos_token_id") else captioner.tokenizer.eos_token_id
        info, seeds = batch.get("step_info"), None
        if self.smile.subset == "random" and info is not None and "index" in batch:  # training: per caption's index
            seeds = step_seeds(self.seed, int(info.step), batch["index"])
        draws = self._generator if seeds is None else seeds
        loss = smile_loss(logits, labels, self.smile, eos_token_id=eos, draws=draws, alternatives=alternatives)
        valid = labels != IGNORE_INDEX  # (B, T)
        with torch.no_grad():
            token_losses = mle_loss(logits, labels, reduction="none")[valid.reshape(-1)]  # (n,) each token's CE
        mle = self.token_means.add("mle_loss", token_losses, not is_copy(batch))
        n = int(valid.sum())
        return ObjectiveOutput(losses={"smile": loss}, metrics={"mle_loss": mle}, num_items=n)  # n tokens


def validation_shift_token(cfg, model: Any) -> int | torch.Tensor | None:
    """What the training loop's validation loss puts first in every validation caption of ``model``: for
    ``train.objective=smile`` with ``smile.first_token=shift`` what training shifts with (:func:`first_token_shift`:
    ``smile.shift_token_id``, or each first token's sub-word form), else ``None`` (captions as they are).

    The paper selects SMILE checkpoints by self-retrieval and says nothing of a validation loss; finecap's ``loss``
    (``train.best_metric=loss``) scores the caption the model is trained to emit, so a shifted model is scored with
    its shift token first, as :class:`SmileObjective` trains it (the training log's ``mle_loss`` likewise). Scored on
    unshifted captions (finecap until 2026-11), its first label was a word the model is trained not to emit there and
    every later token was read after a context it never saw in training.
    """
    if cfg.train.objective == "smile" and cfg.smile.first_token == "shift":
        return first_token_shift(cfg.smile, unwrap(model))
    return None


TEACHER_FORCED = ("mle", "smile")
"""The objectives that train the first token on the captions as they are (teacher forcing; SMILE unless it shifts):
a run of one started from shifted weights retrains the first word, so its weights are not recorded as shifted
(:func:`training_shift`)."""


def training_shift(cfg, start: str | Path | None = None, resumed: bool = False) -> dict[str, Any] | None:
    """The shift the weights a run trains under ``cfg`` emit first, which its checkpoints record
    (:attr:`~finecap.models.base.CaptionerBase.first_token_shift`) and its validation captions, rollouts and rewards
    are written without (:func:`unshift_as`). ``start``: the checkpoint the run starts from (``train.init_from``, or
    with ``resumed`` the run's own checkpoint it resumes from).

    - The run shifts itself (:func:`shift_of`): its own shift, whatever the start's.
    - ``resumed``: what the run's own checkpoint records (the decision below, made when the run started).
    - Started from shifted weights (:func:`start_shift`) with an RL objective (SCST, GRPO, SLE, DiscriTune's
      listener reward) or any other that learns from the captioner's own samples: the shift is carried on. The
      policy samples the shift token first, as it was trained to, and nothing in its training teaches it otherwise,
      so its rollouts, rewards, validation captions and checkpoints are written and recorded as shifted.
    - Started from shifted weights with a teacher-forced objective (:data:`TEACHER_FORCED`: MLE, SMILE without
      shifting): the shift is dropped (logged as a warning). Such a run trains the first token on the captions as
      they are, so its weights learn to emit the first word again; a shift token it still emits (a run of a few
      steps) shows in its captions instead of a first word being silently left out.
    """
    own = shift_of(cfg)
    if own is not None or not start:
        return own
    inherited = start_shift(start)
    if inherited is None or resumed:
        return inherited
    if cfg.train.objective in TEACHER_FORCED:
        log.warning("train.init_from=%s: its weights were trained with SMILE's first-token shifting (%s); "
                    "train.objective=%s trains the first token on the captions as they are, so this run's captions "
                    "are written as decoded and its checkpoints record no shift", start, inherited,
                    cfg.train.objective)  # fmt: skip
        return None
    return inherited


def build(cfg) -> SmileObjective:
    """Factory used by the objective registry (``train.objective=smile``): the ``smile`` section itself."""
    return SmileObjective(cfg.smile, seed=cfg.run.seed)
