"""One process of tests/train/test_fsdp_loading.py (started 2 times by ``accelerate launch``): the training model of a
VLM checkpoint built sharded as ``finecap train train.strategy=fsdp`` builds it
(:func:`finecap.train.setup.build_sharded_model`), one checkpoint after another in one launch, with what each process
saw recorded into ``<out>/<case>.rank<r>.json``:
its parameters' devices when sharding began, whether each full parameter and each buffer equals the main process's
loaded one exactly, and which parameter names are one tensor (ties)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from finecap.config import load
from finecap.models import sharding
from finecap.train import setup
from finecap.train.engine import process_state
from finecap.utils.system import leave_process_group


def record_case(cfg, state, rank: int) -> dict:
    """Build ``cfg``'s training model sharded and say what this process saw (module docstring)."""
    seen: dict = {}
    shard = sharding.shard_captioner

    def recording(model, mixed_precision="no", device=None):
        seen["devices"] = sorted({p.device.type for p in model.parameters()})
        seen["loaded"] = {k: v.detach().clone() for k, v in model.state_dict().items()} if rank == 0 else None
        return shard(model, mixed_precision, device)

    sharding.shard_captioner = recording
    try:
        torch.manual_seed(rank)  # the processes' random parts (LoRA adapters) differ until the main one's arrive
        model, layers = setup.build_sharded_model(cfg, None, "cpu", state.is_main_process)
    finally:
        sharding.shard_captioner = shard
    sent = [seen["loaded"]]
    dist.broadcast_object_list(sent, src=0)  # the main process's weights as loaded, before sharding
    main_state = sent[0]
    params = dict(model.named_parameters())
    equal = {}
    for name, p in params.items():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()  # a collective: same order everywhere
        equal[name] = bool(full.dtype == main_state[name].dtype and torch.equal(full, main_state[name]))
    buffers_equal = {}
    for name, b in model.named_buffers():
        other = [b.detach().clone()]
        dist.broadcast_object_list(other, src=0)
        buffers_equal[name] = bool(torch.equal(b, other[0]))
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    ties = sorted(group for group in names.values() if len(group) > 1)  # names that are one parameter
    return {"devices": seen["devices"], "layers": len(layers), "equal": equal, "buffers_equal": buffers_equal,
            "ties": ties, "params": len(params),
            "sharded": sum(1 for p in params.values() if hasattr(p, "full_tensor"))}  # fmt: skip


def main() -> None:
    """``<out> <cases JSON: {case: overrides}>``: every case built in turn in this one launch, each recorded into
    ``<out>/<case>.rank<r>.json``."""
    out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    state = None
    for case, overrides in cases.items():
        cfg = load(None, ["train.strategy=fsdp", *overrides])
        if state is None:
            state = process_state(cfg.train)  # the launch's processes, as training sets them up (gloo on the CPU)
        rank = dist.get_rank()
        assert state.is_main_process == (rank == 0) and state.num_processes == 2
        (out / f"{case}.rank{rank}.json").write_text(json.dumps(record_case(cfg, state, rank)))
        dist.barrier()
    leave_process_group()  # as the finecap command does: a gloo group alive at exit may abort the process


if __name__ == "__main__":
    main()
