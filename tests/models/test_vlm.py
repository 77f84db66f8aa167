"""Decoder-only VLMs (``model.kind=vlm``) per family: loading by path, the prompt, caption-only losses against the
model's own loss, decoding against ``generate``, LoRA targets, and the ``save_pretrained`` / peft round trips.

Every model is a tiny random LLaVA, Idefics3 or Qwen2-VL built from configs and saved to a temporary folder
(:func:`finecap.models.presets.save_tiny_vlm`), then loaded by path as a user's checkpoint would be.
"""

from __future__ import annotations

import json

import pytest
import torch
from beam_match import assert_same_hypotheses, trimmed
from peft import PeftModel
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.utils import is_torchvision_available

from finecap.config import DecodeConfig, load
from finecap.data.targets import IGNORE_INDEX
from finecap.models import lora
from finecap.models.backbones import build_model, load_captioner
from finecap.models.processors import load_processor
from finecap.models.vlm import FAMILIES, Vlm
from finecap.objectives.mle import mle_loss
from finecap.objectives.smile import SmileObjective, smile_loss
from helpers.vlm import batch_of, images


def processor_inputs(model: Vlm, n: int, seed: int = 0) -> dict:
    """What a user passes to ``generate``: the processor's own output for the chat prompt and the images (including
    Qwen2-VL's ``mm_token_type_ids``), independent of finecap's collator."""
    ims = [[im.convert("RGB")] for im in images(n, seed)]
    enc = model.processor(text=[model.prompt_text] * n, images=ims, padding=True, return_tensors="pt")
    return dict(enc)


# --------------------------------------------------------------------------------------------------------------------
# Loading and the prompt
# --------------------------------------------------------------------------------------------------------------------


def test_built_from_the_config_by_path(vlm_dirs, family):
    cfg = load(None, ["model.kind=vlm", f"vlm.name={vlm_dirs[family]}", "vlm.prompt=Describe the image.",
                      "model.train_lm=false", "vlm.train_projector=false"])  # fmt: skip
    model = build_model(cfg)
    assert isinstance(model, Vlm) and model.family is FAMILIES[family] and model.source == str(vlm_dirs[family])
    assert (
        not model.train_lm
        and not model.section.train_projector
        and not any(p.requires_grad for p in model.parameters())
    )
    assert model.prompt_text.count("Describe the image.") == 1
    eot = {"llava": "<eos>", "idefics3": "<end_of_utterance>", "qwen2_vl": "<|im_end|>"}[family]
    assert model.tokenizer.eos_token == eot  # captions end where an assistant turn ends
    batch = batch_of(model)
    prompt = batch["prompt_ids"]
    assert model.tokenizer.padding_side == "left" and bool((batch["prompt_mask"][:, -1] == 1).all())
    assert bool(((prompt == model.image_token_id).sum(1) > 0).all())
    generation_prompt = {"llava": "ASSISTANT:", "idefics3": "Assistant:", "qwen2_vl": "<|im_start|>assistant\n"}
    assert model.prompt_text.endswith(generation_prompt[family])  # the chat template's generation prompt


def test_unknown_family_and_missing_parts_are_named(vlm_dirs, tmp_path):
    from transformers import PaliGemmaConfig, VipLlavaConfig

    from finecap.models.vlm import family_of

    with pytest.raises(ValueError, match="model_type 'vipllava' is not a supported VLM family; supported: gemma3"):
        family_of(VipLlavaConfig(), "llava-hf/vip-llava-7b-hf")
    refused = "'paligemma' is not supported: it is a prefix-LM .* nearest supported family: gemma3"
    with pytest.raises(ValueError, match=refused):
        family_of(PaliGemmaConfig(), "google/paligemma-3b")
    with pytest.raises(OSError, match="vlm.name=.*nowhere: cannot load the VLM or its processor"):
        Vlm.from_pretrained(tmp_path / "nowhere")
    model = AutoModelForImageTextToText.from_pretrained(vlm_dirs["qwen2_vl"])
    model.generation_config.eos_token_id = [0]
    with pytest.raises(ValueError, match=r"tokenizer's EOS '<\|im_end\|>' .* not among the model's stop tokens"):
        Vlm(model, load_processor(vlm_dirs["qwen2_vl"]), source="tiny")


