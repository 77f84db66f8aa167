"""A command that stops under ``accelerate launch`` says why once (issue 49, item 4): a missing prerequisite met by
the main process (the world encoder of one's own data set) is relayed to the other process, which stops without a
line of its own instead of crashing at the next barrier with a traceback; a configuration error, the same on every
process, is printed by the main process only. (The launcher still reports the failed processes in its own words.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from PIL import Image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU machine"),
]


@pytest.fixture
def own_data(tmp_path):
    """Four images with captions, as one's own JSONL data set (never the world: nothing is prepared for it)."""
    for i in range(4):
        Image.new("RGB", (32, 32), (40 * i, 0, 0)).save(tmp_path / f"{i}.png")
    lines = [
        {"image": f"{i}.png", "captions": ["a red circle"], "split": "train" if i < 3 else "val"} for i in range(4)
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path / "d.jsonl"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], "the world encoder of this configuration"),  # met by the main process while preparing
        (["train.lr=abc"], "train.lr: expected a number"),  # met by every process alike, before any process group
    ],
)
def test_one_error_line_per_launched_command(own_data, tmp_path, launch_two, extra, expected):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FINECAP_HOME": str(tmp_path / "home")}
    cmd = [*launch_two, "-m", "finecap.app.cli", "train", "demo/mle", "data.format=jsonl", f"data.path={own_data}",
           "--out", str(tmp_path / "run"), *extra]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = [line for line in out.splitlines() if "finecap: error:" in line]
    assert len(errors) == 1 and expected in errors[0], out[-3000:]
    assert "[rank0]" not in out and "[rank1]" not in out, out[-3000:]  # no process's traceback
    assert "Connection closed by peer" not in out
