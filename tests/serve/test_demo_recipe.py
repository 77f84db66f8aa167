"""``finecap serve-reward demo/sr_bagcurri`` from an empty working directory, as from a fresh clone: the command
makes (or finds, in the finecap home) the world and trains (or finds) its world encoder, the retriever of NDLB's
reward SR + 0.5 CIDEr-D, then serves it; the world at the quick demo's size (``--quick``'s world and retriever
settings, so that the session's quick demo and this test share them), one slow test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from finecap.recipes.settings import DEMO_QUICK

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.slow
def test_serve_reward_demo_sr_bagcurri_from_an_empty_directory(tmp_path):
    quick = [f"{section}.{key}={value}" for section in ("world", "retriever")
             for key, value in DEMO_QUICK[section].items()]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "finecap.app.cli", "serve-reward", "demo/sr_bagcurri", *quick, "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert "finecap serve-reward: 1*retrieval + 0.5*cider over 300 training images on http://127.0.0.1:" in line, (
            line + (proc.stderr.read() if proc.poll() is not None else ""))  # fmt: skip
        url = line.split(" on ")[1].split()[0]
        from finecap.config import load
        from finecap.data.datasets import load_records

        records = load_records(load("demo/sr_bagcurri", quick), "train")[:8]
        captions = [r.captions[0] for r in records]
        got = httpx.post(f"{url}/reward", json={"captions": captions, "image_ids": [r.image_id for r in records]},
                         timeout=120).json()  # fmt: skip
        assert len(got["total"]) == 8 and set(got["parts"]) >= {"retrieval", "cider", "retrieval/accuracy"}
        assert min(got["parts"]["cider"]) > 1.0  # each caption is a reference of its image
        body = {"query": captions, "labels": [json.dumps({"image_id": r.image_id}) for r in records]}
        assert httpx.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"] == got["total"]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped after 2 requests (16 captions)" in out
    assert not list(tmp_path.iterdir())  # the world and its encoder went to the finecap home, not here
    # the values are those of the training loop's reward on the same world and encoder (found in the home now)
    from finecap.app.serve_reward import load_reward
    from finecap.rewards import call_batch

    reward, _ = load_reward(load("demo/sr_bagcurri", quick))
    assert reward(captions, call_batch([r.image_id for r in records])).total.tolist() == got["total"]
