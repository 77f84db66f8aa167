"""The captioner contract (:class:`finecap.models.base.CaptionerBase`), run on every backbone: ClipCap, BLIP (its own
ViT and the world BLIP reading a dual encoder's tokens), each decoder-only VLM family (LLaVA, Idefics3, Qwen2-VL), and
a toy fourth backbone written in one file of hooks on :class:`finecap.models.base.CaptionerBase`
(``tests/helpers/toy_backbone.py``), which checks that the base carries everything else and that a backbone named by
its dotted path (``model.kind=helpers.toy_backbone:ShowTell``) is built, saved and loaded back with no registry row.

Every backbone is a tiny random model built from configs (saved like Hub checkpoints in a session folder). A new
backbone adds one :class:`Case` here.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from finecap.config import ClipCapBackboneConfig, DecodeConfig, load
from finecap.data.datasets import model_collator
from finecap.data.targets import IGNORE_INDEX
from finecap.models import lora
from finecap.models.backbones import (
    BACKBONES,
    TRUST_ENV,
    backbone,
    build_model,
    check_backbone,
    checkpoint_kind,
    external_encoder,
    load_captioner,
    reads_world_encoder,
)
from finecap.models.base import CaptionerBase
from finecap.models.blip import Blip, FeatureMapTokens
from finecap.models.captioner import PARTS, ImageSide, token_scores
from finecap.models.clipcap import ClipCap
from finecap.models.presets import (
    VLM_FAMILIES,
    build_world_lm,
    save_tiny_blip,
    save_tiny_clip,
    save_tiny_vlm,
    world_blip,
    world_vlm,
)
from finecap.models.vision import VisionEncoder
from finecap.models.vlm import Vlm
from finecap.objectives.mle import mle_loss
from finecap.runs import CheckpointError
from finecap.train.model_card import model_card
from helpers.toy_backbone import ShowTell

CAPTIONS = ["a red circle", "two blue squares on the left", "a small green triangle"]
TOY_KIND = "helpers.toy_backbone:ShowTell"
"""The toy backbone's ``model.kind``: its dotted path (it is in no registry)."""


@dataclass(frozen=True)
class Case:
    """A backbone under test: how to build it from the session's saved tiny models, the module it always trains
    (whatever ``train_lm`` / ``train_encoder`` say: ClipCap's mapper, a VLM's projector), and its images' size."""

    build: Callable[[dict[str, Path]], CaptionerBase]
    always: Callable[[CaptionerBase], torch.nn.Module | None]
    image_size: int


