"""Sequence-level exploration (Chen & Jin, CVPR 2020, Eq. 8-16, Algorithm 1, Sec. 4.3): REINFORCE on
``alpha * precision + (1 - alpha) * diversity`` (``train.objective=sle``).

For each image, s captions y_1..y_s are sampled (``rl.samples``, paper: 5). Per sample j (Eq. 15-16):

- **precision**: the reward ``R(y_j)`` (``rl.rewards``; the paper names CIDEr, Sec. 4.3, without the variant:
  finecap's ``cider`` is CIDEr-D, SCST's, per caption on pycocoevalcap's scale) minus its own baseline
  (``rl.baseline``, paper: the greedy caption's reward), weighted by ``alpha`` (``sle.alpha``, paper: 0.75);
- **diversity**: the reward ``r_j = (2/s) sum_k d(y_j, y_k)`` (Eq. 14-16; k runs over all s samples, and
  ``d(y_j, y_j) = 0``) minus ``2 b`` with ``b = (1/s^2) sum_j sum_k d(y_j, y_k)`` the mean pairwise distance of the
  image's samples (Sec. 4.3), weighted by ``1 - alpha``.

The loss is ``-(1/B) sum_i (1/s) sum_j [A_prec_j + A_div_j] log p(y_j)``, returned as the two named losses
``precision`` and ``diversity`` (weights included). Every sample gets its own diversity advantage, so the term
distinguishes the samples of one image: those far from the others are pushed up, near-duplicates down (unlike a
per-image diversity score shared by all samples of the image).

A sample a reward could not score (``RewardOutput.failed``: a judge that timed out) takes no gradient from either
term, as from every term of the REINFORCE family (docs/methods/grpo.md): its precision advantage is 0, and the
diversity term is that of the image's scored samples alone (s their number in ``r_j`` and ``b``), its own advantage
0. Were it kept, it would be pushed up for being far from its image's other samples with no reward to answer it
(a judge fails more on long or garbled captions, which are far from the others), and would count in their sums.
Until 2026-11-29 it was kept. ``pairwise_distance`` (the samples themselves) still covers it.

Choices made where the paper is open, and why:

- **Where the baseline goes.** Eq. 13 is two REINFORCE estimates, one for each of the two expectations; giving each
  the baseline b yields ``(2/s^2) sum_j sum_k (d_jk - b) grad log p_j``, i.e. the advantage
  ``(2/s) sum_k (d_jk - b) = r_j - 2b``. Sec. 4.3 states b but not the factor; subtracting b once from
  ``r_j`` (whose mean over j is ``2b``) would leave advantages whose mean is ``+b > 0``, pushing up every sampled
  caption and so *narrowing* the distribution, the opposite of the term's purpose. With ``r_j - 2b`` the diversity
  advantages of an image sum to zero. ``sle.diversity_baseline=none`` uses ``r_j`` itself. Checked on world scenes
  (tiny GPT-2 captioner, 300 steps of 32 images x 5 samples, lr 1e-4, 300 validation images): the literal
  ``r_j - b`` form ended with the diversity of SCST (Div-2 0.31 vs 0.30, mBLEU-4 0.85 vs 0.84), while ``r_j - 2b``
  kept part of the MLE model's diversity (Div-2 0.37, mBLEU-4 0.72; MLE: 0.62, 0.33).
- **Distance.** The paper uses "BLEU3 + BLEU4"; a distance must grow with difference, so ``d = 1 - (BLEU-3 + BLEU-4) /
  2``: sentence-level BLEU (pycocoevalcap's smoothing) of one caption against the other as the single reference
  (:func:`finecap.metrics.diversity.bleu_distance`). Sentence BLEU is not symmetric (brevity penalty and precision
  denominators depend on the hypothesis), while Eq. 13-14 assume ``d(y, y') = d(y', y)``; for an asymmetric d, Eq. 13
  gives exactly the symmetrised distance ``(d(y, y') + d(y', y)) / 2``, which is used. **Scale** (the paper gives
  none): the mean ``(BLEU-3 + BLEU-4) / 2`` keeps d in [0, 1], half the range of the paper's sum; a distance on the
  sum's scale, ``2 - BLEU-3 - BLEU-4``, would double every diversity advantage: the paper's alpha = 0.75 on that scale
  weighs the two terms in the ratio ``sle.alpha=0.6`` gives here (``sle.alpha=0.75`` here is alpha = 6/7 there).
  Identical captions are at distance 0 by definition (pycocoevalcap's smoothing would give two identical captions
  shorter than 4 words a positive distance, rewarding short duplicates). Captions are PTB-tokenised first, like the
  CIDEr-D reward.
- **A length-neutral distance (finecap's ablation, not the paper's).** BLEU-3/4 leans towards short captions: a
  caption shorter than the image's other samples has a brevity penalty against each of them and fewer 3- and
  4-grams to share, so it is "far" from them and the term pushes it up (docs/results.md, "Training noise": the
  advantage correlates with relative length at -0.13 on two worlds). ``sle.distance=overlap34`` replaces BLEU by the
  n-gram overlap coefficient, ``d = 1 - (O_3 + O_4) / 2`` with ``O_n`` = shared n-grams (clipped counts) over the
  n-grams of the *shorter* caption (:func:`finecap.metrics.diversity.overlap_distance`). A caption whose n-grams all
  occur in another one (it stops sooner, or the other goes on) is at distance 0 from it, so neither dropping nor
  adding words earns diversity, only wording that differs; it is symmetric without averaging, 0 between identical
  captions and needs no smoothing (a caption shorter than n words is compared by its whole word sequence). The
  alternatives were weaker: BLEU without its brevity penalty still divides by the hypothesis' n-grams
  (symmetrised, "a red circle" inside a 9-word caption is still at 0.69, against 1 for a disjoint one), and Jaccard
  or Dice divide by the union or the sum of both captions' n-grams, so a length difference alone is distance again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, get_args

import numpy as np
import torch

from finecap.config import Distance, DiversityBaseline, SLEConfig
from finecap.contract import is_copy
from finecap.metrics.diversity import bleu_distance, overlap_distance
from finecap.metrics.ptb_tokenize import tokenize
from finecap.objectives.reinforce import Reinforce, Rollout, reinforce_kwargs

if TYPE_CHECKING:
    from finecap.config import Config

DISTANCES = get_args(Distance)
DIVERSITY_BASELINES = get_args(DiversityBaseline)


def bleu34_distance(groups: list[list[str]]) -> np.ndarray:
    """The paper's ``1 - (BLEU-3 + BLEU-4) / 2``, symmetrised, 0 between identical captions (module docstring):
    (G, s, s) over groups of tokenised captions."""
    d = bleu_distance(groups, (3, 4))  # (G, s, s), asymmetric
    d = (d + d.transpose(0, 2, 1)) / 2.0
    same = np.array([[[a == b for b in g] for a in g] for g in groups], dtype=bool).reshape(d.shape)  # (G, s, s)
    d[same] = 0.0
    return d


def overlap34_distance(groups: list[list[str]]) -> np.ndarray:
    """The length-neutral ``1 - (O_3 + O_4) / 2`` (n-gram overlap coefficients; module docstring): (G, s, s)."""
    return overlap_distance(groups, (3, 4))


DISTANCE_FUNCTIONS = {"bleu34": bleu34_distance, "overlap34": overlap34_distance}
"""``sle.distance`` names -> ``distance(groups of tokenised captions) -> (G, s, s)``."""


def caption_distances(captions: Sequence[str], s: int, distance: str = "bleu34") -> torch.Tensor:
    """Pairwise distances (B, s, s) within consecutive groups of ``s`` captions (one group per image), PTB-tokenised
    first: ``sle.distance`` of :data:`DISTANCE_FUNCTIONS` (module docstring).

    >>> d = caption_distances(["a red circle on grass", "a red circle on grass", "two big blue squares"], 3)
    >>> d[0].tolist()[0][:2], round(float(d[0, 0, 2]), 3)  # identical: 0; no shared 3-gram: ~1
    ([0.0, 0.0], 1.0)
    >>> d = caption_distances(["a red circle", "a red circle on grass", "a blue circle"], 3, "overlap34")
    >>> d[0].tolist()  # the first is contained in the second: 0; "a blue circle" shares no trigram with either
    [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    """
    if distance not in DISTANCE_FUNCTIONS:
        raise ValueError(f"sle.distance: invalid value {distance!r}; valid choices: {', '.join(DISTANCES)}")
    if s < 1 or len(captions) % s:
        raise ValueError(f"caption_distances: {len(captions)} captions do not form groups of {s}")
    texts = [tokenize(c) for c in captions]
    groups = [texts[i : i + s] for i in range(0, len(texts), s)]
    return torch.from_numpy(DISTANCE_FUNCTIONS[distance](groups)).float()


def _scored_or_all(d: torch.Tensor, scored: torch.Tensor | None) -> torch.Tensor:
    """``scored`` (B, s) bool, or every sample of d (B, s, s) for ``None``."""
    return torch.ones(d.shape[:-1], dtype=torch.bool, device=d.device) if scored is None else scored


def diversity_rewards(d: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 14-16: ``r_j = (2/s) sum_k d(y_j, y_k)`` per sample; d (B, s, s) -> (B, s). ``scored`` (B, s) bool: the
    samples a reward scored (``None``: all); the sum and s are then over an image's scored samples alone, as if only
    they had been drawn, and a failed sample's r is 0 (module docstring)."""
    scored = _scored_or_all(d, scored)  # (B, s)
    both = (scored[:, :, None] & scored[:, None, :]).to(d.dtype)  # (B, s, s): pairs of scored samples
    m = scored.sum(dim=-1, keepdim=True).to(d.dtype).clamp(min=1.0)  # (B, 1) scored samples per image
    r = (2.0 / m) * (d * both).sum(dim=-1)  # (B, s)
    return torch.where(scored, r, torch.zeros_like(r))


def diversity_advantages(d: torch.Tensor, baseline: str = "pairwise_mean", scored: torch.Tensor | None = None
                         ) -> torch.Tensor:  # fmt: skip
    """Diversity advantage per sample (B, s): ``(2/s) sum_k (d_jk - b)`` with ``b`` the image's mean pairwise
    distance ``(1/s^2) sum_jk d_jk`` (``pairwise_mean``; zero-mean over an image's samples), or ``r_j`` (``none``).
    With ``scored`` (B, s) bool, over each image's scored samples alone (s their number); a failed sample's is 0.

    >>> d = torch.tensor([[[0.0, 0.5, 1.0], [0.5, 0.0, 0.5], [1.0, 0.5, 0.0]]])
    >>> [round(v, 4) for v in diversity_advantages(d)[0].tolist()]  # r = (2/3)(1.5, 1, 1.5), b = 4/9: r - 8/9
    [0.1111, -0.2222, 0.1111]
    >>> d4 = torch.tensor([[[0.0, 0.5, 1.0, 0.2], [0.5, 0.0, 0.5, 0.9], [1.0, 0.5, 0.0, 0.3], [0.2, 0.9, 0.3, 0.0]]])
    >>> scored = torch.tensor([[True, True, True, False]])  # sample 3 failed: the three others as above, it 0
    >>> [round(v, 4) for v in diversity_advantages(d4, scored=scored)[0].tolist()]
    [0.1111, -0.2222, 0.1111, 0.0]
    """
    scored = _scored_or_all(d, scored)  # (B, s)
    r = diversity_rewards(d, scored)  # (B, s)
    if baseline == "none":
        return r
    if baseline == "pairwise_mean":
        m = scored.sum(dim=-1).to(d.dtype).clamp(min=1.0)  # (B,) scored samples per image
        b = r.sum(dim=-1) / (2.0 * m)  # (B,) = (1/m^2) sum_jk d_jk over scored pairs (the mean of r is 2b)
        return torch.where(scored, r - 2.0 * b[:, None], torch.zeros_like(r))  # a failed sample's: 0
    raise ValueError(
        f"sle.diversity_baseline: invalid value {baseline!r}; valid choices: {', '.join(DIVERSITY_BASELINES)}"
    )


class SequenceLevelExploration(Reinforce):
    """``objective(model, batch)``: losses ``precision`` (``sle.alpha``-weighted REINFORCE of the reward with its
    baseline) and ``diversity`` ((1 - ``sle.alpha``)-weighted diversity REINFORCE term, ``sle.distance``,
    ``sle.diversity_baseline``); see the module docstring. Arguments as :class:`Reinforce`, and ``sle`` (the
    ``sle`` section, :class:`finecap.config.SLEConfig`; default: its defaults)."""

    def __init__(self, *args: Any, sle: SLEConfig | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sle = sle or SLEConfig()
        if self.rl.strategy != "sample" or self.rl.samples < 2:  # what this objective needs of the rl section
            raise ValueError(
                "train.objective=sle needs rl.strategy=sample and rl.samples >= 2 (paper: 5), got "
                f"rl.strategy={self.rl.strategy}, rl.samples={self.rl.samples}"
            )

    def advantages(self, rollout: Rollout, batch: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        gen = rollout.samples
        s = self.rl.samples
        expected = torch.arange(len(gen) // s, device=gen.image_index.device).repeat_interleave(s)
        if len(gen) % s or not torch.equal(gen.image_index, expected):
            raise ValueError(f"sle: expected {s} contiguous samples per image from the decoder")
        t0 = time.perf_counter()
        d = caption_distances(gen.texts, s, self.sle.distance)  # (B, s, s)
        seconds = time.perf_counter() - t0
        failed = rollout.rewards.failed_mask()  # (N,) or None: captions a reward could not score
        scored = None if failed is None else ~failed.reshape(-1, s)  # (B, s)
        div = diversity_advantages(d, self.sle.diversity_baseline, scored).reshape(-1)  # (N,)
        device = rollout.advantage.device
        advantages = {
            "precision": self.sle.alpha * rollout.advantage,
            "diversity": (1.0 - self.sle.alpha) * div.to(device),
        }
        rewards = diversity_rewards(d, scored)  # (B, s)
        values = rewards.flatten() if scored is None else rewards[scored]  # the scored samples' (N',)
        metrics = {  # diversity_reward: the step's mean over every scored sample, every process's (Reinforce.metrics)
            "diversity_reward": self.token_means.add("diversity_reward", values, not is_copy(batch)),
            "pairwise_distance": float(d.sum() / max(1, d.shape[0] * s * (s - 1))),  # mean over pairs j != k
            "time/diversity": seconds,
        }
        return advantages, metrics


def build(cfg: Config) -> SequenceLevelExploration:
    """Factory of ``train.objective=sle`` (options ``sle.*``, the rollout's ``rl.*``; paper: alpha 0.75, s 5,
    CIDEr (finecap: CIDEr-D), greedy baseline). The GRPO family's options are refused: the two terms are separate
    REINFORCE estimates (Eq. 13), which neither a group normalisation of the precision term nor a clipped ratio of
    their sum would keep."""
    for key, default in (("advantage", "baseline"), ("policy_loss", "reinforce")):
        if getattr(cfg.grpo, key) != default:
            raise ValueError(f"grpo.{key}={getattr(cfg.grpo, key)}: train.objective=sle is REINFORCE only (grpo.{key}="
                             f"{default}); use train.objective=grpo for the GRPO family")  # fmt: skip
    return SequenceLevelExploration(**reinforce_kwargs(cfg), sle=cfg.sle)
