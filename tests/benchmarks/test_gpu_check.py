"""benchmarks/gpu_check.py --cpu-smoke (issue 65): the GPU check's plumbing on the CPU at the tiniest sizes, so that it
cannot rot between the rare runs on a GPU. Every check gets a status; the table is printed; what has a CPU stand-in
(bfloat16 on the CPU, FSDP2 over gloo, bitsandbytes' CPU 4-bit layers) passes; ``grpo_vllm`` is skipped where vLLM
is not installed (its run on vLLM's CPU backend: tests/engines/test_vllm_gpu_check.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MUST_PASS = ["env", "setup", "family:llava", "family:idefics3", "family:qwen2_vl", "fsdp2", "grpo", "trl",
             *(f"memory:{r}" for r in ("mle_vlm", "smile_vlm", "discritune_vlm", "sr_l_vlm", "sr_lv_bagcurri_vlm",
                                       "grpo_cider_vlm", "grpo_sr_cider_vlm"))]  # fmt: skip


@pytest.mark.slow
def test_cpu_smoke_records_every_check(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-smoke", "--out-dir",
                           str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    records = {r["name"]: r for r in report["checks"]}
    from finecap.models.vlm import FAMILIES

    families = [f"family:{f}" for f in FAMILIES]  # a line each (a family it cannot build: skipped)
    # the training paths, then the families, then the measurements: a budget that runs short leaves measurements
    in_order = [*MUST_PASS[:2], "qlora", *MUST_PASS[5:7], *families, *MUST_PASS[8:], "grpo_vllm", "trl"]
    assert report["mode"] == "cpu-smoke" and list(records) == in_order
    assert all(r["status"] for r in records.values())
    failed = {n: (records[n]["status"], records[n].get("error")) for n in MUST_PASS if records[n]["status"] != "pass"}
    assert not failed, failed
    # the smoke's families pass (every family's CPU contract: tests/models/test_vlm_families.py); the others say why
    # they were left out
    smoke = ("llava", "llava_next", "idefics3", "qwen2_vl", "gemma3")
    from finecap.models.tiny import LOAD_NEEDS

    for family in FAMILIES:
        record = records[f"family:{family}"]
        need = LOAD_NEEDS.get(family)
        if need and importlib.util.find_spec(need) is None:  # skipped before a process was started for it
            assert record["summary"] == f"skipped: {need} not installed", record
        elif family in smoke:
            assert record["status"] == "pass", (family, record.get("summary"), record.get("error"))
        else:
            assert record["status"] == "skipped" and "test_vlm_families" in record["summary"], record
    try:
        import bitsandbytes  # noqa: F401

        assert records["qlora"]["status"] == "pass", records["qlora"]
    except ImportError:
        assert records["qlora"]["status"] == "skipped"
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = proc.stdout[proc.stdout.index("check ") :]
    assert all(name in table for name in records) and "key numbers" in table
    # the comparisons can fail: the control (other images) moves the logits far beyond the tolerance
    for family in ("llava", "llava_next", "idefics3", "qwen2_vl", "gemma3"):
        part = records[f"family:{family}"]["parts"]["float32/sdpa"]
        assert part["first_token_max_rel_diff"] <= part["tolerance_rel"] < part["control_rel_diff_other_images"]
        assert records[f"family:{family}"]["parts"]["train/sdpa"]["gradient_checkpointing"] is True
    assert records["grpo"]["vllm"].startswith("not run")
    grpo = records["grpo"]
    assert len(grpo["losses"]) == grpo["steps"] == 3 and all(math.isfinite(x) for x in grpo["losses"])
    if importlib.util.find_spec("vllm") is None:  # this venv; the check runs in .venv-vllm: test_vllm_gpu_check.py
        assert records["grpo_vllm"]["status"] == "skipped", records["grpo_vllm"]
        assert records["grpo_vllm"]["summary"] == "skipped: vllm not installed"  # decided before any process
    else:
        assert records["grpo_vllm"]["status"] == "pass", records["grpo_vllm"]
    assert not list(tmp_path.glob("*.json"))  # nothing in the working directory


def test_out_of_memory_is_a_finding_of_a_memory_line_and_an_error_elsewhere(tmp_path):
    import torch

    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")

    def short_of_memory(ctx):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def cublas_short_of_memory(ctx):  # cuBLAS creating its handle on a full card: a RuntimeError, not torch's
        raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    def other_error(ctx):
        raise RuntimeError("CUDA error: device-side assert triggered")

    ctx = gc.Ctx(smoke=True, work=tmp_path)
    assert gc.run_body(gc.Check("memory:mle_vlm", short_of_memory, 60), ctx)["status"] == "oom"
    assert gc.run_body(gc.Check("memory:sr_l_vlm", cublas_short_of_memory, 60), ctx)["status"] == "oom"
    assert gc.run_body(gc.Check("memory:sr_l_vlm", other_error, 60), ctx)["status"] == "error"
    for name in ("grpo", "fsdp2", "family:llava"):  # a training path that runs out of memory failed
        record = gc.run_body(gc.Check(name, short_of_memory, 60), ctx)
        assert record["status"] == "error" and record["status"] in gc.FAILED
        assert "out of memory" in record["error"]


@pytest.mark.slow
def test_make_gpu_check_leaves_four_files_in_out_and_the_env_record_when_finecap_does_not_import(tmp_path):
    """What a device machine runs (make gpu-check -> benchmarks/gpu_check.sh, OUT set): four files come back, and
    when finecap cannot be imported (a dependency missing there: a stand-in platformdirs that fails to import) the
    env check still runs in its own fresh process (--spawn, as on a GPU) and records the versions and the error."""
    broken = tmp_path / "broken" / "platformdirs"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('platformdirs is missing here (a test stand-in)')\n")
    (tmp_path / "no-wheels").mkdir()
    out = tmp_path / "out"
    (tmp_path / "tmp").mkdir()  # the script's temporary folders (the checks' own, kept): here, not in /tmp
    env = {**os.environ, "OUT": str(out), "WHEELS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable,
           "PYTHONPATH": str(tmp_path / "broken"), "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "gpu-check",
                           f"GPU_CHECK_ARGS=--cpu-smoke --spawn --only family:llava --work-dir {tmp_path / 'work'}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_check.json", "gpu_check.log", "gpu_check_logs.tgz", "nvidia-smi.txt"
    ], proc.stdout[-2000:] + proc.stderr[-2000:]  # fmt: skip
    report = json.loads((out / "gpu_check.json").read_text())
    assert "platformdirs is missing here" in report["preload_error"]
    (record,) = report["checks"]
    assert record["name"] == "env" and record["versions"]["torch"], record  # it ran: the versions are recorded
    assert "platformdirs is missing here" in record["imports"]["finecap.train.run"]
    assert record["status"] == "fail"  # finecap does not import: the run failed (the script's status 1, make's 2)
    assert proc.returncode == 2 and "gpu-check] Error 1" in proc.stderr, proc.stderr
    assert "env " in (out / "gpu_check.log").read_text()  # --only family:llava: the env record all the same
    assert not list(tmp_path.glob("*.json"))  # nothing in the working directory
    # the script itself, OUT named relative to the caller's folder (not the repository's)
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "gpu_check_logs.tgz").write_text("an earlier run's")
    env["OUT"] = "rel"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--cpu-smoke", "--spawn", "--work-dir",
                           str(tmp_path / "work2")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 1 and (tmp_path / "rel" / "gpu_check.json").is_file(), proc.stderr[-2000:]
    assert (tmp_path / "rel" / "gpu_check_logs.tgz").read_bytes()[:2] == b"\x1f\x8b"  # this run's tarball
    assert not (ROOT / "rel").exists()
    assert len(list((tmp_path / "tmp").glob("finecap-gpu-out.*"))) == 2  # both runs' folders, under TMPDIR


@pytest.mark.slow
def test_a_gpu_check_cut_off_from_outside_leaves_its_json_in_out(tmp_path):
    """The device kills a command that runs past its limit (less than timeout_s when less device time is left) and
    brings back what is under OUT: the JSON must be there as soon as a check has ended, not only copied at the end."""
    import signal
    import time

    (tmp_path / "no-wheels").mkdir()
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "WHEELS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable,
           "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
    proc = subprocess.Popen(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--cpu-smoke", "--only", "env",
                             "--work-dir", str(tmp_path / "work")], env=env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    log, deadline = out / "gpu_check.log", time.monotonic() + 240
    try:
        while not (log.exists() and "  env " in log.read_text()) and time.monotonic() < deadline:
            assert proc.poll() is None, "the check ended before it could be cut off"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the script, gpu_check.py and tee: the command, cut off mid-run
        proc.wait()
    # setup's process, if it had begun its own session, outlives the command: let it end before the folder is left
    work, deadline = str(tmp_path / "work"), time.monotonic() + 120
    while any(work in cmd for cmd in command_lines()) and time.monotonic() < deadline:
        time.sleep(0.2)
    report = json.loads((out / "gpu_check.json").read_text())
    assert [r["name"] for r in report["checks"]] == ["env"] and report["checks"][0]["status"] == "pass"


def test_the_json_says_where_it_runs_before_anything_slow_and_done_at_the_end(tmp_path, monkeypatch):
    """gpu_check.json was first written after the env check (up to 60 s: torch imported, CUDA asked), so a run cut off
    in its first minute brought back no JSON. It is written first, status "started" with the machine's facts that
    need no CUDA work, before finecap is imported (preload) and before any check; "done" at the end."""
    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")
    out = tmp_path / "out"
    path = out / "gpu_check.json"
    seen: dict[str, Any] = {}

    def preload():
        seen["preload"] = json.loads(path.read_text()) if path.exists() else None
        return None

    def first(ctx):  # runs in a forked process: what it saw comes back in its record
        return {"status": "pass", "saw": json.loads(path.read_text()) if path.exists() else None, "summary": ""}

    monkeypatch.setattr(gc, "preload", preload)
    monkeypatch.setattr(gc, "checks", lambda: [gc.Check("first", first, 60)])
    monkeypatch.setattr(gc, "cuda_visible", lambda: False)  # forked checks, as on the CPU
    assert gc.main(["--out-dir", str(out), "--work-dir", str(tmp_path / "work"), "--budget", "120"]) == 0
    started = seen["preload"]
    assert started is not None, "no gpu_check.json before finecap was imported"
    assert started["status"] == "started" and started["checks"] == [] and started["mode"] == "gpu"
    facts = started["machine"]
    assert facts["cpu_count"] == os.cpu_count() and facts["python"] == sys.version.split()[0]
    assert isinstance(facts["gpus"], list) and facts["memory_bytes"] > 0 and facts["host"]
    report = json.loads(path.read_text())
    (record,) = report["checks"]
    assert record["status"] == "pass" and record["saw"]["status"] == "running" and record["saw"]["checks"] == []
    assert report["status"] == "done" and report["machine"] == facts


@pytest.mark.slow
def test_a_wheel_install_that_fails_comes_back_in_out_with_its_reason(tmp_path):
    """make gpu-check installs the carried wheels first; when that failed (exit 3) OUT was not made yet, so nothing
    came back but stderr. OUT, gpu_check.log (with pip's words and the script's) and nvidia-smi.txt are made first."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "WHEELS": str(wheels), "PYTHON": sys.executable,
           "TMPDIR": str(tmp_path)}  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--cpu-smoke"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "nvidia-smi.txt"]
    log = (out / "gpu_check.log").read_text()
    assert f"the wheels in {wheels} could not be installed" in log and "broken-1.0-py3-none-any.whl" in log, log
    assert "could not be installed" in proc.stderr
    assert not list(tmp_path.glob("finecap-gpu-site.*"))  # the unpacked wheels' folder removed