def sharpen(model: torch.nn.Module, std: float = 0.2, seed: int = 0) -> None:
    """Redraw every weight matrix from N(0, std): at a random tiny model's init (std 0.02) the captions barely depend
    on the image, and decoding tests need them to."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def build_clipcap(dirs: dict[str, Path]) -> ClipCap:
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2, dropout=0.0)
    encoder = VisionEncoder.from_pretrained(dirs["clip"])
    model = ClipCap(lm, tok, encoder.feature_dim, ClipCapBackboneConfig(prefix_length=2), encoder=encoder)
    sharpen(model)
    return model


def build_blip(dirs: dict[str, Path]) -> Blip:
    model = Blip.from_pretrained(dirs["blip"])
    sharpen(model)
    return model


def build_toy(dirs: dict[str, Path]) -> ShowTell:
    """The toy built as a run builds it: ``model.kind`` its dotted path, resolved through no registry row."""
    torch.manual_seed(0)
    model = build_model(load(None, [f"model.kind={TOY_KIND}", f"model.encoder={dirs['clip']}"]))
    assert type(model) is ShowTell
    sharpen(model)
    return model


def build_world_blip(dirs: dict[str, Path]) -> Blip:
    torch.manual_seed(0)
    world = FeatureMapTokens.from_pretrained(dirs["clip"])
    _, width = world.token_shape(16)
    blip, tok = world_blip(width, layers=1, hidden=32, heads=2, dropout=0.0, positions=40)
    model = Blip(blip, tok, world=world, source="world-tiny")
    sharpen(model)
    return model


def build_world_vlm(dirs: dict[str, Path]) -> Vlm:
    torch.manual_seed(0)
    world = FeatureMapTokens.from_pretrained(dirs["clip"])
    n_tokens, width = world.token_shape(16)
    model, processor = world_vlm(width, n_tokens, world.image_processor, layers=1, hidden=32, heads=2)
    vlm = Vlm(model, processor, source="world-tiny", world=world)
    sharpen(vlm)
    return vlm


def build_vlm(family: str) -> Callable[[dict[str, Path]], Vlm]:
    def build(dirs: dict[str, Path]) -> Vlm:
        return Vlm.from_pretrained(dirs[family])  # saved with std 0.2

    return build


def projector(model: Vlm) -> torch.nn.Module:
    projectors = {"llava": "multi_modal_projector", "idefics3": "connector", "qwen2_vl": "merger"}
    name = projectors[model.model.config.model_type]
    return next(m for n, m in model.model.named_modules() if n.rsplit(".", 1)[-1] == name)


CASES: dict[str, Case] = {
    "clipcap": Case(build_clipcap, lambda m: m.mapper, 16),
    "blip": Case(build_blip, lambda m: None, 32),
    "blip_world": Case(build_world_blip, lambda m: None, 16),
    **{f"vlm_{f}": Case(build_vlm(f), projector, 16) for f in VLM_FAMILIES},
    "vlm_world": Case(build_world_vlm, projector, 16),
    "toy": Case(build_toy, lambda m: m.projection, 16),
}


@pytest.fixture(autouse=True)
def trust_the_toy(monkeypatch):
    """The toy's checkpoints name its dotted path, which finecap imports only when the user names it (as a user of
    their own backbone does: ``FINECAP_TRUSTED_CODE``; ``tests/models/test_backbone_trust.py``)."""
    monkeypatch.setenv(TRUST_ENV, TOY_KIND)


@pytest.fixture(scope="session")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backbones")
    out = {"clip": save_tiny_clip(root / "clip", image_size=16, patch_size=8),
           "blip": save_tiny_blip(root / "blip", image_size=32, layers=1, vision_layers=1)}  # fmt: skip
    for family in VLM_FAMILIES:
        out[family] = save_tiny_vlm(root / family, family, std=0.2)
    return out


@pytest.fixture(params=list(CASES))
def case(request, dirs) -> tuple[str, CaptionerBase]:
    """``(name, a fresh captioner in eval mode)``."""
    torch.manual_seed(0)
    return request.param, CASES[request.param].build(dirs).eval()


def images(n: int, size: int, seed: int = 0) -> list[Image.Image]:
    """Random RGB images; every second one is wider (VLM prompts of different lengths, where the family allows)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(size, size + (size // 4) * (i % 2)) for i in range(n)]
    return [Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).byte().numpy()) for h, w in shapes]


def batch_of(model: CaptionerBase, size: int, captions=CAPTIONS, seed: int = 0) -> dict:
    items = [{"caption": c, "image": im, "image_id": i, "references": [c], "index": i}
             for i, (c, im) in enumerate(zip(captions, images(len(captions), size, seed), strict=True))]  # fmt: skip
    return model_collator(model, 12)(items)


def _alone(model: CaptionerBase, size: int, i: int) -> dict:
    """Example ``i`` of :func:`batch_of` alone (no padding at all)."""
    ims = images(len(CAPTIONS), size)
    items = [{"caption": CAPTIONS[i], "image": ims[i], "image_id": i, "references": [], "index": i}]
    return model_collator(model, 12)(items)