@pytest.mark.skipif(is_torchvision_available(), reason="without torchvision only")
def test_qwen2_vl_processor_without_torchvision(vlm_dirs):
    """transformers cannot build Qwen2-VL's video processor without torchvision; finecap loads the processor class
    without it, and images are processed exactly as the processor does."""
    with pytest.raises((ImportError, OSError, ValueError)):
        AutoProcessor.from_pretrained(vlm_dirs["qwen2_vl"])
    processor = load_processor(vlm_dirs["qwen2_vl"])
    assert type(processor).__name__ == "Qwen2VLProcessor" and processor.video_processor is None
    out = processor(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=images(1), return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]  # 16 patches of 4 px, merged 2 x 2: 4 image tokens
    assert int((out["input_ids"] == processor.image_token_id).sum()) == 4


# --------------------------------------------------------------------------------------------------------------------
# Caption tokens only
# --------------------------------------------------------------------------------------------------------------------


def test_mle_is_the_models_own_loss_with_prompt_and_padding_masked(vlm_dirs, family):
    """finecap's MLE loss equals the transformers model's own loss on ``[prompt, caption]`` with the labels of prompt,
    image and padding tokens at -100 (the model shifts them itself and computes its own positions)."""
    model = Vlm.from_pretrained(vlm_dirs[family]).eval()
    batch = batch_of(model)
    ours = mle_loss(model(batch), batch["labels"])
    ids = torch.cat([batch["prompt_ids"], batch["input_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["attention_mask"]], 1)
    labels = torch.cat([torch.full_like(batch["prompt_ids"], IGNORE_INDEX), batch["labels"]], 1)
    extra = {k: batch[k] for k in model.family.image_inputs if k in batch}
    if family == "qwen2_vl":
        extra["mm_token_type_ids"] = (ids == model.image_token_id).int()
        model.model.model.rope_deltas = None
    theirs = model.model(input_ids=ids, attention_mask=mask, labels=labels, **extra).loss
    assert torch.allclose(ours, theirs, atol=1e-5)
    # the prompt is part of the conditioning, not of the loss: labels over the prompt would change it
    prompt_labels = torch.cat([batch["prompt_ids"].masked_fill(batch["prompt_mask"] == 0, IGNORE_INDEX),
                               batch["labels"]], 1)  # fmt: skip
    with_prompt = model.model(input_ids=ids, attention_mask=mask, labels=prompt_labels, **extra).loss
    assert not torch.allclose(ours, with_prompt, atol=1e-3)


def test_smile_draws_its_vocabulary_from_caption_tokens_only(vlm_dirs, family):
    """SMILE's subset is the caption's own tokens: the prompt's words and image tokens never enter it."""
    model = Vlm.from_pretrained(vlm_dirs[family]).eval()
    batch = batch_of(model)
    logits = model(batch)
    out = SmileObjective()(model, batch)
    caption_ids = set(batch["input_ids"][batch["attention_mask"].bool()].tolist())
    prompt_ids = set(batch["prompt_ids"][batch["prompt_mask"].bool()].tolist())
    assert model.image_token_id in prompt_ids - caption_ids
    assert torch.allclose(out.losses["smile"], smile_loss(logits, batch["labels"]), atol=1e-6)
    # by hand: first token over the full vocabulary, then a softmax over the row's caption tokens only
    V = logits.shape[-1]
    total, n = 0.0, 0
    for b in range(logits.shape[0]):
        valid = batch["labels"][b] != IGNORE_INDEX
        allowed = torch.zeros(V, dtype=torch.bool)
        allowed[batch["labels"][b][valid]] = True
        for t in torch.nonzero(valid).flatten().tolist():
            row = logits[b, t] if t == 0 else logits[b, t].masked_fill(~allowed, float("-inf"))
            total += -torch.log_softmax(row, -1)[batch["labels"][b, t]].item()
            n += 1
    assert abs(out.losses["smile"].item() - total / n) < 1e-4


def test_processor_kwargs_set_the_image_token_budget_and_are_checked(vlm_dirs, tmp_path):
    """``vlm.processor_kwargs`` reach every processor call (Qwen2-VL's pixel budget changes the number of image
    tokens in the prompt), are recorded in the checkpoint, and a key the image processor does not take is named."""
    image = [Image.new("RGB", (64, 48), (200, 30, 30))]
    cfg = ["model.kind=vlm", f"vlm.name={vlm_dirs['qwen2_vl']}"]
    plain = build_model(load(None, cfg))
    budget = build_model(load(None, [*cfg, "vlm.processor_kwargs={max_pixels: 1568}"]))
    tokens = {m: int((m.encoder.preprocess(image)["prompt_ids"] == m.image_token_id).sum()) for m in (plain, budget)}
    assert tokens[budget] > tokens[plain] > 0  # the tiny processor's own budget is 256 pixels
    again = load_captioner(budget.save(tmp_path / "ckpt"))
    assert again.section.processor_kwargs == {"max_pixels": 1568}
    assert torch.equal(again.encoder.preprocess(image)["prompt_ids"], budget.encoder.preprocess(image)["prompt_ids"])
    idefics = build_model(load(None, ["model.kind=vlm", f"vlm.name={vlm_dirs['idefics3']}",
                                      "vlm.processor_kwargs={do_image_splitting: true}"]))  # fmt: skip
    assert idefics.section.processor_kwargs == {
        "do_image_splitting": True
    }  # (the tiny processor's 16 px make one crop)
    with pytest.raises(ValueError, match="vlm.processor_kwargs: 'max_pixel' is not an argument of Qwen2VL"):
        build_model(load(None, [*cfg, "vlm.processor_kwargs={max_pixel: 1568}"]))


def test_pixel_bounds_reach_the_processor_as_transformers_5_wants_them(vlm_dirs):
    """``max_pixels`` (older recipes and checkpoints) and ``size: {longest_edge: ...}`` (transformers 5's spelling)
    give the same image tokens, and neither makes transformers warn that ``max_pixels`` in a call is deprecated."""
    import warnings

    image = [Image.new("RGB", (64, 48), (200, 30, 30))]
    cfg = ["model.kind=vlm", f"vlm.name={vlm_dirs['qwen2_vl']}"]
    old = build_model(load(None, [*cfg, "vlm.processor_kwargs={max_pixels: 1568}"]))
    new = build_model(load(None, [*cfg, "vlm.processor_kwargs={size: {longest_edge: 1568}}"]))
    assert old.processor_kwargs["size"]["longest_edge"] == 1568 and "max_pixels" not in old.processor_kwargs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = [m.encoder.preprocess(image)["prompt_ids"] for m in (old, new)]
    assert torch.equal(ids[0], ids[1])
    assert not [w for w in caught if "deprecated" in str(w.message)], [str(w.message) for w in caught]
    with pytest.raises(ValueError, match="expected"):  # a size holds integers only
        load(None, [*cfg, "vlm.processor_kwargs={size: {longest_edge: big}}"])


# --------------------------------------------------------------------------------------------------------------------
# Decoding against generate
# --------------------------------------------------------------------------------------------------------------------


class Recorder:
    """A Stepper around the model that records the tokens fed at each step (a finished beam feeds its stop token)."""

    def __init__(self, model: Vlm) -> None:
        self.model, self.fed = model, []

    def start(self, prompt):
        return self.model.start(prompt)

    def step(self, tokens, state):
        self.fed.append(tokens.clone())
        return self.model.step(tokens, state)

    def select(self, state, index):
        return self.model.select(state, index)


def new_tokens(out: torch.Tensor, prompt_len: int) -> list[list[int]]:
    return [row.tolist() for row in out[:, prompt_len:]]


def test_greedy_equals_generate(vlm_dirs, family):
    model = Vlm.from_pretrained(vlm_dirs[family]).eval()
    inputs = processor_inputs(model, 4)
    ours = model.generate(inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]},
                          DecodeConfig(strategy="greedy", max_length=10))  # fmt: skip
    theirs = model.model.generate(**inputs, max_new_tokens=10, do_sample=False)
    assert len(set(ours.texts)) > 1  # the images get different captions
    for row, seq in enumerate(new_tokens(theirs, inputs["input_ids"].shape[1])):
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n]
        assert all(t == model.pad_token_id for t in seq[n:])


