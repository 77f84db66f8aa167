"""BLIP behind the captioner protocol: the transformers pitfalls, decoding against ``generate``, save/load."""

from __future__ import annotations

import pytest
import torch
from beam_match import assert_same_hypotheses, trimmed
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import BlipConfig, BlipForConditionalGeneration

from finecap.config import DecodeConfig
from finecap.data.targets import IGNORE_INDEX
from finecap.models import lora
from finecap.models.backbones import checkpoint_kind, load_captioner
from finecap.models.blip import Blip, BlipImageProcessor, FeatureMapTokens
from finecap.models.presets import save_tiny_blip, tiny_blip_config
from finecap.models.tokenizer import world_tokenizer
from finecap.models.vision import VisionEncoder
from finecap.models.world_encoder import build_world_model
from finecap.objectives.mle import mle_loss


@pytest.fixture(scope="module")
def blip_dir(tmp_path_factory):
    return save_tiny_blip(tmp_path_factory.mktemp("blip"), image_size=32)


def load(blip_dir, **kwargs) -> Blip:
    torch.manual_seed(0)
    model = Blip.from_pretrained(blip_dir, **kwargs).eval()
    # at BLIP's init (std 0.02) a random tiny decoder barely reads the image; std 0.15 makes captions differ per image
    with torch.no_grad():
        for p in model.model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.15)
    return model


def pixels(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed)) * 2.0


def captions_batch(model: Blip, texts: list[str]) -> dict:
    enc = model.tokenizer(texts, add_special_tokens=False)["input_ids"]
    rows = [r + [model.eos_token_id] for r in enc]
    T = max(map(len, rows))
    ids = torch.full((len(rows), T), model.pad_token_id)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "pixel_values": pixels(len(rows))}


def test_special_ids_must_lie_in_the_tiny_vocabulary():
    tok = world_tokenizer()
    config = tiny_blip_config(tok)
    ids = config.text_config
    assert (ids.bos_token_id, ids.sep_token_id, ids.pad_token_id) == (tok.bos_token_id, tok.eos_token_id, 0)
    bad = BlipConfig(text_config={"vocab_size": len(tok), "hidden_size": 32, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 64},
                     vision_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                    "intermediate_size": 64, "image_size": 32, "patch_size": 8})  # fmt: skip
    with pytest.raises(ValueError, match="bos_token_id=30522 is outside the decoder's vocabulary"):
        Blip(BlipForConditionalGeneration(bad), tok)


def test_image_processor_sized_for_small_images_with_the_pil_backend(blip_dir):
    from PIL import Image

    model = Blip.from_pretrained(blip_dir)
    assert type(model.image_processor).__name__ == "BlipImageProcessorPil"
    pv = model.encoder.preprocess([Image.new("RGB", (40, 50)), Image.new("L", (20, 20))])
    assert pv.shape == (2, 3, 32, 32)  # the processor's default would be 384 px


def test_teacher_forcing_matches_blip_forward_with_bos_and_shifted_labels(blip_dir):
    """finecap's logits are aligned with the caption (``[bos]`` fed first, as BLIP trains), so its token loss equals
    ``BlipForConditionalGeneration``'s loss on ``[bos] + caption`` with -100 padding (labels shifted inside)."""
    model = load(blip_dir)
    batch = captions_batch(model, ["a red circle", "two blue squares on the left"])
    logits = model(batch)  # (B, T, V)
    ours = mle_loss(logits, batch["labels"])
    B = batch["input_ids"].shape[0]
    bos = torch.full((B, 1), model.bos_token_id)
    ids = torch.cat([bos, batch["input_ids"]], 1)  # (B, T+1)
    labels = torch.cat([torch.full((B, 1), IGNORE_INDEX), batch["labels"]], 1)
    mask = torch.cat([torch.ones(B, 1, dtype=torch.long), batch["attention_mask"]], 1)
    theirs = model.model(pixel_values=batch["pixel_values"], input_ids=ids, attention_mask=mask, labels=labels).loss
    assert torch.allclose(ours, theirs, atol=1e-5)
    # without [bos] (what forward does when given the caption as is) the loss is another one: the pitfall
    plain = batch["input_ids"]
    wrong = model.model(pixel_values=batch["pixel_values"], input_ids=plain, attention_mask=batch["attention_mask"],
                        labels=batch["labels"]).loss  # fmt: skip
    assert not torch.allclose(ours, wrong, atol=1e-3)


@pytest.mark.parametrize("beams", [1, 3])
def test_decoding_equals_blip_generate(blip_dir, beams):
    model = load(blip_dir)
    pv = pixels(4)
    cfg = DecodeConfig(strategy="greedy" if beams == 1 else "beam", beam_size=beams, max_length=12)
    ours = model.generate({"pixel_values": pv}, cfg)
    theirs = model.model.generate(pixel_values=pv, max_new_tokens=12, num_beams=beams, do_sample=False,
                                  length_penalty=1.0)  # fmt: skip
    assert len(set(ours.texts)) > 1  # the images get different captions
    for row, seq in enumerate(theirs.tolist()):
        seq = seq[1:]  # generate returns the [bos] it starts from
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n]
        assert all(t in (model.pad_token_id, model.eos_token_id) for t in seq[n:])  # beam search pads with EOS
    if beams > 1:  # finecap's beam scores (sum log p / length) are generate's sequences_scores
        out = model.model.generate(pixel_values=pv, max_new_tokens=12, num_beams=beams, do_sample=False,
                                   return_dict_in_generate=True, output_scores=True)  # fmt: skip
        assert torch.allclose(ours.scores, out.sequences_scores, atol=1e-4)