def trainable(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def names_of(model: CaptionerBase, module: torch.nn.Module | None) -> set[str]:
    """Names (in the captioner) of ``module``'s parameters."""
    ids = {id(p) for p in module.parameters()} if module is not None else set()
    return {n for n, p in model.named_parameters() if id(p) in ids}


def part_names(model: CaptionerBase, part: str) -> set[str]:
    """Parameter names (in the captioner) of ``lora_module(part)``."""
    return names_of(model, model.lora_module(part))


# --------------------------------------------------------------------------------------------------------------------
# What a captioner is
# --------------------------------------------------------------------------------------------------------------------


def test_every_backbone_kind_has_a_case():
    kinds = {"clipcap": ClipCap, "blip": Blip, "vlm": Vlm}
    assert set(BACKBONES) == set(kinds) and all(backbone(k) is c and c.kind == k for k, c in kinds.items())


def test_a_backbone_of_ones_own_is_named_by_its_dotted_path():
    """A class that sets no ``kind`` is named by its dotted path, which ``model.kind`` and a checkpoint's
    ``captioner.json`` resolve like a registered name; a path to anything but a captioner class is refused naming the
    option."""
    assert ShowTell.kind == TOY_KIND and backbone(TOY_KIND) is ShowTell
    assert backbone("finecap.models.clipcap:ClipCap") is backbone("clipcap")
    with pytest.raises(ValueError, match=r"^model.kind: 'finecap.config:Config' is not a captioner class"):
        backbone("finecap.config:Config")
    with pytest.raises(ValueError, match=r"^model.kind: module 'helpers.toy_backbone' has no attribute 'Nope'"):
        backbone("helpers.toy_backbone:Nope")
    card = model_card(load(None, [f"model.kind={TOY_KIND}"]), {}, {"kind": TOY_KIND, "encoder_source": "/enc"}, None,
                      "finecap train")  # fmt: skip
    assert f"- **Backbone**: `{TOY_KIND}`" in card and "- **Base vision encoder**: `/enc`" in card


def test_a_checkpoint_of_ones_own_backbone_starts_only_a_run_naming_it(dirs, tmp_path):
    """``train.init_from`` a toy checkpoint: refused under another ``model.kind`` (naming the dotted path to set) or
    another ``model.encoder`` (the checkpoint keeps the one it was built on), accepted under the toy's dotted path and
    its encoder."""
    out = build_toy(dirs).save(tmp_path / "ckpt")
    assert checkpoint_kind(out) == TOY_KIND
    with pytest.raises(CheckpointError, match=f"is a {TOY_KIND} captioner, but model.kind=clipcap; set "
                       f"model.kind={TOY_KIND}, or start from a clipcap checkpoint"):  # fmt: skip
        check_backbone(out, load(None, []), "train.init_from")
    with pytest.raises(CheckpointError, match=r"model.encoder=.* in the checkpoint, 'world' configured"):
        check_backbone(out, load(None, [f"model.kind={TOY_KIND}"]), "train.init_from")
    check_backbone(out, load(None, [f"model.kind={TOY_KIND}", f"model.encoder={dirs['clip']}"]), "train.init_from")


def test_a_backbone_missing_a_hook_is_named_when_built():
    from finecap.models.base import CaptionerBase

    class Partial(ShowTell):
        caption_logits = CaptionerBase.caption_logits  # the abstract hook again

    with pytest.raises(TypeError, match="abstract.*caption_logits"):  # the wording differs across Pythons
        Partial(None, None, None)


def test_members_and_their_types(case, tmp_path):
    name, model = case
    assert isinstance(model, CaptionerBase) and isinstance(model.encoder, ImageSide)
    vocab = model(batch_of(model, CASES[name].image_size)).shape[-1]
    assert 0 <= model.pad_token_id < vocab and 0 <= model.eos_token_id < vocab
    assert model.tokenizer.eos_token_id == model.eos_token_id
    assert isinstance(model.cache_features, bool) and isinstance(model.train_lm, bool)
    assert model.max_caption_tokens is None or model.max_caption_tokens >= 8
    assert model.device == next(model.parameters()).device
    assert {p: model.lora_module(p) is not None for p in PARTS} == {"lm": True, "encoder": True}
    assert all(isinstance(t, str) for p in PARTS for t in model.lora_default_targets(p))
    assert model.config_dict()["kind"] == checkpoint_kind(model.save(tmp_path / "ckpt"))


def test_teacher_forced_logits_are_the_caption_tokens_and_score_them(case):
    """``forward(batch)`` gives ``(B, T, V)`` for the caption tokens only, ``logits[:, t]`` predicting ``labels[:,
    t]``; given the same tokens as ``sequences`` it returns their log-probs (and entropies) under those logits."""
    name, model = case
    batch = batch_of(model, CASES[name].image_size)
    logits = model(batch)
    B, T = batch["input_ids"].shape
    assert logits.shape[:2] == (B, T)
    # not a slice of a larger output: FSDP2 warns of a sharded forward returning a view (an in-place op on it would
    # skip the pre-backward all-gather). BLIP's text decoder ends in a Linear with a bias, whose 3-d output torch
    # returns as a view of its 2-d (B*T, V) product: that one is transformers', not a slice
    if logits._base is not None:
        assert name.startswith("blip") and logits._base.shape == (B * T, logits.shape[-1]), (name, logits._base.shape)
    mask = batch["attention_mask"].bool()
    scores = model(batch, sequences=batch["input_ids"], mask=mask, temperature=2.0, with_entropy=True)
    expected = token_scores(logits, batch["input_ids"], mask, temperature=2.0, with_entropy=True)
    assert torch.allclose(scores.logprobs, expected.logprobs, atol=1e-5)
    assert torch.allclose(scores.entropy, expected.entropy, atol=1e-5)
    assert bool((scores.logprobs[~mask] == 0).all()) and bool((scores.entropy[~mask] == 0).all())
    # the MLE loss is the mean -log p of the caption tokens (EOS included), padding ignored
    nll = -F.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][..., None]).squeeze(-1)  # (B, T)
    assert torch.allclose(mle_loss(logits, batch["labels"]), nll[mask].mean(), atol=1e-5)
    assert bool((batch["labels"][~mask] == IGNORE_INDEX).all())


