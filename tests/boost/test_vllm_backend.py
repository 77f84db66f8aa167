"""boost's in-process ``vllm`` backend (:mod:`finecap.boost.vllm_backend`) over a stand-in ``vllm.LLM`` (no vLLM
here; the real engine's tests are tests/engines/test_vllm_boost.py, in ``.venv-vllm``): an engine that raises
instead of answering (vLLM's ``EngineDeadError``, out of memory, a use after close) ends a ``finecap boost`` as a
failing server does, a prompt the engine refuses stays that image's own failure."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from finecap.app.boost import main as boost
from finecap.boost import chat, vllm_backend
from finecap.boost.chat import InProcessBackend
from finecap.boost.engine import BoostFailed, EngineFailing, Task
from finecap.boost.vllm_backend import VllmBackend
from finecap.config import load
from finecap.data.records import Record
from finecap.engines import vllm as engines_vllm
from finecap.utils.closing import UsedAfterClose
from helpers.cli import refused
from helpers.tiny_world import make_tiny_world, world_items
from helpers.vllm_stand_in import StandInLLM, stand_in_vllm


class VLLMClientError(Exception):
    """vLLM's error of a request (its HTTP 4xx: a prompt longer than ``vllm.max_model_len``)."""


class EngineDeadError(Exception):
    """vLLM's error of an engine core that died (a ``VLLMServerError``), with vLLM's own message."""

    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the root cause.")


class ScriptedLLM(StandInLLM):
    """A ``vllm.LLM`` that answers its first ``healthy`` ``generate`` calls (each prompt ``Caption N.``, N its task's
    position, as :func:`scripted` tokenizes it), then raises ``error`` on every later call; a prompt in ``refused`` is
    refused (:class:`VLLMClientError`). ``calls``: the prompts of each call."""

    healthy = 0
    error: BaseException | None = None
    refused: frozenset[int] = frozenset()
    calls: list[list[int]] = []

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model_config = SimpleNamespace(get_diff_sampling_param=lambda: {})

    def generate(self, prompts, params, use_tqdm=False):
        ids = [p["prompt_token_ids"][0] for p in prompts]
        type(self).calls.append(ids)
        if len(self.calls) > self.healthy:
            raise self.error
        if self.refused & set(ids):
            raise VLLMClientError("This model's maximum context length is 512 tokens")
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[i], finish_reason="stop")]) for i in ids]


@pytest.fixture
def scripted(monkeypatch):
    """vLLM stood in for by :class:`ScriptedLLM` (its records emptied): the backend's prompt of a task is its
    position alone, decoded back as ``Caption N.``."""
    vllm = ModuleType("vllm")
    vllm.SamplingParams = SimpleNamespace(from_optional=lambda **settings: settings)
    exceptions = ModuleType("vllm.exceptions")
    exceptions.VLLMClientError = VLLMClientError
    tokenizer = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [f"Caption {i[0]}." for i in ids])
    with stand_in_vllm(monkeypatch):
        monkeypatch.setitem(sys.modules, "vllm", vllm)
        monkeypatch.setitem(sys.modules, "vllm.exceptions", exceptions)
        monkeypatch.setattr(engines_vllm, "import_vllm", lambda option="": SimpleNamespace(LLM=ScriptedLLM))
        monkeypatch.setattr(VllmBackend, "_settings", InProcessBackend._settings)  # the settings kept, as boost's
        monkeypatch.setattr(chat, "load_chat_tokenizer", lambda model, **kwargs: (None, tokenizer))
        monkeypatch.setattr(vllm_backend, "prompt_ids", lambda tokenizer, task: [task.index])
        for name, value in (("healthy", 0), ("error", None), ("refused", frozenset()), ("calls", [])):
            monkeypatch.setattr(ScriptedLLM, name, value)
        yield ScriptedLLM


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return make_tiny_world(tmp_path_factory.mktemp("world"))


def settings(world: Path, *extra: str) -> list[str]:
    return [*world_items(world), "boost.mode=blend", "boost.few_shot=false", "boost.llm_backend=vllm",
            "boost.llm_model=a-chat-model", "boost.batch_size=4", *extra]  # fmt: skip