def test_set_aside_beam_search_equals_blip_generate_when_beams_end_early(blip_dir):
    """``decode.finished_beams=set_aside`` is ``generate``'s beam search: the same K hypotheses per image (tokens,
    scores, order) for every ``early_stopping`` and several length penalties. The EOS logit's bias is raised so that
    hypotheses end early (checked); finecap's default rule (keep) then answers otherwise."""
    model = load(blip_dir)
    with torch.no_grad():
        model.model.text_decoder.cls.predictions.bias[model.eos_token_id] += 2.0
    pv, K, L = pixels(4), 3, 12
    found = {}
    for early_stopping in (False, True, "never"):
        for lp in (0.0, 1.0, 2.0):
            cfg = DecodeConfig(strategy="beam", beam_size=K, num_return_sequences=K, max_length=L, length_penalty=lp,
                               finished_beams="set_aside", early_stopping=early_stopping)  # fmt: skip
            ours = model.generate({"pixel_values": pv}, cfg)
            theirs = model.model.generate(pixel_values=pv, max_new_tokens=L, num_beams=K, num_return_sequences=K,
                                          do_sample=False, length_penalty=lp, early_stopping=early_stopping,
                                          return_dict_in_generate=True, output_scores=True)  # fmt: skip
            setting = (early_stopping, lp)
            new = [seq[1:] for seq in theirs.sequences.tolist()]  # generate returns the [bos] it starts from
            fill = (model.pad_token_id, model.eos_token_id)
            assert_same_hypotheses(ours, new, theirs.sequences_scores, fill, setting)
            found[setting] = (trimmed(ours), int(ours.lengths.min()))
    assert all(found[(es, lp)][1] < L for es in (False, True, "never") for lp in (0.0, 1.0))  # ended early
    assert len({str(captions) for captions, _ in found.values()}) > 2  # the settings matter here
    keep = model.generate({"pixel_values": pv}, DecodeConfig(strategy="beam", beam_size=K, num_return_sequences=K,
                                                             max_length=L))  # fmt: skip
    assert trimmed(keep) != found[(False, 1.0)][0]


def test_batched_decoding_equals_one_image_at_a_time(blip_dir):
    model = load(blip_dir)
    pv = pixels(5, seed=3)
    for cfg in (DecodeConfig(strategy="greedy", max_length=10),
                DecodeConfig(strategy="beam", beam_size=3, max_length=10, num_return_sequences=2),
                DecodeConfig(strategy="sample", max_length=10, num_return_sequences=3)):  # fmt: skip
        seeds = torch.arange(5) + 11
        together = model.generate({"pixel_values": pv}, cfg, seeds=seeds)
        alone = [model.generate({"pixel_values": pv[i : i + 1]}, cfg, seeds=seeds[i : i + 1]) for i in range(5)]
        assert together.texts == [t for g in alone for t in g.texts], cfg.strategy
        singles = torch.cat([g.token_logprobs.sum(1) for g in alone])
        assert torch.allclose(together.token_logprobs.sum(1), singles, atol=1e-4)


def test_sequence_scores_equal_decoding_logprobs(blip_dir):
    model = load(blip_dir)
    batch = {"pixel_values": pixels(3)}
    gen = model.generate(batch, DecodeConfig(strategy="sample", max_length=10, num_return_sequences=2),
                         seeds=torch.tensor([1, 2, 3]))  # fmt: skip
    scores = model(batch, sequences=gen.sequences, mask=gen.mask, image_index=gen.image_index, with_entropy=True)
    assert torch.allclose(scores.logprobs, gen.token_logprobs, atol=1e-4)
    assert scores.entropy.shape == gen.sequences.shape and bool((scores.entropy[gen.mask] > 0).all())


