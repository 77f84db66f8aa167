"""Self-retrieval reward (DiscriTune Sec. 3, NDLB Eq. 1): a frozen retriever scores each caption against its own
image and a set of distractor images.

For a caption ``c`` of image ``i`` with distractors ``D``, with unit-norm text and image embeddings and the
retriever's similarity ``sim(c, i') = s * cos(c, i')`` (``s``: the retriever's ``exp(logit_scale)``, or
``sr.logit_scale``), the reward (``sr.reward``) is

- ``log_prob`` (default; DiscriTune, NDLB Eq. 1): ``sim(c, i) - log sum_{i' in D + {i}} exp(sim(c, i'))``, the
  log-probability that the retriever picks ``i`` (<= 0; ``log(1 / (|D| + 1))`` at chance);
- ``accuracy``: 1 if ``sim(c, i) > sim(c, i')`` for every distractor ``i'`` (strictly, as DiscriTune defines
  retrieval; a tie is a miss), else 0;
- ``cosine``: ``cos(c, i)`` alone, no distractors (CLIPScore-like; DiscriTune appendix B.2).

All three (and the number of candidates) are returned as parts and logged (``reward/retrieval/accuracy`` is the
training batch's R@1), whichever is the reward, and so is ``truncated``: 1 for a caption longer than the
retriever's text window and cut to it (``chunked`` instead with ``retriever.long_text=chunks``; with ``error`` such
a caption is refused, naming its image; :mod:`finecap.models.text_window`), so the log's
``reward/retrieval/truncated`` is the share of the batch's captions scored on their first window only.

Distractors (``sr.distractors``):

- ``batch`` (default; DiscriTune: a batch of 100 gives 99 random distractors): the other images of the *global*
  batch, i.e. of the whole optimizer step: the training engine gives every micro-batch the image ids of its step's
  global batch (``batch['step_info'].image_ids``), so the distractors do not depend on the number of processes or
  gradient-accumulation steps and no communication is needed (embeddings come from the table).
- ``bag``: only the image's bag-mates, from ``batch["bag"]`` (bag numbers, a per-example field of the BagCurri
  sampler that the engine attaches, ``data.sampler=bagcurri``). In the random-batch epochs of a BagCurri schedule
  (bag size 0) each image is its own bag and the other batch images are used instead; so is an image whose bag-mates
  were all dropped as near-duplicates (``sr.duplicate_threshold``), whose reward is then on the random-batch scale.
  (With ``batch`` and BagCurri, the distractors are the bag-mates *plus* the other bags of the batch, as NDLB
  trains.)
- ``hard`` (DiscriTune D.2): the ``sr.hard_k`` training images most similar to the target under the retriever's
  image embeddings (mined over the whole training set, the target itself excluded), plus random ones: the other
  images of the global batch, in batch order (random batches are a random sample), skipping the mined ones, up to
  ``|global batch| - 1`` distractors in all, as the paper keeps 99 candidates with k of them mined (the k mined are
  always kept: a batch shorter than k + 1 images has k distractors).

``sr.duplicate_threshold`` drops every distractor (and mined candidate) whose image cosine to the target exceeds
it, so that near-identical images (duplicates in COCO; identical scenes in the world) do not punish a correct
caption. Images with the same image id are one candidate; two ids of one picture are two (a tie: ``log_prob`` at most
``-log 2``, ``accuracy`` 0) unless ``sr.duplicate_threshold`` drops one.

A caption whose image is left without a distractor (a global batch of one image, or every distractor dropped as a
near-duplicate) is *failed* (``RewardOutput.failed``, its ``log_prob`` and ``accuracy`` NaN) with
``sr.reward=log_prob`` or ``accuracy``, whose value over the target alone (0, a hit) says nothing of the caption: it
takes no gradient and counts in no running mean (docs/methods/discritune.md#an-image-without-a-distractor).

Image embeddings are computed once, in :meth:`RetrievalReward.setup` (from its :class:`~finecap.rewards.RewardInputs`:
``embeddings``, or ``images`` embedded there, or in a run the training ``records`` with
:meth:`finecap.models.retriever.Retriever.image_embeddings`, cached on disk by model and data set identity) and
looked up by image id; only the captions are encoded each step. The retriever (``inputs.retriever``: in a run
``load_retriever``, the object the retrieval validator shares: :class:`finecap.models.retriever.SharedRetrievers`) is
a frozen copy apart from the captioner (``requires_grad_(False)``, eval mode), so fine-tuning the captioner's vision
encoder (SR-V), even one loaded from the same checkpoint, never moves the scorer.

Example (hand-computed; see tests/rewards/test_retrieval_reward.py)::

    >>> import torch
    >>> text = torch.tensor([[1.0, 0.0]])                  # the caption's embedding
    >>> images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])    # target, one distractor
    >>> out = self_retrieval_scores(text, images, torch.tensor([0]), torch.ones(1, 2, dtype=torch.bool), 1.0)
    >>> round(out["log_prob"].item(), 4)                   # 1 - log(e^1 + e^0)
    -0.3133
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, get_args

import torch

from finecap.config import Distractors, SRConfig, SRReward
from finecap.data.records import id_key, refuse_repeated_ids
from finecap.models.text_window import DONE, encode_texts
from finecap.rewards.base import RewardBase, RewardOutput, caption_rows

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.rewards.inputs import RewardInputs

VARIANTS = get_args(SRReward)
DISTRACTORS = get_args(Distractors)
NO_TABLE = (
    "retrieval: give retriever= and one image table, images={image_id: PIL image} or embeddings={image_id: "
    "tensor (D,)}"
)


# --------------------------------------------------------------------------------------------------------------------
# Pure functions (hand-tested)
# --------------------------------------------------------------------------------------------------------------------


def self_retrieval_scores(
    text_emb: torch.Tensor, image_emb: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, scale: float
) -> dict[str, torch.Tensor]:
    """Per-caption ``log_prob``, ``accuracy``, ``cosine`` and ``candidates`` (each ``(N,)``).

    Args:
        text_emb: ``(N, D)`` unit-norm caption embeddings.
        image_emb: ``(M, D)`` unit-norm candidate image embeddings.
        target: ``(N,)`` column of each caption's own image in ``image_emb``.
        mask: ``(N, M)`` bool, the candidates of each caption (its target is always one).
        scale: similarity scale ``s`` (logit scale) of the log-softmax.
    """
    n = text_emb.shape[0]
    rows = torch.arange(n, device=text_emb.device)
    cos = text_emb.float() @ image_emb.float().T  # (N, M)
    mask = mask.clone().to(cos.device)
    mask[rows, target] = True
    logits = (scale * cos).masked_fill(~mask, float("-inf"))  # (N, M)
    own = logits[rows, target]  # (N,)
    log_prob = own - torch.logsumexp(logits, dim=1)  # (N,)
    others = logits.clone()
    others[rows, target] = float("-inf")
    best_other = others.max(dim=1).values if logits.shape[1] else torch.full_like(own, float("-inf"))  # (N,)
    return {
        "log_prob": log_prob,
        "accuracy": (own > best_other).float(),
        "cosine": cos[rows, target],
        "candidates": mask.sum(dim=1).float(),
    }


def mine_hard(
    pool: torch.Tensor, targets: torch.Tensor, k: int, threshold: float | None = None, chunk: int = 256
) -> torch.Tensor:
    """``(U, k)`` rows of ``pool`` most similar to each of ``pool[targets]`` (best first), the target itself and
    rows with cosine above ``threshold`` excluded; ``-1`` where fewer than ``k`` remain.

    ``pool``: ``(P, D)`` unit-norm image embeddings; ``targets``: ``(U,)`` row indices.
    """
    k_eff = min(k, pool.shape[0])
    out = torch.full((len(targets), k), -1, dtype=torch.long)
    for start in range(0, len(targets), chunk):
        t = targets[start : start + chunk].to(pool.device)
        sims = pool[t] @ pool.T  # (u, P)
        sims[torch.arange(len(t), device=pool.device), t] = float("-inf")
        if threshold is not None:
            sims = sims.masked_fill(sims > threshold, float("-inf"))
        values, index = sims.topk(k_eff, dim=1)  # (u, k_eff)
        index[values == float("-inf")] = -1
        out[start : start + len(t), :k_eff] = index.cpu()
    return out


def candidate_mask(
    mode: str,
    target: torch.Tensor,
    batch_columns: int,
    n_columns: int,
    *,
    bags: torch.Tensor | None = None,
    hard: torch.Tensor | None = None,
    duplicates: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(N, M)`` bool candidates of each caption (targets included) over ``M = n_columns`` image columns whose
    first ``batch_columns`` are the global batch's images (the rest: mined images outside the batch).

    Args:
        mode: ``batch``, ``bag`` or ``hard`` (module docstring).
        target: ``(N,)`` column of each caption's image (a batch column).
        bags: ``(batch_columns,)`` bag number of each batch column (``bag`` mode).
        hard: ``(N, k)`` columns of each caption's mined distractors, ``-1`` = none (``hard`` mode).
        duplicates: ``(N, M)`` bool, columns too similar to the caption's image (never distractors).
    """
    if mode not in DISTRACTORS:
        raise ValueError(f"sr.distractors: invalid value {mode!r}; valid choices: {', '.join(DISTRACTORS)}")
    n = len(target)
    rows = torch.arange(n)
    in_batch = torch.zeros(n, n_columns, dtype=torch.bool)
    in_batch[:, :batch_columns] = True
    allowed = in_batch.clone()
    if duplicates is not None:
        allowed &= ~duplicates
    allowed[rows, target] = False  # distractors only
    if mode == "batch":
        mask = allowed
    elif mode == "bag":
        if bags is None:
            raise ValueError("sr.distractors=bag needs bag numbers (batch['bag']): use data.sampler=bagcurri")
        column_bags = torch.full((n_columns,), -1, dtype=torch.long)
        column_bags[:batch_columns] = bags.long()
        mates = allowed & (column_bags[None, :] == column_bags[target][:, None])  # (N, M)
        lonely = ~mates.any(dim=1)  # no bag-mate (random-batch epochs): the other batch images instead
        mask = torch.where(lonely[:, None], allowed, mates)
    else:
        if hard is None:
            raise ValueError("sr.distractors=hard: the mined distractors are missing")
        mined = torch.zeros(n, n_columns, dtype=torch.bool)
        valid = hard >= 0
        mined[rows[:, None].expand_as(hard)[valid], hard[valid]] = True
        if duplicates is not None:
            mined &= ~duplicates
        mined[rows, target] = False
        fill = allowed & ~mined  # in-batch random ones, in batch order
        room = (batch_columns - 1 - mined.sum(dim=1)).clamp(min=0)  # (N,)
        fill &= fill.long().cumsum(dim=1) <= room[:, None]
        mask = mined | fill
    mask = mask.clone()
    mask[rows, target] = True
    return mask