def command_lines() -> list[str]:
    """The command lines of this machine's processes (Linux's /proc), arguments joined by spaces."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            out.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


def test_greedy_rows_agree_when_equal_or_parting_at_a_near_tie():
    import torch

    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")
    pad = 0
    # generate's logits for 3 steps of 3 rows over 5 tokens; row 1 parts at step 1 where tokens 3 and 4 are 0.01
    # apart, row 2 at step 0 where they are 2.0 apart
    logits = torch.zeros(3, 3, 5)
    logits[1, 1, 3], logits[1, 1, 4] = 1.00, 1.01
    logits[0, 2, 1], logits[0, 2, 2] = 0.0, 2.0
    theirs = [[1, 2, pad], [2, 4, 1], [2, 3, 1]]  # row 0 ended after two tokens (padded)
    ours = [[1, 2], [2, 3, 1], [1, 3, 1]]
    equal, ties = gc.greedy_agreement(ours, theirs, logits, pad, tolerance=0.05)
    assert equal == 1 and [(t["row"], t["step"]) for t in ties] == [(1, 1)]
    assert ties[0]["logit_gap"] == pytest.approx(0.01, abs=1e-6)
    assert gc.greedy_agreement(ours, theirs, logits, pad, tolerance=0.001) == (1, [])  # no tie that close
    # finecap went on where generate ended (its end token, here the padding id, chosen 0.5 above finecap's token 3)
    ended = torch.zeros(3, 1, 5)
    ended[2, 0, pad] = 0.5
    assert gc.greedy_agreement([[1, 2, 3]], [[1, 2, pad]], ended, pad, 1.0)[0] == 0  # not equal ...
    assert [t["step"] for t in gc.greedy_agreement([[1, 2, 3]], [[1, 2, pad]], ended, pad, 1.0)[1]] == [2]  # a tie
    assert gc.greedy_agreement([[1, 2, 3]], [[1, 2, pad]], ended, pad, 0.1) == (0, [])  # ... or not, closer
    # generate chose a token its own logits rank 10 below finecap's (a logits processor's doing): never a tie
    lower = torch.zeros(1, 1, 5)
    lower[0, 0, 3] = 10.0
    assert gc.greedy_agreement([[3]], [[4]], lower, pad, 0.05) == (0, [])


def test_the_json_is_strict_when_a_check_measures_no_number(tmp_path, monkeypatch):
    """A check that failed records a loss or a timing that is no number (NaN, inf): gpu_check.json says ``null``
    there, never Python's ``NaN`` or ``Infinity`` tokens, which ``jq`` and strict JSON parsers refuse."""
    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")

    def diverged(ctx):
        return {"status": "fail", "losses": [2.5, float("nan")], "seconds_per_step": float("inf"), "summary": "nan"}

    monkeypatch.setattr(gc, "checks", lambda: [gc.Check("diverged", diverged, 60)])
    monkeypatch.setattr(gc, "cuda_visible", lambda: False)  # forked checks, as on the CPU
    out = tmp_path / "out"
    assert gc.main(["--out-dir", str(out), "--work-dir", str(tmp_path / "work"), "--budget", "120"]) == 1

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    report = json.loads((out / "gpu_check.json").read_text(), parse_constant=refuse)
    (record,) = report["checks"]
    assert (record["name"], record["status"]) == ("diverged", "fail")
    assert record["losses"] == [2.5, None] and record["seconds_per_step"] is None
    assert not list(out.glob(".*.part"))  # written atomically: no partial file left beside it


