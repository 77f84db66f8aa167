"""``finecap serve-reward demo/sr_bagcurri`` from an empty working directory, as from a fresh clone: the command
makes (or finds, in the finecap home) the world and trains (or finds) its world encoder, the retriever of NDLB's
reward SR + 0.5 CIDEr-D, then serves it; the world at the quick demo's size (``--quick``'s world and retriever
settings, so that the session's quick demo and this test share them), one slow test."""

from __future__ import annotations

import json

import httpx
import pytest

from finecap.app.serve_reward import load_reward
from finecap.config import load
from finecap.data.datasets import load_records
from finecap.recipes.settings import DEMO_QUICK
from finecap.rewards import call_batch
from helpers.served import serve_command


@pytest.mark.slow
def test_serve_reward_demo_sr_bagcurri_from_an_empty_directory(tmp_path):
    quick = [f"{section}.{key}={value}" for section in ("world", "retriever")
             for key, value in DEMO_QUICK[section].items()]  # fmt: skip
    with serve_command(["demo/sr_bagcurri", *quick], tmp_path) as command:
        assert "finecap serve-reward: 1*retrieval + 0.5*cider over 300 training images" in command.out
        records = load_records(load("demo/sr_bagcurri", quick), "train")[:8]
        captions, ids = [r.captions[0] for r in records], [r.image_id for r in records]
        got = httpx.post(f"{command.url}/reward", json={"captions": captions, "image_ids": ids}, timeout=120).json()
        assert len(got["total"]) == 8 and set(got["parts"]) >= {"retrieval", "cider", "retrieval/accuracy"}
        assert min(got["parts"]["cider"]) > 1.0  # each caption is a reference of its image
        body = {"query": captions, "labels": [json.dumps({"image_id": i}) for i in ids]}
        assert httpx.post(f"{command.url}/get_reward", json=body, timeout=120).json()["rewards"] == got["total"]
    assert command.code == 0, command.err
    assert "stopped after 2 requests scored (16 captions), 0 failed, 0 timed out, 0 left" in command.out
    assert not list(tmp_path.iterdir())  # the world and its encoder went to the finecap home, not here
    # the values are those of the training loop's reward on the same world and encoder (found in the home now)
    reward, _ = load_reward(load("demo/sr_bagcurri", quick))
    assert reward(captions, call_batch(ids)).total.tolist() == got["total"]