def test_an_engine_that_dies_mid_run_stops_boost_in_one_line_keeping_the_cached_answers(scripted, world, tmp_path):
    # the engine's EngineDeadError escaped backend.run, boost_records and finecap boost as a traceback: no boost.json
    # but "running", no failures.jsonl, no line saying what failed
    scripted.healthy, scripted.error = 2, EngineDeadError()  # two batches answered (8 images), then dead
    out = tmp_path / "out"
    with pytest.raises(BoostFailed) as stopped:
        boost(load(None, settings(world)), out, progress=False)
    message = str(stopped.value)
    engine_error = ("the vLLM engine failed: EngineDeadError: EngineCore encountered an issue. See stack trace "
                    "(above) for the root cause.")  # fmt: skip
    # the default budget (boost.max_failure_rate=0.01 of 32 images) stops at the first failed image; the error's own
    # period ends the reason (it read "root cause.. 8 of 32")
    assert message == ("boost stopped: 1 of 32 images failed, more than boost.max_failure_rate=0.01 allows; last "
                       f"error: {engine_error} 8 of 32 images boosted (blend), 1 failed, 23 not done; no data set "
                       f"written. 8 answers are kept in {out / 'cache.jsonl'}: re-run with the same --out to continue "
                       f"(details: {out / 'boost.json'}, {out / 'failures.jsonl'})")  # fmt: skip
    assert scripted.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # the dead batch not asked prompt by prompt
    summary = json.loads((out / "boost.json").read_text())
    assert summary["status"] == "failed" and summary["error"].endswith(engine_error) and summary["output"] is None
    assert (summary["boosted"], summary["failed"], summary["not_done"]) == (8, 1, 23)
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    failed = ("blend", f"EngineFailing: {engine_error}", 1)  # step, error, attempts: the image's own line
    assert [(f["step"], f["error"], f["attempts"]) for f in failures] == [failed]
    cached = [json.loads(line) for line in (out / "cache.jsonl").read_text().splitlines()]
    assert sorted(row["answer"] for row in cached) == sorted(f"Caption {i}." for i in range(8))
    assert not (out / "dataset.json").exists()
    (llm,) = scripted.built
    assert llm.shutdowns == 1  # the dead engine's backend closed all the same
    # the engine started again: the run continues where it stopped, asking only for the 24 images not answered
    scripted.healthy, scripted.calls = 10**6, []
    summary = boost(load(None, settings(world)), out, progress=False)
    assert summary["status"] == "ok" and summary["boosted"] == 32
    assert summary["cached"] == {"blend": 8} and summary["requested"] == {"blend": 24}
    assert sorted(i for call in scripted.calls for i in call) == list(range(8, 32))


def test_a_dead_engine_stops_the_run_after_max_consecutive_failures_whatever_the_budget(scripted, world, tmp_path):
    # a budget of 100 % let a dead engine fail all 32 images and the command exit 0 ("ok", nothing boosted): only an
    # unreachable server's requests counted towards boost.max_consecutive_failures. A failed batch (one generate
    # call) now counts as one request: the 3rd failed batch in a row stops the run, exit 2
    scripted.error = RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")
    out = tmp_path / "out"
    with pytest.raises(BoostFailed) as stopped:
        boost(load(None, settings(world, "boost.max_failure_rate=1", "boost.max_consecutive_failures=3")), out,
              progress=False)  # fmt: skip
    engine_error = "the vLLM engine failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    reason = (f"3 requests in a row got no answer from the in-process engine (boost.max_consecutive_failures=3); "
              f"last error: {engine_error}")  # fmt: skip
    assert str(stopped.value).startswith(f"boost stopped: {reason}. 0 of 32 images boosted (blend), 9 failed, 23 "
                                         "not done; no data set written."), str(stopped.value)  # fmt: skip
    assert scripted.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # each batch asked once, none after
    summary = json.loads((out / "boost.json").read_text())
    assert (summary["status"], summary["error"], summary["output"]) == ("failed", reason, None)
    assert (summary["boosted"], summary["failed"], summary["not_done"]) == (0, 9, 23)
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [f["error"] for f in failures] == [f"EngineFailing: {engine_error}"] * 9
    assert not (out / "dataset.json").exists()


def failing_batches(scripted, monkeypatch, fails):
    """The scripted engine answers every batch but those whose index (0: the first) ``fails`` says, which raise as
    an engine out of memory; each batch asked is recorded in ``scripted.calls``."""
    scripted.healthy = 10**6
    real = ScriptedLLM.generate

    def generate(self, prompts, params, use_tqdm=False):
        if fails(len(type(self).calls)):
            type(self).calls.append([p["prompt_token_ids"][0] for p in prompts])
            raise RuntimeError("CUDA out of memory")
        return real(self, prompts, params, use_tqdm)

    monkeypatch.setattr(scripted, "generate", generate)


def test_one_failed_batch_larger_than_the_streak_does_not_stop_a_run_the_rate_allows(scripted, world, tmp_path,
                                                                                     monkeypatch):  # fmt: skip
    # each image of a failed batch counted towards boost.max_consecutive_failures, so one transient failure (an out
    # of memory on one batch) of a batch of boost.batch_size >= that streak (256 against the default 10) stopped
    # the run at once, whatever boost.max_failure_rate allowed. The batch is one request: it counts once
    failing_batches(scripted, monkeypatch, lambda batch: batch == 1)  # the second batch fails
    cfg = load(None, settings(world, "boost.max_failure_rate=0.2", "boost.max_consecutive_failures=2"))
    summary = boost(cfg, tmp_path / "out", progress=False)
    assert summary["status"] == "ok" and (summary["boosted"], summary["failed"], summary["not_done"]) == (28, 4, 0)
    assert len(scripted.calls) == 8  # every batch asked once


