"""benchmarks/gpu_check.py's ``grpo_vllm`` check (issue 65) in the vLLM venv (``make vllm-test``): ``--cpu-smoke
--only grpo_vllm`` trains ``coco/grpo_cider_vlm`` for 5 steps on the tiny Idefics3 of setup with its rollouts on vLLM's
CPU backend (``decode.engine=vllm``), with finite losses, and records that vLLM refuses ``vllm.enable_sleep_mode``
on the CPU (its memory measurements are CUDA's: they run on a GPU only)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_grpo_vllm_check_trains_on_vllm_rollouts_and_records_the_cpu_refusal_to_sleep(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "VLLM_LOGGING_LEVEL": "ERROR"}  # fmt: skip
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-smoke", "--only",
                           "grpo_vllm", "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=420)  # fmt: skip
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    records = {r["name"]: r for r in report["checks"]}
    assert list(records) == ["setup", "grpo_vllm"], proc.stdout[-2000:]
    assert "smolvlm" in records["setup"]["built"] and "data" in records["setup"]["built"], records["setup"]
    record = records["grpo_vllm"]
    assert record["status"] == "pass", (record.get("error"), record.get("traceback"), record.get("log_tail"))
    assert record["engine"] == "vllm" and record["enable_sleep_mode"] is False and record["sleeps"] == 0
    assert len(record["losses"]) == record["steps"] == 5 and all(math.isfinite(x) for x in record["losses"])
    assert all(record["time/sync"]), record["time/sync"]  # every step's rollout synced the policy into vLLM
    assert math.isfinite(record["seconds_per_step"]) and record["captions_per_second"] > 0
    sleep = record["sleep"]
    assert sleep.startswith("refused on the CPU") and "vllm.enable_sleep_mode" in sleep and "GPU" in sleep, sleep
    assert "grpo_vllm" in proc.stdout[proc.stdout.index("check ") :]