def test_padding_never_changes_a_caption(case):
    """Each example's logits in a padded batch equal the example's alone (caption padding, a VLM's prompt padding and
    image tokens of other sizes all masked)."""
    name, model = case
    size = CASES[name].image_size
    batch = batch_of(model, size)
    logits = model(batch)
    for i in range(len(CAPTIONS)):
        alone = _alone(model, size, i)
        n = int(alone["attention_mask"].sum())
        assert torch.allclose(model(alone)[0, :n], logits[i, :n], atol=1e-4), i


def test_scores_map_rows_to_images(case):
    """``image_index`` maps sequence rows to batch images: scoring two captions per image equals scoring them on a
    batch holding each image once per caption."""
    name, model = case
    batch = batch_of(model, CASES[name].image_size)
    seqs = torch.cat([batch["input_ids"], batch["input_ids"].flip(0)])  # (2B, T)
    mask = torch.cat([batch["attention_mask"], batch["attention_mask"].flip(0)]).bool()
    index = torch.arange(3).repeat(2)
    got = model(batch, sequences=seqs, mask=mask, image_index=index)
    for r in range(6):
        alone = _alone(model, CASES[name].image_size, int(index[r]))
        want = model(alone, sequences=seqs[r : r + 1], mask=mask[r : r + 1])
        assert torch.allclose(got.logprobs[r], want.logprobs[0], atol=1e-4), r
    with pytest.raises(ValueError, match="images for 6 sequences"):
        model(batch, sequences=seqs, mask=mask)


