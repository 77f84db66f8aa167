"""The memory and precision levers (:mod:`finecap.models.memory`) on every backbone, built through the training path
(:func:`finecap.train.setup.build_model`) from tiny random checkpoints saved like Hub ones: the weights' dtype with
float32 master weights, gradient checkpointing (equal gradients, equal captions), the attention implementation, and
4/8-bit QLoRA through bitsandbytes on the CPU."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers.pytorch_utils import Conv1D

from finecap.config import DecodeConfig, load
from finecap.data.datasets import model_collator
from finecap.models import lora, memory, strict
from finecap.models.backbones import load_captioner
from finecap.models.base import module_path
from finecap.models.captioner import PARTS, last_positions
from finecap.models.presets import build_world_lm, save_tiny_blip, save_tiny_clip, save_tiny_vlm
from finecap.models.vlm import Vlm
from finecap.objectives.mle import MLE, mle_loss
from finecap.runs import CheckpointError
from finecap.train.setup import build_model

CAPTIONS = ["a red circle", "two blue squares on the left", "a small green triangle"]
BACKBONES = {
    "clipcap": (["clipcap.lm={gpt2}", "model.encoder={clip}", "clipcap.prefix_length=2"], 16),
    "blip": (["model.kind=blip", "blip.name={blip}"], 32),
    "vlm": (["model.kind=vlm", "vlm.name={vlm}"], 16),
}
"""Per backbone: the overrides that build it from the tiny checkpoints, and its images' size."""
FAMILIES = {"llava": "vlm", "idefics3": "vlm", "qwen2_vl": "vlm"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("memory")
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2, dropout=0.0)
    lm.save_pretrained(root / "gpt2")
    tok.save_pretrained(root / "gpt2")
    out = {"gpt2": root / "gpt2", "clip": save_tiny_clip(root / "clip", image_size=16, patch_size=8),
           "blip": save_tiny_blip(root / "blip", image_size=32, layers=1, vision_layers=1)}  # fmt: skip
    for family in FAMILIES:
        out[family] = save_tiny_vlm(root / family, family, std=0.2)
    return out


def config(dirs: dict[str, Path], backbone: str, *overrides: str, family: str = "llava"):
    base = [o.format(**dirs, vlm=dirs[family]) for o in BACKBONES[backbone][0]]
    return load(None, [*base, "lora.rank=4", "lora.alpha=8", *overrides])


def build(dirs: dict[str, Path], backbone: str, *overrides: str, family: str = "llava", seed: int = 0):
    """The training model of a configuration (``build_model``: loaders, ``configure_training``, the levers)."""
    torch.manual_seed(seed)
    return build_model(config(dirs, backbone, *overrides, family=family))


def batch_of(model, backbone: str, seed: int = 0) -> dict:
    size = BACKBONES[backbone][1]
    g = torch.Generator().manual_seed(seed)
    images = [Image.fromarray((torch.rand(size, size, 3, generator=g) * 255).byte().numpy()) for _ in CAPTIONS]
    items = [{"caption": c, "image": im, "image_id": i, "references": [c], "index": i}
             for i, (c, im) in enumerate(zip(CAPTIONS, images, strict=True))]  # fmt: skip
    return model_collator(model, 12)(items)


