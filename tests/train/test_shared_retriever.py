"""A run with the self-retrieval reward and the retrieval validator loads the frozen retriever once and both use that
one object (:class:`finecap.models.retriever.SharedRetrievers`), where each used to load its own copy (0.56 GiB of
CLIP ViT-B/32 each on the device); and sharing it changes no number the run logs: the reward's values, the
validator's R@1 and everything they move are bit for bit those of a run whose two components load their own."""

from __future__ import annotations

import contextlib
import json

import pytest

from finecap.models.retriever import Retriever
from finecap.train.run import train

SR = ["train.objective=reinforce", "rl.rewards={retrieval: 1.0}", "rl.samples=2", "rl.baseline=leave_one_out",
      "rl.strategy=sample", "train.batch_size=8", "decode.max_length=8", "train.lr=1e-3", "train.max_steps=2",
      "train.eval_every=1", "train.validators=[retrieval]", "train.eval_samples=8"]  # fmt: skip


def counted_loads(monkeypatch) -> list[Retriever]:
    """Every retriever :meth:`Retriever.from_pretrained` loads from now on, in order."""
    loads: list[Retriever] = []
    real = Retriever.from_pretrained

    def from_pretrained(cls, *args, **kwargs):
        loads.append(real(*args, **kwargs))
        return loads[-1]

    monkeypatch.setattr(Retriever, "from_pretrained", classmethod(from_pretrained))
    return loads


def logged(run_dir) -> list[tuple]:
    """The run's logged numbers (step, split, values), wall-clock times left out."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(e["step"], e["split"], {k: v for k, v in e["values"].items() if "time" not in k and "second" not in k})
            for e in events]  # fmt: skip


@pytest.mark.slow
def test_a_run_loads_one_retriever_for_the_reward_and_the_validator_and_logs_the_same_numbers(
    make_cfg, clip_dir, monkeypatch
):
    loads = counted_loads(monkeypatch)
    shared = train(make_cfg(*SR, f"retriever.checkpoint={clip_dir}", run="shared"))
    assert len(loads) == 1  # the reward's and the validator's: one object (two loads before)
    # the same run with each component loading its own copy, as before (its own feature cache too, so that nothing
    # it computes is read from the first run's)
    monkeypatch.setattr("finecap.train.run.SharedRetrievers", contextlib.nullcontext)
    own = train(make_cfg(*SR, f"retriever.checkpoint={clip_dir}", f"run.cache_dir={shared.parent / 'own_cache'}",
                         run="own"))  # fmt: skip
    assert len(loads) == 3 and loads[1] is not loads[2]
    numbers = logged(shared)
    assert any("reward/retrieval" in v for _, split, v in numbers if split == "train")
    assert sum("r@1" in v for _, split, v in numbers if split == "val") == 2  # both evaluations scored R@1
    assert numbers == logged(own)


def test_shared_retrievers_share_only_the_same_settings_and_move_to_the_device_asked(make_cfg, clip_dir, monkeypatch):
    from finecap.models.retriever import SharedRetrievers, load_retriever

    loads = counted_loads(monkeypatch)
    cfg = make_cfg(f"retriever.checkpoint={clip_dir}")
    shared = SharedRetrievers()
    with shared:
        first = load_retriever(cfg)
        assert load_retriever(cfg, device="meta") is first and first.device.type == "meta"  # moved there
        assert load_retriever(cfg) is first and first.device.type == "meta"  # no device asked: left where it is
        other_batch = load_retriever(cfg, batch_size=3)
        chunks = load_retriever(make_cfg(f"retriever.checkpoint={clip_dir}", "retriever.long_text=chunks"))
        draft = load_retriever(make_cfg(f"retriever.checkpoint={clip_dir}", "data.jpeg_draft=false"))
    assert len(loads) == 4 and len({id(r) for r in (first, other_batch, chunks, draft)}) == 4
    assert (other_batch.batch_size, chunks.long_text, draft.jpeg_draft) == (3, "chunks", False)
    with shared:  # a second block of the same object: what the first loaded
        assert load_retriever(cfg) is first
    assert load_retriever(cfg) is not first and len(loads) == 5  # outside any block: a copy of its own
