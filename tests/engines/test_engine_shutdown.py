"""Every ``vllm.LLM`` finecap starts is shut down exactly once (:func:`finecap.engines.vllm.shutdown_llm`), without
vLLM (a stand-in ``vllm.LLM`` counting its shutdowns): when its owner closes it, however often, and when the owner's
start fails after vLLM started; an engine of a launched job leaves the job's process group. On a GPU an engine not
shut down keeps its weights and KV cache (most of the card) in a notebook until the garbage collector finds it.
The owners: the captioner's engine (:meth:`VllmEngine.from_captioner`) and boost's in-process backend
(:class:`VllmBackend`, which the ``vllm`` judge uses too: tests/judges/test_vllm_judge.py)."""

from __future__ import annotations

import gc
import os
import sys
from types import SimpleNamespace

import pytest

from finecap.boost import vllm_backend
from finecap.boost.vllm_backend import VllmBackend
from finecap.config import load
from finecap.engines import vllm as engines_vllm
from finecap.engines.rollouts import RolloutEngine
from finecap.engines.vllm import VllmEngine
from finecap.utils.closing import UsedAfterClose
from helpers.vllm_stand_in import NAMES, StandInLLM, launched, stand_in_vllm


@pytest.fixture
def stand_in(monkeypatch):
    """vLLM stood in for (:func:`helpers.vllm_stand_in.stand_in_vllm`): a captioner to serve."""
    with stand_in_vllm(monkeypatch) as captioner:
        yield captioner


def fail(*args, **kwargs):
    raise ZeroDivisionError("a step after vLLM started failed")


@pytest.mark.parametrize("step", ["served_prompt", "__init__", "sync"])
def test_a_captioner_engine_whose_start_fails_after_vllm_started_shuts_it_down(stand_in, monkeypatch, step):
    # served_prompt and VllmEngine(...) fail before the engine exists (its close cannot be called), sync after
    target = VllmEngine if step in ("__init__", "sync") else engines_vllm
    monkeypatch.setattr(target, step, fail)
    with pytest.raises(ZeroDivisionError):
        VllmEngine.from_captioner(stand_in)
    (llm,) = StandInLLM.built
    assert llm.shutdowns == 1 and not any(name in os.environ for name in NAMES)


def test_a_captioner_engine_closed_twice_shuts_down_once(stand_in):
    engine = VllmEngine.from_captioner(stand_in)
    (llm,) = StandInLLM.built
    assert llm.shutdowns == 0  # alive until closed
    engine.close()
    engine.close()
    assert llm.shutdowns == 1 and engine.llm is None