# --------------------------------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------------------------------


class RetrievalReward(RewardBase):
    """Self-retrieval reward of each caption; see the module docstring. Needs the retriever (``needs``).

    Args:
        retriever: a :class:`finecap.models.retriever.Retriever` (``encode_texts``, or a stand-in's
            ``embed_texts``, its captions' embeddings L2-normalised here as the image table's; ``logit_scale``,
            ``image_embeddings``); ``None``: the inputs' in :meth:`setup`.
        sr: the ``sr`` section (:class:`finecap.config.SRConfig`: ``reward``, ``distractors``, ``hard_k``,
            ``duplicate_threshold``, ``logit_scale``; checked when it is built; default: its defaults).
        image_ids, embeddings: the embedding table (``(P, D)`` unit-norm rows of the listed image ids); default: the
            inputs' (:meth:`setup`).
        device: where hard negatives are mined (default: the CPU; :meth:`setup` sets the inputs' device).
    """

    name = "retrieval"

    def __init__(
        self,
        retriever: Any = None,
        sr: SRConfig | None = None,
        *,
        image_ids: Sequence[Hashable] | None = None,
        embeddings: torch.Tensor | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.sr = sr or SRConfig()
        self.device = device or torch.device("cpu")  # where hard negatives are mined
        self.retriever = None
        if retriever is not None:
            self._set_retriever(retriever)
        self.table: torch.Tensor | None = None
        self.mining_table: torch.Tensor | None = None  # the table on the accelerator's device (hard mining)
        self.row_of: dict[Hashable, int] = {}
        if embeddings is not None:
            if image_ids is None:
                raise ValueError("RetrievalReward: embeddings need the image_ids of their rows")
            self.set_embeddings(image_ids, embeddings)

    # ----------------------------------------------------------------------------------------------------------------

    def _set_retriever(self, retriever: Any) -> None:
        model = getattr(retriever, "model", None)
        if isinstance(model, torch.nn.Module):  # the scorer never learns, whatever the captioner trains
            model.requires_grad_(False)
            model.eval()
        self.retriever = retriever

    def set_embeddings(self, image_ids: Sequence[Hashable], embeddings: torch.Tensor) -> None:
        """Use ``embeddings`` ``(P, D)`` (L2-normalised here) as the image table, row ``j`` = ``image_ids[j]``; two
        ids naming one image (``1`` and ``"1"``, or one id twice) are a ``ValueError``
        (:func:`~finecap.data.records.refuse_repeated_ids`): the image's other row stays in the table, a candidate
        that ties with it (a hard distractor mined from it, ``sr.distractors=hard``), as the self-retrieval metric
        refuses such images."""
        image_ids = list(image_ids)
        refuse_repeated_ids(image_ids, "retrieval image table")
        if len(image_ids) != embeddings.shape[0]:
            raise ValueError(f"RetrievalReward: {len(image_ids)} image ids for {embeddings.shape[0]} embeddings")
        self.table = torch.nn.functional.normalize(embeddings.detach().float().cpu(), dim=-1)  # (P, D)
        self.mining_table = None
        self.row_of = {image_id: j for j, image_id in enumerate(image_ids)}

    needs = frozenset({"retriever"})

    def known_images(self) -> list[Hashable]:
        """The images of the embedding table."""
        return list(self.row_of)

    def setup(self, inputs: RewardInputs) -> None:
        """The frozen retriever (``inputs.retriever``) on ``inputs.device`` (when given) and the image table: the
        inputs' ``embeddings``, or their ``images`` embedded here, or the embeddings of their ``records`` (the
        training images; disk-cached in ``inputs.cache_dir``, the main process filling the cache first)."""
        if inputs.device is not None:
            self.device = inputs.device
        if self.retriever is None:
            if inputs.retriever is None:
                raise ValueError(NO_TABLE)
            self._set_retriever(inputs.retriever)
        if inputs.device is not None and isinstance(getattr(self.retriever, "model", None), torch.nn.Module):
            self.retriever.model.to(inputs.device)
        if self.table is not None:
            return
        given = [inputs.images is not None, inputs.embeddings is not None]
        if sum(given) > 1 or (not any(given) and inputs.records is None):
            raise ValueError(NO_TABLE)
        if inputs.images is not None:
            ids = list(inputs.images)
            table = self.retriever.embed_images([inputs.images[i] for i in ids]).cpu()  # (P, D)
        elif inputs.embeddings is not None:
            ids = list(inputs.embeddings)
            table = torch.stack([torch.as_tensor(inputs.embeddings[i]).float() for i in ids])  # (P, D)
        else:
            records = list(inputs.records)
            if not records:
                raise ValueError("rl.rewards.retrieval: the training split has no images")
            with inputs.main_process_first():  # the main process fills the cache, the others read it
                table = self.retriever.image_embeddings(records, cache_dir=inputs.cache_dir)
            ids = [r.image_id for r in records]
        self.set_embeddings(ids, table)

    @property
    def compares_images(self) -> bool:
        """Whether the candidates are the call's images (:func:`finecap.rewards.base.compares_images`): every mode but
        ``hard`` (mined distractors) and ``cosine`` (no distractors)."""
        return self.sr.distractors != "hard" and self.sr.reward != "cosine"

    @property
    def scale(self) -> float:
        return float(self.sr.logit_scale) if self.sr.logit_scale > 0 else float(self.retriever.logit_scale)

    # ----------------------------------------------------------------------------------------------------------------

    def _rows(self, image_ids: Sequence[Hashable]) -> torch.Tensor:
        rows = []
        for i in image_ids:
            key = i if i in self.row_of else id_key(i, self.row_of)  # an id written as an int or as its string
            if key is None:
                raise KeyError(f"rl.rewards.retrieval: image id {i!r} has no retriever embedding (only the training "
                               f"split's {len(self.row_of)} images are embedded)")  # fmt: skip
            rows.append(self.row_of[key])
        return torch.tensor(rows, dtype=torch.long)  # (B,)

    def _global_batch(self, batch: Mapping[str, Any], rows: torch.Tensor, bags: torch.Tensor | None):
        """Table rows (and bag numbers) of the images of the optimizer step's global batch, in global order: from
        ``batch['step_info']`` (:class:`~finecap.contract.StepInfo`), which the training engine attaches to
        every micro-batch (so the distractors are the same whatever the number of processes and accumulation steps);
        without it, the batch itself."""
        info = batch.get("step_info")
        if info is None:
            return rows, bags
        step_bags = info.fields.get("bag") if bags is not None else None
        if bags is not None and step_bags is None:
            raise ValueError("sr.distractors=bag: the micro-batch carries bag numbers but its step's are missing")
        return self._rows(info.image_ids), (torch.as_tensor(step_bags).cpu() if bags is not None else None)

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.retriever is None or self.table is None:
            raise RuntimeError("RetrievalReward: no retriever or image embeddings; call setup(inputs) first")
        caption_row = caption_rows(captions, batch)  # (N,) batch row of each caption
        rows = self._rows(batch["image_ids"])  # (B,) table row of each batch image
        bags = batch.get("bag")
        if self.sr.distractors == "bag" and bags is None:
            raise ValueError("sr.distractors=bag needs the batch's bag numbers: train with data.sampler=bagcurri")
        global_rows, global_bags = self._global_batch(batch, rows, bags if self.sr.distractors == "bag" else None)
        column_of: dict[int, int] = {}
        column_bags = []
        for j, r in enumerate(global_rows.tolist()):  # one column per image of the global batch
            if r not in column_of:
                column_of[r] = len(column_of)
                if global_bags is not None:
                    column_bags.append(int(global_bags[j]))
        batch_columns = len(column_of)
        target_rows = rows[caption_row]  # (N,)
        hard = None
        if self.sr.distractors == "hard":
            unique_rows = torch.unique(target_rows)  # (U,)
            if self.mining_table is None:
                self.mining_table = self.table.to(self.device)
            mined = mine_hard(
                self.mining_table, unique_rows, self.sr.hard_k, self.sr.duplicate_threshold
            )  # (U, k) rows
            for r in mined[mined >= 0].tolist():
                column_of.setdefault(r, len(column_of))
            mined_columns = mined.apply_(lambda r: column_of[r] if r >= 0 else -1)  # (U, k) columns
            where = {r: u for u, r in enumerate(unique_rows.tolist())}
            hard = mined_columns[torch.tensor([where[r] for r in target_rows.tolist()])]  # (N, k)
        columns = torch.tensor(list(column_of), dtype=torch.long)  # (M,) table rows
        image_emb = self.table[columns]  # (M, D)
        target = torch.tensor([column_of[r] for r in target_rows.tolist()], dtype=torch.long)  # (N,)
        duplicates = None
        if self.sr.duplicate_threshold is not None:
            duplicates = (image_emb[target] @ image_emb.T) > self.sr.duplicate_threshold  # (N, M)
        mask = candidate_mask(
            self.sr.distractors, target, batch_columns, len(columns),
            bags=torch.tensor(column_bags) if column_bags else None, hard=hard, duplicates=duplicates,
        )  # fmt: skip
        names = [batch["image_ids"][r] for r in caption_row.tolist()]  # each caption's image (for a refusal)
        encoding = encode_texts(self.retriever, list(captions), names)
        # (N, D) unit norm: a Retriever's already are, a stand-in's own embed_texts need not be (as the image table)
        text_emb = torch.nn.functional.normalize(encoding.embeddings.float().cpu(), dim=-1)
        scores = self_retrieval_scores(text_emb, image_emb, target, mask, self.scale)
        if encoding.long_text in DONE:  # (N,) 1 = longer than the text window
            scores[DONE[encoding.long_text]] = torch.tensor(encoding.long, dtype=torch.float)
        failed = None
        if self.sr.reward != "cosine":  # a caption whose image has no distractor: no retrieval to score (docstring)
            alone = scores["candidates"] <= 1  # (N,)
            if bool(alone.any()):
                failed = alone
                for key in ("log_prob", "accuracy"):
                    scores[key] = scores[key].masked_fill(alone, float("nan"))
        total = scores[self.sr.reward]
        return RewardOutput(total, {self.name: total, **scores}, failed)


def build(cfg: Config) -> RetrievalReward:
    """Factory of the reward registry (``rl.rewards: {retrieval: w}``) with the ``sr`` section of ``cfg``; the
    retriever and the image table are read in ``setup(inputs)``."""
    return RetrievalReward(sr=cfg.sr)
