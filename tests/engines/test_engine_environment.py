"""The environment variables a vLLM engine starts with, without vLLM (a stand-in ``vllm.LLM`` recording what it
saw): set while the engine starts and lives, removed when it closes, so that a run later in the process is not
taken for one process of a launch; a value the user set is theirs, kept. The captioner's engine
(:meth:`VllmEngine.from_captioner`) and boost's in-process backend (:class:`VllmBackend`) alike."""

from __future__ import annotations

import os

import pytest

from finecap.boost.vllm_backend import VllmBackend
from finecap.engines import vllm as engines_vllm
from finecap.engines.vllm import VllmEngine
from finecap.utils.system import launched_rank
from helpers.vllm_stand_in import NAMES, StandInLLM, launched, stand_in_vllm


@pytest.fixture
def stand_in(monkeypatch):
    """vLLM stood in for (:func:`helpers.vllm_stand_in.stand_in_vllm`): a captioner to serve."""
    with stand_in_vllm(monkeypatch) as captioner:
        yield captioner


def test_the_engine_variables_are_set_while_it_lives_and_removed_when_it_closes(stand_in):
    engine = VllmEngine.from_captioner(stand_in)
    engine_vars = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": "127.0.0.1", "RANK": None,
                   "LOCAL_RANK": None}  # fmt: skip
    assert StandInLLM.started == [engine_vars]  # what vLLM reads as it starts: its engine core here, on loopback
    assert {name: os.environ.get(name) for name in NAMES} == engine_vars  # and while it lives
    llm = engine.llm
    engine.close()
    assert llm.shutdowns == 1
    assert not any(name in os.environ for name in NAMES)
    engine.close()  # a second close does nothing
    assert not any(name in os.environ for name in NAMES)


def test_a_later_run_is_not_taken_for_a_launched_process_after_an_engine_of_a_launch_closed(stand_in, monkeypatch):
    # rank 1 of 2 processes whose group was set up by hand: vLLM's external_launcher executor reads RANK and
    # LOCAL_RANK, which the engine sets from the group; once it closed (and the group is gone), a run in this process
    # must not read them: finecap's launched_rank would say 1 (its notes and errors kept from the user), and
    # accelerate takes any LOCAL_RANK for a launch (train.cpu: MULTI_CPU, then torch.distributed's env://
    # rendezvous fails for want of MASTER_ADDR)
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    with monkeypatch.context() as group:
        launched(group, rank=1, world=2)
        engine = VllmEngine.from_captioner(stand_in)
        assert StandInLLM.started[0]["RANK"] == "1" and StandInLLM.started[0]["LOCAL_RANK"] == "1"
        assert engine.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend == "external_launcher"
        engine.close()
    assert "RANK" not in os.environ and "LOCAL_RANK" not in os.environ and launched_rank() == 0
    PartialState._reset_state()
    try:
        assert PartialState(cpu=True).distributed_type == DistributedType.NO
    finally:
        PartialState._reset_state()


def test_a_variable_the_user_set_is_kept_and_one_changed_since_is_not_removed(stand_in, monkeypatch):
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.7")  # the user's address
    engine = VllmEngine.from_captioner(stand_in)
    assert StandInLLM.started[0]["VLLM_HOST_IP"] == "10.0.0.7"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # set by someone else while the engine lived
    engine.close()
    assert os.environ["VLLM_HOST_IP"] == "10.0.0.7" and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_an_engine_that_fails_to_start_leaves_no_variable(stand_in, monkeypatch):
    monkeypatch.setattr(engines_vllm, "served_prompt", lambda captioner: 1 / 0)  # after vLLM started
    with pytest.raises(ZeroDivisionError):
        VllmEngine.from_captioner(stand_in)
    assert len(StandInLLM.started) == 1 and not any(name in os.environ for name in NAMES)


def test_the_boost_backend_removes_the_engine_variables_when_closed(stand_in):
    backend = VllmBackend("a-chat-model")
    assert StandInLLM.started[0]["VLLM_HOST_IP"] == "127.0.0.1" and os.environ["VLLM_HOST_IP"] == "127.0.0.1"
    backend.close()
    assert not any(name in os.environ for name in NAMES)
    with pytest.raises(RuntimeError, match="failed to start"):
        VllmBackend("fails")
    assert not any(name in os.environ for name in NAMES)


def test_two_engines_of_one_process_closed_in_either_order_leave_no_variable(stand_in):
    # boost's LLM and VLM roles are two engines in one process: the first sets the variables, the second finds them
    # set; whichever closes first, none is left once both have
    for order in ((0, 1), (1, 0)):
        backends = [VllmBackend("llm"), VllmBackend("vlm")]
        backends[order[0]].close()
        backends[order[1]].close()
        assert not any(name in os.environ for name in NAMES), order
