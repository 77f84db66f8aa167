"""LoRA on the captioner (SR-L / SR-V / SR-LV): targets, what trains, checkpoints in peft's format, reload, merge,
and self-retrieval steps that move the captioner's encoder but never the retriever scoring it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, CLIPModel

from finecap.config import ClipCapBackboneConfig, DecodeConfig, RLConfig, load
from finecap.models import lora
from finecap.models.clipcap import ClipCap
from finecap.models.export import export_merged
from finecap.models.presets import build_world_lm, save_tiny_clip
from finecap.models.retriever import Retriever
from finecap.models.vision import VisionEncoder
from finecap.objectives.baselines import MeanBaseline
from finecap.objectives.reinforce import Reinforce
from finecap.rewards.retrieval import RetrievalReward


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    """A tiny random CLIP (ViT + text tower over the world vocabulary) saved like a Hub checkpoint."""
    return save_tiny_clip(tmp_path_factory.mktemp("clip"), image_size=16, patch_size=8)


def captioner(clip_dir: Path, *, train_encoder: bool = False, train_lm: bool = True, seed: int = 0) -> ClipCap:
    torch.manual_seed(seed)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2)
    encoder = VisionEncoder.from_pretrained(clip_dir)
    return ClipCap(lm, tok, encoder.feature_dim, ClipCapBackboneConfig(prefix_length=2), encoder=encoder,
                   train_encoder=train_encoder, train_lm=train_lm)  # fmt: skip


def cfg(*overrides: str):
    return load(None, ["lora.rank=4", "lora.alpha=8", *overrides])


def batch_of(model: ClipCap, n: int = 4, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[5, 6, 7, 4], [8, 9, 4, 0], [10, 4, 0, 0], [6, 6, 4, 0]])[:n]
    return {"pixel_values": torch.randn(n, 3, 16, 16, generator=g), "input_ids": ids,
            "attention_mask": (ids != 0).long(), "image_ids": list(range(n))}  # fmt: skip


def trainable(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def randomise_adapters(model) -> None:
    """LoRA's B starts at 0 (no effect); give every adapter weight a value so that saving/merging is tested."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


# --------------------------------------------------------------------------------------------------------------------
# Targets and what trains
# --------------------------------------------------------------------------------------------------------------------


def test_default_targets_all_linear_layers_but_the_head_and_the_text_side(clip_dir):
    model = captioner(clip_dir)
    lm_names = lora.resolve_targets("lm", model.lm, [])
    assert lm_names == ["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc",
                        "transformer.h.0.mlp.c_proj"]  # fmt: skip
    enc_names = lora.resolve_targets("encoder", model.encoder.model, [])
    assert "visual_projection" in enc_names and any(n.endswith("self_attn.q_proj") for n in enc_names)
    assert all(n.startswith(("vision_model.", "visual_projection")) for n in enc_names)
    assert lora.resolve_targets("lm", model.lm, ["c_attn"]) == ["transformer.h.0.attn.c_attn"]
    # the text tower is never adapted, even when named
    assert lora.resolve_targets("encoder", model.encoder.model, ["q_proj"]) == [
        "vision_model.encoder.layers.0.self_attn.q_proj"
    ]
    with pytest.raises(ValueError, match="lora.lm_targets: 'q_proj' matches no linear layer"):
        lora.resolve_targets("lm", model.lm, ["q_proj"])


def test_sr_lv_with_lora_trains_mapper_and_adapters_only(clip_dir):
    model = captioner(clip_dir)
    batch = batch_of(model)
    with torch.no_grad():
        before = model.eval()(batch)
    lora.configure_training(model, cfg("model.train_encoder=true", "lora.lm=true", "lora.encoder=true"))
    names = trainable(model)
    assert model.train_lm and model.train_encoder
    assert all(n.startswith("mapper.") or "lora_" in n for n in names)
    assert any(n.startswith("lm.") for n in names) and any(n.startswith("encoder.") for n in names)
    assert not any("text_model" in n or "text_projection" in n for n in names)
    with torch.no_grad():
        after = model.eval()(batch)
    assert torch.allclose(before, after, atol=1e-6)  # LoRA's B = 0: the outputs are unchanged at the start
    # a gradient step reaches the adapters of both parts through the captioning loss
    model.train()
    model(batch).logsumexp(-1).mean().backward()
    grads = {n.split(".")[0] for n, p in model.named_parameters() if "lora_B" in n and p.grad.abs().sum() > 0}
    assert grads == {"lm", "encoder"}  # B (= 0 at the start) gets a gradient in both parts; A waits for B


