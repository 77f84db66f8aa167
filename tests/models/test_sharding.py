"""``finecap.models.sharding`` in one process: a 1-process gloo group is enough for FSDP2's mechanics (what is
sharded, the mixed-precision policy, full parameters for decoding); tests/train/test_fsdp.py runs 2 processes."""

from __future__ import annotations

import pytest
import torch

from finecap.config import ClipCapBackboneConfig, DecodeConfig
from finecap.models import sharding
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm


def captioner(seed: int = 0) -> ClipCap:
    torch.manual_seed(seed)
    lm, tok = build_world_lm(layers=2, hidden=32, heads=2, dropout=0.0)
    return ClipCap(lm, tok, 24, ClipCapBackboneConfig(prefix_length=2))


def batch() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"features": torch.randn(3, 24, generator=g), "input_ids": torch.tensor([[5, 6, 2], [7, 2, 0], [9, 9, 2]]),
            "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])}  # fmt: skip


def test_the_transformer_layers_and_the_root_are_sharded(group):
    model = captioner()
    assert sharding.shard_layers(model) == ["lm.transformer.h.0", "lm.transformer.h.1"]  # GPT2Block, outermost only
    assert sharding.shard_captioner(model) == ["lm.transformer.h.0", "lm.transformer.h.1"]
    assert sharding.is_sharded(model) and len(sharding.fsdp_modules(model)) == 3
    assert all(type(p).__name__ == "DTensor" for p in model.parameters())


def test_sharded_logits_and_decoding_equal_the_plain_model(group):
    plain, model = captioner().eval(), captioner().eval()
    sharding.shard_captioner(model)
    with torch.no_grad():
        assert torch.allclose(model(batch()), plain(batch()), atol=1e-6)
    cfg = DecodeConfig(strategy="greedy", max_length=6)
    with sharding.decoding(model) as full:
        assert not any(type(p).__name__ == "DTensor" for p in full.parameters())
        ours = full.generate(batch()["features"], cfg)
    assert torch.equal(ours.sequences, plain.generate(batch()["features"], cfg).sequences)
    assert all(type(p).__name__ == "DTensor" for p in model.parameters())  # resharded on exit


def test_bf16_policy_computes_in_bf16_and_keeps_float32_gradients(group):
    model = captioner()
    sharding.shard_captioner(model, "bf16")
    seen = []
    model.lm.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, i, o: seen.append((m.weight.dtype, o.dtype)))
    logits = model(batch())
    logits.float().sum().backward()
    assert seen == [(torch.bfloat16, torch.bfloat16)]  # gathered in bfloat16 for the forward
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)  # reduced into the float32 sharded parameters
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("checkpointing", [False, True], ids=["whole-logits", "checkpointing-vocab-chunks"])
def test_sharded_scores_are_no_view_and_equal_the_plain_model_with_gradients(group, checkpointing):
    """Given sequences scored by a sharded ClipCap in training mode (MLE under ``train.gradient_checkpointing``
    scores its captions so, in vocabulary chunks: ``scores_in_chunks``), as ``tests/train/test_fsdp.py``'s ``ckpt``
    run does: FSDP2 warns of no view returned by the root's forward (an in-place op on one would skip its
    pre-backward all-gather), and the log-probs, entropies and every gradient equal the plain model's bit for bit
    (one process: the all-gather and reduce-scatter move the same numbers)."""
    import warnings

    from finecap.models import memory

    models = [captioner().train(), captioner().train()]
    for model in models:
        if checkpointing:
            memory.enable_gradient_checkpointing(model)
        assert model.scores_in_chunks is checkpointing
    sharding.shard_captioner(models[1])
    b = batch()
    results = []
    for model in models:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(b, sequences=b["input_ids"], mask=b["attention_mask"].bool(), with_entropy=True)
        assert not [str(w.message) for w in caught if "view tensor" in str(w.message)]
        (out.logprobs.sum() - 0.3 * out.entropy.sum()).backward()
        grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                 for n, p in model.named_parameters() if p.grad is not None}  # fmt: skip
        results.append((out.logprobs.detach(), out.entropy.detach(), grads))
    (plain_lp, plain_ent, plain_grads), (lp, ent, grads) = results
    assert torch.equal(lp, plain_lp) and torch.equal(ent, plain_ent)
    assert grads.keys() == plain_grads.keys() and len(grads) > 0
    differ = [n for n in grads if not torch.equal(grads[n], plain_grads[n])]
    assert not differ, differ