def test_a_dead_engine_on_fewer_images_than_the_streak_fails_the_run_whatever_the_budget(scripted, world, tmp_path):
    # boost.limit=5 under boost.max_consecutive_failures=10: a dead engine failed all 5 images, never 10 in a row,
    # and a budget of 100 % let the run end "ok", exit 0, writing a data set with no boosted caption. A run whose
    # every image failed now fails (exit 2, boost.json "failed", no data set), and resumes once the engine answers
    scripted.error = RuntimeError("CUDA out of memory")
    out = tmp_path / "out"
    argv = ["boost", "--out", str(out), *settings(world, "boost.max_failure_rate=1", "boost.limit=5")]
    line = refused(argv, "boost stopped: all 5 images failed, none boosted, whatever boost.max_failure_rate=1 "
                   "allows; last error: the vLLM engine failed: RuntimeError: CUDA out of memory. 0 of 5 images "
                   "boosted (blend), 5 failed, 0 not done; no data set written.")  # fmt: skip
    assert scripted.calls == [[0, 1, 2, 3], [4]]
    summary = json.loads((out / "boost.json").read_text())
    assert (summary["status"], summary["output"]) == ("failed", None)
    assert summary["error"] == line.removeprefix("finecap: error: boost stopped: ").split(". 0 of 5")[0]
    assert (summary["boosted"], summary["failed"], summary["not_done"]) == (0, 5, 0)
    assert len((out / "failures.jsonl").read_text().splitlines()) == 5
    assert not (out / "dataset.json").exists()
    scripted.healthy, scripted.calls = 10**6, []  # the engine answers again: the same --out boosts the 5 images
    summary = boost(load(None, settings(world, "boost.max_failure_rate=1", "boost.limit=5")), out, progress=False)
    assert summary["status"] == "ok" and (summary["boosted"], summary["failed"]) == (5, 0)


def test_an_answered_batch_ends_a_dead_engines_streak(scripted, world, tmp_path, monkeypatch):
    # the streak counts requests in a row that got no answer: a batch answered in between starts it again, and a budget
    # of 100 % then lets the run end "ok" with the failed images' human captions
    failing_batches(scripted, monkeypatch, lambda batch: batch % 2 == 1)  # batches 2, 4, 6, 8: 4 images in a row
    cfg = load(None, settings(world, "boost.max_failure_rate=1", "boost.max_consecutive_failures=5"))
    summary = boost(cfg, tmp_path / "out", progress=False)
    assert summary["status"] == "ok" and (summary["boosted"], summary["failed"], summary["not_done"]) == (16, 16, 0)


def tasks(n: int) -> list[Task]:
    return [Task(i, Record(i, Path(f"{i}.png"), "test", ["a dog"]), "blend", [], {}) for i in range(n)]


def test_a_refused_prompt_fails_alone_and_an_engine_failure_fails_its_batch(scripted):
    scripted.healthy, scripted.refused, scripted.error = 4, frozenset({1}), RuntimeError("CUDA out of memory")
    backend = VllmBackend("a-chat-model", batch_size=3)
    answers = dict(backend.run(tasks(6)))
    # the first batch refused as a whole, asked again prompt by prompt: only the refused prompt fails, as its own
    assert scripted.calls == [[0, 1, 2], [0], [1], [2], [3, 4, 5]]
    assert (answers[0], answers[2]) == ("Caption 0.", "Caption 2.")
    assert type(answers[1]).__name__ == "BackendError" and "refused the request" in str(answers[1])
    # the second batch's engine failed: each of its tasks fails with it, none asked again
    assert all(isinstance(answers[i], EngineFailing) for i in (3, 4, 5))
    assert str(answers[3]) == "the vLLM engine failed: RuntimeError: CUDA out of memory"
    with pytest.raises(EngineFailing, match="^the vLLM engine failed: RuntimeError: CUDA out of memory$"):
        backend.generate(tasks(1))  # what the vllm judge counts towards judge.max_consecutive_failures
    backend.close()


def test_a_closed_backend_fails_each_task_naming_the_close(scripted):
    backend = VllmBackend("a-chat-model", batch_size=2)
    backend.close()
    with pytest.raises(UsedAfterClose):  # generate says it, as before
        backend.generate(tasks(1))
    answers = list(backend.run(tasks(3)))
    assert [i for i, _ in answers] == [0, 1, 2] and scripted.calls == []
    assert all(isinstance(a, EngineFailing) for _, a in answers)
    assert str(answers[0][1]).startswith("the vLLM engine failed: UsedAfterClose: boost.llm_backend=vllm: this "
                                         "backend was closed")  # fmt: skip
