"""The real-checkpoint path: a tiny CLIPModel and GPT-2 saved with ``save_pretrained`` into a folder and loaded by
path through exactly the code a user runs with ``model.encoder=openai/clip-vit-base-patch32 clipcap.lm=gpt2``."""

import json

import pytest
import torch
from PIL import Image
from tokenizers import ByteLevelBPETokenizer
from transformers import CLIPImageProcessor, CLIPModel, GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

import finecap.models.clipcap
from finecap.config import DecodeConfig, load
from finecap.models.clipcap import ClipCap
from finecap.models.presets import tiny_clip_config

IMAGE = 32
CORPUS = ["A red circle on the grass.", "Two blue squares near a tree.", "A small dog runs on the beach."] * 5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Folders laid out like Hub checkpoints: ``clip/`` (CLIPModel + image processor), ``gpt2/`` (LM + tokenizer)."""
    root = tmp_path_factory.mktemp("hub")
    torch.manual_seed(0)
    clip = CLIPModel(tiny_clip_config(vocab_size=99, eos_token_id=98, image_size=IMAGE, patch_size=8))
    clip.save_pretrained(root / "clip")
    CLIPImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE}).save_pretrained(
        root / "clip"
    )
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<|endoftext|>")  # fmt: skip
    assert tok.pad_token_id is None  # like GPT-2
    eos = tok.eos_token_id
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                    bos_token_id=eos, eos_token_id=eos))  # fmt: skip
    lm.save_pretrained(root / "gpt2")
    tok.save_pretrained(root / "gpt2")
    return root


def images(n: int) -> list[Image.Image]:
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 20)]
    return [Image.new("RGB", (48, 40), colors[i % 4]) for i in range(n)]


def test_build_from_paths_forward_generate_save_reload(checkpoints, tmp_path):
    cfg = load(None, [f"model.encoder={checkpoints / 'clip'}", f"clipcap.lm={checkpoints / 'gpt2'}",
                      "clipcap.prefix_length=5", "clipcap.mapper=transformer", "clipcap.mapper_heads=4"])  # fmt: skip
    torch.manual_seed(0)
    model = ClipCap.build(cfg).eval()
    assert model.feature_dim == 24 and model.hidden_size == 32  # from the checkpoints, not the config
    assert model.pad_token_id == model.eos_token_id  # GPT-2 convention when the tokenizer has no pad token
    assert not any(p.requires_grad for p in model.encoder.parameters())  # frozen by default
    assert not model.train().encoder.training and model.lm.training  # a frozen encoder stays in eval mode
    model.eval()

    pixels = model.encoder.preprocess(images(3))
    assert pixels.shape == (3, 3, IMAGE, IMAGE)
    feats = model.image_features({"pixel_values": pixels})  # what the frozen-feature cache stores
    assert feats.shape == (3, 24)
    expected = CLIPModel.from_pretrained(checkpoints / "clip").get_image_features(pixel_values=pixels).pooler_output
    assert torch.allclose(feats, expected, atol=1e-5)

    from finecap.data.targets import encode_captions

    enc = encode_captions(model.tokenizer, ["A red circle.", "A dog on the beach."], max_tokens=12)
    batch = {"features": feats[:2], **enc}
    logits = model(batch)
    assert logits.shape == (2, enc["input_ids"].shape[1], len(model.tokenizer))
    assert torch.allclose(model({"pixel_values": pixels[:2], **enc}), logits, atol=1e-5)

    gen = model.generate(feats, DecodeConfig(strategy="beam", beam_size=2, num_return_sequences=2, max_length=6))
    assert gen.sequences.shape[0] == 6 and len(gen.texts) == 6 and all(isinstance(t, str) for t in gen.texts)
    lp = model({"features": feats}, sequences=gen.sequences, mask=gen.mask, image_index=gen.image_index).logprobs
    assert torch.allclose(lp, gen.token_logprobs, atol=1e-5)

    model.save(tmp_path / "ckpt")
    meta = json.loads((tmp_path / "ckpt" / "captioner.json").read_text())
    assert meta["encoder_source"] == str((checkpoints / "clip").resolve()) and not meta["encoder_saved"]
    again = ClipCap.from_checkpoint(tmp_path / "ckpt").eval()
    with torch.no_grad():
        assert torch.allclose(again(batch), logits, atol=1e-5)
        assert torch.allclose(again.image_features({"pixel_values": pixels}), feats, atol=1e-6)
    regen = again.generate(feats, DecodeConfig(strategy="beam", beam_size=2, num_return_sequences=2, max_length=6))
    assert regen.texts == gen.texts
    # the period stop id comes from the checkpoint's own tokenizer
    from finecap.decode import stop_token_ids

    assert len(stop_token_ids(model.tokenizer, stop_at_period=True)) >= 2


def test_trainable_encoder_trains_only_the_image_path_and_is_saved(checkpoints, tmp_path):
    cfg = load(None, [f"model.encoder={checkpoints / 'clip'}", f"clipcap.lm={checkpoints / 'gpt2'}",
                      "clipcap.prefix_length=3", "model.train_encoder=true"])  # fmt: skip
    model = ClipCap.build(cfg).train()
    assert model.encoder.training
    pixels = model.encoder.preprocess(images(2))
    enc = {"input_ids": torch.tensor([[5, 6, 7]]).repeat(2, 1), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    with pytest.raises(ValueError, match="model.train_encoder"):
        model({"features": torch.randn(2, 24), **enc})
    model({"pixel_values": pixels, **enc}).logsumexp(-1).mean().backward()
    clip = model.encoder.model
    assert clip.vision_model.encoder.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert clip.visual_projection.weight.grad.abs().sum() > 0
    assert not any(p.requires_grad for p in clip.text_model.parameters())
    assert not clip.logit_scale.requires_grad and not clip.text_projection.weight.requires_grad

    with torch.no_grad():
        clip.visual_projection.weight.add_(1.0)  # a "trained" encoder must be saved, not re-read from its source
    model.save(tmp_path / "ckpt")
    again = ClipCap.from_checkpoint(tmp_path / "ckpt")
    assert again.train_encoder
    assert torch.allclose(again.encoder.model.visual_projection.weight, clip.visual_projection.weight)


def test_world_encoder_and_world_tiny_lm_from_config(checkpoints, monkeypatch):
    # model.encoder=world asks the retriever module for the (cached) world encoder folder; a tiny CLIP stands in
    monkeypatch.setattr(finecap.models.clipcap, "world_encoder_path", lambda cfg: checkpoints / "clip")
    cfg = load(None, ["model.encoder=world", "clipcap.lm=world-tiny", "clipcap.tiny_layers=1",
                      "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=4"])  # fmt: skip
    model = ClipCap.build(cfg)
    assert model.lm.config.n_layer == 1 and model.hidden_size == 32
    assert model.tokenizer.eos_token_id == 4 and model.lm.config.eos_token_id == 4
    assert model.encoder_source == str((checkpoints / "clip").resolve())
    assert model.generate(torch.randn(2, 24), DecodeConfig(max_length=4)).sequences.shape[0] == 2


@pytest.mark.parametrize("recipe", ["coco/sr_l_clipcap", "coco/sr_v_clipcap", "coco/sr_lv_bagcurri_clipcap"])
def test_coco_sr_recipes_adapt_the_modules_ndlbs_code_adapts(checkpoints, recipe):
    """NDLB's released code (lora.py, configs/sr_final.yml at 77b3e7e) puts LoRA (rank 32, alpha 16) on each GPT-2
    block's attn.c_attn / attn.c_proj and, for the image side, on CLIP's q/k/v projections and MLP: with the recipes'
    targets, peft adapts exactly those modules of a GPT-2 and a CLIP ViT loaded by path."""
    from finecap.models.lora import configure_training

    cfg = load(recipe, [f"model.encoder={checkpoints / 'clip'}", f"clipcap.lm={checkpoints / 'gpt2'}",
                        f"retriever.checkpoint={checkpoints / 'clip'}"])  # fmt: skip
    assert (cfg.lora.rank, cfg.lora.alpha) == (32, 16.0)
    model = configure_training(ClipCap.build(cfg), cfg)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A" in name}
    lm = {n for n in adapted if ".h." in n}
    encoder = adapted - lm
    if cfg.lora.lm:
        assert {n.split(".h.", 1)[1].split(".", 1)[1] for n in lm} == {"attn.c_attn", "attn.c_proj"}
        assert len(lm) == 2 * 2  # both blocks of the tiny GPT-2
    else:
        assert not lm
    if cfg.lora.encoder:
        kinds = {n.rsplit(".", 2)[-2] + "." + n.rsplit(".", 1)[-1] for n in encoder}
        assert kinds == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.fc1", "mlp.fc2"}
        assert all("vision_model" in n for n in encoder)  # the image side only
    else:
        assert not encoder
    assert all(not p.requires_grad for n, p in model.named_parameters() if ".wte." in n)  # embeddings frozen
