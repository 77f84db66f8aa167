"""The retrievers of validation and of ``finecap eval`` run on the accelerator's device, not a hard-coded CPU.

This machine has no GPU, so these tests check that the device *flows*: to :func:`load_retriever`, from the
accelerator to the retrieval validator, and from ``torch.accelerator`` (made to report a device) to ``finecap eval``'s
groups. A ``meta`` device stands for the GPU where weights can move without computing; whether a CLIP model then runs
on a real GPU is accelerate's and torch's business.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

import finecap.train.validators as validators
from finecap.data.datasets import load_records
from finecap.metrics.context import EvalContext
from finecap.models.memory import eval_device
from finecap.models.retriever import load_retriever


def test_load_retriever_puts_the_model_on_the_device_asked(make_cfg, clip_dir):
    cfg = make_cfg(f"retriever.checkpoint={clip_dir}")
    assert load_retriever(cfg).device.type == "cpu"  # the default: where from_pretrained loads it
    assert load_retriever(cfg, device="meta").device.type == "meta"


def test_finecap_eval_runs_the_retriever_on_the_accelerator(make_cfg, clip_dir, monkeypatch):
    cfg = make_cfg(f"retriever.checkpoint={clip_dir}")
    assert eval_device(cfg) == torch.device("cpu")  # this machine: no accelerator
    # a machine with an accelerator device (stood in for by meta): the retriever goes there, unless train.cpu
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("meta"))
    assert eval_device(cfg) == torch.device("meta")
    assert EvalContext(predictions={}, references=None, cfg=cfg).get_retriever().device.type == "meta"
    cpu_cfg = make_cfg(f"retriever.checkpoint={clip_dir}", "train.cpu=true")
    assert EvalContext(predictions={}, references=None, cfg=cpu_cfg).get_retriever().device.type == "cpu"


def test_the_retrieval_validator_moves_its_retriever_to_the_accelerators_device(make_cfg, clip_dir, monkeypatch):
    cfg = make_cfg(f"retriever.checkpoint={clip_dir}")
    moved = []
    real_load = validators.load_retriever

    def load(cfg):
        retriever = real_load(cfg)
        to = retriever.model.to
        retriever.model.to = lambda device: (moved.append(device), to(device))[1]
        return retriever

    monkeypatch.setattr(validators, "load_retriever", load)
    val = load_records(cfg, "val")
    captions = {r.image_id: r.captions[:1] for r in val}
    monkeypatch.setattr(validators, "generate_captions", lambda *a, **k: captions)  # the references as captions
    validator = validators.retrieval_validator(cfg)
    assert moved == []  # loaded (a missing retriever stops the run before training), moved at the first evaluation
    # an accelerator whose device is the CPU with an index: a device object the validator cannot have made itself
    device = torch.device("cpu", 0)
    accelerator = SimpleNamespace(device=device, process_index=0, num_processes=1)
    values = validator(None, cfg, accelerator)
    assert moved == [device] and 0.0 <= values["r@1"] <= 1.0
    validator(None, cfg, accelerator)
    assert moved == [device]  # once
