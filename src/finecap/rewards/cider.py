"""CIDEr-D reward: each caption scored against the references of its image (the SCST reward).

Uses the reward form of :class:`finecap.metrics.ngram.CiderD`: reference n-gram statistics and document
frequencies are computed once, from the references it is set up with (``setup(inputs)`` reads ``inputs.references``:
in a run the *training* references, N = the number of training images), as self-critical training does; each step
then only counts the captions' n-grams.
References and captions are tokenised with the pure-Python PTB tokenizer (:mod:`finecap.metrics.ptb_tokenize`),
like the evaluation, so the reward is the number the evaluation reports (per caption, not corpus-averaged). The
values are pycocoevalcap's scale (about 0-10 per caption; the papers' "CIDEr 114.6" is 100 x the mean).

A call may bring references of its own (``batch["caption_references"]``: one list per caption,
:func:`finecap.rewards.call_batch`, as the reward server's requests may): each caption is then scored against its
list, the document frequencies (and N) still the corpus's, which costs a pass over the corpus's references per call
(training never does this).

Example::

    >>> reward = CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]})
    >>> out = reward(["a red circle", "a square"], {"image_ids": [1, 2]})
    >>> [round(v, 3) for v in out.total.tolist()]  # pycocoevalcap's Cider gives the same per-image scores
    [5.26, 1.743]
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from finecap.data.records import id_key, refuse_repeated_ids
from finecap.metrics.ngram import CiderD
from finecap.metrics.ptb_tokenize import tokenize
from finecap.rewards.base import (
    CAPTION_REFERENCES,
    RewardBase,
    RewardOutput,
    caption_rows,
    flag_setting,
    number_setting,
)

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.rewards.inputs import RewardInputs


class CiderReward(RewardBase):
    """CIDEr-D of each caption against its image's references; document frequencies from a fixed corpus.

    Args:
        references: ``{image_id: [reference captions]}``; when ``None`` they are read in :meth:`setup`.
        tokenize_text: PTB-tokenise references and captions (lower-case, punctuation removed) before scoring.
        sigma: CIDEr-D length-penalty width (6, as pycocoevalcap).
    """

    name = "cider"
    per_caption = True  # a caption's value needs only its own references and the fixed document frequencies
    settings = ("tokenize_text", "sigma")

    def __init__(
        self,
        references: Mapping[Hashable, Sequence[str]] | None = None,
        *,
        tokenize_text: bool = True,
        sigma: float = 6.0,
    ):
        self.tokenize_text = self.check_setting("tokenize_text", tokenize_text)
        self.sigma = self.check_setting("sigma", sigma)
        self.scorer: CiderD | None = None
        self.references: dict[Hashable, list[str]] = {}  # the document-frequency corpus, as scored (tokenised)
        if references is not None:
            self._build(references)

    def _build(self, references: Mapping[Hashable, Sequence[str]]) -> None:
        # {1: ..., "1": ...}: one image as two documents of the corpus (its n-grams' document frequencies counted
        # twice) and a caption scored against the list keyed as its id is written; refused as finecap eval does
        refuse_repeated_ids(references, "cider references")
        if self.tokenize_text:
            references = {i: [tokenize(c) for c in refs] for i, refs in references.items()}
        self.references = {i: list(refs) for i, refs in references.items()}
        self.scorer = CiderD(self.references, sigma=self.sigma)

    def check_setting(self, key: str, value: Any) -> Any:
        """``sigma``: a number above 0 (the length penalty divides by it); ``tokenize_text``: ``True`` or ``False``; a
        ``ValueError`` naming the setting otherwise."""
        if key == "sigma":
            return number_setting(self.name, key, value, positive=True)
        if key == "tokenize_text":
            return flag_setting(self.name, key, value)
        return value

    def configure(self, **settings: Any) -> None:
        """Set ``sigma`` and ``tokenize_text`` (:meth:`RewardBase.configure`, :meth:`check_setting`) wholly: a new
        ``sigma`` is the scorer's too when the references were given already; ``tokenize_text`` cannot change once
        they were (they are kept as scored, tokenised or not), a ``ValueError`` saying to give it to the
        constructor."""
        changed = "tokenize_text" in settings and (
            self.check_setting("tokenize_text", settings["tokenize_text"]) != self.tokenize_text
        )
        if self.scorer is not None and changed:
            raise ValueError(f"cider: configure(tokenize_text={settings['tokenize_text']!r}) after the references "
                             "were given (they are kept as scored): give tokenize_text= to the constructor, with "
                             "the references")  # fmt: skip
        super().configure(**settings)
        if self.scorer is not None:
            self.scorer.sigma = self.sigma  # the scorer was built with the earlier sigma: its score reads this

    def known_images(self) -> list[Hashable]:
        """The images of the document-frequency corpus."""
        return list(self.references)

    def setup(self, inputs: RewardInputs) -> None:
        """Reference statistics and document frequencies from ``inputs.references`` (once)."""
        if self.scorer is not None:
            return
        if inputs.references is None:
            raise ValueError("cider: outside a training run give references={image_id: [captions]} (CIDEr-D's "
                             "document frequencies come from them)")  # fmt: skip
        if not inputs.references:
            raise ValueError("cider: references={image_id: [captions]} is empty (in a run: the training split has no "
                             "records with references)")  # fmt: skip
        self._build(inputs.references)

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.scorer is None:
            raise RuntimeError("CiderReward: no references; pass them to the constructor or call setup(inputs) first")
        texts = [tokenize(c) for c in captions] if self.tokenize_text else list(captions)
        given = batch.get(CAPTION_REFERENCES)
        if given is not None:
            scores = self.score_against(texts, given)  # (N,) float64
        else:
            rows = caption_rows(captions, batch).tolist()
            ids = batch["image_ids"]
            keys = [id_key(ids[r], self.references) for r in rows]  # an id written as an int or as its string
            scores = self.scorer.score(texts, [ids[r] if k is None else k for r, k in zip(rows, keys)])  # (N,) float64
        total = torch.from_numpy(scores).float()  # (N,)
        return RewardOutput(total, {self.name: total})

    def score_against(self, texts: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
        """(N,) float64: CIDEr-D of ``texts[n]`` (as scored: tokenised already) against ``references[n]``, with the
        document frequencies and N of the corpus the reward was built on."""
        if len(references) != len(texts):
            raise ValueError(f"cider: {len(references)} reference lists for {len(texts)} captions")
        refs = {n: [tokenize(r) for r in rs] if self.tokenize_text else list(rs) for n, rs in enumerate(references)}
        return CiderD(refs, df_references=self.references, sigma=self.sigma).score(texts, list(refs))


def build(cfg: Config) -> CiderReward:
    """Factory of the reward registry (``rl.rewards: {cider: w}``); the references are read in ``setup(inputs)``."""
    return CiderReward()
