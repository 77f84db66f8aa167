"""boost's in-process ``vllm`` backend (``boost.llm_backend=vllm``, ``boost.vlm_backend=vllm``) on a tiny world:
HolisticCap through a tiny Llama chat LM and a tiny Idefics3 answers as the ``transformers`` backend does (greedy,
float32, with the folders' repetition penalty); the decoding settings are boost's over the folder's; a prompt vLLM
refuses fails alone, an engine raising inside ``generate`` fails its whole batch; a ``finecap boost`` killed (SIGKILL)
after two batches resumes without asking vLLM again for a finished image.

The two engines (LLM and VLM) are built once, by :func:`finecap.boost.backends.make_backend` from the run's
configuration, and live side by side in this process, as in a ``finecap boost`` with both roles on vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.app import boost as boost_command  # noqa: E402
from finecap.boost.backends import make_backend  # noqa: E402
from finecap.boost.engine import AnswerCache, BackendError, EngineFailing, Task, boost_records  # noqa: E402
from finecap.boost.prompts import Prompts  # noqa: E402
from finecap.config import load  # noqa: E402
from finecap.data.formats import read_dataset  # noqa: E402
from finecap.models.presets import save_tiny_vlm  # noqa: E402
from finecap.world.make import make_world  # noqa: E402
from helpers.chat_models import save_chat_lm  # noqa: E402

pytestmark = pytest.mark.slow

WORLD = ("world.n_train=8", "world.n_val=2", "world.n_test=2")
"""12 images."""
EOS_SCALE = 4.5
GENERATION = {"do_sample": True, "top_k": 5, "repetition_penalty": 1.3}
"""The folders' generation_config.json: the penalty acts on greedy answers too; top_k on sampling only."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The tiny world, the chat LM (2 heads of 32: vLLM's CPU attention needs >= 32) and the Idefics3 chat VLM."""
    root = tmp_path_factory.mktemp("boost-vllm")
    make_world(load(None, [f"world.out={root / 'world'}", *WORLD]).world, progress=False)
    folders = {
        "world": root / "world",
        "lm": save_chat_lm(root / "lm", hidden=64, heads=2, kv_heads=1, std=0.1),
        "vlm": save_tiny_vlm(root / "vlm", "idefics3", std=0.1, hidden=64, heads=2, kv_heads=1, positions=512),
    }
    for name, auto in (("lm", AutoModelForCausalLM), ("vlm", AutoModelForImageTextToText)):
        model = auto.from_pretrained(folders[name])
        with torch.no_grad():  # some answers stop at EOS before boost.max_new_tokens: stopping is compared too
            model.get_output_embeddings().weight[model.generation_config.eos_token_id] *= EOS_SCALE
        model.generation_config.update(**GENERATION)  # read by transformers.generate and by vLLM ("auto")
        model.save_pretrained(folders[name])
    return folders


def settings(folders: dict[str, Path], backend: str, mode: str = "holistic") -> list[str]:
    return [f"world.out={folders['world']}", *WORLD, f"boost.mode={mode}",
            f"boost.llm_backend={backend}", f"boost.llm_model={folders['lm']}",
            f"boost.vlm_backend={backend}", f"boost.vlm_model={folders['vlm']}",
            "boost.batch_size=4", "boost.max_new_tokens=64", "boost.retries=1",
            "vllm.max_model_len=512", f"vllm.kv_cache_memory_bytes={2**27}"]  # fmt: skip


@pytest.fixture(scope="module")
def backends(folders):
    """The LLM and VLM roles on vLLM, made as ``finecap boost`` makes them."""
    cfg = load(None, settings(folders, "vllm"))
    made = {role: make_backend(cfg, role) for role in ("llm", "vlm")}
    yield made
    for backend in made.values():
        backend.close()


def holistic(folders, llm, vlm, cache: Path):
    records = read_dataset("world", folders["world"])
    with_cache = AnswerCache(cache)
    try:
        return boost_records(records, "holistic", llm, vlm, with_cache, Prompts.load(), retries=1, progress=False)
    finally:
        with_cache.close()


def test_holistic_boost_on_vllm_equals_transformers(folders, backends, tmp_path):
    theirs = holistic(folders, backends["llm"], backends["vlm"], tmp_path / "vllm.jsonl")
    cfg = load(None, settings(folders, "transformers"))
    ours = holistic(folders, make_backend(cfg, "llm"), make_backend(cfg, "vlm"), tmp_path / "hf.jsonl")
    assert theirs.fields == ours.fields  # blend, visual and holistic of every image
    assert [f.to_dict() for f in theirs.failures] == [f.to_dict() for f in ours.failures]
    # Not vacuous: most images are boosted, and the VLM's descriptions depend on the image.
    assert len(theirs.boosted) >= 9, theirs.failures
    visual = [f["visual"][0] for i, f in enumerate(theirs.fields) if i in theirs.boosted]
    assert len(set(visual)) > 1
    assert len({f["blend"][0] for i, f in enumerate(theirs.fields) if i in theirs.boosted}) > 1
    assert any(len(f["holistic"][0].split()) < 12 for f in theirs.fields)  # some stop at EOS (a word-level vocabulary)
    # Some answers run to boost.max_new_tokens without EOS: cut off, failed, on both backends alike (vLLM's
    # finish_reason "length", the transformers backend's missing EOS).
    assert theirs.cut_off == ours.cut_off and sum(theirs.cut_off.values()) >= 1


def test_decoding_settings_come_from_boost_and_the_folder(backends, monkeypatch):
    """boost.temperature and boost.max_new_tokens over the folder's generation_config.json (:data:`GENERATION`)."""
    llm = backends["llm"]
    greedy = llm.sampling_params()
    assert (greedy.temperature, greedy.max_tokens, greedy.repetition_penalty) == (0.0, 64, 1.3)
    monkeypatch.setattr(llm, "temperature", 0.7)
    sampled = llm.sampling_params()
    assert (sampled.temperature, sampled.max_tokens, sampled.repetition_penalty, sampled.top_k) == (0.7, 64, 1.3, 5)
    assert llm.identity()["temperature"] == 0.7  # another cache key: greedy answers are not reused
    # sampled answers depend on the engine's seed (run.seed): another seed is another key, greedy ones do not
    sampled_key = llm.identity()
    monkeypatch.setattr(llm, "seed", llm.seed + 1)
    assert llm.identity() != sampled_key
    monkeypatch.setattr(llm, "temperature", 0.0)
    assert "seed" not in llm.identity()


