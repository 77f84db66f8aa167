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


class ServedModel:
    """The check of the models one role's replies name (module docstring), shared by every backend of the role (the
    judge's servers): thread-safe, as the replies of concurrent requests arrive.

    ``model``: the name asked for; ``option``: the option that names it (``boost.llm_model``, ``judge.model``);
    ``who``: how the warning names the role (``boost.llm``, ``judge openai``); ``advice``: what the error tells the
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
        self._recorded: tuple[str, str] | None = None  # (where, advice) when first came from expect
        self._lock = threading.Lock()

    def check(self, served: str) -> None:
        """Check the model ``served`` that a reply names (module docstring): the first is kept, with a warning when it
        is not :attr:`model` nor a version of it (:func:`is_version_of`); a later one naming another model than
        :attr:`first` (or than the earlier answers of :meth:`expect`) is a
        :class:`~finecap.boost.engine.FatalBackendError`, and its reply's answer is not to be used."""
        with self._lock:
            first, recorded = self.first, self._recorded
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
        where, advice = recorded
        raise FatalBackendError(f"a server answered as model {served!r}, but {where} came from model {first!r} "
                                f"({self.option}={self.model!r}): {advice}")  # fmt: skip

    def expect(self, model: str, *, where: str, advice: str) -> None:
        """Before this run uses answers an earlier run kept (``where``: which, as messages name them), check the model
        ``model`` they record (its replies named) by the rule of :meth:`check`: taken as :attr:`first` when no reply
        named one yet (with the same warning when it is not :attr:`model` nor a version of it), so that a reply
        naming another model stops the run, the error naming both models and ending with ``advice``; a
        :class:`~finecap.boost.engine.FatalBackendError` at once when :attr:`first` is another model already.

        Example::

            >>> served = ServedModel("gpt-4o", "boost.llm_model", who="boost.llm", advice="serve one model")
            >>> served.expect("gpt-4o-2024-08-06", where="3 answers kept", advice="serve it again")
            >>> served.check("gpt-4o-2024-08-06")  # the resumed run's first reply: the same model
            >>> try:
            ...     served.check("gpt-4o-mini")
            ... except FatalBackendError as e:
            ...     error = str(e)
            >>> error.split(" (")[0]  # then the option and the advice
            "a server answered as model 'gpt-4o-mini', but 3 answers kept came from model 'gpt-4o-2024-08-06'"
        """
        with self._lock:
            first, recorded = self.first, self._recorded
            if first is None:
                self.first, self._recorded = model, (where, advice)
        if first is None:
            if not is_version_of(model, self.model):
                log.warning("%s: %s came from model %r, not %s=%r; they are used and reported under %s", self.who,
                            where, model, self.option, self.model, self.option)  # fmt: skip
            return
        if model != first:
            said = f"{recorded[0]} came from model {first!r}" if recorded else f"a server answered as {first!r}"
            raise FatalBackendError(f"{where} came from model {model!r}, but {said} ({self.option}={self.model!r}): "
                                    f"{advice}")  # fmt: skip