def test_scalar_parameters_stay_whole_when_frozen_and_are_refused_when_trained(group):
    model = captioner()
    model.scale = torch.nn.Parameter(torch.tensor(2.0), requires_grad=False)
    sharding.shard_captioner(model)
    assert type(model.scale).__name__ == "Parameter"
    trained = captioner()
    trained.scale = torch.nn.Parameter(torch.tensor(2.0))
    with pytest.raises(ValueError, match="trained scalar parameters \\['scale'\\]"):
        sharding.shard_captioner(trained)


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_fsdp_with_a_quantized_base_is_refused_in_one_line(quantization, capsys):
    """``train.strategy=fsdp`` with ``model.quantization`` set (issue 65): one line naming both options, from the CLI
    when the configuration is built, before any world, encoder or model is made."""
    from finecap.app.cli import main

    code = main(["train", "demo/mle", "train.strategy=fsdp", f"model.quantization={quantization}", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1, err
    assert "train.strategy" in err[0] and f"fsdp cannot shard a model.quantization={quantization} base" in err[0]


def test_another_process_trains_what_the_main_process_trains(monkeypatch):
    # which vision-tower weights train is found by a forward pass (vision.reached_parameters), which a model built on
    # the meta device (a sharded run's other processes) cannot run: such a process takes the main one's flags, so
    # that every process trains the same parameters
    import torch.distributed as dist

    from finecap.models.sharding import match_main

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))

    main = model()
    main[1].requires_grad_(False)  # the main process found the norm unreached
    sent = {n: (tuple(p.shape), p.dtype, n, p.requires_grad) for n, p in main.named_parameters()}
    with torch.device("meta"):
        other = model()  # every flag on, as a meta build leaves it
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: objects.__setitem__(0, sent))
    match_main(other)
    assert {n: p.requires_grad for n, p in other.named_parameters()} == {
        "0.weight": True, "0.bias": True, "1.weight": False, "1.bias": False,
    }  # fmt: skip


def test_another_process_drops_the_tower_adapters_the_main_process_left_out(monkeypatch):
    # LoRA leaves out the tower layers the image features never reach (the tiny LLaVA reading its first hidden layer
    # of 2), found by a forward pass that a meta build cannot run: such a process adapts them all, and match_main
    # takes away those the main process does not have, so that every process shards the same parameters
    import torch.distributed as dist

    from finecap.config import load
    from finecap.models import lora
    from finecap.models.vlm import Vlm
    from helpers.vlm_families import tiny_family

    cfg = load(None, ["model.kind=vlm", "model.train_encoder=true", "lora.encoder=true", "lora.rank=2"])

    def build(device: str) -> Vlm:
        model, processor = tiny_family("llava")
        model.config.vision_feature_layer = -2
        return lora.configure_training(Vlm(model.to(device), processor, source="llava"), cfg)

    sent: list = []
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: sent.append(objects[0]))
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    main = build("cpu")
    sharding.match_main(main)  # what the main process sends
    other = build("meta")
    assert any(".layers.1." in n for n, _ in other.named_parameters() if "lora_" in n)  # every target adapted
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: objects.__setitem__(0, sent[0]))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    sharding.match_main(other)
    assert [n for n, _ in other.named_parameters()] == [n for n, _ in main.named_parameters()]
    assert {n: p.requires_grad for n, p in other.named_parameters()} == {
        n: p.requires_grad for n, p in main.named_parameters()
    }
    assert lora.adapter_spec(other, "encoder") == lora.adapter_spec(main, "encoder")
