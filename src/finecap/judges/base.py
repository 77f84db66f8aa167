"""The judge contract: what the judge-backed rewards and metrics ask a judge, and what they get back.

A judge answers four kinds of calls, each batched (a list in, a list out in the same order) so that a judge behind
a server can send them concurrently:

- :meth:`Judge.answer` ``(asks) -> [option | JudgeFailed]``: a multiple-choice question (:class:`Ask`: the question,
  its options as presented, :data:`CANNOT_ANSWER` last, and the caption it must be answered from, or ``None`` for a
  blind ask) -> the option's text chosen;
- :meth:`Judge.claims` ``(texts) -> [[claim] | JudgeFailed]``: the atomic claims a text makes;
- :meth:`Judge.supports` ``(checks) -> [[bool] | JudgeFailed]``: for ``(claims, evidence)`` pairs, whether the
  evidence (a :class:`Subject`: reference texts, and on the world the scene graph) supports each claim;
- :meth:`Judge.reference_claims` ``(subjects) -> [[claim] | JudgeFailed]``: the claims a complete description of the
  subject makes (the references' claims; on the world the scene's facts), against which recall is counted;
- :meth:`Judge.rate` ``(pairs) -> [(score, reason) | JudgeFailed]``: a CLAIR-style 0-100 judgement of a caption
  against its subject's references, with the judge's reason.

A call that fails (no answer after the judge's retries, an answer that does not parse) comes back as a
:class:`JudgeFailed` in its place, never as a made-up value: the caller counts it and leaves the caption out. A judge
that cannot answer at all (its server down or failing call after call, its engine failing every call, a refused key)
raises
:class:`JudgeUnavailable`.
:attr:`Judge.counts` counts calls, cache hits and failures; :meth:`Judge.tallies` reports them with the HTTP 429
replies of the judge's servers, one fixed set of keys (:data:`TALLIES`), what ``finecap eval``'s results file and a
training run's log say of the judge's work. The design: docs/methods/judges.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from finecap.world.scene import Scene

CANNOT_ANSWER = "cannot answer from the caption"
"""The option every question is presented with, last: the caption does not say (CapRL's "cannot answer")."""

T = TypeVar("T")

TALLIES = ("calls", "cache_hits", "unparsable", "failed", "rate_limited")
"""What :meth:`Judge.tallies` reports, always every key: the calls asked of the judge (one per question ask, claims
split, support check, reference claims, rating), those answered from the answer cache, the answers that did not parse
(the ``openai`` judge asks again while they differ), the calls that failed (a :class:`JudgeFailed` in their place)
and the HTTP 429 (rate limit) replies of its servers."""


def tallies_grown(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """How much each of the tallies ``after`` (:meth:`Judge.tallies`, :meth:`finecap.rewards.base.RewardBase.tallies`)
    grew since ``before``, a key new since then counted from 0 (a judge of one's own may name a tally first later):
    a training step's (:meth:`finecap.objectives.reinforce.Reinforce.end_step`), a judged metric group's
    (``finecap eval``'s ``group_counts``) and an adapter's call's
    (:meth:`finecap.integrations.scoring.Scorer.counted`).

    >>> tallies_grown({"judge/calls": 4.0, "judge/failed": 1.0}, {"judge/calls": 10.0, "judge/failed": 1.0})
    {'judge/calls': 6.0, 'judge/failed': 0.0}
    >>> tallies_grown({"calls": 3}, {"calls": 5, "rated": 2})
    {'calls': 2, 'rated': 2}
    """
    return {k: v - before.get(k, 0) for k, v in after.items()}


class JudgeFailed(Exception):
    """A judge call that gave no usable answer after its retries (the message says why); returned in the call's place
    by the batched methods, raised by nothing."""


class JudgeUnavailable(ValueError):
    """The judge cannot answer any call: its servers refuse the key, the model or the URL, or
    ``judge.max_consecutive_failures`` calls in a row got no answer from any of them (unreachable, or failing with
    HTTP 429/5xx after the retries) or from its in-process engine (raising: out of memory, its engine core dead; the
    rule's one home: :class:`~finecap.judges.openai.OpenAIJudge`, whose ``vllm`` judge is a subclass). Raised, never
    returned: the rewards and
    metrics stop with this message (a one-line error of the command) rather than score every caption as failed."""


@dataclass(frozen=True)
class Question:
    """A multiple-choice question about an image: ``options`` (without :data:`CANNOT_ANSWER`), the right one
    ``answer`` (one of ``options``), a stable ``id`` (the cache key's), and on the world the ``fact`` it asks about,
    ``(kind, shape)`` of :class:`finecap.world.facts.Fact` (``shape`` None for ``background`` and ``count``)."""

    id: str
    text: str
    options: tuple[str, ...]
    answer: str
    fact: tuple[str, str | None] | None = None

    def __post_init__(self) -> None:
        if self.answer not in self.options:
            raise ValueError(f"question {self.id!r}: the answer {self.answer!r} is not one of {self.options}")
        if len(set(self.options)) != len(self.options) or CANNOT_ANSWER in self.options:
            raise ValueError(f"question {self.id!r}: options must be distinct and not {CANNOT_ANSWER!r}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "question": self.text, "options": list(self.options),
                               "answer": self.answer}  # fmt: skip
        if self.fact is not None:
            out["fact"] = list(self.fact)
        return out


@dataclass(frozen=True)
class Ask:
    """One question as presented to the judge: ``options`` in the order shown (shuffled, :data:`CANNOT_ANSWER` last)
    and the ``caption`` to answer from (``None``: blind, no caption at all)."""

    question: Question
    options: tuple[str, ...]
    caption: str | None


@dataclass(frozen=True)
class Subject:
    """What a caption describes, as evidence: the image's ``references`` and, on the world, its ``scene``."""

    image_id: Hashable
    references: tuple[str, ...] = ()
    scene: Scene | None = None


class Judge(ABC):
    """A judge (module docstring). ``name`` and ``prompt_version`` go into every output and every cache key."""

    name: str = "judge"
    prompt_version: str = "0"
    served_model: str | None = None
    """The model a served judge's replies named (:class:`finecap.boost.served_model.ServedModel`), once one came, or
    the one the cached answers it used record; ``None`` for a judge of no server, or before either: what a results
    file adds to the judge's record (:func:`finecap.metrics.judged.judge_record`)."""

    backends: Sequence[Any] = ()
    """The clients of the servers a judge over servers asks in turn (:class:`~finecap.judges.openai.OpenAIJudge`'s),
    each counting the HTTP 429 replies it got as ``rate_limited``; none for a judge of no server."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def tallies(self) -> dict[str, int]:
        """What the judge did since it was built, by the names of :data:`TALLIES` (every one, 0 when none): its
        :attr:`counts` of calls, cache hits, unparsable answers and failed calls, and ``rate_limited``, the HTTP 429
        replies of its servers (:attr:`backends`). ``finecap eval`` writes them in its results file
        (:func:`finecap.metrics.judged.judge_record`), a training run logs each step's
        (:meth:`finecap.rewards.base.RewardBase.tallies`).

        Example::

            >>> from finecap.judges.world import WorldJudge
            >>> judge = WorldJudge()
            >>> judge.counts.update(calls=3, failed=1)
            >>> judge.tallies()
            {'calls': 3, 'cache_hits': 0, 'unparsable': 0, 'failed': 1, 'rate_limited': 0}
        """
        out = {key: int(self.counts[key]) for key in TALLIES if key != "rate_limited"}
        out["rate_limited"] = sum(int(backend.rate_limited) for backend in self.backends)
        return out

    def identity(self) -> dict[str, Any]:
        """What makes two judges' answers interchangeable (the cache key's judge part)."""
        return {"judge": self.name, "prompt_version": self.prompt_version}

    @abstractmethod
    def answer(self, asks: Sequence[Ask]) -> list[str | JudgeFailed]: ...

    @abstractmethod
    def claims(self, texts: Sequence[str]) -> list[list[str] | JudgeFailed]: ...

    @abstractmethod
    def supports(self, checks: Sequence[tuple[Sequence[str], Subject]]) -> list[list[bool] | JudgeFailed]: ...

    @abstractmethod
    def reference_claims(self, subjects: Sequence[Subject]) -> list[list[str] | JudgeFailed]: ...

    @abstractmethod
    def rate(self, pairs: Sequence[tuple[str, Subject]]) -> list[tuple[float, str] | JudgeFailed]: ...

    def make_questions(self, subjects: Sequence[Subject], n: int) -> list[list[Question] | JudgeFailed]:
        """Up to ``n`` multiple-choice questions per image written from its references (CapRL's question
        generation; ``finecap questions make`` on data without scene graphs). A judge that writes none says so."""
        raise NotImplementedError(f"the {self.name} judge does not write questions from references; use judge.name="
                                  "openai or vllm (an LLM), or a world's scene graphs")  # fmt: skip

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections (a judge behind a server)."""


def refuse_unread(judge: type[Judge], options: Mapping[str, Any]) -> None:
    """A ``TypeError`` for ``options`` given to the constructor of ``judge`` (a judge class; its factory passes on
    what it does not read) that it does not take: one of another judge's options
    (:data:`~finecap.config.sections.judge.JUDGE_READS`: ``retries=`` to the ``world`` or ``vllm`` judge, ``noise=``
    to the ``openai`` judge) says whose it is, as the configuration does (``judge.retries`` with ``judge.name=world``
    changes nothing), with the option's doc; one the judge's callers read (``seed=``, ``shuffles=``, ``questions=``,
    ``name=``: in no judge's :data:`~finecap.config.sections.judge.JUDGE_READS`, so the configuration never warns of
    it) says that the callers read it from the configuration, not this judge, which would otherwise take and ignore
    it (``seed=`` to the ``openai`` judge: its decoding is greedy, the option shuffles are the callers'); any other is
    Python's unexpected keyword. Nothing when ``options`` is empty. The one home of the rule, which every built-in
    judge's constructor applies (docs/methods/judges.md#the-judge-section).

    Example::

        >>> from finecap.judges.openai import OpenAIJudge
        >>> refuse_unread(OpenAIJudge, {"noise": 0.1})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: OpenAIJudge: noise= is judge.noise, read with judge.name=world, not by the openai judge. ...
        >>> refuse_unread(OpenAIJudge, {"seed": 1})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: OpenAIJudge: seed= is judge.seed, which the judge's callers read from the configuration ...
    """
    import dataclasses

    from finecap.config.sections.judge import JUDGE_READS, JudgeConfig

    docs = {f.name: f.metadata["doc"] for f in dataclasses.fields(JudgeConfig)}
    who = judge.__qualname__
    for key in options:
        if key in docs and key not in JUDGE_READS:  # the callers' key: given here, it would change nothing
            raise TypeError(f"{who}: {key}= is judge.{key}, which the judge's callers read from the configuration "
                            f"(its judge section), not an option of the {judge.name} judge. "
                            f"judge.{key}: {docs[key]}")  # fmt: skip
        readers = JUDGE_READS.get(key, (judge.name,))
        if judge.name not in readers:
            raise TypeError(f"{who}: {key}= is judge.{key}, read with judge.name={' or '.join(readers)}, not by the "
                            f"{judge.name} judge. judge.{key}: {docs[key]}")  # fmt: skip
    if options:
        raise TypeError(f"{who}.__init__() got an unexpected keyword argument {next(iter(options))!r}")


def failed(value: object) -> bool:
    """Whether a batched call's result is a failure."""
    return isinstance(value, JudgeFailed)
