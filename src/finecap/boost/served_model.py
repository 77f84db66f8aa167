"""The model an OpenAI-compatible server says answered (a reply's ``"model"``), checked against the one asked for:
one rule for boost's ``openai`` backend and the ``openai`` judge (docs/boost.md#failures-fail,
docs/methods/judges.md).

A server names the model that gave each reply. A proxy that falls back to a cheaper model, or two models behind the
URLs of one role (``judge.urls``), answer under the name asked for; their answers would be cached and used as that
model's. So the first model a reply names is kept (:attr:`ServedModel.first`), with a warning when it is neither the
model asked for nor a version of it (``gpt-4o-2024-08-06`` of ``gpt-4o``: a server may name its dated snapshot), and a
later reply naming another model is a :class:`~finecap.boost.engine.FatalBackendError`: its answer is neither used
nor cached, and the run (or the judge) stops. A run that resumes answers an earlier run kept (boost's
``cache.jsonl``) first takes the model they record as the first one named (:meth:`ServedModel.expect`), so that the
same rule holds across the two runs (docs/boost.md#failures-fail).
"""

from __future__ import annotations

import logging
import threading

from finecap.boost.engine import FatalBackendError

log = logging.getLogger(__name__)


def is_version_of(served: str, model: str) -> bool:
    """Whether the model name ``served`` is ``model`` or a version of it (``model`` then ``-`` and more).

    Example::

        >>> is_version_of("gpt-4o-2024-08-06", "gpt-4o"), is_version_of("gpt-4o", "gpt-4o")
        (True, True)
        >>> is_version_of("gpt-4o-mini", "gpt-4"), is_version_of("gpt-4o-mini", "gpt-4o-2024-08-06")
        (False, False)
    """
    return served == model or served.startswith(f"{model}-")


def clash_advice(why: str, cached: list[str], afresh: str) -> str:
    """What the error of a clash between the model a server answers as and the models of the cached answers tells the
    user to do, true of what the answer cache holds (``cached``: its models, as far as the run knows,
    :attr:`ServedModel.cached`): ``why`` mixing would be wrong, then, when it holds one model's answers, to serve that
    model again or ``afresh`` (how to start without the cache); when it holds several models' answers (a run that
    cached its server's answers, then met another model's), serving any one of them stops at the others', so
    ``afresh`` alone. One wording for boost's cache and the judges' (docs/boost.md#failures-fail).

    Example::

        >>> clash_advice("mixed", ["m-1"], "boost into another folder")
        "mixed; serve 'm-1' again to continue, or boost into another folder"
        >>> clash_advice("mixed", ["m-2", "m-1"], "start afresh")
        "mixed; the cache now holds answers of 'm-2' and 'm-1': serving one stops at another's, so start afresh"
    """
    if len(cached) <= 1:
        return f"{why}; serve {cached[0]!r} again to continue, or {afresh}" if cached else f"{why}; {afresh}"
    models = ", ".join(map(repr, cached[:-1])) + f" and {cached[-1]!r}"
    return f"{why}; the cache now holds answers of {models}: serving one stops at another's, so {afresh}"