def test_the_vllm_check_sets_the_memory_sleep_freed_beside_finecaps_forecast_of_the_engine(monkeypatch):
    """``grpo_vllm`` on CUDA records the engine share finecap's dry run forecasts (``vllm.gpu_memory_utilization`` of
    the device: 0.3 of 80 GiB = 24 GiB) beside what the engine's sleep freed; no forecast where the KV cache is sized
    in bytes (the forecast then needs the engine's weights) or without CUDA."""
    import torch

    from finecap.config import load
    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")
    cfg = load(overrides=["vllm.gpu_memory_utilization=0.3"])
    assert gc.engine_forecast(cfg, 12.0) == {"forecast_engine_share_gib": None, "freed_over_forecast": None}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (50 * 2**30, 80 * 2**30))  # (free, total)
    assert gc.engine_forecast(cfg, 12.0) == {"forecast_engine_share_gib": pytest.approx(24.0),
                                             "freed_over_forecast": pytest.approx(0.5)}  # fmt: skip
    sized = load(overrides=["vllm.kv_cache_memory_bytes=1073741824"])
    assert gc.engine_forecast(sized, 12.0)["forecast_engine_share_gib"] is None


def replayed_memory_line(tmp_path, monkeypatch, record: dict, cuda: bool) -> dict:
    """``check_memory`` of ``record``'s recipe with the dry run replaying ``record``'s forecast and measured peak (a
    committed GPU record), on a CUDA device faked to be there when ``cuda``: the line as the check would judge it."""
    import types

    import torch

    import finecap.train.run
    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")
    (tmp_path / "smolvlm").mkdir(parents=True)
    (tmp_path / "smolvlm" / "config.json").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset.json").write_text("{}")
    activations = record.get("activation_forecast_bytes")
    report = {"memory_bytes": record["forecast_bytes"], "parameters": record["parameters"],
              "forecast": {"activations": activations} if activations else None,
              "step": {"loss": record["loss"], "seconds": record["step_seconds"],
                       "peak_bytes": record["measured_peak_bytes"]}}  # fmt: skip
    monkeypatch.setattr(finecap.train.run, "dry_run", lambda cfg: report)
    if cuda:
        card = types.SimpleNamespace(total_memory=140 * 2**30)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: card)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 2**30)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (100 * 2**30, 140 * 2**30))
    ctx = gc.Ctx(smoke=False, work=tmp_path, cuda=cuda)
    return gc.check_memory(ctx, record["recipe"].split("/")[1])