def test_fine_tuned_blip_loads_back_with_from_pretrained(blip_dir, tmp_path):
    model = load(blip_dir, train_encoder=True)
    model.train()
    batch = captions_batch(model, ["a red circle", "a green triangle"])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        mle_loss(model(batch), batch["labels"]).backward()
        opt.step()
    model.eval()
    expected = model(batch)
    out = model.save(tmp_path / "ckpt")
    assert (out / "model.safetensors").exists() and checkpoint_kind(out) == "blip"
    plain = BlipForConditionalGeneration.from_pretrained(out).eval()  # outside finecap
    B = batch["input_ids"].shape[0]
    ids = torch.cat([torch.full((B, 1), model.bos_token_id), batch["input_ids"][:, :-1]], 1)
    mask = torch.cat([torch.ones(B, 1, dtype=torch.long), batch["attention_mask"][:, :-1]], 1)
    logits = plain(pixel_values=batch["pixel_values"], input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(logits, expected, atol=1e-5)
    again = load_captioner(out).eval()
    assert isinstance(again, Blip) and again.train_encoder
    assert torch.allclose(again(batch), expected, atol=1e-5)
    assert isinstance(BlipImageProcessor.from_pretrained(out), BlipImageProcessor)


def test_lora_adapters_saved_in_peft_format(blip_dir, tmp_path):
    model = load(blip_dir)
    lora.apply_lora(model, "lm", lora.LoraSpec(rank=4, alpha=4.0))
    lora.apply_lora(model, "encoder", lora.LoraSpec(rank=4, alpha=4.0))
    lora.set_trainable(model, lm=True, encoder=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any("crossattention" in n for n in trainable) and any("vision_model" in n for n in trainable)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    model.eval()
    batch = captions_batch(model, ["a red circle"])
    expected = model(batch)
    out = model.save(tmp_path / "ckpt")
    assert (out / "lm_lora" / "adapter_model.safetensors").exists()
    assert (out / "encoder_lora" / "adapter_config.json").exists()
    base = BlipForConditionalGeneration.from_pretrained(out).eval()  # base weights, no adapter names
    base.text_decoder = PeftModel.from_pretrained(base.text_decoder, out / "lm_lora")
    base.vision_model = PeftModel.from_pretrained(base.vision_model, out / "encoder_lora")
    ids = torch.cat([torch.tensor([[model.bos_token_id]]), batch["input_ids"][:, :-1]], 1)
    logits = base(pixel_values=batch["pixel_values"], input_ids=ids).logits
    assert torch.allclose(logits, expected, atol=1e-5)
    again = load_captioner(out).eval()
    assert lora.has_adapters(again)
    assert torch.allclose(again(batch), expected, atol=1e-5)


def test_world_tokens_from_a_convnet_feature_map():
    """The world BLIP's image tokens: the projected feature, then the cells of the 2x2 map before the readout."""
    torch.manual_seed(0)
    tok = world_tokenizer()
    dual = build_world_model(tok, image_size=32)
    tokens = FeatureMapTokens(dual)
    pv = torch.randn(2, 3, 32, 32)
    out = tokens(pv)  # (2, 1 + 2*2, 256)
    assert out.shape == (2, 5, 256)
    assert torch.allclose(out[:, 0], dual.get_image_features(pixel_values=pv).pooler_output, atol=1e-5)
    stage = dual.vision_model(pixel_values=pv, output_hidden_states=True).hidden_states[-2]  # (2, 256, 2, 2)
    assert torch.allclose(out[:, 2], stage[:, :, 0, 1], atol=1e-5)  # cell (row 0, column 1)


def test_world_tokens_of_a_vit_train_only_what_the_tokens_read(tmp_path):
    """A ViT tower's tokens are its last hidden state: ``set_trainable`` leaves out its pooled output's
    ``post_layernorm`` and ``visual_projection``, which no loss reaches (they counted as trained in ``--dry-run``
    and stopped a 2-process run at its second step: DDP's "parameters that were not used in producing loss"), and
    everything it trains, full or through LoRA adapters, gets a gradient from the tokens."""
    from finecap.models.presets import save_tiny_clip

    tokens = FeatureMapTokens.from_pretrained(save_tiny_clip(tmp_path / "clip", image_size=32, patch_size=16))
    unread = ("vision_model.post_layernorm.", "visual_projection.")
    for adapted in (False, True):
        if adapted:
            targets = lora.candidate_modules("encoder", tokens.model)  # visual_projection among them
            tokens.model = get_peft_model(tokens.model, LoraConfig(r=2, target_modules=targets))
        tokens.set_trainable(True)
        trained = {lora.plain_name(n): p for n, p in tokens.model.named_parameters() if p.requires_grad}
        assert trained and all(("lora_" in n) == adapted for n in trained)
        assert not any(n.startswith(unread) for n in trained), sorted(trained)
        tokens(torch.randn(2, 3, 32, 32)).square().sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in trained.items() if "lora_A" not in n)
        side = {lora.plain_name(n) for n, p in tokens.model.named_parameters() if "text" not in n and "logit" not in n}
        assert {n for n in side if not n.startswith(unread) and ("lora_" in n) == adapted} == set(trained)
        tokens.model.zero_grad()


def test_world_tokens_of_a_convnet_train_every_image_side_weight():
    """The world encoder's tokens read its projected feature: its whole image side trains."""
    torch.manual_seed(0)
    tokens = FeatureMapTokens(build_world_model(world_tokenizer(), image_size=32))
    tokens.set_trainable(True)
    assert [p for p in tokens.model.parameters() if p.requires_grad] == tokens.image_parameters()
    assert {id(p) for p in tokens.image_parameters()} == {id(p) for p in VisionEncoder.image_parameters(tokens)}