def factors(model, part: str, which: str) -> torch.Tensor:
    """Every entry of the ``which`` (A or B) factors of the adapters of ``part`` (lm / encoder), flattened."""
    return torch.cat([p.detach().flatten() for n, p in model.named_parameters()
                      if n.startswith(f"{part}.") and f".lora_{which}." in n])  # fmt: skip


@pytest.mark.parametrize("init", ["kaiming", "gaussian", "normal"])
def test_adapter_initialisation_follows_lora_init(clip_dir, init):
    """One factor of every adapter is zero whatever the choice (outputs unchanged). kaiming: B = 0, A within peft's
    Kaiming-uniform bound 1/sqrt(fan_in) (1/sqrt(32) on the 32-wide LM); gaussian: B = 0, A with std 1/r = 1/4;
    normal (NDLB's code, which draws the factor on the stored weight's column side): on the encoder's nn.Linear
    layers (stored out x in) A ~ N(0, 1) and B = 0, on the LM's GPT-2 Conv1D layers (stored in x out) B ~ N(0, 1) and
    A = 0."""
    model = captioner(clip_dir)
    batch = batch_of(model)
    with torch.no_grad():
        before = model.eval()(batch)
    lora.configure_training(model, cfg("model.train_encoder=true", "lora.lm=true", "lora.encoder=true",
                                       f"lora.init={init}"))  # fmt: skip
    with torch.no_grad():
        assert torch.allclose(before, model.eval()(batch), atol=1e-6)
    lm_a, lm_b = factors(model, "lm", "A"), factors(model, "lm", "B")
    enc_a, enc_b = factors(model, "encoder", "A"), factors(model, "encoder", "B")
    if init == "normal":
        assert torch.count_nonzero(lm_a) == 0 and torch.count_nonzero(enc_b) == 0
        for drawn in (lm_b, enc_a):  # thousands of draws each
            assert 0.9 < drawn.std() < 1.1 and abs(float(drawn.mean())) < 0.1
        return
    assert torch.count_nonzero(lm_b) == 0 and torch.count_nonzero(enc_b) == 0
    every_a = torch.cat([lm_a, enc_a])
    if init == "kaiming":
        assert lm_a.abs().max() <= 1 / 32**0.5 and every_a.std() < 0.2
    else:
        assert 0.2 < every_a.std() < 0.3 and every_a.abs().max() > 1 / 32**0.5


def test_lora_init_is_checked_and_not_applied_to_reloaded_adapters(clip_dir, tmp_path):
    with pytest.raises(ValueError, match="lora.init: invalid value 'xavier'; valid choices: kaiming, gaussian, norm"):
        cfg("lora.init=xavier")
    settings = cfg("lora.lm=true", "lora.init=normal")
    model = lora.configure_training(captioner(clip_dir), settings)
    randomise_adapters(model)  # trained adapters
    model.save(tmp_path / "ckpt")
    again = lora.configure_training(ClipCap.from_checkpoint(tmp_path / "ckpt"), settings)
    saved = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert saved and all(torch.equal(p, saved[n]) for n, p in again.named_parameters() if "lora_" in n)


@pytest.mark.parametrize(
    "overrides, trains",
    [
        (["model.train_lm=true"], {"mapper", "lm"}),  # SR-L (full)
        (["model.train_lm=false", "model.train_encoder=true"], {"mapper", "encoder"}),  # SR-V (full)
        (["model.train_lm=false"], {"mapper"}),
    ],
)
def test_full_fine_tuning_flags_follow_the_config(clip_dir, overrides, trains):
    model = lora.configure_training(captioner(clip_dir), cfg(*overrides))
    assert {n.split(".")[0] for n in trainable(model)} == trains
    assert not any("lora_" in n for n in trainable(model))


def test_same_adapters_are_kept_and_changed_ones_merged(clip_dir):
    model = captioner(clip_dir)
    lora.configure_training(model, cfg("lora.lm=true"))
    randomise_adapters(model)
    first = model.lm
    lora.configure_training(model, cfg("lora.lm=true"))  # resume / continue: the very same adapters
    assert model.lm is first
    batch = batch_of(model)
    with torch.no_grad():
        before = model.eval()(batch)
    lora.configure_training(model, cfg("lora.lm=true", "lora.rank=2"))  # other settings: merged, fresh rank 2
    assert lora.adapter_spec(model, "lm").rank == 2
    with torch.no_grad():
        assert torch.allclose(model.eval()(batch), before, atol=1e-5)  # merged weights + B = 0
    lora.configure_training(model, cfg())  # no LoRA: merged, the LM trained fully
    assert not lora.has_adapters(model)
    assert "lm.transformer.h.0.attn.c_attn.weight" in trainable(model)