def test_sampling_equals_generate_with_the_same_random_state(vlm_dirs, family):
    model = Vlm.from_pretrained(vlm_dirs[family]).eval()
    inputs = processor_inputs(model, 3)
    batch = inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]}
    cfg = DecodeConfig(strategy="sample", temperature=0.7, max_length=8, num_return_sequences=2)
    torch.manual_seed(123)
    ours = model.generate(batch, cfg)
    torch.manual_seed(123)
    theirs = model.model.generate(**inputs, max_new_tokens=8, do_sample=True, temperature=0.7, top_k=0, top_p=1.0,
                                  num_return_sequences=2)  # fmt: skip
    assert len(set(ours.texts)) > 2
    for row, seq in enumerate(new_tokens(theirs, inputs["input_ids"].shape[1])):
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n], row


def test_beam_search_equals_generate_while_no_beam_ends_early(vlm_dirs, family):
    """Beam search equals ``generate``'s (tokens and length-normalised scores) when no hypothesis ends before the
    last step; finecap then keeps finished hypotheses in the beam (ClipCap's reference, finecap.decode) where
    ``generate`` sets them aside, so the test first checks that no stop token was fed before the last step."""
    model = Vlm.from_pretrained(vlm_dirs[family]).eval()
    inputs = processor_inputs(model, 3, seed=4)  # images for which no family's beam ends before 5 tokens
    batch = inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]}
    cfg = DecodeConfig(strategy="beam", beam_size=3, max_length=5, num_return_sequences=2)
    recorder = Recorder(model)
    from finecap.decode import decode

    prompt = model.prompt_of(batch)
    ours = decode(recorder, prompt, cfg, model.tokenizer)
    assert not any(bool((fed == model.eos_token_id).any()) for fed in recorder.fed)  # the regime tested
    theirs = model.model.generate(**inputs, max_new_tokens=5, num_beams=3, num_return_sequences=2, do_sample=False,
                                  length_penalty=1.0, return_dict_in_generate=True, output_scores=True)  # fmt: skip
    assert new_tokens(theirs.sequences, inputs["input_ids"].shape[1]) == ours.sequences.tolist()
    assert torch.allclose(ours.scores, theirs.sequences_scores, atol=1e-4)


