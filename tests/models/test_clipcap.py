"""ClipCap on the tiny world GPT-2 with random image features: alignment, MLE fit, decoding, log-probs, saving."""

import json

import pytest
import torch
import torch.nn.functional as F

from finecap.config import ClipCapBackboneConfig, DecodeConfig
from finecap.data.targets import encode_captions
from finecap.models.clipcap import ClipCap, MLPMapper, TransformerMapper
from finecap.models.presets import build_world_lm

D = 16  # feature dim
K = 4  # prefix length
CAPTIONS = ["a red circle", "a big blue square on grass", "two things", "a small green star at the top left"]


def tiny_captioner(seed: int = 0, section: ClipCapBackboneConfig | None = None, **kw) -> ClipCap:
    torch.manual_seed(seed)
    lm, tok = build_world_lm(layers=2, hidden=32, heads=2)
    return ClipCap(lm, tok, D, section or ClipCapBackboneConfig(prefix_length=K), **kw)


def make_batch(model: ClipCap, features: torch.Tensor, captions: list[str]) -> dict:
    enc = encode_captions(model.tokenizer, captions, max_tokens=16)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    return {"features": features, **enc, "labels": labels, "image_ids": list(range(len(captions)))}


def mle_loss(model: ClipCap, batch: dict) -> torch.Tensor:
    logits = model(batch)  # (B, T, V), already aligned with labels
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)


@pytest.fixture(scope="module")
def trained():
    """A captioner fitted for a few steps to four captions of different lengths (4 random feature vectors)."""
    model = tiny_captioner()
    torch.manual_seed(1)
    feats = torch.randn(4, D)
    batch = make_batch(model, feats, CAPTIONS)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    losses = []
    for _ in range(40):
        loss = mle_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    changed = all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    return model.eval(), feats, losses, changed


def test_mle_fits_captions_of_different_lengths(trained):
    model, feats, losses, changed = trained
    assert changed  # mapper and LM all moved
    assert losses[-1] < 0.1 * losses[0]
    gen = model.generate(feats, DecodeConfig(max_length=16))
    assert gen.texts == CAPTIONS
    assert gen.lengths.tolist() == [4, 7, 3, 9]  # words + EOS


def test_logits_are_aligned_with_labels_and_with_incremental_decoding():
    model = tiny_captioner().eval()
    feats = torch.randn(2, D)
    batch = make_batch(model, feats, ["a red circle on grass", "two things"])
    with torch.no_grad():
        logits = model(batch)  # (2, T, V)
        ids = batch["input_ids"]
        assert logits.shape == (2, ids.shape[1], len(model.tokenizer))
        # position 0 is predicted from the prefix alone (last prefix position)
        first, cache = model.start(feats)
        assert torch.allclose(logits[:, 0], first, atol=1e-5)
        # position t from the prefix and tokens < t, as in cached decoding
        for t in range(1, 4):
            step, cache = model.step(ids[:, t - 1], cache)
            assert torch.allclose(logits[:, t], step, atol=1e-5)
        # causal: changing token 2 leaves logits 0..2 unchanged and changes logits 3
        other = dict(batch, input_ids=ids.clone())
        other["input_ids"][:, 2] = 5
        changed = model(other)
    assert torch.allclose(changed[:, :3], logits[:, :3], atol=1e-6)
    assert not torch.allclose(changed[:, 3], logits[:, 3])


def test_greedy_batch_equals_each_image_alone(trained):
    model, feats, _, _ = trained
    torch.manual_seed(2)
    many = torch.cat([feats, torch.randn(5, D)])  # seen and unseen images
    cfg = DecodeConfig(max_length=12)
    batch = model.generate(many, cfg)
    for i in range(many.shape[0]):
        alone = model.generate(many[i : i + 1], cfg)
        n = int(alone.lengths[0])
        assert batch.sequences[i, :n].tolist() == alone.sequences[0, :n].tolist()
        assert batch.texts[i] == alone.texts[0]
        assert int(batch.lengths[i]) == n


