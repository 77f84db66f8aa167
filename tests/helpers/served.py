"""A tiny world served by the reward server, for tests/serve and the adapters' tests: the ``served`` fixture of
tests/conftest.py builds it once per session.

:func:`make_served` makes a world of :data:`N_TRAIN` training scenes and a tiny random CLIP (the retriever), and
builds two services as ``finecap serve-reward`` builds them (:func:`finecap.app.serve_reward.build_service`: the
training loop's reward, set up with its context): the NDLB mixture ``retrieval 1.0 + cider 0.5`` and CIDEr-D alone.
:func:`fixture_captions` gives the 1,000 captions of the identity tests, cut into :data:`GROUP` requests of 100;
:func:`serving` runs a service on 127.0.0.1 (a free port) in a thread."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

N_TRAIN = 100
N_CAPTIONS = 1000
GROUP = 100  # captions per request: 10 requests of 100, each over ~60 distinct images


def make_served(root: Path) -> dict:
    """``{"cfg", "mix", "cider", "records", "captions", "image_ids", "groups", "clip"}`` (module docstring)."""
    from finecap.app.serve_reward import build_service
    from finecap.config import load
    from finecap.data.datasets import load_records
    from helpers.tiny_run import tiny_world_and_clip

    overrides, clip = tiny_world_and_clip(root, N_TRAIN, 8, 8)
    base = [*overrides, f"retriever.checkpoint={clip}", f"run.dir={root / 'run'}"]
    cfg = load(None, [*base, "rl.rewards={retrieval: 1.0, cider: 0.5}"])
    mix = build_service(cfg, log_every=0)
    cider = build_service(load(None, [*base, "rl.rewards={cider: 1.0}"]), log_every=0)
    records = load_records(cfg, "train")
    captions, ids = fixture_captions(records)
    groups = [(captions[i : i + GROUP], ids[i : i + GROUP]) for i in range(0, len(captions), GROUP)]
    return {"cfg": cfg, "base": base, "mix": mix, "cider": cider, "records": records, "captions": captions,
            "image_ids": ids, "groups": groups, "clip": clip}  # fmt: skip


def fixture_captions(records: list, n: int = N_CAPTIONS, seed: int = 0) -> tuple[list[str], list]:
    """``n`` captions with the image each describes: a reference of its own image, a reference of another image,
    or the first words of its own reference, in a fixed random order (seeded)."""
    rng = random.Random(seed)
    captions, ids = [], []
    for k in range(n):
        record = records[rng.randrange(len(records))]
        kind = k % 3
        if kind == 0:
            text = rng.choice(record.captions)
        elif kind == 1:
            text = rng.choice(records[rng.randrange(len(records))].captions)
        else:
            words = rng.choice(record.captions).split()
            text = " ".join(words[: max(2, len(words) // 2)])
        captions.append(text)
        ids.append(record.image_id)
    return captions, ids


@contextlib.contextmanager
def serving(service) -> Iterator[str]:
    """``service`` on 127.0.0.1 at a free port, in a thread, for the block: its base URL."""
    from finecap.serve.app import make_server

    server, sock = make_server(service)
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the reward server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


PROMPT = "<|im_start|>user\n<image>Describe the image in detail.<|im_end|>\n<|im_start|>assistant\n"


def every_front_end(reward, url: str, captions: list[str], ids: list) -> dict[str, list[float]]:
    """The totals of one call (``captions`` of the images ``ids``) through every front end: in process, the server's
    two endpoints and its client, and each adapter over the reward in process and over the server at ``url``."""
    import asyncio
    import json

    import httpx

    from finecap.integrations.openrlhf import reward_function
    from finecap.integrations.swift import async_orm, orm
    from finecap.integrations.trl import TrlReward
    from finecap.integrations.verl import VerlReward, compute_score_batch
    from finecap.rewards import call_batch
    from finecap.serve.client import RewardClient

    n = len(captions)
    infos = [{"image_id": i} for i in ids]
    queries = [PROMPT + c + "<|im_end|>" for c in captions]
    labels = [json.dumps({"image_id": i}) for i in ids]
    conversational = [[{"role": "assistant", "content": [{"type": "text", "text": c}]}] for c in captions]
    return {
        "in process": reward(captions, call_batch(ids)).total.tolist(),
        "server /reward": httpx.post(f"{url}/reward", json={"captions": captions, "image_ids": ids}).json()["total"],
        "server /get_reward": httpx.post(f"{url}/get_reward", json={"query": queries, "prompts": [PROMPT] * n,
                                                                     "labels": labels}).json()["rewards"],
        "client": RewardClient(url).score(captions, ids).total,
        "TRL": TrlReward("r", reward)(prompts=[PROMPT] * n, completions=conversational, image_id=ids),
        "verl batch": [r["score"] for r in VerlReward(reward).batch(["finecap"] * n, captions, [""] * n, infos)],
        "verl batch, server": [r["score"] for r in compute_score_batch(["finecap"] * n, captions, [""] * n, infos,
                                                                        url=url)],
        "ms-swift ORM": orm(reward)()(captions, image_id=ids, trainer_state=None),
        "ms-swift ORM, server": orm(url=url)()(captions, image_id=ids, trainer_state=None),
        "ms-swift AsyncORM, server": asyncio.run(async_orm(url)()(captions, image_id=ids, trainer_state=None)),
        "OpenRLHF reward_func": reward_function(reward)(queries, [PROMPT] * n, labels)["rewards"].tolist(),
        "OpenRLHF reward_func, server": reward_function(url=url)(queries, [PROMPT] * n, labels)["rewards"].tolist(),
    }  # fmt: skip