def randomise_adapters(model, seed: int = 3) -> None:
    """LoRA's B starts at 0; give the adapters values so that they change the outputs and receive every gradient."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def loss_of(model, batch: dict) -> torch.Tensor:
    """MLE of the captions plus the summed log-probs of the same captions as sampled sequences (the scoring forward
    of REINFORCE-style objectives), both through ``forward``."""
    logits = model(batch)
    seqs = batch["input_ids"]
    scores = model(batch, sequences=seqs, mask=batch["attention_mask"].bool(), image_index=torch.arange(len(seqs)))
    return mle_loss(logits, batch["labels"]) - 0.1 * scores.logprobs.sum()


def sgd_steps(model, batch: dict, steps: int, lr: float = 1e-2) -> list[float]:
    """``steps`` AdamW steps of MLE on ``batch``; the losses."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(steps):
        loss = mle_loss(model(batch), batch["labels"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


# --------------------------------------------------------------------------------------------------------------------
# Weights' dtype and float32 master weights
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("adapters", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_bfloat16_weights_float32_master_weights_step_save_reload(dirs, backbone, adapters, tmp_path):
    """``model.dtype=bfloat16``: every frozen weight is bfloat16, every trained one (adapters, a fully trained LM,
    ClipCap's mapper, a VLM's projector) float32; a training step moves them and keeps them float32; the checkpoint
    records the dtypes and a run resuming from it (the same training path) gets every weight back bit for bit."""
    extra = ["lora.lm=true"] if adapters else []
    model = build(dirs, backbone, "model.dtype=bfloat16", *extra)
    params = dict(model.named_parameters())
    frozen = {n: p for n, p in params.items() if not p.requires_grad}
    learning = {n: p for n, p in params.items() if p.requires_grad}
    assert frozen and learning
    assert {p.dtype for p in frozen.values()} == {torch.bfloat16}
    assert {p.dtype for p in learning.values()} == {torch.float32}
    lm_part = {id(p) for p in model.lora_module("lm").parameters()}
    assert all("lora_" in n for n, p in learning.items() if id(p) in lm_part) == adapters
    dtypes = memory.part_dtypes(model)
    assert dtypes["lm"]["trainable"] == "float32" and dtypes["encoder"] == {"frozen": "bfloat16"}
    assert dtypes["lm"].get("frozen") == ("bfloat16" if adapters else None)

    randomise_adapters(model)
    batch = batch_of(model, backbone)
    before = snapshot(model)
    losses = sgd_steps(model, batch, 3)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    after = model.state_dict()
    moved = {n for n in learning if not torch.equal(before[n], after[n])}
    # (a BLIP cross-attention key over near-identical image tokens gets a gradient of ~1e-20 and may not move)
    assert len(moved) > 0.9 * len(learning)
    if backbone != "blip":  # the mapper / projector learn beside the LM
        assert moved - {n for n in moved if n.startswith(PARTS_PREFIXES[backbone])}
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    model.eval()
    assert model.generate(batch, DecodeConfig(max_length=6)).sequences.shape[0] == len(CAPTIONS)

    out = model.save(tmp_path / "ckpt")
    assert json.loads((out / "captioner.json").read_text())["dtypes"] == memory.part_dtypes(model)
    assert (out / memory.MASTERS).exists() == (backbone != "blip" or not adapters)  # BLIP + LoRA: adapters only
    # nothing at the folder's top a loader could take for a shard of the model's weights (vLLM reads every
    # *.safetensors there when no shard index lists them)
    assert {f.name for f in out.glob("*.safetensors")} <= {"model.safetensors", "mapper.safetensors"}
    again = build(dirs, backbone, "model.dtype=bfloat16", *extra, f"train.init_from={out}")
    mine, theirs = model.state_dict(), again.state_dict()
    assert set(theirs) == set(mine)
    for name, tensor in mine.items():
        assert theirs[name].dtype == tensor.dtype and torch.equal(theirs[name], tensor), name


def test_inference_load_takes_the_asked_dtype(dirs, tmp_path):
    """A checkpoint of a bfloat16 run with float32 master weights loads for captioning in the dtype asked: float32
    (exact: the master values), or bfloat16 everywhere."""
    model = build(dirs, "vlm", "model.dtype=bfloat16")
    sgd_steps(model, batch_of(model, "vlm"), 1)
    out = model.save(tmp_path / "ckpt")
    wide = load_captioner(out, options=memory.LoadOptions(dtype="float32"))
    assert {p.dtype for p in wide.parameters()} == {torch.float32}
    head = model.model.get_output_embeddings().weight
    assert torch.equal(wide.model.get_output_embeddings().weight, head)  # trained in float32, stored in float32
    narrow = load_captioner(out, options=memory.LoadOptions(dtype="bfloat16"))
    assert {p.dtype for p in narrow.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(("flags", "trained"), [
    (["lora.lm=true"], "projector"),  # float32 projector between a bfloat16 vision tower and language model
    (["model.train_encoder=true", "model.train_lm=false", "vlm.train_projector=false"], "vision"),  # float32 tower
])  # fmt: skip
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_vlm_family_runs_with_parts_of_two_dtypes(dirs, family, flags, trained):
    """Where a float32 part meets a bfloat16 one inside ``transformers``' own forward (the projector inside
    ``get_image_features``, Qwen2-VL's merger inside its vision tower), the bridges cast what crosses: training and
    decoding run, and the gradient reaches the same weights as in a float32 model."""
    reached = {}
    for dtype in ("float32", "bfloat16"):
        model = build(dirs, "vlm", f"model.dtype={dtype}", *flags, family=family)
        randomise_adapters(model)
        batch = batch_of(model, "vlm")
        model.train()
        loss_of(model, batch).backward()
        reached[dtype] = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert reached["bfloat16"] == reached["float32"] and reached["float32"]
    if trained == "projector":  # Qwen2-VL's merger sits inside its vision tower
        assert {p.dtype for p in module_path(model.model, model.family.projector).parameters()} == {torch.float32}
    else:
        assert memory.part_dtypes(model)["encoder"]["trainable"] == "float32"
    assert memory.install_bridges(model) > 0  # the model mixes dtypes (re-installing is idempotent)
    model.eval()
    assert model.generate(batch, DecodeConfig(strategy="beam", beam_size=2, max_length=5)).sequences.shape[0] == 3


def test_trainable_dtype_same_and_auto_weights(dirs, tmp_path):
    """``model.trainable_dtype=same`` keeps what learns in ``model.dtype`` (no master copy); ``model.dtype=auto``
    loads a checkpoint in its own dtype (a GPT-2 stored in bfloat16 stays bfloat16, float32 converts it)."""
    model = build(dirs, "clipcap", "model.dtype=bfloat16", "model.trainable_dtype=same")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    stored = tmp_path / "gpt2-bf16"
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2, dropout=0.0)
    lm.to(torch.bfloat16).save_pretrained(stored)
    tok.save_pretrained(stored)
    frozen = ["model.train_lm=false", f"clipcap.lm={stored}"]
    assert {p.dtype for p in build(dirs, "clipcap", "model.dtype=auto", *frozen).lm.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in build(dirs, "clipcap", *frozen).lm.parameters()} == {torch.float32}  # the default


def test_models_built_here_take_dtype_and_attention():
    """Random-init models (the world-tiny presets) are cast to ``model.dtype`` and given the attention
    implementation; quantizing one is refused (it quantizes a checkpoint as it loads)."""
    lm, _ = build_world_lm(layers=1, hidden=32, heads=2)
    lm = memory.LoadOptions(dtype="bfloat16", attn_implementation="eager").fresh(lm, "clipcap.lm=world-tiny")
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16} and lm.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match=r"model.quantization=4bit .* clipcap.lm=world-tiny is built here"):
        memory.LoadOptions(quantization="4bit").fresh(lm, "clipcap.lm=world-tiny")
    with pytest.raises(ValueError, match="model.dtype='half'; valid: auto, float32, bfloat16, float16"):
        memory.LoadOptions(dtype="half")


# --------------------------------------------------------------------------------------------------------------------
# Gradient checkpointing
# --------------------------------------------------------------------------------------------------------------------


def linear_calls(module: torch.nn.Module) -> tuple[list[int], list]:
    """A counter of the calls of every linear layer (GPT-2's ``Conv1D`` too) inside ``module`` (and the hooks, to
    remove afterwards)."""
    count = [0]
    hooks = [m.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
             for m in module.modules() if isinstance(m, torch.nn.Linear | Conv1D)]  # fmt: skip
    return count, hooks


@pytest.mark.parametrize("adapters", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_checkpointing_gives_the_same_gradients(dirs, backbone, adapters):
    """With ``train.gradient_checkpointing`` the layers are recomputed in backward (the language model's linear
    layers run more often) and every gradient equals the one without. With LoRA the VLM's projector is frozen
    too, so nothing before the adapters needs a gradient: the case where a reentrant checkpoint gives none."""
    extra = ["lora.lm=true", "vlm.train_projector=false"] if adapters else []
    grads, calls = {}, {}
    for on in (False, True):
        model = build(dirs, backbone, *extra, f"train.gradient_checkpointing={str(on).lower()}")
        assert memory.gradient_checkpointing(model) == on
        randomise_adapters(model)
        if isinstance(model, Vlm):  # under checkpointing a VLM scores each sequence after its own prompt pass:
            model.share_prompt = False  # compare like with like (the shared pass agrees up to rounding only)
        model.train()
        assert model.scores_in_chunks == on  # the scoring forward runs the vocabulary head in chunks ...
        model.vocab_chunk_elements = 7 * model.output_head().weight.shape[0]  # ... of 7 positions here
        count, hooks = linear_calls(model.lora_module("lm"))
        loss_of(model, batch_of(model, backbone)).backward()
        for h in hooks:
            h.remove()
        calls[on] = count[0]
        grads[on] = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        assert all(g is not None and g.abs().sum() > 0 for g in grads[on].values())
        flags = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
        assert not flags  # switched on only while forward runs
    assert calls[True] > calls[False]  # the checkpointed layers ran again in backward
    assert grads[True].keys() == grads[False].keys()
    if adapters:
        assert all("lora_" in n for n in grads[True] if not n.startswith("mapper."))  # (ClipCap's mapper learns)
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointing_counts_only_the_layers_of_parts_that_train(dirs):
    """The log line of ``train.gradient_checkpointing`` ("lm 2 modules, encoder 4 modules") counts the layers that
    are checkpointed: a frozen part's layers stay in eval mode, which transformers never checkpoints, so a frozen
    encoder counts 0 (it said 4)."""
    counts = {}
    for trains in (True, False):
        model = build(
            dirs, "clipcap", f"model.train_encoder={str(trains).lower()}", "train.gradient_checkpointing=true"
        )
        counts[trains] = memory.enable_gradient_checkpointing(model)
    assert counts[True]["encoder"] > 0 and counts[True]["lm"] > 0
    assert counts[False] == {**counts[True], "encoder": 0}


@pytest.mark.parametrize("backbone", ["clipcap", "vlm"])
def test_the_head_reads_contiguous_hidden_states(dirs, backbone):
    """Teacher forcing and the first decoding step ask transformers for the logits of the last positions only; the
    head must then read a contiguous tensor: on a strided one (an int ``logits_to_keep``'s slice) PyTorch's CPU
    ``linear`` in bfloat16 copies the vocabulary matrix once per row (``captioner.last_positions``)."""
    model = build(dirs, backbone, "model.dtype=bfloat16").eval()
    seen = []
    hook = model.output_head().register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    batch = batch_of(model, backbone)
    with torch.no_grad():
        model(batch)
        model.generate(batch, DecodeConfig(strategy="greedy", max_length=3))
    hook.remove()
    assert len(seen) >= 3 and all(seen), seen  # teacher forcing, the first step and the next ones


def test_last_positions():
    assert last_positions(2, 5, torch.device("cpu")).tolist() == [3, 4]
    assert last_positions(1, 1, torch.device("cpu")).tolist() == [0]


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_mle_in_vocabulary_chunks_equals_mle(dirs, backbone):
    """Under checkpointing MLE scores the captions as given sequences in vocabulary chunks (never the batch's whole
    logits): its loss, token accuracy and every gradient equal those of the teacher-forced logits' cross-entropy,
    and the head runs once per chunk (the captions' positions in chunks of 5) and again per chunk in backward."""
    out, grads = {}, {}
    for on in (False, True):
        model = build(dirs, backbone, f"train.gradient_checkpointing={str(on).lower()}")
        if isinstance(model, Vlm):
            model.share_prompt = False
        model.train()
        model.vocab_chunk_elements = 5 * model.output_head().weight.shape[0]
        calls = []
        hook = model.output_head().register_forward_hook(lambda m, i, o, calls=calls: calls.append(i[0].shape[0]))
        batch = batch_of(model, backbone)
        out[on] = MLE()(model, batch)
        out[on].losses["mle"].backward()
        hook.remove()
        grads[on] = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        positions = batch["input_ids"].numel()
        if on:  # forward and the backward's recomputation, 5 positions at a time
            assert sum(calls) == 2 * positions and max(calls) == 5
        else:
            assert calls == [batch["input_ids"].shape[0]]  # one call on the whole (B, T, H)
    torch.testing.assert_close(out[True].losses["mle"], out[False].losses["mle"])
    assert out[True].metrics == out[False].metrics
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_decoding_with_checkpointing_gives_the_same_captions(dirs, backbone):
    """Decoding runs on the KV cache, which ``transformers`` drops in a checkpointed layer in training mode: with
    checkpointing enabled and the model in training mode (as SCST samples), greedy and beam captions are those of
    the same model without checkpointing."""
    model = build(dirs, backbone, "lora.lm=true", "train.gradient_checkpointing=true")
    randomise_adapters(model)
    model.train()
    batch = batch_of(model, backbone)
    model(batch)  # a training forward first: checkpointing switched on, then off again
    decoded = {}
    for on in (True, False):
        if not on:
            memory.disable_gradient_checkpointing(model)
        decoded[on] = [model.generate(batch, DecodeConfig(strategy=s, beam_size=3, max_length=8)).sequences
                       for s in ("greedy", "beam")]  # fmt: skip
    for with_ckpt, without in zip(decoded[True], decoded[False], strict=True):
        assert torch.equal(with_ckpt, without)


def test_checkpointing_with_cache_checkpoints_by_hand_and_puts_everything_back_even_on_an_error(dirs):
    """Inside :func:`memory.checkpointing_with_cache` transformers' flags are off and each switched-on layer's call
    is checkpointed by finecap (an instance ``forward``); on leaving, even by an exception, the flags are on again
    and the layers' own ``forward`` is back; ``by_hand=False`` only pauses checkpointing. Nothing changes where
    checkpointing is off."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model = build(dirs, "vlm", "lora.lm=true", "train.gradient_checkpointing=true").train()
    layers = getattr(model, memory._CHECKPOINTING).layers
    by_hand = [m for m in layers if isinstance(m, GradientCheckpointingLayer)]
    assert by_hand and len(by_hand) < len(layers)  # decoder / vision layers, and the models that hold them
    for m in layers:  # as the captioner's forward switches them on
        m.gradient_checkpointing = True
    with pytest.raises(RuntimeError, match="inside"), memory.checkpointing_with_cache(model):
        assert not any(m.gradient_checkpointing for m in layers)
        assert all("forward" in m.__dict__ for m in by_hand)
        raise RuntimeError("inside")
    assert all(m.gradient_checkpointing for m in layers)
    assert not any("forward" in m.__dict__ for m in layers)
    with memory.checkpointing_with_cache(model, by_hand=False):  # paused: transformers' flags off, nothing by hand
        assert not any(m.gradient_checkpointing for m in layers) and not any("forward" in m.__dict__ for m in layers)
    assert all(m.gradient_checkpointing for m in layers)
    memory.disable_gradient_checkpointing(model)
    with memory.checkpointing_with_cache(model):
        assert not any("forward" in m.__dict__ for m in model.modules())


# --------------------------------------------------------------------------------------------------------------------
# Attention implementation
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_attention_implementation_reaches_the_loaded_model(dirs, backbone, implementation, tmp_path):
    if backbone == "blip" and implementation == "sdpa":  # transformers' BLIP has no SDPA path, and says so
        with pytest.raises(ValueError, match="BlipForConditionalGeneration does not support .*scaled_dot_product"):
            build(dirs, backbone, f"model.attn_implementation={implementation}")
        return
    model = build(dirs, backbone, f"model.attn_implementation={implementation}")
    lm = model.lora_module("lm")
    assert lm.config._attn_implementation == implementation
    out = model.save(tmp_path / "ckpt")
    again = load_captioner(out, options=memory.LoadOptions(attn_implementation=implementation))
    assert again.lora_module("lm").config._attn_implementation == implementation


def test_flash_attention_is_passed_through(dirs):
    """``flash_attention_2`` goes to transformers, which refuses it here (no flash-attn, no CUDA) and says why."""
    with pytest.raises((ImportError, ValueError), match="(?i)flash"):
        build(dirs, "vlm", "model.attn_implementation=flash_attention_2")


# --------------------------------------------------------------------------------------------------------------------
# Quantization (bitsandbytes on the CPU)
# --------------------------------------------------------------------------------------------------------------------


def quantized_kinds(module: torch.nn.Module) -> set[str]:
    return {type(m).__name__ for m in module.modules() if type(m).__name__ in ("Linear4bit", "Linear8bitLt")}


def test_quantization_without_bitsandbytes_is_one_clear_line(dirs, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes -> ImportError
    with pytest.raises(ImportError) as err:
        build(dirs, "vlm", "model.quantization=4bit", "lora.lm=true")
    assert str(err.value) == "model.quantization=4bit needs bitsandbytes: pip install 'finecap[quant]'"


@pytest.mark.slow
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_qlora_trains_adapters_only_and_reloads_onto_an_unquantised_base(dirs, backbone, tmp_path):
    """4-bit QLoRA for real: the language model's linear layers are bitsandbytes NF4 layers, the vision side, the
    output head, ClipCap's mapper and a VLM's projector are not; the loss falls over a few steps (with an evaluation
    forward in between, as validation does) and only the adapters (and the mapper / projector) move. The
    checkpoint reloads (a) quantized for a resumed run, giving the same outputs, (b) dequantized with
    ``model.quantization=none``: an unquantised base with the trained adapters, giving the same outputs up to
    float rounding, and (c) its adapters on the original unquantised checkpoint lower the loss there too."""
    pytest.importorskip("bitsandbytes")
    model = build(dirs, backbone, "model.quantization=4bit", "lora.lm=true")
    assert quantized_kinds(model.lora_module("lm")) == {"Linear4bit"}
    assert not quantized_kinds(model.lora_module("encoder"))
    assert memory.part_dtypes(model)["lm"] == {"trainable": "float32", "frozen": "float32", "quantized": "4bit"}
    learning = {n for n, p in model.named_parameters() if p.requires_grad}
    assert learning and all("lora_" in n or n.startswith(("mapper.", "model.model.multi_modal_projector"))
                            for n in learning)  # fmt: skip
    batch = batch_of(model, backbone)
    before = snapshot(model)
    losses = sgd_steps(model, batch, 2)
    model.eval()
    with torch.no_grad():
        model(batch)  # bitsandbytes' CPU inference path would repack the 4-bit weights here (memory.keep_cpu_layout)
    losses += sgd_steps(model, batch, 4)
    assert losses[-1] < losses[0] - 0.1 and losses[-1] < losses[2]  # falls, also after the evaluation forward
    after = model.state_dict()
    moved = {n for n in after if not torch.equal(before[n], after[n])}
    assert moved <= learning and len(moved) > 0.9 * len(learning)  # (BLIP's cross-attention keys: ~0 gradient)

    model.eval()
    with torch.no_grad():
        expected = model(batch)
    out = model.save(tmp_path / "ckpt")
    assert json.loads((out / "captioner.json").read_text())["dtypes"]["lm"]["quantized"] == "4bit"
    resumed = build(dirs, backbone, "model.quantization=4bit", "lora.lm=true", f"train.init_from={out}").eval()
    assert quantized_kinds(resumed.lora_module("lm")) == {"Linear4bit"}
    dequantized = load_captioner(out).eval()  # model.quantization=none (default): dequantized on load
    assert not quantized_kinds(dequantized) and lora.has_adapters(dequantized)
    with torch.no_grad():
        torch.testing.assert_close(resumed(batch), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(dequantized(batch), expected, rtol=1e-4, atol=1e-4)
    for loaded, folder in ((resumed, "resumed"), (dequantized, "dequantized")):  # what was loaded saves again
        again = load_captioner(loaded.save(tmp_path / folder)).eval()
        with torch.no_grad():
            torch.testing.assert_close(again(batch), expected, rtol=1e-4, atol=1e-4, msg=folder)

    original = build(dirs, backbone, "lora.lm=true").eval()  # the unquantised checkpoint, fresh adapters (B = 0)
    with torch.no_grad():
        base_loss = float(mle_loss(original(batch), batch["labels"]))
        lora.merge_lora(original)
        lora.load_adapters(original, out, json.loads((out / "captioner.json").read_text())["lora"])
        rest = {n: p for n, p in dequantized.named_parameters() if not n.startswith(PARTS_PREFIXES[backbone])}
        own = dict(original.named_parameters())
        for name, p in rest.items():  # the mapper / projector trained beside the adapters
            own[name].copy_(p)
        adapted_loss = float(mle_loss(original.eval()(batch), batch["labels"]))
    assert adapted_loss < base_loss


PARTS_PREFIXES = {
    "clipcap": ("lm.", "encoder."),
    "blip": ("model.",),
    "vlm": ("model.model.language_model.", "model.model.vision_tower.", "model.lm_head."),
}
"""Parameter names of the parts (and head) of each backbone: what the unquantised original brings itself."""


QLORA_TOLERANCES = {
    ("float32", "float32"): 1e-5,
    ("bfloat16", "float32"): 2**-6,
    ("float32", "bfloat16"): 2**-3,
    ("bfloat16", "bfloat16"): 2**-3,
}
"""Largest logit difference to the float32 dequantized checkpoint, over its largest logit, per (the run's
``model.dtype``, the load's). Both read the same 4-bit weights. A float32 run's load in float32 computes as the
reference does (to float rounding). A bfloat16 run saved its quantization constants for bfloat16 weights: the reference
dequantizes them rounded to bfloat16 (2^-8 relative), the 4-bit kernel without grad does not; through the tiny models'
two layers of N(0, 0.2) weights that came to 0.04-0.7 % of the largest logit, bounded here by 2^-6 (1.6 %). A load in
bfloat16 computes in bfloat16 (every matmul, norm and activation rounded: 1.4-4.6 % measured), bounded by 2^-3;
wrong weights would be off by the logits' own size."""


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_a_qlora_checkpoint_loads_quantized_in_either_dtype(dirs, backbone, tmp_path):
    """A QLoRA checkpoint loaded quantized for captioning (no training path, so no dtype bridges), in the run's own
    ``model.dtype`` or the other one (``finecap caption ... model.dtype=...``): every floating-point weight outside
    the adapters (and ClipCap's mapper, finecap's own) is in the dtype asked, the 4-bit layers compute in it, and its
    logits are those of transformers' own dequantization of the same checkpoint (``model.quantization=none``,
    float32) within :data:`QLORA_TOLERANCES`. transformers alone left the layers it does not quantize in the saved
    dtype with their biases in the asked one, computing in the saved ``bnb_4bit_compute_dtype``: the first forward
    failed for a bfloat16 VLM in its own dtype (its float32-trained projector after its bfloat16 tower) and for every
    backbone in the other dtype."""
    pytest.importorskip("bitsandbytes")
    batch = None
    for run in ("bfloat16", "float32"):
        model = build(dirs, backbone, "model.quantization=4bit", "lora.lm=true", f"model.dtype={run}")
        randomise_adapters(model)
        out = model.save(tmp_path / run)
        batch = batch or batch_of(model, backbone)
        with torch.no_grad():
            reference = load_captioner(out, options=memory.LoadOptions(dtype="float32")).eval()(batch).float()
        for dtype in ("bfloat16", "float32"):
            loaded = load_captioner(out, options=memory.LoadOptions(dtype=dtype, quantization="4bit")).eval()
            assert quantized_kinds(loaded.lora_module("lm")) == {"Linear4bit"}
            own = {n: p.dtype for n, p in loaded.named_parameters()
                   if p.is_floating_point() and "lora_" not in n and not n.startswith("mapper.")}  # fmt: skip
            assert set(own.values()) == {getattr(torch, dtype)}, (run, dtype)
            computes = {m.compute_dtype for m in loaded.modules() if type(m).__module__.startswith("bitsandbytes")}
            assert computes == {getattr(torch, dtype)}, (run, dtype)
            with torch.no_grad():
                logits = loaded(batch).float()
                captions = loaded.generate(batch, DecodeConfig(max_length=5)).sequences
            bound = QLORA_TOLERANCES[run, dtype] * reference.abs().max().item()
            torch.testing.assert_close(logits, reference, rtol=0, atol=bound, msg=f"{run} run, loaded in {dtype}")
            assert captions.shape[0] == len(CAPTIONS)


def test_eight_bit_lora_step(dirs):
    """``model.quantization=8bit`` (LLM.int8()): int8 linear layers in the language model, a LoRA step moves the
    adapters."""
    pytest.importorskip("bitsandbytes")
    model = build(dirs, "vlm", "model.quantization=8bit", "lora.lm=true")
    assert quantized_kinds(model.lora_module("lm")) == {"Linear8bitLt"}
    assert memory.part_dtypes(model)["lm"]["quantized"] == "8bit"
    batch = batch_of(model, "vlm")
    before = snapshot(model)
    losses = sgd_steps(model, batch, 3)
    assert all(torch.isfinite(torch.tensor(losses)))
    after = model.state_dict()
    assert any("lora_" in n for n in after if not torch.equal(before[n], after[n]))


class Quantized(torch.nn.Module):
    """A captioner-shaped module whose ``lm`` holds two bitsandbytes 4-bit layers and one 8-bit layer, quantized on
    the CPU as a load quantizes them (``.to("cpu")``)."""

    def __init__(self) -> None:
        super().__init__()
        import bitsandbytes as bnb

        self.lm = torch.nn.ModuleList([
            bnb.nn.Linear4bit(700, 300, bias=False, compress_statistics=True, quant_type="nf4"),
            bnb.nn.Linear4bit(64, 64, bias=False, compress_statistics=True, quant_type="nf4"),
            bnb.nn.Linear8bitLt(700, 300, bias=False, has_fp16_weights=False),
        ]).to("cpu")  # fmt: skip

    def lora_module(self, part: str) -> torch.nn.Module | None:
        return getattr(self, part, None)


def test_training_memory_counts_bitsandbytes_block_scales():
    """A quantized weight's bytes are its packed data and the constants bitsandbytes 0.50 keeps beside it (session
    35's review: the forecast counted the packed data only). Measured on the CPU: each 4-bit layer (NF4, double
    quantization, blocks of 64) holds a uint8 absmax per block, a float32 absmax per 256 of those, a float32 offset
    and its own two code books (16 and 256 float32); an 8-bit layer one float32 scale per output row."""
    pytest.importorskip("bitsandbytes")
    model = Quantized()
    for layer in model.lm:  # the layout counted below, as the layers hold it
        assert type(layer.weight).__name__ in ("Params4bit", "Int8Params")
    state = model.lm[0].weight.quant_state
    assert (state.absmax.dtype, state.absmax.numel(), state.state2.absmax.numel()) == (torch.uint8, 3282, 13)
    # 300 x 700 = 210,000 weights: 105,000 bytes packed + 3,282 absmax (ceil(210,000 / 64)) + 13 x 4 nested absmax
    # (ceil(3,282 / 256)) + 4 offset + 16 x 4 code + 256 x 4 nested code = 109,426
    # 64 x 64 = 4,096 weights: 2,048 + 64 + 1 x 4 + 4 + 64 + 1,024 = 3,208
    # 8-bit 300 x 700: 210,000 int8 + 300 x 4 row scales = 211,200
    assert memory.training_memory(model) == {"weights": 109_426 + 3_208 + 211_200, "gradients": 0, "optimizer": 0,
                                             "total": 323_834}  # fmt: skip


def test_a_quantized_language_model_trains_through_adapters_only(dirs):
    pytest.importorskip("bitsandbytes")
    with pytest.raises(ValueError, match=r"quantized and cannot be trained fully; .*lora.lm=true.*model.train_lm="):
        build(dirs, "clipcap", "model.quantization=4bit")
    model = build(dirs, "clipcap", "model.quantization=4bit", "lora.lm=true")
    with pytest.raises(ValueError, match="cannot be merged"):
        lora.merge_lora(model)


def test_part_dtypes_cover_every_part(dirs):
    model = build(dirs, "vlm", "model.dtype=bfloat16", "lora.lm=true")
    assert isinstance(model, Vlm) and set(memory.part_dtypes(model)) == {*PARTS, "rest"}
    assert memory.describe(memory.part_dtypes(model)).startswith("lm: trainable float32, frozen bfloat16; encoder:")


def test_a_qlora_checkpoint_loads_without_transformers_warning_that_its_own_quantization_is_used(dirs, tmp_path):
    """transformers warns that the ``quantization_config`` passed is ignored for the one a checkpoint stored quantized
    holds (every ``finecap caption`` of a QLoRA run said it); finecap then settles the dtype itself
    (:meth:`finecap.models.memory.LoadOptions.loaded`), so :meth:`~finecap.models.memory.LoadOptions.load` silences
    that one warning, and the checkpoint still loads quantized."""
    import warnings

    pytest.importorskip("bitsandbytes")
    model = build(dirs, "clipcap", "model.quantization=4bit", "lora.lm=true", "model.dtype=float32")
    out = model.save(tmp_path / "run")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loaded = load_captioner(out, options=memory.LoadOptions(dtype="float32", quantization="4bit"))
    assert quantized_kinds(loaded.lora_module("lm")) == {"Linear4bit"}
    assert [str(w.message)[:60] for w in said if "quantization_config" in str(w.message)] == []


START_TRAINING = {"clipcap": ("model.train_lm=true",), "vlm": ("lora.lm=true",)}
"""How the unquantised start of a QLoRA run trained: GPT-2 fine-tuned whole (its weights move), the VLM through
LoRA adapters (its base weights stay, the adapters and the projector move)."""
BESIDE = ("mapper.", "model.model.connector.")
"""What trains beside the adapters: ClipCap's mapper, Idefics3's projector (its connector)."""


def packed(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The language model's bitsandbytes-quantized weights and their quantization constants, by name."""
    lm = model.lora_module("lm")
    names = strict.quantized_weights(lm)
    return {n: t for n, t in lm.state_dict().items() if n in names or n.rsplit(".weight.", 1)[0] + ".weight" in names}


@pytest.mark.slow
@pytest.mark.parametrize("backbone", ["clipcap", "vlm"])
def test_an_unquantised_checkpoint_starts_a_qlora_run(dirs, backbone, tmp_path):
    """``train.init_from`` an unquantised checkpoint with ``model.quantization=4bit`` (the route docs/training.md
    gives for a run that changes ``model.quantization``) quantizes its float weights as they load, as transformers
    quantizes a Hub model's, instead of refusing them as "of another kind" (stored F32, the model's uint8). The
    packed weights are those of QLoRA from the same weights as a pretrained model (``clipcap.lm`` / ``vlm.name``
    naming the checkpoint's folder), not the original's, and what the start trained beside them (adapters, ClipCap's
    mapper, the projector) is the start's; a step trains only the adapters (and mapper / projector), and its
    checkpoint reloads quantized with the same outputs and captions. An integer tensor in place of a quantized float
    weight is still refused."""
    pytest.importorskip("bitsandbytes")
    family = "idefics3"
    start = build(dirs, backbone, *START_TRAINING[backbone], family=family)
    batch = batch_of(start, backbone)
    sgd_steps(start, batch, 2)
    saved = start.save(tmp_path / "start")
    quantized = ("model.quantization=4bit", "lora.lm=true")
    model = build(dirs, backbone, *quantized, f"train.init_from={saved}", family=family)
    assert quantized_kinds(model.lora_module("lm")) == {"Linear4bit"}
    name = {"clipcap": f"clipcap.lm={saved / 'lm'}", "vlm": f"vlm.name={saved}"}[backbone]
    hub, original = (build(dirs, backbone, *quantized, *extra, family=family) for extra in ((name,), ()))
    ours, theirs, before = packed(model), packed(hub), packed(original)
    assert ours.keys() == theirs.keys() == before.keys() and any(k.endswith(".weight") for k in ours)
    for key, tensor in ours.items():
        assert torch.equal(tensor, theirs[key]), key
    trained_base = any(not torch.equal(ours[k], before[k]) for k in ours)
    assert trained_base == (backbone == "clipcap")  # GPT-2's trained weights, not clipcap.lm's
    own = dict(model.named_parameters())
    kept = {n: p for n, p in start.named_parameters() if p.requires_grad and n in own}
    assert kept.keys() >= {n for n in own if n.startswith(BESIDE)}
    assert backbone == "clipcap" or any("lora_" in n for n in kept)
    for n, p in kept.items():  # the adapters, mapper and projector the start trained
        assert torch.equal(own[n], p), n

    learning = {n for n, p in model.named_parameters() if p.requires_grad}
    assert learning and all("lora_" in n or n.startswith(BESIDE) for n in learning)
    sgd_steps(model, batch, 1)
    model.eval()
    config_ = DecodeConfig(strategy="greedy", max_length=8)
    with torch.no_grad():
        expected, captions = model(batch), model.generate(batch, config_).sequences
    out = model.save(tmp_path / "qlora")
    loaded = load_captioner(out, options=memory.LoadOptions(quantization="4bit")).eval()
    assert quantized_kinds(loaded.lora_module("lm")) == {"Linear4bit"}
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch), expected, rtol=0, atol=1e-5)
        assert torch.equal(loaded.generate(batch, config_).sequences, captions)

    weights = saved / ("lm" if backbone == "clipcap" else "") / "model.safetensors"
    tensors = strict.read_tensors(weights)
    victim = sorted(k for k, t in tensors.items() if t.dim() == 2 and k.endswith(("c_fc.weight", "up_proj.weight")))[0]
    tensors[victim] = torch.ones_like(tensors[victim], dtype=torch.int32)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    refused = rf"of another kind: {re.escape(victim)} \(stored I32, the model's uint8"
    with pytest.raises(CheckpointError, match=refused):
        build(dirs, backbone, *quantized, f"train.init_from={saved}", family=family)


def test_smolvlm2_refuses_parts_whose_dtypes_its_forward_cannot_merge(tmp_path):
    """SmolVLM2's forward (transformers 5.24) casts the image features to its first parameter's dtype, the vision
    tower's, and scatters them into the language model's embeddings: on a bfloat16 base, a float32 language model
    trained whole (or a float32 tower) made every step fail in ``masked_scatter`` ("expected self and source to have
    same dtypes"). The build refuses it, naming what works; one dtype trains, and Idefics3, which casts the features
    to the embeddings' dtype, takes parts of two dtypes."""
    from helpers.vlm_families import save_family

    folders = {family: save_family(tmp_path / family, family) for family in ("smolvlm", "idefics3")}

    def model(family: str, *overrides: str):
        torch.manual_seed(0)
        return build_model(load("coco/mle_vlm", [f"vlm.name={folders[family]}", "model.dtype=bfloat16", *overrides]))

    for parts in (["lora.lm=false"], ["model.train_encoder=true", "lora.encoder=false"]):
        with pytest.raises(ValueError, match=r"SmolVLM2: .* model\.trainable_dtype=same, LoRA"):
            model("smolvlm", *parts)
        for family, extra in (("smolvlm", ["model.trainable_dtype=same"]), ("idefics3", [])):
            vlm = model(family, *parts, *extra)
            batch = model_collator(vlm, 8)([{"caption": "w1 w2", "image": Image.new("RGB", (32, 24)), "image_id": 0,
                                             "references": ["w1"], "index": 0}])  # fmt: skip
            assert torch.isfinite(MLE()(vlm, batch).losses["mle"]), (family, parts)
