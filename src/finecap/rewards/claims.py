"""Claim precision and recall (BalCapRL's, CCCaption's and ClaimDiff-RL's decomposition): the judge splits the caption
and the references into atomic claims; precision = caption claims the image's evidence supports, recall = reference
claims the caption covers (:mod:`finecap.judges.claims`). On the world with the ``world`` judge the claims are the
parsed facts and the evidence the scene graph, so precision and recall are the faithfulness metric's exactly, but for
a caption that states no fact (precision 0 here, 1 there: below).

The evidence is read in ``setup(inputs)``: ``inputs.references`` (in a run the training references) and
``inputs.scenes`` (on the world); a call's own references (``caption_references``) replace an image's. The judge is the
``judge`` setting (a :class:`~finecap.judges.base.Judge` or a judge name) or the run's ``judge`` section.

``reward`` = F1 (``score="f1"``, the default; a setting), or ``precision`` / ``recall``; parts ``precision``,
``recall``, ``f1`` and ``judge_failed`` (1 when a judge call for the caption failed: the caption is marked in
``failed`` and its other values are NaN, :mod:`finecap.rewards.judged`). A caption that claims nothing (empty, or no
atomic claim) has precision 0 here, and F1 0: the metric's 1 (nothing claimed, nothing false) would pay a policy the
highest precision for saying nothing (:attr:`finecap.judges.claims.ClaimScore.reward_precision`). To pay the two
parts each normalised on its own (BalCapRL, GDPO-style), sum two of these rewards, ``score="precision"`` and
``score="recall"``, under GDPO's per-reward normalisation.

Example::

    >>> from finecap.world.scene import Obj, Scene
    >>> from finecap.judges.world import WorldJudge
    >>> scene = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
    >>> out = ClaimsReward(WorldJudge(), scenes={0: scene})(["a blue circle"], {"image_ids": [0]})
    >>> out.parts["precision"].tolist(), out.parts["recall"].tolist()  # object true, colour false; 1 of 6 facts
    ([0.5], [0.1666666716337204])
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from finecap.data.records import id_text
from finecap.judges.base import Judge, JudgeFailed
from finecap.judges.claims import claim_scores, f1
from finecap.rewards.base import keyed_table
from finecap.rewards.judged import JudgedReward, caption_subjects, judged_output

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.rewards.base import RewardOutput
    from finecap.rewards.inputs import RewardInputs
    from finecap.world.scene import Scene

Score = Literal["f1", "precision", "recall"]
SCORES = ("f1", "precision", "recall")


def check_score(score: str) -> None:
    if score not in SCORES:
        raise ValueError(f"claims: score={score!r}; valid: {', '.join(SCORES)}")


class ClaimsReward(JudgedReward):
    """Claim F1 (or precision, recall) of each caption (module docstring).

    Args:
        judge: the judge (or a judge name); ``None``: the ``judge`` section of ``cfg``, made in :meth:`setup`.
        references: ``{image_id: [captions]}`` and ``scenes`` ``{image_id: Scene}``, the evidence; ``None`` for both:
            read in :meth:`setup`. Two ids of one naming one image (``1`` and ``"1"``) are a ``ValueError``
            (:meth:`take_evidence`).
        score: the total, ``f1``, ``precision`` or ``recall``.
        cfg: the configuration whose ``judge`` section builds the judge (``None``: the ``world`` judge's defaults).
    """

    name = "claims"
    per_caption = True  # a caption's value needs only its own image's evidence
    settings = ("judge", "score")

    def __init__(
        self,
        judge: Judge | str | None = None,
        *,
        references: Mapping[Hashable, Sequence[str]] | None = None,
        scenes: Mapping[Hashable, Scene] | None = None,
        score: Score = "f1",
        cfg: Config | None = None,
    ) -> None:
        check_score(score)
        self.judge: Judge | str | None = judge
        self.score, self.cfg = score, cfg
        self.references: dict[Hashable, list[str]] | None = None
        self.scenes: dict[Hashable, Scene] | None = None
        self.take_evidence(references, scenes)
        if judge is not None and not isinstance(judge, Judge):
            self.judge = self._resolve(judge, cfg, "claims")

    def check_setting(self, key: str, value: Any) -> Any:
        """``score``: one of :data:`SCORES`; ``judge``: :meth:`JudgedReward.check_setting`'s (a ``ValueError``
        naming the setting otherwise)."""
        if key == "score":
            check_score(value)
        return super().check_setting(key, value)

    def configure(self, **settings: Any) -> None:
        """Set ``judge`` and ``score`` (:meth:`check_setting`); a judge given is resolved here, as the constructor
        resolves it, so that it applies whether :meth:`setup` came before or comes after."""
        super().configure(**settings)
        if "judge" in settings:
            self.judge = self._resolve(self.judge, self.cfg, "claims")

    def setup(self, inputs: RewardInputs) -> None:
        """The judge and the evidence (module docstring), once."""
        check_score(self.score)
        self.judge = self._resolve(self.judge, self.cfg, "claims")
        if self.references is not None or self.scenes is not None:
            return
        if inputs.references is None and inputs.scenes is None:
            raise ValueError("claims: outside a training run give references={image_id: [captions]} and/or scenes= "
                             "(world=)")  # fmt: skip
        self.take_evidence(inputs.references, inputs.scenes)

    def take_evidence(
        self, references: Mapping[Hashable, Sequence[str]] | None, scenes: Mapping[Hashable, Scene] | None
    ) -> None:
        """Where the evidence enters the reward (the constructor's, or :meth:`setup`'s inputs'): each table copied,
        two ids of one table naming one image (``1`` and ``"1"``) a ``ValueError`` naming it ("claims references:
        ...", :func:`~finecap.rewards.base.keyed_table`), as a caption would meet the one its call's spelling of the
        id finds first. An image keyed ``1`` by the references and ``"1"`` by the scenes is one image, as the two
        sides are read (:func:`~finecap.rewards.judged.caption_subjects`)."""
        self.references = keyed_table(references, "claims references", list)
        self.scenes = keyed_table(scenes, "claims scenes")

    def known_images(self) -> list[Hashable] | None:
        """The images with evidence: those of the references and of the scenes."""
        if self.references is None and self.scenes is None:
            return None
        known: dict[str, Hashable] = {}  # one entry an image, a side keying it as an int, its string or 1.0 (id_text)
        for image_id in [*(self.references or {}), *(self.scenes or {})]:
            known.setdefault(id_text(image_id), image_id)
        return list(known.values())

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if not isinstance(self.judge, Judge) or (self.references is None and self.scenes is None):
            raise RuntimeError("ClaimsReward: no judge or evidence; pass them or call setup(inputs) first")
        subjects = caption_subjects(captions, batch, self.scenes, self.references)
        scores = claim_scores(self.judge, list(captions), subjects)
        n = len(captions)
        precision, recall, harmonic = (torch.zeros(n) for _ in range(3))
        failed = torch.zeros(n, dtype=torch.bool)
        for i, s in enumerate(scores):
            if isinstance(s, JudgeFailed):
                failed[i] = True
            else:
                p = s.reward_precision  # 0 for a caption that claims nothing (module docstring)
                precision[i], recall[i], harmonic[i] = p, s.recall, f1(p, s.recall)
        parts = {"precision": precision, "recall": recall, "f1": harmonic}
        return judged_output(parts[self.score].clone(), parts, failed)


def build(cfg: Config) -> ClaimsReward:
    """Factory of the reward registry (``rl.rewards: {claims: w}``): the judge (``judge.*``, or the ``judge``
    setting) and the evidence (the references and scenes of the inputs) are read in ``setup(inputs)``."""
    return ClaimsReward(cfg=cfg)