def test_set_aside_beam_search_equals_generate_when_beams_end_early(vlm_dirs, family):
    """``decode.finished_beams=set_aside`` is ``generate``'s beam search: the same K hypotheses per image (tokens,
    scores, order) for every ``early_stopping`` and several length penalties. A second stop token (the one greedy
    decoding writes most often) makes hypotheses end early, which the test checks, and two stop ids exercise
    ``generate``'s ``(1 + #stop ids) * K`` candidates per step."""
    from finecap.decode import beam_search

    model = Vlm.from_pretrained(vlm_dirs[family]).eval()
    inputs = processor_inputs(model, 3, seed=4)
    batch = inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]}
    P, K, L = inputs["input_ids"].shape[1], 3, 8
    greedy = model.generate(batch, DecodeConfig(strategy="greedy", max_length=L)).sequences
    frequent = torch.bincount(greedy.flatten()).argmax().item()
    stops = [model.eos_token_id, frequent]
    assert frequent != model.eos_token_id
    prompt = model.prompt_of(batch)
    found = {}
    for early_stopping in (False, True, "never"):
        for lp in (0.0, 1.0, 2.0):
            with torch.no_grad():
                cfg = DecodeConfig(strategy="beam", max_length=L, beam_size=K, length_penalty=lp,
                                   num_return_sequences=K, finished_beams="set_aside",
                                   early_stopping=early_stopping)  # fmt: skip
                ours = beam_search(model, prompt, cfg, stops, model.pad_token_id)
                theirs = model.model.generate(**inputs, max_new_tokens=L, num_beams=K, num_return_sequences=K,
                                              do_sample=False, length_penalty=lp, early_stopping=early_stopping,
                                              eos_token_id=stops, return_dict_in_generate=True,
                                              output_scores=True)  # fmt: skip
            setting = (early_stopping, lp)
            new, fill = new_tokens(theirs.sequences, P), (model.pad_token_id, model.eos_token_id)
            assert_same_hypotheses(ours, new, theirs.sequences_scores, fill, setting)
            found[setting] = (trimmed(ours), int(ours.lengths.min()))
    assert all(found[(es, lp)][1] < L for es in (False, True, "never") for lp in (0.0, 1.0))  # ended early
    assert len({str(captions) for captions, _ in found.values()}) > 2  # the settings matter here
    cfg = DecodeConfig(strategy="beam", max_length=L, beam_size=K, length_penalty=1.0, num_return_sequences=K)
    keep = beam_search(model, prompt, cfg, stops, model.pad_token_id)
    assert trimmed(keep) != found[(False, 1.0)][0]  # finecap's default rule answers otherwise here

    # Through the captioner's own decoding (its EOS only), as finecap caption runs it.
    cfg = DecodeConfig(strategy="beam", beam_size=K, num_return_sequences=2, max_length=L, finished_beams="set_aside")
    ours = model.generate(batch, cfg)
    theirs = model.model.generate(**inputs, max_new_tokens=L, num_beams=K, num_return_sequences=2, do_sample=False,
                                  length_penalty=1.0)  # fmt: skip
    for row, seq in enumerate(new_tokens(theirs, P)):
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n]


