"""Judge-backed metric groups of ``finecap eval``: ``qa`` (QA utility), ``claims`` (claim precision, recall, F1) and
``clair`` (a CLAIR-style 0-100 judgement against the references, with the judge's reason), asking the judge of the
``judge`` section (``finecap eval --judge world``; docs/methods/judges.md).

Reported (corpus values are means over images; per-image values under the same keys):

- ``qa/accuracy``, ``qa/cannot_answer``, ``qa/wrong``: shares of the asks (questions x ``judge.shuffles``) answered
  right, "cannot answer", wrongly (:mod:`finecap.judges.qa`); ``qa/blind_dropped``: the share of questions dropped
  because a blind judge answers them (corpus only). Questions: the data set's own (its records' ``questions``),
  else ``judge.questions`` (a questions file), else made from the world's scene graphs: the order of the
  ``qa_utility`` reward (:func:`finecap.judges.questions.pick_questions`); the data set's and a file together are
  refused.
- ``claims/precision``, ``claims/recall``, ``claims/f1`` (:mod:`finecap.judges.claims`): evidence the references
  and, on the world, the scene graph.
- ``clair/score``: the judge's 0-100 score; per image also ``clair/reason``, the judge's words.
- ``<group>/judge_scored``: the images the means are over (a count); ``<group>/judge_failed``: images whose judge
  calls failed after the retries, left out of the means (a count). A mean over fewer images than were predicted says
  so in these two, beside it in the results file and the table, and in a warning. ``qa`` leaves out, besides, the
  images left with no question a blind judge misses (warned): it scores ``qa/judge_scored`` of the others.

Each image's row of ``--per-image`` also names the ``judge`` and its ``judge/prompt_version``; the evaluation's
``about["judge"]`` holds the whole of what judged (:func:`judge_record`), and, after scoring, what the judge did
(``counts``: :meth:`~finecap.judges.base.Judge.tallies`; ``group_counts``: each group's), which ``finecap eval``
writes under the key ``judge`` of its JSON.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from finecap.judges.base import JudgeFailed, Subject, tallies_grown
from finecap.metrics.faithfulness import scene_of
from finecap.metrics.group import Column, MetricGroup

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.judges.base import Judge
    from finecap.metrics.context import EvalContext

log = logging.getLogger(__name__)


def _judge(ctx: EvalContext) -> Judge:
    """The evaluation's judge (``judge.*`` of its configuration), made once for the groups that ask it; what it is
    goes to ``ctx.about["judge"]`` (:func:`judge_record`)."""
    if "judge" not in ctx.cache:
        from finecap.judges import get_judge

        ctx.cache["judge"] = ctx.own(get_judge(ctx.cfg.judge.name, ctx.cfg))
        ctx.about["judge"] = judge_record(ctx.cache["judge"], ctx.cfg)
    return ctx.cache["judge"]


def judge_record(judge: Judge, cfg: Config) -> dict[str, Any]:
    """What a results file says of the judge behind its judge-backed scores: the judge's identity (its name, prompt
    version and what else decides its answers: the model and ``judge.max_tokens``, the world judge's ``noise`` and
    ``seed``; :meth:`~finecap.judges.base.Judge.identity`) with the QA settings of every judge, ``shuffles`` and the
    option shuffles' ``seed`` (``judge.*``). Once the judge's server named the model that answered
    (:attr:`~finecap.judges.base.Judge.served_model`: ``gpt-4o-2024-08-06`` for ``judge.model=gpt-4o``), the record
    says it as ``served_model`` too (added after scoring; when every answer came from the cache, the model their rows
    record; absent when none names one). After each
    judge-backed group the record's ``counts`` holds the judge's :meth:`~finecap.judges.base.Judge.tallies` so far
    (calls, cache hits, unparsable answers, failed calls, HTTP 429 replies: of every group of the evaluation, the
    blind asks of ``qa`` included), and ``group_counts`` each group's own, ``{"qa": {...}, "claims": {...}}`` (a
    group's calls are those made while it ran: the groups run one after another), so that of two judged groups the
    one whose calls failed is told apart.

    Example::

        >>> from finecap.config import load
        >>> from finecap.judges.world import WorldJudge
        >>> judge_record(WorldJudge(noise=0.1, seed=3), load(None, ["judge.seed=3"]))
        {'judge': 'world', 'prompt_version': 'world-1', 'noise': 0.1, 'seed': 3, 'shuffles': 2}
    """
    return {**judge.identity(), "shuffles": cfg.judge.shuffles, "seed": cfg.judge.seed}


def _subjects(ctx: EvalContext, group: str, need_references: bool) -> list[Subject]:
    refs = ctx.references or {}
    if need_references and ctx.references is None and ctx.scenes is None:
        ctx.need("references", group, "pass the reference captions (or a world, whose scene graphs are evidence)")
    out = []
    for i in ctx.predictions:
        scene = scene_of(i, ctx.scenes) if ctx.scenes is not None else None
        out.append(Subject(i, tuple(refs.get(i, ())), scene))
    return out


def _record(ctx: EvalContext, group: str, scores: dict[Hashable, dict[str, Any]], keys: list[str]) -> dict[str, float]:
    """Per-image rows (with the judge's name and prompt version), the corpus means over the images that did not fail
    (NaN when none is left: never a made-up 0), the count of those the means are over and of those that failed; the
    judge's record gets its served model and its tallies so far."""
    judge = _judge(ctx)
    ok = {i: s for i, s in scores.items() if s is not None}
    ctx.add_items(ok, keys)
    if ctx.items is not None:
        for i, s in scores.items():
            row = ctx.items.setdefault(i, {})
            row.update({"judge": judge.name, "judge/prompt_version": judge.prompt_version})  # type: ignore[dict-item]
            if s is not None and isinstance(s.get("clair/reason"), str):
                row["clair/reason"] = s["clair/reason"]
    if judge.served_model is not None:  # the model that answered (judge_record): a reply's, or its cached answers'
        ctx.about["judge"]["served_model"] = judge.served_model
    counts = judge.tallies()
    before = ctx.cache.get("judge tallies", {})  # at the end of the groups before this one (each key's last value)
    ctx.about["judge"]["counts"] = counts  # of the whole evaluation so far: every group's calls
    # a judge of one's own may name a tally first in a later group: counted from 0 (Judge.tallies names every one)
    ctx.about["judge"].setdefault("group_counts", {})[group] = tallies_grown(before, counts)
    ctx.cache["judge tallies"] = {**before, **counts}  # a key this group's tallies lack keeps its last value
    n_failed = len(scores) - len(ok)
    if n_failed:
        log.warning("%s: the judge failed on %d of %d images; the means are over the other %d (%s/judge_scored)",
                    group, n_failed, len(scores), len(ok), group)  # fmt: skip
    corpus = {k: sum(s[k] for s in ok.values()) / len(ok) if ok else math.nan for k in keys}  # none: no value
    corpus[f"{group}/judge_scored"] = float(len(ok))
    corpus[f"{group}/judge_failed"] = float(n_failed)
    return corpus


def _qa(ctx: EvalContext) -> dict[str, float]:
    from finecap.judges.qa import drop_blind, qa_scores
    from finecap.judges.questions import pick_questions

    judge, j = _judge(ctx), ctx.cfg.judge
    scenes = None  # of the predicted images alone: questions are made for them only
    if ctx.scenes is not None:
        scenes = {i: s for i in ctx.predictions if (s := scene_of(i, ctx.scenes)) is not None}
    questions = pick_questions(ctx.questions, j.questions, scenes, "metric 'qa'")
    if questions is None:
        raise ValueError("metric 'qa' needs questions: the data set's own (a 'questions' field of its records), "
                         "judge.questions (a questions file) or a world's scenes")  # fmt: skip
    mine = {i: scene_of(i, questions) for i in ctx.predictions}
    missing = [i for i, qs in mine.items() if not qs]
    if missing:
        raise ValueError(f"metric 'qa': no questions for {len(missing)} image(s), e.g. {missing[:5]}")
    # unfiltered questions would pass as filtered: refused
    kept, blind = drop_blind(judge, mine, j.shuffles, j.seed, refuse="metric 'qa'")  # type: ignore[arg-type]
    ids = [i for i in ctx.predictions if kept[i]]
    if not ids:
        raise ValueError(f"metric 'qa': a blind judge answers every question of all {len(ctx.predictions)} images, "
                         "so no image keeps a question to score (judge.questions: questions that need the "
                         "image)")  # fmt: skip
    if len(ids) < len(ctx.predictions):
        log.warning("qa: %d image(s) keep no question a blind judge misses; they are not scored",
                    len(ctx.predictions) - len(ids))  # fmt: skip
    results = qa_scores(judge, [ctx.predictions[i] for i in ids], [kept[i] for i in ids], j.shuffles, j.seed)
    scores: dict[Hashable, Any] = {i: None for i in ids}
    for i, r in zip(ids, results):
        if not isinstance(r, JudgeFailed):
            scores[i] = {
                "qa/accuracy": r.accuracy,
                "qa/cannot_answer": r.cannot / r.asks,
                "qa/wrong": r.wrong / r.asks,
            }
    corpus = _record(ctx, "qa", scores, ["qa/accuracy", "qa/cannot_answer", "qa/wrong"])
    corpus["qa/blind_dropped"] = blind["share"]
    return corpus


def _claims(ctx: EvalContext) -> dict[str, float]:
    from finecap.judges.claims import claim_scores

    subjects = _subjects(ctx, "claims", need_references=True)
    results = claim_scores(_judge(ctx), list(ctx.predictions.values()), subjects)
    scores: dict[Hashable, Any] = {}
    for i, r in zip(ctx.predictions, results):
        ok = not isinstance(r, JudgeFailed)
        scores[i] = {"claims/precision": r.precision, "claims/recall": r.recall, "claims/f1": r.f1} if ok else None  # type: ignore[union-attr]
    return _record(ctx, "claims", scores, ["claims/precision", "claims/recall", "claims/f1"])


def _clair(ctx: EvalContext) -> dict[str, float]:
    subjects = _subjects(ctx, "clair", need_references=True)
    results = _judge(ctx).rate(list(zip(ctx.predictions.values(), subjects)))
    scores: dict[Hashable, Any] = {}
    for i, r in zip(ctx.predictions, results):
        scores[i] = None if isinstance(r, JudgeFailed) else {"clair/score": r[0], "clair/reason": r[1]}
    return _record(ctx, "clair", scores, ["clair/score"])


FAILED = Column("*/judge_failed", "lower", count=True)
SCORED = Column("*/judge_scored", None, count=True)
QA = MetricGroup("qa", _qa,  # reads the data's questions, judge.questions or a world's scenes: checked when it runs
                 columns=(FAILED, SCORED, Column("qa/wrong", "lower"), Column("qa/cannot_answer", None),
                          Column("qa/blind_dropped", None), Column("qa/accuracy", "higher")))  # fmt: skip
"""QA utility through the judge (its questions the data set's, judge.questions or the world's scene graphs): right
answers are better, wrong ones worse; "cannot answer" and the share of blind-answerable questions have no better
direction."""
CLAIMS = MetricGroup("claims", _claims, reads=frozenset({"references"}),
                     columns=(FAILED, SCORED, Column("claims/*", "higher")))  # fmt: skip
"""Claim precision, recall and F1 through the judge (higher is better)."""
CLAIR = MetricGroup(
    "clair", _clair, reads=frozenset({"references"}), columns=(FAILED, SCORED, Column("clair/score", "higher"))
)
"""The judge's 0-100 reference judgement (higher is better)."""