def test_a_prompt_vllm_refuses_fails_alone(folders, backends):
    """A prompt longer than vllm.max_model_len (512) fails its task; the others of its batch are answered as alone."""
    llm = backends["llm"]
    records = read_dataset("world", folders["world"])[:3]
    prompts = Prompts.load()
    tasks = [Task(i, r, "blend", prompts.messages("blend", few_shot=False, captions=r.captions),
                  {"captions": r.captions}) for i, r in enumerate(records)]  # fmt: skip
    tasks[1].messages[-1]["content"] = " ".join(["red"] * 600)
    answers = dict(llm.run(tasks))
    assert isinstance(answers[1], BackendError) and "vLLM refused the request" in str(answers[1])
    assert "512" in str(answers[1])  # vLLM's reason names the limit
    assert [answers[0], answers[2]] == [dict(llm.run([t]))[0] for t in (tasks[0], tasks[2])]
    assert all(isinstance(answers[i], str) for i in (0, 2))


def test_a_tasks_samples_depend_on_neither_its_batch_nor_what_ran_before(folders, backends, monkeypatch):
    """Sampling (boost.temperature > 0) drew from the engine's one generator, seeded once by run.seed: a task's
    samples depended on the tasks asked with it and before it, so a resumed run drew other samples than an
    uninterrupted one, under one cache key. Each task now has its seed (request_seed, the openai backend's)."""
    llm = backends["llm"]
    monkeypatch.setattr(llm, "temperature", 1.0)
    records = read_dataset("world", folders["world"])[:4]
    prompts = Prompts.load()
    tasks = [Task(i, r, "blend", prompts.messages("blend", few_shot=False, captions=r.captions),
                  {"captions": r.captions}) for i, r in enumerate(records)]  # fmt: skip

    def answers(batches: list[list[Task]]) -> list[str]:  # a failed answer (cut off) as its message
        return [a if isinstance(a, str) else repr(a) for batch in batches for a in llm.generate(batch)]

    together = answers([tasks])
    alone = answers([[t] for t in reversed(tasks)])[::-1]  # one at a time, last first, after the batch
    assert together == alone and any(not a.startswith("CutOff(") for a in together)
    assert llm.identity()["drawn"] == "per task" and "batch_size" not in json.dumps(llm.identity())
    monkeypatch.setattr(llm, "seed", llm.seed + 1)  # not vacuous: the seed decides the samples
    assert answers([tasks]) != together


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from finecap.app.cli import main
    from finecap.boost.vllm_backend import VllmBackend

    calls, answers = 0, VllmBackend._answers

    def killed_after(self, prompts, tasks):  # SIGKILL when the third batch is asked for: two batches are done
        global calls
        calls += 1
        if calls == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return answers(self, prompts, tasks)

    VllmBackend._answers = killed_after
    sys.exit(main(sys.argv[1:]))
    """
)


class Kept:
    """A backend lent to ``finecap boost`` without its ``close`` (the module's engine outlives the command),
    recording the images it is asked about."""

    def __init__(self, backend) -> None:
        self.backend, self.asked = backend, []

    def identity(self):
        return self.backend.identity()

    def run(self, tasks):
        self.asked += [t.record.image_id for t in tasks]
        return self.backend.run(tasks)


def test_killed_boost_resumes_without_repeating_finished_images(folders, backends, tmp_path, monkeypatch):
    out, items = tmp_path / "out", settings(folders, "vllm", mode="blend")
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.run([sys.executable, str(script), "boost", "--out", str(out), *items], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]  # killed, not finished
    cached = [json.loads(line) for line in (out / "cache.jsonl").read_text().splitlines() if line.strip()]
    done = {row["image_id"] for row in cached}
    assert len(cached) == len(done) == 8  # two batches of 4, every answer flushed before the kill
    assert not (out / "dataset.json").exists()

    kept = Kept(backends["llm"])
    monkeypatch.setattr(boost_command, "make_backend", lambda cfg, role: kept)
    summary = boost_command.main(load(None, items), out, progress=False)
    records = read_dataset("world", folders["world"])
    assert sorted(kept.asked) == sorted(r.image_id for r in records if r.image_id not in done)  # only the rest
    assert summary["requested"] == {"blend": 4} and summary["cached"] == {"blend": 8}
    lines = [json.loads(line) for line in (out / "cache.jsonl").read_text().splitlines() if line.strip()]
    assert len(lines) == len({row["key"] for row in lines}) == 12  # every image once
    # The resumed data set is what an uninterrupted run writes.
    whole = AnswerCache(tmp_path / "whole.jsonl")
    uninterrupted = boost_records(records, "blend", backends["llm"], None, whole, Prompts.load(), retries=1,
                                  progress=False)  # fmt: skip
    whole.close()
    resumed = read_dataset("world", out)
    assert [r.captions for r in resumed] == [f["blend"] for f in uninterrupted.fields]


def test_an_engine_raising_inside_generate_fails_its_batch_not_as_a_refusal(folders, monkeypatch):
    """vLLM's engine raising from inside ``LLM.generate`` (its model's step; a CUDA out of memory stood in for on the
    CPU) reaches boost as one :class:`EngineFailing` per task of the batch, naming the engine's error: vLLM passes it
    on as it is, never as a refusal (a ``VLLMClientError`` or ``ValueError``), so the batch is not asked again prompt
    by prompt. An engine of its own, shut down after: the module's engines stay sound for the other tests."""
    backend = make_backend(load(None, settings(folders, "vllm")), "llm")
    try:
        steps = []

        def out_of_memory(*args, **kwargs):
            steps.append(args)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        core = backend.llm.llm_engine.engine_core.engine_core  # the in-process engine core (InprocClient's)
        monkeypatch.setattr(core.model_executor, "execute_model", out_of_memory)
        records = read_dataset("world", folders["world"])[:3]
        prompts = Prompts.load()
        tasks = [Task(i, r, "blend", prompts.messages("blend", few_shot=False, captions=r.captions),
                      {"captions": r.captions}) for i, r in enumerate(records)]  # fmt: skip
        answers = dict(backend.run(tasks))
        assert len(steps) == 1  # one step of the batch, none of a prompt alone
        assert sorted(answers) == [0, 1, 2] and all(isinstance(a, EngineFailing) for a in answers.values()), answers
        assert str(answers[0]) == ("the vLLM engine failed: OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                   "2.00 GiB")  # fmt: skip
    finally:
        backend.close()