def test_padding_after_eos(trained):
    model, feats, _, _ = trained
    gen = model.generate(feats, DecodeConfig(max_length=12))
    assert gen.sequences.shape[1] == 9  # stops when the longest caption has ended
    for seq, lp, n in zip(gen.sequences, gen.token_logprobs, gen.lengths.tolist(), strict=True):
        assert int(seq[n - 1]) == model.eos_token_id
        assert (seq[n:] == model.pad_token_id).all()
        assert (lp[n:] == 0).all() and (lp[:n] < 0).all()


@pytest.mark.parametrize(
    "cfg",
    [
        DecodeConfig(strategy="greedy", max_length=10),
        DecodeConfig(strategy="beam", beam_size=3, num_return_sequences=2, max_length=10),
        DecodeConfig(strategy="sample", temperature=1.5, top_p=0.95, num_return_sequences=3, max_length=10),
    ],
    ids=["greedy", "beam", "sample"],
)
def test_returned_logprobs_equal_sequence_logprob(trained, cfg):
    model, feats, _, _ = trained
    gen = model.generate(feats, cfg, generator=torch.Generator().manual_seed(0))
    lp = model({"features": feats}, sequences=gen.sequences, mask=gen.mask, image_index=gen.image_index).logprobs
    assert torch.allclose(lp, gen.token_logprobs, atol=1e-5)
    repeated = model({"features": feats[gen.image_index]}, sequences=gen.sequences, mask=gen.mask).logprobs
    assert torch.allclose(repeated, lp, atol=1e-6)