# --------------------------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------------------------


def test_checkpoint_saves_base_and_peft_adapters_and_reloads_them(clip_dir, tmp_path):
    model = captioner(clip_dir)
    base_lm = {k: v.clone() for k, v in model.lm.state_dict().items()}
    lora.configure_training(model, cfg("model.train_encoder=true", "lora.lm=true", "lora.encoder=true"))
    randomise_adapters(model)
    batch = batch_of(model)
    with torch.no_grad():
        expected = model.eval()(batch)
    out = model.save(tmp_path / "ckpt")

    meta = json.loads((out / "captioner.json").read_text())
    assert set(meta["lora"]) == {"lm", "encoder"} and meta["lora"]["lm"]["rank"] == 4
    for folder in ("lm_lora", "encoder_lora"):
        assert (out / folder / "adapter_config.json").exists()
        assert (out / folder / "adapter_model.safetensors").exists()
    # the base folders are plain checkpoints holding the unchanged base weights
    plain = AutoModelForCausalLM.from_pretrained(out / "lm")
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in base_lm.items())
    assert not any("lora" in k for k in CLIPModel.from_pretrained(out / "encoder").state_dict())

    again = ClipCap.from_checkpoint(out)
    assert lora.adapter_spec(again, "lm") == lora.adapter_spec(model, "lm")
    assert trainable(again) == trainable(model)  # adapters unmerged and trainable: --resume continues them
    with torch.no_grad():
        assert torch.allclose(again.eval()(batch), expected, atol=1e-6)

    merged = lora.merge_lora(again)
    assert not lora.has_adapters(merged)
    with torch.no_grad():
        assert torch.allclose(merged.eval()(batch), expected, atol=1e-5)
    export = export_merged(out, tmp_path / "merged")
    assert json.loads((export / "captioner.json").read_text())["lora"] == {}
    with torch.no_grad():
        assert torch.allclose(ClipCap.from_checkpoint(export).eval()(batch), expected, atol=1e-5)


def test_a_trained_encoder_frozen_by_a_later_stage_is_saved_with_it(clip_dir, tmp_path):
    """A stage that trained the encoder (SR-V, here through LoRA), then a stage from its checkpoint with the encoder
    frozen (``train.init_from``, ``model.train_encoder=false``: its adapters merged): the second checkpoint holds the
    encoder it trained on. It used to name the source CLIP instead, so it reloaded the untrained encoder (and
    ``finecap caption`` refused it: the feature fingerprint of the run was the checkpoint's encoder)."""
    model = captioner(clip_dir)
    lora.configure_training(model, cfg("model.train_encoder=true", "lora.encoder=true"))
    randomise_adapters(model)
    first = model.save(tmp_path / "sr_v")
    later = lora.configure_training(ClipCap.from_checkpoint(first), cfg())  # frozen: the adapters merged into it
    assert not later.train_encoder and not lora.has_adapters(later)
    batch = batch_of(later)
    with torch.no_grad():
        expected = later.eval()(batch)
    out = later.save(tmp_path / "frozen")
    meta = json.loads((out / "captioner.json").read_text())
    assert meta["encoder_saved"] is True and (out / "encoder").is_dir()
    with torch.no_grad():
        assert torch.allclose(ClipCap.from_checkpoint(out).eval()(batch), expected, atol=1e-6)


def test_plain_checkpoints_are_unchanged(clip_dir, tmp_path):
    model = captioner(clip_dir)
    out = model.save(tmp_path / "plain")
    assert json.loads((out / "captioner.json").read_text())["lora"] == {}
    assert not (out / "lm_lora").exists()
    assert not lora.has_adapters(ClipCap.from_checkpoint(out))


# --------------------------------------------------------------------------------------------------------------------
# Self-retrieval steps: the captioner's encoder moves, the retriever never does
# --------------------------------------------------------------------------------------------------------------------