def test_cached_features_equal_pixels(case):
    """A backbone that caches frozen vision outputs reads ``encoder(pixel_values)`` as ``features`` with the same
    result as from pixels; one that does not reads its pre-processed inputs."""
    name, model = case
    batch = batch_of(model, CASES[name].image_size)
    if not model.cache_features:
        inputs = model.encoder.preprocess(images(1, CASES[name].image_size))
        keys = set(inputs) if isinstance(inputs, dict) else {"pixel_values"}
        assert "features" not in batch and keys <= set(batch)
        return
    with torch.no_grad():
        features = model.encoder(batch["pixel_values"])
    cached = {k: v for k, v in batch.items() if k != "pixel_values"} | {"features": features}
    assert torch.allclose(model(cached), model(batch), atol=1e-5)


# --------------------------------------------------------------------------------------------------------------------
# Decoding (Stepper)
# --------------------------------------------------------------------------------------------------------------------


def test_greedy_decoding_follows_the_teacher_forced_argmax(case):
    """The Stepper (start/step with the KV cache) and ``forward`` are one model: each greedy token is the argmax of
    the teacher-forced logits of the decoded caption, and its log-prob is ``forward``'s."""
    name, model = case
    batch = batch_of(model, CASES[name].image_size)
    gen = model.generate(batch, DecodeConfig(strategy="greedy", max_length=8))
    assert len(gen) == 3 and gen.image_index.tolist() == [0, 1, 2] and len(gen.texts) == 3
    scores = model(batch, sequences=gen.sequences, mask=gen.mask)
    assert torch.allclose(scores.logprobs, gen.token_logprobs, atol=1e-4)
    tf = model({**batch, "input_ids": gen.sequences, "attention_mask": gen.mask.long()})
    assert bool((tf.argmax(-1)[gen.mask] == gen.sequences[gen.mask]).all())
    stops = gen.sequences[torch.arange(3), gen.lengths - 1]
    assert all(s == model.eos_token_id or n == 8 for s, n in zip(stops.tolist(), gen.lengths.tolist(), strict=True))


