"""A stand-in ``vllm.LLM`` for the tests of the engines finecap builds on vLLM without vLLM
(tests/engines/test_engine_environment.py, tests/engines/test_engine_shutdown.py, the ``vllm`` judge's): it records
the environment it started in and its shutdowns, and :func:`stand_in_vllm` puts it where
:func:`finecap.engines.vllm.start_llm` builds a ``vllm.LLM``."""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace

import torch
import torch.distributed as dist

NAMES = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_HOST_IP", "RANK", "LOCAL_RANK")
"""The environment variables an engine may start with (:func:`finecap.engines.vllm.engine_environment`)."""


PROCESS_STATE = ("model parallel groups", "world", "envs cache")
"""vLLM's process-wide state, which every in-process engine runs on: its model-parallel groups, its world group (with
the default process group) and its cache of the ``VLLM_*`` variables read at the start."""


class StandInLLM:
    """A ``vllm.LLM`` that records the environment it started in (``started``, one entry per engine built), each
    engine built (``built``) and how many times its engine core was shut down (``shutdowns``). A model named
    ``"fails"`` fails to start. It makes vLLM's process-wide state (``process``: each of :data:`PROCESS_STATE`, true
    while it stands), or finds it made, when it starts, and its shutdown tears it down as vLLM 0.32's in-process engine
    core's does (``cleanup_dist_env_and_memory``: the variables' cache, the model-parallel groups, then the world and
    the default process group), each teardown looked up by name in the modules :func:`stand_in_vllm` puts at
    ``vllm.envs`` and ``vllm.distributed.parallel_state``; nothing of the environment."""

    started: list[dict[str, str | None]] = []
    built: list[StandInLLM] = []
    destroyed: list[object] = []  # the groups torch.distributed.destroy_process_group was called with
    process: dict[str, bool] = {}

    def __init__(self, **kwargs) -> None:
        if kwargs.get("model") == "fails":
            raise RuntimeError("the engine failed to start")
        type(self).started.append({name: os.environ.get(name) for name in NAMES})
        type(self).built.append(self)
        type(self).process.update(dict.fromkeys(PROCESS_STATE, True))
        backend = kwargs.get("distributed_executor_backend")
        self.shutdowns = 0
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend=backend)),
            engine_core=SimpleNamespace(shutdown=self.shutdown), reset_encoder_cache=lambda: None,
        )  # fmt: skip

    def shutdown(self) -> None:
        self.shutdowns += 1
        # looked up now, as vLLM's cleanup does: finecap's process_state_kept may have replaced them
        sys.modules["vllm.envs"].disable_envs_cache()
        state = sys.modules["vllm.distributed.parallel_state"]
        state.destroy_model_parallel()
        state.destroy_distributed_environment()

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        list(kwargs["weights_iterator"])

    def reset_prefix_cache(self) -> None:
        return


def _torn_down(part: str) -> None:
    StandInLLM.process[part] = False


def _destroy_distributed_environment() -> None:
    _torn_down("world")
    dist.destroy_process_group()  # looked up now: finecap's training_group_kept may have replaced it


def process_state_modules() -> dict[str, ModuleType]:
    """The stand-ins of vLLM's modules whose teardowns an engine core's shutdown calls (:class:`StandInLLM`)."""
    envs, state = ModuleType("vllm.envs"), ModuleType("vllm.distributed.parallel_state")
    envs.disable_envs_cache = lambda: _torn_down("envs cache")
    state.destroy_model_parallel = lambda: _torn_down("model parallel groups")
    state.destroy_distributed_environment = _destroy_distributed_environment
    return {envs.__name__: envs, state.__name__: state}


@contextlib.contextmanager
def stand_in_vllm(monkeypatch) -> Iterator[SimpleNamespace]:
    """Within the block vLLM is stood in for (:class:`StandInLLM`, its records emptied), the process's environment
    lacks the engine's variables (a test sets those it needs; they are put back as they were when the block ends,
    whatever the engine left), vLLM's modules of process-wide teardowns are stand-ins too
    (:func:`process_state_modules`, in ``sys.modules`` until the block ends), no engine of an earlier test counts as
    alive (:data:`finecap.engines.vllm.LIVE`), ``torch.distributed.destroy_process_group`` records its calls in
    ``StandInLLM.destroyed`` (what a training's group would lose) instead of destroying anything, and
    :meth:`VllmEngine.from_captioner` and boost's :class:`VllmBackend` skip vLLM's own checks and the model's
    files. Yields a captioner :meth:`VllmEngine.from_captioner` takes."""
    from finecap.boost import vllm_backend
    from finecap.boost.vllm_backend import VllmBackend
    from finecap.engines import vllm as engines_vllm

    saved = {name: os.environ.pop(name, None) for name in NAMES}
    StandInLLM.started, StandInLLM.built, StandInLLM.destroyed, StandInLLM.process = [], [], [], {}
    for name, module in process_state_modules().items():  # removed again when the test ends
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(engines_vllm, "LIVE", weakref.WeakSet())  # no engine of an earlier test lives on
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: StandInLLM.destroyed.append(group))
    monkeypatch.setattr(engines_vllm, "import_vllm", lambda option="": SimpleNamespace(LLM=StandInLLM))
    monkeypatch.setattr(engines_vllm, "unservable_reason", lambda captioner: None)
    monkeypatch.setattr(engines_vllm, "registry_refusal", lambda captioner, vllm: None)
    monkeypatch.setattr(engines_vllm, "save_engine_folder", lambda captioner, folder, dtype: folder)
    monkeypatch.setattr(engines_vllm, "served_prompt", lambda captioner: "prompt")
    monkeypatch.setattr(engines_vllm, "streamed_weights",
                        lambda policy: contextlib.nullcontext(iter([("lm_head.weight", torch.zeros(1))])))  # fmt: skip
    monkeypatch.setattr(VllmBackend, "_settings", lambda self, model, **settings: None)
    monkeypatch.setattr(vllm_backend, "saved_dtype", lambda model: "float32")
    monkeypatch.setattr(vllm_backend, "model_stamp", lambda model: {})
    try:
        yield SimpleNamespace(model=torch.nn.Linear(2, 2), processor_kwargs={}, end_token_ids=[2],
                              first_token_unshift=None, tokenizer=SimpleNamespace(eos_token_id=2))  # fmt: skip
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def launched(monkeypatch, rank: int, world: int) -> None:
    """``torch.distributed`` initialised as process ``rank`` of ``world`` (a group set up by hand, ``mp.spawn``
    style: the launcher's ``RANK`` / ``LOCAL_RANK`` not in the environment)."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