def test_forward_scores_sequences_with_temperature_entropy_and_gradient():
    model = tiny_captioner().train()
    feats = torch.randn(3, D)
    seqs = torch.tensor([[5, 6, 4, 0], [7, 8, 9, 4], [4, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    model.eval()
    with torch.no_grad():
        logits = model(make_batch(model, feats, ["x"] * 3) | {"input_ids": seqs, "attention_mask": mask})
    manual = torch.log_softmax(logits / 0.5, -1).gather(-1, seqs[..., None]).squeeze(-1) * mask
    scores = model({"features": feats}, sequences=seqs, mask=mask, temperature=0.5, with_entropy=True)
    lp = scores.logprobs
    assert torch.allclose(lp, manual, atol=1e-5)
    assert (lp[mask == 0] == 0).all()
    # entropies of the same temperature-0.5 distributions, 0 at padding
    probs = torch.softmax(logits / 0.5, -1)
    manual_h = -(probs * torch.log_softmax(logits / 0.5, -1)).sum(-1) * mask
    assert torch.allclose(scores.entropy, manual_h, atol=1e-4)
    assert model({"features": feats}, sequences=seqs, mask=mask).entropy is None
    lp.sum().backward()
    assert model.mapper.net[0].weight.grad.abs().sum() > 0
    assert model.lm.transformer.h[0].attn.c_attn.weight.grad.abs().sum() > 0


def test_beam_one_and_top_k_one_equal_greedy(trained):
    model, feats, _, _ = trained
    torch.manual_seed(3)
    many = torch.cat([feats, torch.randn(3, D)])
    greedy = model.generate(many, DecodeConfig(max_length=10))
    beam = model.generate(many, DecodeConfig(strategy="beam", beam_size=1, max_length=10))
    top1 = model.generate(many, DecodeConfig(strategy="sample", top_k=1, temperature=2.0, max_length=10))
    assert beam.texts == greedy.texts == top1.texts
    assert torch.equal(beam.sequences, greedy.sequences) and torch.equal(top1.sequences, greedy.sequences)


def test_beam_scores_are_length_normalised_and_sorted(trained):
    model, feats, _, _ = trained
    gen = model.generate(feats, DecodeConfig(strategy="beam", beam_size=4, num_return_sequences=4, max_length=10))
    assert gen.image_index.tolist() == [i for i in range(4) for _ in range(4)]
    expected = gen.token_logprobs.sum(1) / gen.lengths.float()  # length_penalty 1: mean log-prob
    assert torch.allclose(gen.scores, expected, atol=1e-5)
    sc = gen.scores.view(4, 4)
    assert (sc[:, :-1] >= sc[:, 1:]).all()
    assert gen.texts[::4] == CAPTIONS  # the memorised caption is every image's best beam


def test_chunked_generation_equals_one_chunk(trained):
    model, feats, _, _ = trained
    whole = model.generate(feats, DecodeConfig(strategy="beam", beam_size=2, num_return_sequences=2, max_length=10))
    chunked = model.generate(
        feats, DecodeConfig(strategy="beam", beam_size=2, num_return_sequences=2, max_length=10, batch_size=3)
    )
    assert chunked.texts == whole.texts
    assert chunked.image_index.tolist() == whole.image_index.tolist()
    assert torch.allclose(chunked.scores, whole.scores, atol=1e-6)


def test_mappers_shapes_and_module_names():
    feats = torch.randn(3, D)
    assert MLPMapper(D, 32, K)(feats).shape == (3, K, 32)
    tm = TransformerMapper(D, 32, K, layers=2, heads=4)
    assert tm(feats).shape == (3, K, 32)
    assert tm.prefix_const.shape == (K, 32)
    with pytest.raises(ValueError, match="clipcap.mapper_heads"):
        TransformerMapper(D, 32, K, layers=1, heads=5)
    model = tiny_captioner(
        section=ClipCapBackboneConfig(mapper="transformer", prefix_length=K, mapper_layers=1, mapper_heads=4)
    )
    assert model._prefix(feats).shape == (3, K, 32)
    # LoRA targets (c_attn/c_proj/q_proj/v_proj) appear only inside the LM, never in the mapper
    names = [n for n, _ in model.named_modules()]
    targets = ("c_attn", "c_proj", "q_proj", "v_proj")
    assert any(n.endswith("c_attn") for n in names)
    assert not [n for n in names if n.startswith("mapper") and n.endswith(targets)]


def test_frozen_lm_and_missing_inputs():
    model = tiny_captioner(train_lm=False)
    model.train()
    assert not model.lm.training and model.mapper.training
    assert not any(p.requires_grad for p in model.lm.parameters())
    feats = torch.randn(2, D)
    loss = mle_loss(model, make_batch(model, feats, ["a red circle", "two things"]))
    loss.backward()
    assert model.mapper.net[0].weight.grad is not None
    with pytest.raises(ValueError, match="neither 'features' nor 'pixel_values'"):
        model({"input_ids": torch.tensor([[4]])})
    with pytest.raises(ValueError, match="model.train_encoder"):
        tiny_captioner(train_encoder=True)
    with pytest.raises(ValueError, match="decode.max_length"):
        model.generate(feats, DecodeConfig(max_length=100))  # prefix 4 + 100 > 64 positions


def test_save_and_from_checkpoint_round_trip(trained, tmp_path):
    model, feats, _, _ = trained
    model.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "mapper.safetensors").exists()
    assert (tmp_path / "ckpt" / "lm" / "model.safetensors").exists()
    again = ClipCap.from_checkpoint(tmp_path / "ckpt").eval()
    batch = make_batch(model, feats, CAPTIONS)
    with torch.no_grad():
        assert torch.allclose(again(batch), model(batch), atol=1e-6)
    assert again.generate(feats).texts == CAPTIONS
    assert again.config_dict() == model.config_dict()


def saved_with_lora(cfg, folder):
    """The ClipCap ``cfg`` makes, with its LoRA adapters (``lora.*``) set to change its outputs (``lora_B`` drawn, not
    0), saved to ``folder``: ``(model, checkpoint folder)``."""
    from finecap.models import lora

    model = ClipCap.build(cfg)
    lora.configure_training(model, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # the adapters change the logits and the features
    return model, model.eval().save(folder)


def test_a_relative_lm_folder_is_recorded_absolute_and_named_by_the_lm_lora_adapter(tmp_path, monkeypatch):
    """``clipcap.lm=models/gpt2`` given where that folder exists: ``captioner.json`` recorded ``lm_source:
    models/gpt2`` (beside the absolute ``encoder_source``) and ``lm_lora/adapter_config.json`` (peft's record of the
    loaded model's name) ``base_model_name_or_path: models/gpt2``, which from any other working directory peft and
    transformers look up as a Hub repository (``AutoPeftModelForCausalLM.from_pretrained("lm_lora")`` failed there)."""
    from peft import AutoPeftModelForCausalLM

    from finecap.config import load
    from finecap.models.presets import save_tiny_clip

    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2)
    folder = tmp_path / "models" / "gpt2"
    lm.save_pretrained(folder)
    tok.save_pretrained(folder)
    clip = save_tiny_clip(tmp_path / "clip", image_size=16, patch_size=8)
    monkeypatch.chdir(tmp_path)
    cfg = load(None, ["clipcap.lm=models/gpt2", f"model.encoder={clip}", "clipcap.prefix_length=2", "lora.rank=4",
                      "lora.alpha=8", "lora.lm=true"])  # fmt: skip
    model, out = saved_with_lora(cfg, tmp_path / "ckpt")
    meta = json.loads((out / "captioner.json").read_text())
    config = json.loads((out / "lm_lora" / "adapter_config.json").read_text())
    assert meta["lm_source"] == config["base_model_name_or_path"] == str(folder.resolve())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the base is found by the adapter's record alone
    theirs = AutoPeftModelForCausalLM.from_pretrained(out / "lm_lora").eval()
    ids = torch.tensor([[5, 6, 7, 2]])
    with torch.no_grad():
        plain = lm(input_ids=ids).logits
        ours, loaded = model.lm(input_ids=ids).logits, theirs(input_ids=ids).logits
    assert not torch.allclose(ours, plain, atol=1e-3)  # the adapter was applied
    assert torch.allclose(loaded, ours, atol=1e-5)


def test_a_relative_encoder_folder_is_named_by_the_encoder_lora_adapter(tmp_path, monkeypatch):
    """``model.encoder=models/clip`` given where that folder exists: ``captioner.json`` recorded its absolute path as
    ``encoder_source``, but the encoder was read from ``models/clip`` as given, so ``encoder_lora/adapter_config.json``
    (peft's record of the loaded model's name) said ``base_model_name_or_path: models/clip``, which from any other
    working directory peft looks up as a Hub repository: the sibling of the lm_lora fix above, which it missed."""
    from peft import AutoPeftModel

    from finecap.config import load
    from finecap.models import lora
    from finecap.models.presets import save_tiny_clip

    torch.manual_seed(0)
    save_tiny_clip(tmp_path / "models" / "clip", image_size=16, patch_size=8)
    monkeypatch.chdir(tmp_path)
    cfg = load(None, ["model.encoder=models/clip", "clipcap.prefix_length=2", "lora.rank=4", "lora.alpha=8",
                      "lora.encoder=true", "model.train_encoder=true"])  # fmt: skip
    model, out = saved_with_lora(cfg, tmp_path / "ckpt")
    meta = json.loads((out / "captioner.json").read_text())
    config = json.loads((out / "encoder_lora" / "adapter_config.json").read_text())
    assert meta["encoder_source"] == config["base_model_name_or_path"] == str((tmp_path / "models" / "clip").resolve())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the base is found by the adapter's record alone
    theirs = AutoPeftModel.from_pretrained(out / "encoder_lora").eval()
    pixels = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.encoder.model.get_image_features(pixel_values=pixels)
        with lora.adapters_disabled(model):
            plain = model.encoder.model.get_image_features(pixel_values=pixels)
        loaded = theirs.get_image_features(pixel_values=pixels)
    features = [getattr(f, "pooler_output", f) for f in (ours, plain, loaded)]
    assert not torch.allclose(features[0], features[1], atol=1e-3)  # the adapter was applied
    assert torch.allclose(features[2], features[0], atol=1e-5)


def test_lora_through_peft_on_the_whole_captioner():
    from peft import LoraConfig, get_peft_model

    model = tiny_captioner()
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    feats = torch.randn(2, D)
    loss = mle_loss(peft_model, make_batch(model, feats, ["a red circle", "two things"]))
    loss.backward()
    assert all(p.grad is not None for n, p in peft_model.named_parameters() if p.requires_grad)
    gen = peft_model.generate(feats, DecodeConfig(max_length=5))
    assert gen.sequences.shape[0] == 2
