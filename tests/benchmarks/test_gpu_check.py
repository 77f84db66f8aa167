"""benchmarks/gpu_check.py --cpu-smoke (issue 65): the GPU check's plumbing on the CPU at the tiniest sizes, so that it
cannot rot between the rare runs on a GPU. Every check gets a status; the table is printed; what has a CPU stand-in
(bfloat16 on the CPU, FSDP2 over gloo, bitsandbytes' CPU 4-bit layers) passes; ``grpo_vllm`` is skipped where vLLM
is not installed (its run on vLLM's CPU backend: tests/engines/test_vllm_gpu_check.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

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
    # the measurements first, the families last: a budget that runs short leaves families unchecked
    in_order = [*MUST_PASS[:2], "qlora", *MUST_PASS[5:7], *MUST_PASS[8:], "grpo_vllm", "trl", *families]
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