class ServedModel:
    """The check of the models one role's replies name (module docstring), shared by every backend of the role (the
    judge's servers): thread-safe, as the replies of concurrent requests arrive.

    ``model``: the name asked for; ``option``: the option that names it (``boost.llm_model``, ``judge.model``);
    ``who``: how the warning names the role (``boost.llm``, ``judge openai``); ``advice``: what the error of two models
    named within a run (no cached answer checked: :meth:`expect`, whose error says :func:`clash_advice`) tells the
    user to do about it (where the answers of either model may be cached).

    Example::

        >>> served = ServedModel("gpt-4o", "judge.model", who="judge openai", advice="serve one model")
        >>> served.check("gpt-4o-2024-08-06")  # the first reply: kept (a version of gpt-4o: no warning)
        >>> served.first
        'gpt-4o-2024-08-06'
        >>> try:
        ...     served.check("gpt-4o-mini")
        ... except FatalBackendError as e:
        ...     error = str(e)
        >>> error.split(": ")[0]  # then the advice
        "a server answered as model 'gpt-4o-mini' after answering as 'gpt-4o-2024-08-06' (judge.model='gpt-4o')"
    """

    def __init__(self, model: str, option: str, *, who: str, advice: str) -> None:
        self.model, self.option, self.who, self.advice = model, option, who, advice
        self.first: str | None = None
        """The model the first reply named, or the one the earlier answers :meth:`expect` was told of came from (a
        reply then must name it); ``None`` before either."""
        self.named: str | None = None
        """The model this run's replies named (every reply that names one names it); ``None`` before one did."""
        self.cached: list[str] = []
        """The models whose answers the answer cache holds, as far as this run knows, in the order it learnt of them:
        those the cached answers :meth:`expect` was told of record, and this run's own kept (:meth:`kept`)."""
        self._recorded: tuple[str, str, str] | None = None  # (where, why, afresh) when first came from expect
        self._lock = threading.Lock()

    def check(self, served: str) -> None:
        """Check the model ``served`` that a reply names (module docstring): the first is kept, with a warning when it
        is not :attr:`model` nor a version of it (:func:`is_version_of`); a later one naming another model than
        :attr:`first` (or than the earlier answers of :meth:`expect`) is a
        :class:`~finecap.boost.engine.FatalBackendError`, and its reply's answer is not to be used."""
        with self._lock:
            first, recorded, cached = self.first, self._recorded, list(self.cached)
            if first is None:
                self.first = served
            if first is None or served == first:
                self.named = self.named or served
        if first is None:
            if not is_version_of(served, self.model):
                log.warning("%s: the server answers as model %r, not %s=%r; its answers are cached and reported under "
                            "%s", self.who, served, self.option, self.model, self.option)  # fmt: skip
            return
        if served == first:
            return
        if recorded is None:
            raise FatalBackendError(
                f"a server answered as model {served!r} after answering as {first!r} ({self.option}={self.model!r}): "
                f"{self.advice}"
            )
        where, why, afresh = recorded
        raise FatalBackendError(f"a server answered as model {served!r}, but {where} came from model {first!r} "
                                f"({self.option}={self.model!r}): {clash_advice(why, cached, afresh)}")  # fmt: skip

    def kept(self, model: str | None) -> None:
        """Note that an answer this run's replies gave as ``model`` (:attr:`named`) was kept in the answer cache, whose
        models :attr:`cached` lists (a clash's advice says what the cache holds: :func:`clash_advice`); ``None`` (no
        model named) notes nothing."""
        with self._lock:
            if model is not None and model not in self.cached:
                self.cached.append(model)

    def expect(self, model: str, *, where: str, why: str, afresh: str) -> None:
        """Before this run uses answers an earlier run kept (``where``: which, as messages name them), check the model
        ``model`` they record (its replies named) by the rule of :meth:`check`: taken as :attr:`first` when no reply
        named one yet (with the same warning when it is not :attr:`model` nor a version of it), so that a reply
        naming another model stops the run, the error naming both models and ending with :func:`clash_advice`'s
        advice (``why`` a run would mix two models' answers, and ``afresh``: how to start again without the cache); a
        :class:`~finecap.boost.engine.FatalBackendError` at once when :attr:`first` is another model already. The
        model is one of :attr:`cached` from then on.

        Example::

            >>> served = ServedModel("gpt-4o", "boost.llm_model", who="boost.llm", advice="serve one model")
            >>> served.expect("gpt-4o-2024-08-06", where="3 answers kept", why="two models", afresh="start afresh")
            >>> served.check("gpt-4o-2024-08-06")  # the resumed run's first reply: the same model
            >>> try:
            ...     served.check("gpt-4o-mini")
            ... except FatalBackendError as e:
            ...     error = str(e)
            >>> error.split(" (")[0]  # then the option and the advice
            "a server answered as model 'gpt-4o-mini', but 3 answers kept came from model 'gpt-4o-2024-08-06'"
            >>> error.split(": ")[1]  # the cache holds the recorded model's answers alone: serving it again continues
            "two models; serve 'gpt-4o-2024-08-06' again to continue, or start afresh"
        """
        with self._lock:
            first, recorded = self.first, self._recorded
            if first is None:
                self.first, self._recorded = model, (where, why, afresh)
            if model not in self.cached:
                self.cached.append(model)
            cached = list(self.cached)
        if first is None:
            if not is_version_of(model, self.model):
                log.warning("%s: %s came from model %r, not %s=%r; they are used and reported under %s", self.who,
                            where, model, self.option, self.model, self.option)  # fmt: skip
            return
        if model != first:
            said = f"{recorded[0]} came from model {first!r}" if recorded else f"a server answered as {first!r}"
            raise FatalBackendError(f"{where} came from model {model!r}, but {said} ({self.option}={self.model!r}): "
                                    f"{clash_advice(why, cached, afresh)}")  # fmt: skip