# --------------------------------------------------------------------------------------------------------------------
# LoRA targets, saving in the model's own format
# --------------------------------------------------------------------------------------------------------------------

TARGETS = {
    "llava": (["layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj",
               "layers.0.self_attn.o_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
               "layers.0.mlp.down_proj"],
              ["encoder.layers.0.self_attn.k_proj", "encoder.layers.0.self_attn.v_proj",
               "encoder.layers.0.self_attn.q_proj", "encoder.layers.0.self_attn.out_proj",
               "encoder.layers.0.mlp.fc1", "encoder.layers.0.mlp.fc2"]),
    "idefics3": (None, None),  # Llama language model, SigLIP vision tower: LLaVA's names
    "qwen2_vl": (None, ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc1", "blocks.0.mlp.fc2"]),
}  # fmt: skip


def test_lora_targets_per_family(vlm_dirs, family):
    """The documented defaults: every attention / MLP projection of the language model and of the vision tower;
    never the projector (Qwen2-VL's merger lives inside its vision tower) nor the output head."""
    model = Vlm.from_pretrained(vlm_dirs[family])
    lm, vision = TARGETS[family]
    lm, vision = lm or TARGETS["llava"][0], vision or TARGETS["llava"][1]
    for part, want in (("lm", lm), ("encoder", vision)):
        got = lora.resolve_targets(part, model.lora_module(part), model.lora_default_targets(part))
        assert sorted(got) == sorted(want), part
    every = lora.resolve_targets("encoder", model.lora_module("encoder"), [])
    assert (family == "qwen2_vl") == any("merger" in n for n in every)  # what the defaults leave out


def test_save_pretrained_folder_and_adapters_load_outside_finecap(vlm_dirs, family, tmp_path):
    """A fine-tuned VLM's folder loads with ``AutoModelForImageTextToText`` and the processor; its adapters with
    ``PeftModel.from_pretrained`` on the language model and vision tower; both give finecap's logits."""
    model = Vlm.from_pretrained(vlm_dirs[family])
    lora.configure_training(model, load(None, ["lora.lm=true", "lora.encoder=true", "model.train_encoder=true",
                                               "lora.rank=2", "lora.alpha=4"]))  # fmt: skip
    model.train()
    batch = batch_of(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        opt.zero_grad()
        mle_loss(model(batch), batch["labels"]).backward()
        opt.step()
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    projector = {"llava": "multi_modal_projector", "idefics3": "connector", "qwen2_vl": "merger"}[family]
    assert moved and all("lora_" in k or f".{projector}." in k for k in moved)
    assert any("lora_" in k and ("language_model" in k or "text_model" in k) for k in moved)
    model.eval()
    expected = model(batch)
    out = model.save(tmp_path / "ckpt")
    meta = json.loads((out / "captioner.json").read_text())
    assert meta["kind"] == "vlm" and meta["family"] == family and set(meta["lora"]) == {"lm", "encoder"}

    plain = AutoModelForImageTextToText.from_pretrained(out).eval()  # transformers alone
    assert type(plain) is type(model.model)
    lm_path, vision_path = model.family.language_model, model.family.vision
    parent = plain.model
    setattr(parent, lm_path.rsplit(".", 1)[-1], PeftModel.from_pretrained(model_part(plain, lm_path), out / "lm_lora"))
    setattr(parent, vision_path.rsplit(".", 1)[-1],
            PeftModel.from_pretrained(model_part(plain, vision_path), out / "encoder_lora"))  # fmt: skip
    processor = load_processor(out)  # AutoProcessor, or Qwen2-VL's class without a video processor (no torchvision)
    if family != "qwen2_vl" or is_torchvision_available():
        assert type(AutoProcessor.from_pretrained(out)) is type(processor)
    enc = processor(text=[model.prompt_text] * 4, images=[[im] for im in images(4)], padding=True, return_tensors="pt")
    assert torch.equal(enc["input_ids"], batch["prompt_ids"])
    ids = torch.cat([enc["input_ids"], batch["input_ids"]], 1)
    mask = torch.cat([enc["attention_mask"], batch["attention_mask"]], 1)
    extra = {k: enc[k] for k in model.family.image_inputs if k in enc}
    if family == "qwen2_vl":
        extra["mm_token_type_ids"] = (ids == model.image_token_id).int()
    logits = plain(input_ids=ids, attention_mask=mask, **extra).logits[:, enc["input_ids"].shape[1] - 1 : -1]
    valid = batch["attention_mask"].bool()
    assert torch.allclose(logits[valid], expected[valid], atol=1e-4)
    again = load_captioner(out).eval()
    assert isinstance(again, Vlm) and lora.has_adapters(again) and again.section.prompt == model.section.prompt
    assert torch.allclose(again(batch), expected, atol=1e-5)


def model_part(model, path: str):
    """``model.<path>`` (a family's attribute path, e.g. ``model.language_model``)."""
    for name in path.split("."):
        model = getattr(model, name)
    return model


def trained_tokenizer(kind: str):
    """A small BPE tokenizer trained here: ``"byte-level"`` (GPT-2's / SmolLM2's kind: a space is part of the next
    word, ``Ġa``) or ``"sentencepiece"`` (Llama's / Mistral's kind: a word-start marker ``▁a``, a space before the
    first word added)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "byte-level":
        bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        alphabet = []
    corpus = ["User: Describe the image.", "Assistant: a red circle on the left", "ASSISTANT: a red circle",
              "a red circle", "<|im_start|>assistant\na red circle"] * 50  # fmt: skip
    specials = ["<unk>", "<end_of_utterance>", "<|im_start|>", "<|im_end|>", "<image>"]
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                        initial_alphabet=alphabet))  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", eos_token="<end_of_utterance>")


@pytest.mark.parametrize(
    "kind, template, prefix",
    [("byte-level", "idefics", " "), ("sentencepiece", "idefics", ""), ("sentencepiece", "llava", ""),
     ("byte-level", "qwen", "")],
    ids=["smolvlm-byte-level", "idefics2-sentencepiece", "llava-sentencepiece", "qwen-newline"],
)  # fmt: skip
def test_caption_targets_are_the_tokens_the_chat_format_gives_the_answer(kind, template, prefix):
    """SmolVLM's template writes ``Assistant: <answer>`` but its generation prompt ends at ``Assistant:``: with a
    byte-level BPE the answer's first token in the chat format is ``Ġa``, and finecap's targets said ``a``. The space
    is the caption's prefix there; a SentencePiece tokenizer's ``▁a`` already matches (no prefix), and a prompt that
    ends in a newline (Qwen) has none. Decoded, the caption has no leading space."""
    from finecap.data.targets import encode_captions
    from finecap.decode import Generation, texts_of
    from finecap.models.tiny import IDEFICS_TEMPLATE, LLAVA_TEMPLATE, QWEN_TEMPLATE
    from finecap.models.vlm import answer_context, answer_prefix

    tok = trained_tokenizer(kind)
    tok.chat_template = {"idefics": IDEFICS_TEMPLATE, "llava": LLAVA_TEMPLATE,
                         "qwen": QWEN_TEMPLATE.replace("IMAGE", "<image>")}[template]  # fmt: skip
    user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    prompt = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    answer = [{"role": "assistant", "content": [{"type": "text", "text": "a red circle on the left"}]}]
    full = tok.apply_chat_template(user + answer, tokenize=False)
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    chat = tok(full, add_special_tokens=False)["input_ids"][n_prompt:]
    before, _ = answer_context(tok, user, prompt)
    assert answer_prefix(tok, prompt, before) == prefix
    ids = encode_captions(tok, ["a red circle on the left"], 16, prefix=prefix)["input_ids"][0].tolist()
    assert ids[:-1] == chat[: len(ids) - 1]  # the answer's tokens, then the end token
    if kind == "byte-level" and template == "idefics":
        assert tok.convert_ids_to_tokens(ids[:1]) == ["Ġa"]
    row = torch.tensor([ids])
    generation = Generation(sequences=row, token_logprobs=torch.zeros(row.shape), lengths=torch.tensor([len(ids)]),
                            image_index=torch.tensor([0]), scores=torch.zeros(1))  # fmt: skip
    assert texts_of(tok, generation) == ["a red circle on the left"]


@pytest.mark.parametrize("kind", ["byte-level", "sentencepiece"])
def test_only_white_space_merged_into_the_answer_is_a_caption_prefix(kind):
    """A template that writes other text between the generation prompt and the answer (the tiny Mistral 3 writes
    ``[INST]`` for every role) put that text's tokens at the start of every caption target."""
    from finecap.models.vlm import answer_prefix

    tok = trained_tokenizer(kind)
    prompt = "User: Describe the image."
    assert answer_prefix(tok, prompt, "[INST]") == ""
    assert answer_prefix(tok, prompt, "Assistant: ") == ""
