"""The model an OpenAI-compatible server says answered (a reply's ``"model"``), checked against the one asked for:
one rule for boost's ``openai`` backend and the ``openai`` judge (docs/boost.md#failures-fail,
docs/methods/judges.md).

A server names the model that gave each reply. A proxy that falls back to a cheaper model, or two models behind the
URLs of one role (``judge.urls``), answer under the name asked for; their answers would be cached and used as that
model's. So the first model a reply names is kept (:attr:`ServedModel.first`), with a warning when it is neither the
model asked for nor a version of it (``gpt-4o-2024-08-06`` of ``gpt-4o``: a server may name its dated snapshot), and a
later reply naming another model is a :class:`~finecap.boost.engine.FatalBackendError`: its answer is neither used
nor cached, and the run (or the judge) stops.
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
        """The model the first reply named; ``None`` before any reply."""
        self._lock = threading.Lock()

    def check(self, served: str) -> None:
        """Check the model ``served`` that a reply names (module docstring): the first is kept, with a warning when it
        is not :attr:`model` nor a version of it (:func:`is_version_of`); a later one naming another model is a
        :class:`~finecap.boost.engine.FatalBackendError`, and its reply's answer is not to be used."""
        with self._lock:
            first = self.first
            if first is None:
                self.first = served
        if first is None:
            if not is_version_of(served, self.model):
                log.warning("%s: the server answers as model %r, not %s=%r; its answers are cached and reported under "
                            "%s", self.who, served, self.option, self.model, self.option)  # fmt: skip
            return
        if served != first:
            raise FatalBackendError(
                f"a server answered as model {served!r} after answering as {first!r} ({self.option}={self.model!r}): "
                f"{self.advice}"
            )