def test_a_captioner_engine_removes_the_folder_it_made_and_never_one_it_was_given(stand_in, tmp_path, monkeypatch):
    """``from_captioner`` builds the engine from a folder of its own (``tempfile.mkdtemp``, ``owns_folder``), removed
    when the engine is closed, when its start fails after the folder was made, or when it is dropped unclosed; an
    engine built on a folder it was given (``owns_folder=False``: a user's model folder) leaves it and its files,
    closed or dropped."""
    made = []

    def recorded_mkdtemp(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    real_mkdtemp = engines_vllm.tempfile.mkdtemp
    monkeypatch.setattr(engines_vllm.tempfile, "mkdtemp", recorded_mkdtemp)
    engine = VllmEngine.from_captioner(stand_in)
    assert [str(engine.folder)] == made and engine.folder.is_dir()
    (engine.folder / "config.json").write_text("{}")  # what save_engine_folder writes (stood in for here)
    engine.close()
    assert not engine.folder.exists()
    # the start fails after the folder was made and vLLM started: before the engine exists, and after
    for target, step in ((engines_vllm, "served_prompt"), (VllmEngine, "sync")):
        kept = getattr(target, step)
        monkeypatch.setattr(target, step, fail)
        with pytest.raises(ZeroDivisionError):
            VllmEngine.from_captioner(stand_in)
        monkeypatch.setattr(target, step, kept)
        assert not os.path.exists(made[-1]), step
    assert len(made) == 3
    dropped = VllmEngine.from_captioner(stand_in).folder
    gc.collect()  # dropped unclosed: its finaliser removes the folder
    assert not dropped.exists()

    given = tmp_path / "my-model"
    given.mkdir()
    (given / "config.json").write_text("{}")
    for close in (True, False):
        engine = VllmEngine(StandInLLM(), stand_in.tokenizer, "prompt", given, owns_folder=False)
        if close:
            engine.close()
        del engine
        gc.collect()
        assert [p.name for p in given.iterdir()] == ["config.json"], close
        assert (given / "config.json").read_text() == "{}"


def test_a_boost_backend_closed_twice_shuts_its_engine_down_once(stand_in):
    backend = VllmBackend("a-chat-model")
    (llm,) = StandInLLM.built
    assert llm.shutdowns == 0
    backend.close()
    assert llm.shutdowns == 1 and backend.llm is None and not any(name in os.environ for name in NAMES)
    backend.close()
    assert llm.shutdowns == 1


def test_a_boost_backend_whose_start_fails_after_vllm_started_shuts_it_down(stand_in, monkeypatch):
    monkeypatch.setattr(vllm_backend, "model_stamp", fail)  # read once the engine has started
    with pytest.raises(ZeroDivisionError):
        VllmBackend("a-chat-model")
    (llm,) = StandInLLM.built
    assert llm.shutdowns == 1 and not any(name in os.environ for name in NAMES)
    with pytest.raises(RuntimeError, match="failed to start"):  # vLLM itself failed: nothing to shut down
        VllmBackend("fails")
    assert len(StandInLLM.built) == 1 and not any(name in os.environ for name in NAMES)


def test_two_boost_engines_of_one_process_are_each_shut_down_once(stand_in):
    llm_role, vlm_role = VllmBackend("llm"), VllmBackend("vlm", vision=True)
    vlm_role.close()
    assert [llm.shutdowns for llm in StandInLLM.built] == [0, 1]
    llm_role.close()
    assert [llm.shutdowns for llm in StandInLLM.built] == [1, 1]


def test_an_engine_not_of_a_launch_shuts_down_as_vllm_does(stand_in):
    # the stand-in's shutdown destroys the default group, as vLLM's in-process engine core does: outside a launch
    # nothing keeps it (the group is vLLM's own), which shows the next test's stand-in can see a destroyed group
    VllmBackend("a-chat-model").close()
    assert StandInLLM.destroyed == [None]


@pytest.mark.parametrize("owner", ["captioner engine", "boost backend"])
def test_an_engine_of_a_launched_job_shuts_down_leaving_the_training_group(stand_in, monkeypatch, owner):
    # a judged reward's vllm judge (a boost backend) or the rollouts' engine in process 1 of 2: the engine joined the
    # training's process group (external_launcher), and its shutdown must not destroy it
    launched(monkeypatch, rank=1, world=2)
    engine = VllmEngine.from_captioner(stand_in) if owner == "captioner engine" else VllmBackend("a-chat-model")
    (llm,) = StandInLLM.built
    assert llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend == "external_launcher"
    engine.close()
    assert llm.shutdowns == 1 and StandInLLM.destroyed == []


def two_engines(captioner, first: str):
    """A captioner's engine and a boost backend (the ``vllm`` judge's transport) of one process, ``first`` built
    first: a :class:`finecap.Captioner`'s engine beside a judge, or vLLM rollouts beside a judged reward."""
    make = {"captioner engine": lambda: VllmEngine.from_captioner(captioner),
            "boost backend": lambda: VllmBackend("a-chat-model")}  # fmt: skip
    second = next(owner for owner in make if owner != first)
    return make[first](), make[second]()


@pytest.mark.parametrize("first", ["captioner engine", "boost backend"])
@pytest.mark.parametrize("closed_first", [0, 1])
def test_an_engine_closed_beside_another_leaves_vllms_process_state_to_it(stand_in, first, closed_first):
    # vLLM's shutdown tears down its process-wide groups, the default process group and its variables' cache, which
    # every in-process engine runs on: the engine still running failed at its next request ("pipeline model parallel
    # group is not initialized"; tests/engines/test_vllm_shared_process.py with vLLM itself)
    engines = two_engines(stand_in, first)
    engines[closed_first].close()
    assert [llm.shutdowns for llm in StandInLLM.built] == [closed_first == 0, closed_first == 1]
    assert all(StandInLLM.process.values()) and StandInLLM.destroyed == []
    engines[1 - closed_first].close()
    assert [llm.shutdowns for llm in StandInLLM.built] == [1, 1]
    assert not any(StandInLLM.process.values()) and StandInLLM.destroyed == [None]  # the last one tears it down
    assert sys.modules["vllm.envs"].disable_envs_cache is not engines_vllm._keep  # the teardowns put back


def test_a_vllm_without_a_teardown_of_its_known_names_still_closes_and_says_so(stand_in, monkeypatch, caplog):
    # the teardowns are looked up by vLLM 0.32's names: a vLLM that renamed one made the first close beside another
    # engine fail (AttributeError) and leave its engine up; it closes, keeping what it can, and says what it could not
    missing = ("vllm.distributed.parallel_state", "a_teardown_this_vllm_lacks")
    monkeypatch.setattr(engines_vllm, "PROCESS_STATE", (*engines_vllm.PROCESS_STATE, missing))
    monkeypatch.setattr(engines_vllm, "STATE_NOT_FOUND", engines_vllm.SaidOnce())
    engines = two_engines(stand_in, "boost backend")
    with caplog.at_level("WARNING", logger="finecap.engines.vllm"):
        engines[0].close()
    assert [llm.shutdowns for llm in StandInLLM.built] == [1, 0]
    assert all(StandInLLM.process.values())  # the names it has are still kept for the other engine
    said = [r.getMessage() for r in caplog.records if "a_teardown_this_vllm_lacks" in r.getMessage()]
    assert len(said) == 1 and "another engine" in said[0], said
    engines[1].close()
    assert [llm.shutdowns for llm in StandInLLM.built] == [1, 1]


def test_an_engine_dropped_without_close_is_not_kept_for(stand_in):
    # an engine unreachable in a reference cycle (its owner dropped unclosed) is counted until the collector finds
    # it: the last closed engine would then leave vLLM's state (the default process group) up
    gc.disable()  # no collection but the one the shutdown makes
    try:
        VllmBackend("dropped")
        StandInLLM.built.clear()  # the stand-in's own record of it: only the reference cycle holds it now
        VllmBackend("kept").close()
    finally:
        gc.enable()
    assert not any(StandInLLM.process.values()) and StandInLLM.destroyed == [None]


def test_an_engine_used_after_close_says_it_was_closed(stand_in):
    # it failed deep inside on the closed engine: AttributeError: 'NoneType' object has no attribute 'generate'
    from PIL import Image

    engine = VllmEngine.from_captioner(stand_in)
    engine.close()
    closed = r"^decode.engine=vllm: this engine was closed \(.*\); open another"
    with pytest.raises(UsedAfterClose, match=closed):
        engine.generate_images([Image.new("RGB", (4, 4))])
    with pytest.raises(UsedAfterClose, match=closed):
        engine.sync(stand_in)
    engine.sleep()  # nothing to release
    backend = VllmBackend("a-chat-model")
    backend.close()
    with pytest.raises(UsedAfterClose, match=r"^boost.llm_backend=vllm: this backend was closed \(.*\); build"):
        backend.generate([SimpleNamespace(messages=[])])
    assert [llm.shutdowns for llm in StandInLLM.built] == [1, 1]


class CloseFails:
    """An engine whose close raises (vLLM's shutdown failing half-way)."""

    closes = 0

    def close(self):
        self.closes += 1
        raise RuntimeError("the engine's shutdown failed")


def test_rollouts_drop_their_engine_when_its_close_raises():
    # RolloutEngine.close kept the engine when its close raised: a later close tried again, and the engine (with the
    # GPU memory it still held) stayed referenced
    rollouts = RolloutEngine(load(None, []))
    rollouts.engine = engine = CloseFails()
    with pytest.raises(RuntimeError, match="shutdown failed"):
        rollouts.close()
    assert rollouts.engine is None
    rollouts.close()
    assert engine.closes == 1
