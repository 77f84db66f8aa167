"""The ``vllm`` judge: a text LLM served by a ``vllm.LLM`` in this process (``judge.name=vllm``), the in-process
counterpart of the ``openai`` judge against a vLLM server.

Everything but the transport is the ``openai`` judge's (:class:`~finecap.judges.openai.OpenAIJudge`): the versioned
prompts, the strict parsing, the answer cache and the counters; but an unparsable answer is counted failed at once,
never asked again (``judge.retries`` is the ``openai`` judge's): one engine decoding greedily, one prompt a call,
gives the same text to the same prompt (tests/engines/test_vllm_judge_engine.py), where a re-ask of a server may be
answered otherwise.
The transport is boost's in-process vLLM chat backend (:class:`finecap.boost.vllm_backend.VllmBackend`, LLM role):
``judge.model`` is a transformers folder or a Hub name, its chat template renders the messages, decoding is greedy
(temperature 0) up to ``judge.max_tokens`` tokens, the engine takes the ``vllm`` section's memory and parallelism
settings. Calls go one at a time (``judge.concurrency`` is not used: one engine in one process answers one
``generate`` call at a time); a prompt vLLM refuses (longer than ``vllm.max_model_len``) fails its call, as an HTTP
400 does with the ``openai`` judge. An engine that raises instead of answering (out of memory, its engine core dead,
shut down) fails the call too, and ``judge.max_consecutive_failures`` such calls in a row (no call answered meanwhile)
make the judge unavailable (:class:`~finecap.judges.base.JudgeUnavailable`, naming the last error), the ``openai``
judge's rule for servers that answer nothing (docs/methods/judges.md#judge-failures-are-counted-never-paid). Nothing
is imported from vLLM until the judge is built.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from finecap.boost.engine import BackendError, EngineFailing, engine_failing, model_stamp
from finecap.judges.base import Judge, refuse_unread
from finecap.judges.cache import AnswerCache
from finecap.judges.openai import OpenAIJudge, holding_cache, judge_settings, load_prompts

if TYPE_CHECKING:
    from finecap.config import Config, VllmConfig


class _InProcess:
    """``complete(request) -> text`` over an in-process chat backend (what :class:`OpenAIJudge` asks of a client)."""

    rate_limited = 0  # no server, no HTTP 429 (Judge.backends)

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def complete(self, request: Any) -> str:
        """The engine's answer to ``request``; a prompt it refuses is that request's :class:`BackendError` (as an
        HTTP 400), an engine that raises (out of memory, its engine core dead, shut down) or returns another error
        gave no answer: :class:`~finecap.boost.engine.EngineFailing`, which the judge counts towards
        ``judge.max_consecutive_failures`` (module docstring)."""
        try:
            (answer,) = self.backend.generate([SimpleNamespace(messages=request.messages)])
        except EngineFailing:  # boost's VllmBackend's own: its engine raised instead of answering
            raise
        except Exception as e:  # not BaseException: a Ctrl-C stops the run, never a call
            raise engine_failing(e) from e
        if isinstance(answer, BackendError):
            raise answer
        if isinstance(answer, BaseException):
            raise engine_failing(answer) from answer
        return answer

    def close(self) -> None:
        """Free the engine."""
        self.backend.close()


class VllmJudge(OpenAIJudge):
    """The ``openai`` judge's prompts, parsing and cache over a ``vllm.LLM`` in this process (module docstring);
    ``backend``: an in-process chat backend answering ``generate(tasks)`` (a test's stand-in), else one is built.
    An option only another judge reads (``retries=``, the ``openai`` judge's ``judge.retries``) is a ``TypeError``
    saying so (:func:`~finecap.judges.base.refuse_unread`), before the engine starts."""

    name = "vllm"

    def __init__(self, model: str, *, section: VllmConfig | None = None, max_tokens: int = 512,
                 max_consecutive_failures: int = 10, cache: AnswerCache | None = None, prompts: Any = None,
                 seed: int = 0, backend: Any = None, **unread: Any) -> None:  # fmt: skip
        refuse_unread(VllmJudge, unread)
        Judge.__init__(self)
        if not model:
            raise ValueError("judge.model: the vllm judge needs a transformers folder or a Hub name of a chat LLM")
        loaded = load_prompts(prompts)  # a bad prompts file refused before the engine starts (minutes, a GPU's memory)
        built = None  # the engine this judge started, shut down if the judge then fails to start
        if backend is None:
            from finecap.boost.vllm_backend import VllmBackend

            # refuse_cut_off=False: an answer is parsed, not kept; a verdict given before judge.max_tokens counts
            backend = built = VllmBackend(model, section=section, batch_size=1, max_new_tokens=max_tokens,
                                          temperature=0.0, seed=seed, key="judge", option="judge.name=vllm",
                                          refuse_cut_off=False)  # fmt: skip
        try:
            self.stamp = model_stamp(model)  # after loading: a folder saved again in place, a Hub commit, asked again
            # retries=0: an unparsable answer is not asked again, the engine would give it again (module docstring)
            self._start(model, [_InProcess(backend)], prompts=loaded, cache=cache, retries=0, concurrency=1,
                        max_tokens=max_tokens, max_consecutive_failures=max_consecutive_failures)  # fmt: skip
        except BaseException:
            if built is not None:
                built.close()
            raise

    def answerers(self) -> str:
        return "its in-process engine"

    def identity(self) -> dict[str, Any]:
        """The ``openai`` judge's, with what identifies the model's files as boost's vLLM backend keys its cache
        (:func:`~finecap.boost.engine.model_stamp`): a local folder's files' names, sizes and times, a Hub name's
        cached commit; answers of earlier weights saved under the same folder, or of another commit, are not reused."""
        return {**super().identity(), **self.stamp}


def build(cfg: Config | None = None, **options: Any) -> VllmJudge:
    """Factory of the judge registry: the ``judge`` and ``vllm`` sections of ``cfg`` (``options`` override the judge
    keys, and may give ``backend``, ``prompts`` or ``cache_path``). A ``seed=`` there is ``judge.seed``, which the
    judge's callers read, refused as :func:`~finecap.judges.base.refuse_unread` says (the engine's seed is
    ``run.seed``)."""
    if "seed" in options:  # not VllmJudge's seed= (the engine's, run.seed): refused before anything is opened
        refuse_unread(VllmJudge, {"seed": options["seed"]})
    settings, cache = judge_settings(cfg, options, ("model", "max_tokens", "max_consecutive_failures"))
    section = cfg.vllm if cfg is not None else None
    seed = cfg.run.seed if cfg is not None else 0
    return holding_cache(
        cache, lambda: VllmJudge(settings.pop("model"), section=section, cache=cache, seed=seed, **settings, **options)
    )