def committed_memory_records() -> dict[str, dict]:
    out = {}
    for file in sorted((ROOT / "benchmarks" / "results").glob("gpu_check_h200_2026-11-28*.json")):
        out |= {c["name"]: c for c in json.loads(file.read_text())["checks"] if c["name"].startswith("memory:")
                and c["status"] != "skipped"}  # fmt: skip
    return out


@pytest.mark.parametrize("name", ["memory:sr_lv_bagcurri_vlm", "memory:mle_vlm", "memory:discritune_vlm"])
def test_a_memory_line_on_cuda_fails_when_its_forecast_is_under_three_quarters_of_the_measured_peak(
    tmp_path, monkeypatch, name
):
    """The H200's 2026-11-28 records replayed through ``check_memory``: ``sr_lv_bagcurri_vlm``'s forecast with
    activations, 3.05 GiB against a measured 8.61 GiB (0.35 of it), fails the line (it passed on that run: a check
    that could not fail on the quantity it checks); ``mle_vlm`` (0.97) and ``discritune_vlm`` (0.90) pass."""
    record = committed_memory_records()[name]
    line = replayed_memory_line(tmp_path, monkeypatch, record, cuda=True)
    ratio = record["forecast_with_activations_gib"] / record["measured_peak_gib"]
    assert line["forecast_over_measured"] == pytest.approx(ratio)
    if name == "memory:sr_lv_bagcurri_vlm":
        assert ratio == pytest.approx(0.354, abs=1e-3)
        assert line["status"] == "fail", line
        assert line["error"].startswith("forecast 3.05 GiB is under 0.75 of the measured 8.61 GiB"), line["error"]
    else:
        assert 0.75 <= ratio < 1 and line["status"] == "pass" and "error" not in line, line
    assert f"({ratio:.2f})" in line["summary"]