def sr_steps(model: ClipCap, retriever: Retriever, steps: int = 3) -> list[float]:
    batch = batch_of(model)
    embeddings = retriever.embed_images(batch["pixel_values"])  # the reward's table (cached in training)
    reward = RetrievalReward(retriever, image_ids=batch["image_ids"], embeddings=embeddings)
    rl = RLConfig(strategy="greedy", samples=1, baseline="mean")
    objective = Reinforce(reward, MeanBaseline(), rl=rl, decode=DecodeConfig(max_length=6))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    losses = []
    for _ in range(steps):
        model.train()
        out = objective(model, batch)
        loss = out.losses["reinforce"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        assert 0.0 <= out.metrics["reward/accuracy"] <= 1.0  # the batch R@1 (reward used alone: no name prefix)
    return losses


def scorer_snapshot(retriever: Retriever, pixel_values: torch.Tensor):
    state = {k: v.clone() for k, v in retriever.model.state_dict().items()}
    return state, retriever.embed_images(pixel_values), retriever.embed_texts(["a red circle", "two things"])


@pytest.mark.parametrize("use_lora", [False, True], ids=["sr_v_full", "sr_lv_lora"])
def test_sr_v_moves_the_captioner_encoder_but_not_the_retriever(clip_dir, use_lora):
    # the retriever and the captioner's encoder come from the same checkpoint
    retriever = Retriever.from_pretrained(clip_dir)
    model = captioner(clip_dir, train_encoder=True, train_lm=use_lora)
    extra = ["lora.lm=true", "lora.encoder=true"] if use_lora else ["model.train_lm=false"]
    lora.configure_training(model, cfg("model.train_encoder=true", *extra))
    pixels = batch_of(model)["pixel_values"]
    scorer_before = scorer_snapshot(retriever, pixels)
    encoder_before = {k: v.clone() for k, v in model.encoder.model.state_dict().items()}
    mapper_before = [p.clone() for p in model.mapper.parameters()]

    losses = sr_steps(model, retriever)

    assert all(torch.isfinite(torch.tensor(losses)))
    scorer_after = scorer_snapshot(retriever, pixels)
    assert all(torch.equal(v, scorer_after[0][k]) for k, v in scorer_before[0].items())
    assert torch.equal(scorer_before[1], scorer_after[1]) and torch.equal(scorer_before[2], scorer_after[2])
    assert not any(p.requires_grad for p in retriever.model.parameters())
    encoder_after = model.encoder.model.state_dict()
    moved = {k for k, v in encoder_before.items() if not torch.equal(v, encoder_after[k])}
    assert moved and all(("lora_" in k) == use_lora for k in moved)
    assert not any("text_model" in k for k in moved)
    assert any(not torch.equal(a, b) for a, b in zip(mapper_before, model.mapper.parameters(), strict=True))


PEFT_ON_DEMAND = """
import sys
import torch
from finecap.config import ClipCapBackboneConfig
import finecap.api, finecap.app.demo, finecap.models.backbones, finecap.train.run  # what a command imports
from finecap.models import lora
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm

before = "peft" in sys.modules or "bitsandbytes" in sys.modules
lm, tok = build_world_lm(layers=1, hidden=32, heads=2)
model = ClipCap(lm, tok, 8, ClipCapBackboneConfig(prefix_length=2))
plain = lora.has_adapters(model) or "peft" in sys.modules  # a model without adapters: peft still not needed
lora.apply_lora(model, "lm", lora.LoraSpec(rank=4))
print(before, plain, "peft" in sys.modules, lora.is_peft(model.lm), lora.has_adapters(model))
"""


@pytest.mark.slow  # a process importing torch and transformers
def test_peft_is_imported_where_adapters_are_first_made():
    """Importing what a command imports, and building a model without adapters, imports neither peft nor
    bitsandbytes (over a second of every command's start; finecap.models.peft_import); making adapters does, and
    they are found as peft's."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([sys.executable, "-c", PEFT_ON_DEMAND], capture_output=True, text=True, env=env,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "False", "True", "True", "True"], proc.stdout


def test_making_and_loading_adapters_gives_no_warning_of_peft_and_transformers_own(clip_dir, tmp_path):
    """peft reads the ``is_gradient_checkpointing`` transformers 5 deprecated, whose ``FutureWarning`` came with every
    run that made or loaded adapters (:func:`finecap.models.peft_import.get_peft_model`): nothing for a user to do."""
    import warnings

    model = captioner(clip_dir)
    with warnings.catch_warnings(record=True) as made:
        warnings.simplefilter("always")
        lora.configure_training(model, cfg("model.train_encoder=true", "lora.lm=true", "lora.encoder=true"))
        out = model.save(tmp_path / "ckpt")
        ClipCap.from_checkpoint(out)
    assert lora.has_adapters(model)
    assert [str(w.message) for w in made if "is_gradient_checkpointing" in str(w.message)] == []