def test_decoding_hands_the_kv_cache_over_under_the_name_transformers_takes(case):
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` and warns on the old name: beam decoding and the
    scoring of its beams hand the cache over under the name the installed version takes, so nothing warns."""
    name, model = case
    batch = batch_of(model, CASES[name].image_size)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    library = logging.getLogger("transformers")
    logging.Logger.warning_once.cache_clear()  # transformers warns once per process: let this test's calls warn again
    library.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gen = model.generate(batch, DecodeConfig(strategy="beam", beam_size=2, max_length=6))
            model(batch, sequences=gen.sequences, mask=gen.mask)
    finally:
        library.removeHandler(handler)
    said += [str(w.message) for w in caught]
    assert len(gen) == 3 and not [s for s in said if "past_key_values" in s or "cache_params" in s], said


@pytest.mark.parametrize("strategy", ["beam", "sample"])
def test_batched_decoding_equals_one_image_at_a_time(case, strategy):
    """``select`` keeps / repeats / reorders the state's rows correctly: beams and seeded samples of an image do not
    depend on the other images of the batch."""
    name, model = case
    size = CASES[name].image_size
    cfg = DecodeConfig(strategy=strategy, beam_size=3, max_length=8, num_return_sequences=2)
    seeds = torch.tensor([5, 6, 7])
    together = model.generate(batch_of(model, size), cfg, seeds=seeds)
    alone = [model.generate(_alone(model, size, i), cfg, seeds=seeds[i : i + 1]) for i in range(3)]
    assert together.texts == [t for g in alone for t in g.texts]
    assert torch.allclose(together.scores, torch.cat([g.scores for g in alone]), atol=1e-4)


# --------------------------------------------------------------------------------------------------------------------
# What trains
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("lm", "encoder"), [(True, False), (False, True), (False, False), (True, True)])
def test_flags_decide_what_trains_and_gradients_reach_it(case, lm, encoder):
    name, model = case
    lora.set_trainable(model, lm=lm, encoder=encoder)
    names = trainable(model)
    always = names_of(model, CASES[name].always(model))
    lm_part, enc_part = part_names(model, "lm"), part_names(model, "encoder")
    assert always <= names
    assert (lm_part - always <= names) == lm and bool((lm_part - always) & names) == lm
    assert bool((enc_part - always) & names) == encoder
    assert names <= always | (lm_part if lm else set()) | (enc_part if encoder else set()) | _head(model, lm)
    model.train()
    frozen = [model.lora_module(part) for part, flag in (("lm", lm), ("encoder", encoder)) if not flag]
    assert all(not m.training for m in frozen)  # frozen parts stay in eval mode (no dropout)
    batch = batch_of(model, CASES[name].image_size)
    loss = mle_loss(model(batch), batch["labels"])
    assert loss.requires_grad == bool(names)
    if not names:  # BLIP with nothing to train
        return
    loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads <= names
    assert (grads & lm_part) if lm else not (grads & (lm_part - always))
    assert (grads & (enc_part - always)) if encoder else not (grads & (enc_part - always))


def _head(model: CaptionerBase, lm: bool) -> set[str]:
    """The output head, which trains with the text side where it is not part of ``lora_module("lm")`` (a VLM)."""
    if not lm or not isinstance(model, Vlm):
        return set()
    head = model.model.get_output_embeddings().weight
    return {n for n, p in model.named_parameters() if p is head}


def test_lora_on_both_parts_trains_adapters_only_and_round_trips(case, tmp_path):
    name, model = case
    cfg = load(None, ["lora.lm=true", "lora.encoder=true", "model.train_encoder=true", "lora.rank=2", "lora.alpha=2"])
    candidates = {p: lora.candidate_modules(p, model.lora_module(p)) for p in PARTS}
    lora.configure_training(model, cfg)
    names = trainable(model)
    always = names_of(model, CASES[name].always(model))
    assert always <= names and names - always and all("lora_" in n for n in names - always)
    for part in PARTS:
        assert any(n in part_names(model, part) for n in names - always), part
        targets, default = set(lora.adapter_spec(model, part).targets), model.lora_default_targets(part)
        if not default:  # every linear layer of the part but the head, and but those its output never reads
            assert targets == set(candidates[part]) - set(model.lora_unreached(part)), part
        else:  # exactly the candidates named by the defaults, each default naming some
            named = {c for c in candidates[part] if any(c == d or c.endswith("." + d) for d in default)}
            assert targets == named and all(any(t.endswith(d) for t in targets) for d in default), part
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    model.eval()
    batch = batch_of(model, CASES[name].image_size)
    expected = model(batch)
    out = model.save(tmp_path / "ckpt")
    again = load_captioner(out).eval()
    assert type(again) is type(model) and lora.has_adapters(again)
    assert torch.allclose(again(batch), expected, atol=1e-5)


ENCODER_LORA = ["model.train_encoder=true", "model.train_lm=false", "lora.encoder=true", "lora.rank=2"]
"""SR-V on a backbone: LoRA (rank 2) on its trained vision side, its text side frozen."""


def encoder_adapters(model: CaptionerBase) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if "lora_" in n and n in part_names(model, "encoder")}


@pytest.mark.parametrize("name", ["blip_world", "vlm_world", "clipcap"])
def test_encoder_adapters_are_made_and_saved_only_where_the_loss_reaches(name, dirs, tmp_path):
    """LoRA on a trained dual encoder adapts only what the captioner's output reads: the world BLIP's and VLM's tokens
    of a ViT (the tiny CLIP) are its last hidden state, which ``visual_projection`` never reaches; its adapters
    stayed frozen at zero (2 of 14 tensors got no gradient from the captioning loss) and were saved in
    ``encoder_lora/``. ClipCap reads the projected feature: ``visual_projection`` keeps its adapter. Every adapter
    trains and gets a gradient from the loss; the saved file holds the same adapters and loads back."""
    from safetensors import safe_open

    model = lora.configure_training(CASES[name].build(dirs), load(None, ENCODER_LORA)).train()
    adapters = encoder_adapters(model)
    assert adapters and all(p.requires_grad for p in adapters.values())
    assert any(".visual_projection." in n for n in adapters) == (name == "clipcap"), sorted(adapters)
    batch = batch_of(model, CASES[name].image_size)
    mle_loss(model(batch), batch["labels"]).backward()
    assert {n for n, p in adapters.items() if p.grad is None} == set()
    out = model.save(tmp_path / "ckpt")
    with safe_open(str(out / "encoder_lora" / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    saved = {k.split(".lora_", 1)[0].removeprefix("base_model.model.") for k in keys}  # <layer>.lora_A.weight
    assert saved == {n.split(".lora_", 1)[0].split(".base_model.model.", 1)[1] for n in adapters}
    again = load_captioner(out)
    assert encoder_adapters(again).keys() == adapters.keys()


def test_a_checkpoint_with_adapters_the_tokens_never_read_still_loads_and_resumes(dirs, monkeypatch, tmp_path):
    """World BLIP checkpoints saved before such adapters were left out hold one on ``visual_projection``: it loads as
    saved, and a run continuing the checkpoint keeps it (the same settings: not merged into the base weights and
    made afresh), frozen; the others train."""
    with monkeypatch.context() as m:
        m.setattr(CaptionerBase, "lora_unreached", lambda self, part: frozenset())  # the old behaviour
        old = lora.configure_training(build_world_blip(dirs), load(None, ENCODER_LORA))
    unread = {n for n in encoder_adapters(old) if ".visual_projection." in n}
    assert unread
    model = load_captioner(old.save(tmp_path / "old"))
    adapters = encoder_adapters(model)
    assert adapters.keys() == encoder_adapters(old).keys()
    lora.configure_training(model, load(None, ENCODER_LORA))
    kept = encoder_adapters(model)
    assert kept.keys() == adapters.keys() and all(kept[n] is adapters[n] for n in kept)  # not merged, not remade
    assert {n for n, p in kept.items() if not p.requires_grad} == unread


# --------------------------------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------------------------------


def test_checkpoint_round_trip(case, tmp_path):
    name, model = case
    lora.set_trainable(model, lm=True, encoder=True)
    model.eval()
    batch = batch_of(model, CASES[name].image_size)
    expected = model(batch)
    gen = model.generate(batch, DecodeConfig(strategy="greedy", max_length=8))
    out = model.save(tmp_path / "ckpt")
    kind = model.config_dict().get("kind", "clipcap")
    assert checkpoint_kind(out) == kind
    again = load_captioner(out).eval()
    assert type(again) is type(model) and again.train_encoder and again.train_lm
    assert torch.allclose(again(batch), expected, atol=1e-5)
    assert again.generate(batch, DecodeConfig(strategy="greedy", max_length=8)).texts == gen.texts


def test_what_a_run_prepares_and_fingerprints(case, tmp_path):
    """``external_encoder``: a saved captioner names the frozen encoder it loads from outside its folder (ClipCap's,
    the world BLIP's dual encoder) and nothing when the folder holds it; ``reads_world_encoder`` from the config."""
    name, model = case
    meta = json.loads((model.save(tmp_path / "ckpt") / "captioner.json").read_text())
    external = external_encoder(meta)
    if name in ("clipcap", "blip_world", "vlm_world", "toy"):
        assert external is not None and Path(external).samefile(model.encoder.source)
    else:
        assert external is None
    assert load_captioner(tmp_path / "ckpt", load_encoder=external is not None) is not None


@pytest.mark.parametrize(("overrides", "reads"), [
    ([], True), (["model.encoder=openai/clip-vit-base-patch32"], False), (["model.kind=blip"], True),
    (["model.kind=blip", "blip.name=Salesforce/blip-image-captioning-base"], False), (["model.kind=vlm"], False),
])  # fmt: skip
def test_which_fresh_captioners_read_the_world_encoder(overrides, reads):
    assert reads_world_encoder(load(None, overrides)) is reads