def test_an_over_forecast_passes_and_the_cpu_smoke_records_no_ratio(tmp_path, monkeypatch):
    """An over-forecast sizes safely: twice the measured peak passes, its ratio recorded. Off CUDA the measured number
    is the step's RSS growth, no peak to hold a forecast to: no ratio and no verdict, however far apart."""
    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")
    record = committed_memory_records()["memory:sr_lv_bagcurri_vlm"]
    over = {**record, "measured_peak_bytes": record["measured_peak_bytes"] // 6}  # forecast 3.05 / 1.44 GiB
    line = replayed_memory_line(tmp_path / "over", monkeypatch, over, cuda=True)
    assert line["status"] == "pass" and line["forecast_over_measured"] == pytest.approx(2.12, abs=0.01), line
    cpu = replayed_memory_line(tmp_path / "cpu", monkeypatch, record, cuda=False)
    assert cpu["status"] == "pass" and cpu["forecast_over_measured"] is None, cpu
    assert cpu["measured_what"] == "peak RSS growth (CPU)"
    # a state forecast alone (no activations forecast) counts no activations: recorded, never judged
    state = gc.judge_forecast({"forecast_gib": 0.7, "measured_peak_gib": 8.6, "status": "pass"}, cuda=True)
    assert state["status"] == "pass" and state["forecast_over_measured"] == pytest.approx(0.7 / 8.6)


def test_setups_smolvlm_shaped_tokenizer_says_smolvlms_own_length_limit(tmp_path, monkeypatch):
    """The SmolVLM-256M-shaped checkpoint setup saves: its tokenizer's ``model_max_length`` is SmolVLM-256M-Instruct's
    8192 (the model's positions), in the saved tokenizer_config.json and as the processor loads back, so a prompt of
    78 tokens (64 image tokens and the text) raises no "longer than the specified maximum sequence length" warning
    (the world tokenizer it is built from says 64: the warning of every memory and grpo log on the 2026-11-28 H200)."""
    import logging

    import transformers

    from finecap.models.presets import tiny_vlm
    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # rollouts.py's SMOLVLM_256M, as the script finds it
    sizes = gc.smolvlm_sizes(smoke=False)
    assert sizes["positions"] == 8192
    _, processor = tiny_vlm("idefics3")  # the tiny shapes' processor: its tokenizer is the same world tokenizer
    assert processor.tokenizer.model_max_length == 64
    gc.smolvlm_tokenizer(processor, sizes)
    processor.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 8192
    loaded = transformers.AutoProcessor.from_pretrained(tmp_path)
    assert loaded.tokenizer.model_max_length == 8192

    class Messages(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.seen: list[str] = []

        def emit(self, record):
            self.seen.append(record.getMessage())

    def warnings_of(tokenizer) -> list[str]:
        messages, library = Messages(), transformers.logging.get_logger("transformers")
        library.addHandler(messages)
        try:
            assert len(tokenizer(" ".join(["red"] * 78))["input_ids"]) >= 78
        finally:
            library.removeHandler(messages)
        return [m for m in messages.seen if "maximum sequence length" in m]

    assert not warnings_of(loaded.tokenizer)
    assert warnings_of(tiny_vlm("idefics3")[1].tokenizer)  # the control: the world tokenizer's 64 warns


def test_gpu_wheels_dry_run_names_the_wheels_the_gpu_check_carries(tmp_path):
    """``benchmarks/gpu_wheels.sh --dry-run`` prints its one pip command and downloads nothing: binary wheels for
    python 3.12 on manylinux x86_64 without dependencies into WHEELS, transformers at the installed version, the
    pyproject's pins for bitsandbytes, platformdirs, snowballstemmer, isal, lemminflect and tenacity, transformers'
    own regex requirement, num2words (SmolVLM's processor)."""
    import importlib.metadata as md
    import shlex
    import tomllib

    wheels = tmp_path / "wheels"
    env = {**os.environ, "WHEELS": str(wheels), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_wheels.sh"), "--dry-run"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    argv = shlex.split(line)
    assert argv[:4] == [sys.executable, "-m", "pip", "download"]
    for flags in (["--no-deps"], ["--only-binary=:all:"], ["--python-version", "3.12"], ["-d", str(wheels)],
                  ["--platform", "manylinux2014_x86_64"]):  # fmt: skip
        assert any(argv[i : i + len(flags)] == flags for i in range(len(argv))), (flags, argv)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {s.split(">")[0].split("<")[0].split("=")[0]: s for s in project["dependencies"]}
    pinned = [pins[n] for n in ("platformdirs", "snowballstemmer", "isal", "lemminflect", "tenacity")]
    regex = next(r for r in md.requires("transformers") if r.startswith("regex"))
    assert argv[argv.index(str(wheels)) + 1 :] == [
        f"transformers=={md.version('transformers')}", *project["optional-dependencies"]["quant"], *pinned,
        regex.split(";")[0], "num2words",
    ]  # fmt: skip
    assert not wheels.exists()  # nothing downloaded, no folder made
    bad = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_wheels.sh"), "--download"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "usage" in bad.stderr and not wheels.exists()


def test_gpu_wheels_without_transformers_says_so_in_one_line(tmp_path):
    """A PYTHON without transformers (the repository's .venv absent, the machine's python3 bare), whose version the
    wheels are for: one line naming it and what to do, exit non-zero, nothing downloaded; it was a traceback of
    importlib.metadata's PackageNotFoundError. The python here is the tests' own, started without its site-packages
    (``-S``), where transformers is not."""
    bare = _stand_in_python(tmp_path, f'exec {shlex.quote(sys.executable)} -S "$@"', lacking="transformers")
    _gpu_wheels_stops_with(
        bare,
        f"benchmarks/gpu_wheels.sh: {bare} has no transformers, whose version the wheels are for: run it with "
        "finecap's .venv (make install) or PYTHON set to a python that has transformers",
        tmp_path,
    )


def _stand_in_python(tmp_path: Path, line: str, lacking: str) -> Path:
    """A ``python`` script in ``tmp_path`` running the shell ``line`` (the tests' python, started otherwise), checked
    to lack the module ``lacking``."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\n{line}\n")
    python.chmod(0o755)
    assert subprocess.run([str(python), "-c", f"import {lacking}"], capture_output=True, timeout=60).returncode != 0
    return python


def _gpu_wheels_stops_with(python: Path, line: str, tmp_path: Path) -> None:
    """benchmarks/gpu_wheels.sh with PYTHON=``python``, with and without --dry-run: exit non-zero, nothing on
    standard output, ``line`` alone on standard error, nothing downloaded."""
    wheels = tmp_path / "wheels"
    env = {**os.environ, "WHEELS": str(wheels), "PYTHON": str(python)}
    for argv in ([], ["--dry-run"]):
        proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_wheels.sh"), *argv], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=60)  # fmt: skip
        assert proc.returncode != 0 and proc.stdout == "", proc
        assert proc.stderr.splitlines() == [line], proc.stderr
    assert not wheels.exists()


def test_gpu_wheels_on_a_python_without_tomllib_says_so_in_one_line(tmp_path):
    """A PYTHON older than 3.11 (a machine's python3.10), which has no tomllib to read pyproject.toml's pins: one
    line naming it, its version and what to do, exit non-zero, nothing downloaded; it was a traceback of
    ModuleNotFoundError. Here the tests' own python stands in for it, with a ``tomllib`` on its path that raises what
    python 3.10's import does."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "tomllib.py").write_text('raise ModuleNotFoundError("No module named \'tomllib\'", name="tomllib")\n')
    old = _stand_in_python(tmp_path, f'PYTHONPATH={shlex.quote(str(shadow))} exec {shlex.quote(sys.executable)} "$@"',
                           lacking="tomllib")  # fmt: skip
    _gpu_wheels_stops_with(
        old,
        f"benchmarks/gpu_wheels.sh: {old} is python {sys.version.split()[0]}, without tomllib (python >= 3.11, as "
        "finecap requires), which reads pyproject.toml's pins: run it with finecap's .venv (make install) or PYTHON "
        "set to a python >= 3.11 that has transformers",
        tmp_path,
    )


def replayed_grpo_line(tmp_path, monkeypatch, rows: list[dict]) -> tuple[dict, list]:
    """``check_grpo`` (not the smoke: 6 steps at the recipe's sizes) with finecap's training faked to log ``rows`` to
    the run's ``metrics.jsonl`` (one per step, as ``train.log_every=1`` writes them), on setup's tokenizer and data
    written small: the line as the check would judge it, and the configurations ``train`` was given."""
    import finecap.train.run
    from finecap.models.presets import vlm_tokenizer
    from finecap.runs import METRICS_FILE, encode_event
    from helpers.scripts import benchmark

    gc = benchmark("gpu_check")
    ctx = gc.Ctx(smoke=False, work=tmp_path, sizes={"data_split": (4, 2, 2), "data_image": (8, 6)})
    vlm_tokenizer("idefics3").save_pretrained(tmp_path / "smolvlm")
    (tmp_path / "smolvlm" / "config.json").write_text("{}")
    gc.write_karpathy(ctx)
    given = []

    def train(cfg, callbacks, overwrite):
        given.append(cfg)
        run = Path(cfg.run.dir)
        run.mkdir(parents=True, exist_ok=True)
        for step, values in enumerate(rows, 1):
            event = {"step": step, "epoch": step / 10, "split": "train", "values": values}
            with open(run / METRICS_FILE, "a") as f:
                f.write(json.dumps(encode_event(event)) + "\n")
            for callback in callbacks:
                callback(None)

    monkeypatch.setattr(finecap.train.run, "train", train)
    return gc.check_grpo(ctx), given


def test_the_learning_signal_rule_fails_when_no_step_logged_zero_std_groups():
    """Rewards equal in every group, gradient norms of float rounding: failed when the run logs
    ``zero_std_groups`` 1.0, and also when it logs no ``zero_std_groups`` at all (a renamed metric, an advantage that
    is not per group), which the rule read as nothing wrong and passed; steps that did not log it are left out of the
    rule, not counted as groups that differed."""
    from helpers.scripts import benchmark

    gpu_check = benchmark("gpu_check")
    rows = [{"loss": 0.0, "reward": 2e-12, "grad_norm": 8.9e-9, "zero_std_groups": 1.0} for _ in range(3)]
    _, problem = gpu_check.learning_signal(rows)
    assert problem is not None and problem.startswith("every group's rewards were equal"), problem
    silent = [{k: v for k, v in r.items() if k != "zero_std_groups"} for r in rows]
    signal, problem = gpu_check.learning_signal(silent)
    assert signal["zero_std_groups"] == [None] * 3
    assert problem == "no step logged zero_std_groups: whether any group's rewards differed is unknown"
    gaps = [silent[0], *rows[1:]]
    _, problem = gpu_check.learning_signal(gaps)
    assert problem is not None and problem.startswith("every group's rewards were equal"), problem
    _, problem = gpu_check.learning_signal([{**r, "zero_std_groups": 0.5} for r in rows])
    assert problem is None


def test_the_grpo_line_fails_when_its_run_logged_no_learning_signal(tmp_path, monkeypatch):
    """The 2026-11-28 H200 grpo line passed with losses of 0 and +-1e-15 and nothing showing a gradient. Replayed
    with what that setup's run logs (measured on the CPU at SmolVLM's vocabulary: every group's rewards equal,
    gradient norm 0, or 9e-9 from rewards of 2e-12), it fails, naming why; a NaN gradient norm or loss fails; a run
    with a gradient passes, its per-step signal recorded."""
    record = next(c for c in json.loads((ROOT / "benchmarks" / "results" / "gpu_check_h200_2026-11-28.json")
                                        .read_text())["checks"] if c["name"] == "grpo")  # fmt: skip
    flat = {"reward": 0.0, "advantage_std": 0.0, "advantage/min": 0.0, "advantage/max": 0.0, "zero_std_groups": 1.0}
    replay = [{"loss": loss, **flat, "grad_norm": 0.0} for loss in record["losses"]]
    line, _ = replayed_grpo_line(tmp_path / "a", monkeypatch, replay)
    assert line["status"] == "fail" and "no step had a finite, non-zero grad_norm" in line["error"], line
    assert line["learning_signal"]["grad_norm"] == [0.0] * 6 and line["losses"] == record["losses"]
    rounding = [dict(r) for r in replay]
    rounding[1].update(grad_norm=8.9e-9, reward=2.2e-12, advantage_std=1.2e-7)
    line, _ = replayed_grpo_line(tmp_path / "b", monkeypatch, rounding)
    assert line["status"] == "fail" and line["error"].startswith("every group's rewards were equal"), line
    healthy = [{"loss": 1e-8, "reward": 0.002, "advantage_std": 0.66, "advantage/min": -0.7, "advantage/max": 2.4,
                "zero_std_groups": 0.5, "grad_norm": 0.04} for _ in range(6)]  # fmt: skip
    line, given = replayed_grpo_line(tmp_path / "c", monkeypatch, healthy)
    assert line["status"] == "pass" and "error" not in line, line
    assert (
        line["learning_signal"]["grad_norm"] == [0.04] * 6 and line["learning_signal"]["zero_std_groups"] == [0.5] * 6
    )
    assert "grad norm <= 0.04" in line["summary"]
    diverged = [dict(r) for r in healthy]
    diverged[3]["grad_norm"] = float("nan")
    diverged[4]["loss"] = float("inf")
    line, _ = replayed_grpo_line(tmp_path / "d", monkeypatch, diverged)
    assert line["status"] == "fail", line
    assert "loss not finite at step 5" in line["error"] and "grad_norm not finite at step 4" in line["error"]
    # the run trained on references the random policy can match: the recipe's max length in the tokenizer's words
    (cfg,) = given
    from finecap.models.presets import vlm_tokenizer

    words = set(vlm_tokenizer("idefics3").get_vocab())
    data = json.loads(Path(cfg.data.path).read_text())["images"]
    setup = json.loads((tmp_path / "c" / "data" / "dataset.json").read_text())["images"]
    assert Path(cfg.data.path).name == "grpo_dataset.json" and len(data) == len(setup) == 8
    assert [e["filename"] for e in data] == [e["filename"] for e in setup]
    for entry in data:
        assert len(entry["sentences"]) == 5
        for s in entry["sentences"]:
            assert len(s["raw"].split()) == cfg.decode.max_length == 40 and set(s["raw"].split()) <= words
    assert all(len(s["raw"].split()) <= 8 for e in setup for s in e["sentences"])  # setup's data left as it was
