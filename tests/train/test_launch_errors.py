"""A command that stops under ``accelerate launch`` says why once (issue 49, item 4): a missing prerequisite met by
the main process (the world encoder of one's own data set) is relayed to the other process, which stops without a
line of its own instead of crashing at the next barrier with a traceback; a mistake in the command line, a
configuration or data error, the same on every process, and Ctrl-C, which the launcher passes to every process, are
said by the main process only. (The launcher still reports the failed processes in its own words.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
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
    said_once(cmd, env, expected)


def said_once(cmd: list[str], env: dict[str, str], expected: str) -> None:
    """Run the failing launch ``cmd``: one ``finecap: error:`` line, holding ``expected``, and no traceback of a
    process (the launcher's own, torchrun's summary, is the one traceback)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = [line for line in out.splitlines() if "finecap: error:" in line]
    assert len(errors) == 1 and expected in errors[0], out[-3000:]
    assert "[rank0]" not in out and "[rank1]" not in out, out[-3000:]  # no process's traceback
    assert out.count("Traceback (most recent call last)") == 1 and "ChildFailedError" in out, out[-3000:]
    assert "Connection closed by peer" not in out


def test_a_data_error_every_process_meets_said_once(own_data, tiny_encoder, tmp_path, launch_two):
    """An image file the data set names is missing: every process reads the data set and stops at it (it used to be
    printed by each)."""
    with own_data.open("a") as f:
        f.write(json.dumps({"image": "missing.png", "captions": ["a red circle"], "split": "train"}) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FINECAP_HOME": str(tmp_path / "home")}
    cmd = [*launch_two, "-m", "finecap.app.cli", "train", "data.format=jsonl", f"data.path={own_data}",
           f"model.encoder={tiny_encoder}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2",
           "train.validators=[]", "--out", str(tmp_path / "run")]  # fmt: skip
    said_once(cmd, env, "1 of 5 image files do not exist")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["train", "demo/mle", "--reusme"], "finecap train: error: unrecognized arguments: --reusme"),  # argparse's
        (["train"], "usage: finecap train RECIPE"),  # a bare `finecap train`: its usage and the recipes
    ],
)
def test_a_usage_mistake_said_once(tmp_path, launch_two, argv, line):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FINECAP_HOME": str(tmp_path / "home")}
    proc = subprocess.run([*launch_two, "-m", "finecap.app.cli", *argv], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count(line) == 1, out[-3000:]


def test_ctrl_c_said_once(own_data, tiny_encoder, tmp_path, launch_two):
    """Ctrl-C stops a launched training run with one ``finecap: interrupted`` (the launcher passes SIGINT to every
    process; each said it)."""
    import psutil

    from helpers.waiting import until

    env = {**os.environ, "OMP_NUM_THREADS": "1", "FINECAP_HOME": str(tmp_path / "home"), "TQDM_DISABLE": "1"}
    run = tmp_path / "run"
    cmd = [*launch_two, "-m", "finecap.app.cli", "train", "data.format=jsonl", f"data.path={own_data}",
           f"model.encoder={tiny_encoder}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2",
           "train.validators=[]", "train.batch_size=1", "train.max_steps=100000", "train.log_every=1",
           "--out", str(run)]  # fmt: skip
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    workers = []
    try:
        metrics = run / "metrics.jsonl"
        until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, "training did not start",
              timeout=240, every=0.2)  # fmt: skip
        workers = psutil.Process(launcher.pid).children(recursive=True)
        launcher.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends it
        out, _ = launcher.communicate(timeout=120)
    finally:
        for worker in workers:  # torchrun starts each in a session of its own: stopped here should the launcher hang
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
        launcher.kill()
        launcher.wait()
    assert out.count("finecap: interrupted") == 1, out[-3000:]
    assert "finecap: error" not in out, out[-3000:]
