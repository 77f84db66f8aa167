"""The family contract (issue 62): every supported VLM family (``finecap.models.vlm.FAMILIES``) against its own
model. A tiny random instance of each (tests/helpers/vlm_families.py: 2 language-model and 2 vision layers, weights
from N(0, 0.2) so the image matters; its own processor class, a named stand-in where that needs a package not
installed here) is checked for:

- first-token logits equal to the model's own forward on each image alone (1e-5 relative), for one image and for
  several images of different sizes batched with left padding;
- prompt ids and image inputs equal to ``apply_chat_template(tokenize=True)``'s, also for non-square images under
  the family's image-token options (pixel bounds, grids, tiles, splitting);
- under those options, per-token log-probs of a batch of four images of different shapes (different numbers of image
  tokens, pixel rows or crops) with captions of unequal lengths, for teacher forcing and for sequences scored under
  an ``image_index`` that repeats and reorders the images, equal to the model's own forward on each image alone;
- greedy captions equal to ``model.generate``'s tokens on the processor's batch;
- captions ending where ``generate`` stops at the chat template's turn end, their text free of template text;
- per-token log-probs of sampled captions (finecap's decoder and finecap's scoring forward) equal to a teacher-forced
  run of the model's own forward on prompt + caption;
- MLE equal to the model's own ``labels`` loss with the prompt and padding at -100 (captions of unequal lengths,
  prompts of two image sizes), the labels being each caption's tokens and its end token;
- two MLE steps that lower the loss and move only what trains;
- beam captions equal to ``generate(num_beams=3)``'s;
- bf16 weights + autocast + LoRA with gradient checkpointing: the loss and adapter gradients of the same model without
  it (checkpointing seen to run: the first layer runs again in the backward pass), also for a caption holding the
  image token (scored after the prompt's cache, both passes checkpointed);
- the family row's LoRA targets resolve in both parts;
- a fine-tuned captioner's saved folder loaded by ``AutoModelForImageTextToText``: finecap's caption logits;
- from a saved folder: LoRA on both parts, saved; peft's adapter on the *original* base and the merged export, each
  loaded by ``AutoModelForImageTextToText``, caption like finecap.

Two GRPO steps of ``coco/grpo_cider_vlm`` from each family's saved folder are tests/train/test_vlm_recipe_families.py
(slow).

``pytest -k family`` selects it (the ids say ``family``). Each family's measured largest relative logit difference
is printed by its test (``-s`` or ``-rP``; docs/vlm.md gives them).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from PIL import Image

from finecap.config import DecodeConfig
from finecap.models.base import module_path
from finecap.models.vlm import FAMILIES, Vlm
from finecap.objectives.mle import mle_loss
from finecap.utils.rng import torch_seeded
from helpers.adapters import adapted
from helpers.vlm import batch_of
from helpers.vlm_families import family_id, tiny_family


@pytest.fixture(scope="module", params=sorted(FAMILIES), ids=[family_id(f) for f in sorted(FAMILIES)])
def tiny(request) -> Vlm:
    model, processor = tiny_family(request.param)
    return Vlm(model, processor, source=f"tiny-{request.param}").eval()


def pictures(n: int, seed: int = 0) -> list[Image.Image]:
    """Random images of two sizes (16 x 16 and 24 x 16): where the family's image tokens depend on the size, the
    prompts differ in length and the batch is left-padded."""
    g = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(16, 16 + 8 * (i % 2), 3, generator=g) * 255).byte().numpy()) for i in range(n)]


def processor_batch(model: Vlm, ims: list[Image.Image]) -> dict:
    """The processor's own output for the chat prompt and ``ims`` (what a user passes to ``generate``)."""
    return dict(model.processor(text=[model.prompt_text] * len(ims), images=[[im.convert("RGB")] for im in ims],
                                padding=True, return_tensors="pt"))  # fmt: skip


def ours(enc: dict) -> dict:
    return enc | {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]}


def own_logits(model: Vlm, image: Image.Image, caption: list[int] = ()) -> tuple[torch.Tensor, int]:
    """The model's own forward on one image's prompt (no padding) followed by ``caption``: logits ``(P + n, V)``
    and P (:func:`own_forward`)."""
    return own_forward(model, processor_batch(model, [image]), caption)


def own_forward(model: Vlm, enc: dict, caption: list[int] = ()) -> tuple[torch.Tensor, int]:
    """The model's own forward on the processor's output ``enc`` for one image (no padding) followed by ``caption``:
    logits ``(P + n, V)`` and P. Per-token processor outputs (Qwen's ``mm_token_type_ids``, Gemma 3's
    ``token_type_ids``) are 0 over the caption, as the processor gives them for text."""
    enc = dict(enc)
    P = enc["input_ids"].shape[1]
    tail = torch.tensor([list(caption)], dtype=torch.long)
    for key, value in enc.items():
        if isinstance(value, torch.Tensor) and value.shape == enc["input_ids"].shape and key != "input_ids":
            enc[key] = torch.cat([value, (torch.ones_like if key == "attention_mask" else torch.zeros_like)(tail)], 1)
    enc["input_ids"] = torch.cat([enc["input_ids"], tail], 1)
    with torch.no_grad():
        return model.model(**enc).logits[0], P


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("n", [1, 3], ids=["one-image", "several-images-padded"])
def test_first_token_logits_equal_the_models_own_forward(tiny, n):
    family = tiny.model.config.model_type
    ims = pictures(n)
    enc = processor_batch(tiny, ims)
    with torch.no_grad():
        first, _ = tiny.start(tiny.prompt_of(ours(enc)))  # (B, V)
    reference = torch.stack([own_logits(tiny, im)[0][-1] for im in ims])  # each image alone: (B, V)
    diff = relative(first, reference)
    print(f"{family}: {n} image(s), padded={bool((enc['attention_mask'] == 0).any())}, max relative logit "
          f"difference {diff:.2e} (logit scale {float(reference.abs().max()):.2f})")  # fmt: skip
    assert diff < 1e-5
    if n > 1:  # the image matters: different images, different next-token distributions
        assert relative(reference[0], reference[1]) > 1e-2


def test_prompt_ids_are_transformers_apply_chat_template_ids(tiny):
    """The collator's prompt ids are transformers' ``apply_chat_template(tokenize=True)``'s: where the template writes
    the BOS itself (Gemma 3's ``{{ bos_token }}``, its tokenizer adding one too) the prompt holds one BOS, elsewhere
    the tokenizer's special tokens are added as transformers adds them."""
    image = pictures(1)[0]
    messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                             {"type": "text", "text": tiny.section.prompt}]}]  # fmt: skip
    theirs = tiny.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                return_tensors="pt")  # fmt: skip
    ours_ids = tiny.encoder.preprocess([image])["prompt_ids"]
    assert ours_ids.tolist() == theirs["input_ids"].tolist()
    bos = tiny.tokenizer.bos_token_id
    if tiny.model.config.model_type == "gemma3":  # the template's BOS, once
        assert ours_ids[0, :2].tolist() == [bos, tiny.tokenizer.convert_tokens_to_ids("<start_of_turn>")]


IMAGE_OPTIONS = {
    "idefics2": {"processor_kwargs": {"do_image_splitting": True}},
    "idefics3": {"processor_kwargs": {"do_image_splitting": True, "size": {"longest_edge": 48}}},
    "smolvlm": {"processor_kwargs": {"do_image_splitting": True, "size": {"longest_edge": 48}}},
    "internvl": {"image_max_pixels": 1024},
    **dict.fromkeys(["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "llava_next", "llava_onevision", "mistral3"],
                    {"image_max_pixels": 256}),
}  # fmt: skip
"""Per family, an image budget or processor option that changes how many image tokens an image gets (Qwen's and
GLM-4V's pixel bounds, LLaVA-NeXT / OneVision grids, Pixtral's edge, InternVL's tiles, SmolVLM / Idefics splitting);
Gemma 3 and LLaVA-1.5 resize every image to one size."""


@pytest.mark.parametrize("family", sorted(FAMILIES), ids=[family_id(f) for f in sorted(FAMILIES)])
def test_prompt_ids_of_non_square_images_under_image_options_are_apply_chat_templates(family):
    """For non-square images of three shapes, under the family's image options (:data:`IMAGE_OPTIONS`, passed by
    finecap to every processor call), the collator's prompt ids and image inputs are transformers'
    ``apply_chat_template(tokenize=True)``'s given the same options, and the model's own forward takes them (its
    image features match the image tokens: a mismatch raises)."""
    import copy

    from finecap.config import VlmBackboneConfig

    model, processor = tiny_family(family)
    vlm = Vlm(model, processor, VlmBackboneConfig(**IMAGE_OPTIONS.get(family, {})), source=family).eval()
    g = torch.Generator().manual_seed(0)
    shapes = ((16, 40), (50, 20), (33, 47))  # (height, width)
    ims = [Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).byte().numpy()) for h, w in shapes]
    counts = []
    for image in ims:
        messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                                 {"type": "text", "text": vlm.section.prompt}]}]  # fmt: skip
        options = copy.deepcopy(vlm.processor_kwargs)  # transformers writes its own keys into the dict it is given
        theirs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                               return_tensors="pt", processor_kwargs=options)  # fmt: skip
        ours = vlm.encoder.preprocess([image])
        assert ours["prompt_ids"].tolist() == theirs["input_ids"].tolist()
        for key in (*vlm.family.image_inputs, *vlm.family.token_inputs):
            if key in theirs:
                assert torch.equal(ours[key], theirs[key]), key
        counts.append(int((ours["prompt_ids"] == vlm.image_token_id).sum()))
    with torch.no_grad():
        vlm.start(vlm.prompt_of(vlm.encoder.preprocess(ims)))  # the three together, left-padded
    if family in IMAGE_OPTIONS and family != "idefics2":  # the options read each image's shape
        assert len(set(counts)) > 1, counts


SCORED_ROWS = {
    "shared": ([2, 0, 0, 1, 3, 2], True),
    "repeated": ([2, 0, 0, 1, 3, 2], False),
    "permuted": ([3, 2, 1, 0], True),
}
"""Sequences mapped to the batch's images (``image_index``) and whether :attr:`Vlm.share_prompt`: images repeated and
reordered, scored after one prompt pass per image (``shared``) or with each row's prompt and image inputs gathered
(``repeated``: :meth:`Vlm.row_images`, an image's block of pixel rows where rows follow image tokens); one sequence per
image in another order (``permuted``: gathered too, as many rows as images)."""


@pytest.mark.parametrize("family", sorted(FAMILIES), ids=[family_id(f) for f in sorted(FAMILIES)])
def test_batched_caption_log_probs_under_image_options_equal_each_image_alone(family):
    """Training's and RL scoring's forward on one batch of four images of different shapes under the family's image
    options (:data:`IMAGE_OPTIONS`: Qwen's and GLM-4V's pixel budget, InternVL's tiles, LLaVA-NeXT / OneVision grids,
    SmolVLM / Idefics3 crops, so that the images get different numbers of image tokens, pixel rows or crops, the
    prompts left-padded) and four captions of unequal lengths (right-padded): every caption token's log-prob equals
    the model's own forward on that image's ``apply_chat_template`` prompt and caption alone (no padding; Qwen's and
    GLM-4V's multimodal rope from their own ``get_rope_index``), for teacher forcing (MLE) and for sequences scored
    under an ``image_index`` that repeats and reorders the images (:data:`SCORED_ROWS`)."""
    import copy

    from finecap.config import VlmBackboneConfig

    model, processor = tiny_family(family)
    vlm = Vlm(model, processor, VlmBackboneConfig(**IMAGE_OPTIONS.get(family, {})), source=family).eval()
    g = torch.Generator().manual_seed(0)
    shapes = ((16, 40), (50, 20), (33, 47), (16, 16))  # (height, width)
    ims = [Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).byte().numpy()) for h, w in shapes]
    captions = ["a red circle on the left of a big blue square", "a", "two green stars", "one big yellow star"]
    batch = batch_of(vlm, captions, pictures=ims)
    ids, lengths = batch["input_ids"], batch["attention_mask"].sum(1).tolist()
    counts = (batch["prompt_ids"] == vlm.image_token_id).sum(1).tolist()
    if family in IMAGE_OPTIONS and family != "idefics2":  # the options read each image's shape
        assert len(set(counts)) > 1 and bool((batch["prompt_mask"] == 0).any()), counts
    assert len(set(lengths)) == len(captions)
    alone = []  # (n,) each caption's own log-probs after its image's prompt alone
    for image, row, n in zip(ims, ids.tolist(), lengths, strict=True):
        messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                                 {"type": "text", "text": vlm.section.prompt}]}]  # fmt: skip
        enc = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                            return_tensors="pt",
                                            processor_kwargs=copy.deepcopy(vlm.processor_kwargs))  # fmt: skip
        logits, P = own_forward(vlm, enc, row[:n])
        alone.append(torch.log_softmax(logits[P - 1 : P - 1 + n], -1).gather(1, torch.tensor(row[:n])[:, None])[:, 0])
    with torch.no_grad():
        taught = torch.log_softmax(vlm(batch), -1).gather(2, ids[..., None])[..., 0]  # (B, T)
    for k, n in enumerate(lengths):
        torch.testing.assert_close(taught[k, :n], alone[k], rtol=1e-5, atol=1e-5, msg=f"MLE, image {k}")
    for case, (rows, share) in SCORED_ROWS.items():
        index = torch.tensor(rows)
        vlm.share_prompt = share
        with torch.no_grad():
            scored = vlm(batch, sequences=ids[index], mask=batch["attention_mask"][index].bool(), image_index=index)
        for r, k in enumerate(rows):
            n = lengths[k]
            torch.testing.assert_close(scored.logprobs[r, :n], alone[k], rtol=1e-5, atol=1e-5, msg=f"{case}, row {r}")


def test_greedy_captions_equal_generate(tiny):
    enc = processor_batch(tiny, pictures(3, seed=1))
    got = tiny.generate(ours(enc), DecodeConfig(strategy="greedy", max_length=6))
    with torch.no_grad():
        theirs = tiny.model.generate(**enc, max_new_tokens=6, do_sample=False)[:, enc["input_ids"].shape[1] :]
    for row, seq in enumerate(theirs.tolist()):
        n = int(got.lengths[row])
        assert got.sequences[row, :n].tolist() == seq[:n], row
        assert all(t == tiny.pad_token_id for t in seq[n:]), row


def test_sampled_caption_logprobs_equal_a_teacher_forced_own_forward(tiny):
    ims = pictures(2, seed=2)
    batch = ours(processor_batch(tiny, ims))
    torch.manual_seed(0)
    got = tiny.generate(batch, DecodeConfig(strategy="sample", max_length=5, num_return_sequences=2))
    with torch.no_grad():
        scored = tiny(batch, sequences=got.sequences, mask=got.mask, image_index=got.image_index).logprobs  # (N, L)
    compared = 0
    for row in range(len(got)):
        n = int(got.lengths[row])
        caption = got.sequences[row, :n].tolist()
        if tiny.image_token_id in caption:  # the model's own forward would read it as an image slot
            continue
        logits, P = own_logits(tiny, ims[int(got.image_index[row])], caption)
        reference = torch.log_softmax(logits[P - 1 : P - 1 + n], -1).gather(1, torch.tensor(caption)[:, None])[:, 0]
        torch.testing.assert_close(got.token_logprobs[row, :n], reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(scored[row, :n], reference, rtol=1e-5, atol=1e-5)
        compared += 1
    assert compared >= len(got) - 1


def test_mle_is_the_models_own_loss_over_caption_tokens_only(tiny):
    """finecap's MLE loss on a batch of four captions of unequal lengths (right-padded) after prompts of images of two
    sizes (left-padded where the family's image tokens depend on the size) equals the model's own ``labels`` loss on
    ``[prompt, caption]`` with the prompt's (its image tokens') and the padding's labels at -100; labels over the
    prompt would change it. Per-token processor inputs (Gemma 3's ``token_type_ids``, Qwen's ``mm_token_type_ids``)
    are 0 over the caption, as the processor gives them for text."""
    from finecap.data.targets import IGNORE_INDEX

    captions = ["a red circle", "two blue squares on the left of a big green circle", "a", "one big yellow star"]
    batch = batch_of(tiny, captions)
    tok = tiny.tokenizer
    for row, text in zip(batch["labels"].tolist(), captions, strict=True):  # each caption's tokens and its end token
        target = [*tok(tiny.caption_prefix + text, add_special_tokens=False)["input_ids"], tiny.eos_token_id]
        assert row == target + [IGNORE_INDEX] * (len(row) - len(target)), text
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 2  # captions of unequal lengths, right-padded
    with torch.no_grad():
        ours = mle_loss(tiny(batch), batch["labels"])
    caption = batch["input_ids"]
    ids = torch.cat([batch["prompt_ids"], caption], 1)
    mask = torch.cat([batch["prompt_mask"], batch["attention_mask"]], 1)
    extra = {k: batch[k] for k in tiny.family.image_inputs if k in batch}
    extra |= {k: torch.cat([batch[k], torch.zeros_like(caption)], 1) for k in tiny.family.token_inputs}
    if tiny.family.mrope:
        extra["mm_token_type_ids"] = (ids == tiny.image_token_id).int()
    prompt_ignored = torch.full_like(batch["prompt_ids"], IGNORE_INDEX)
    with_prompt = batch["prompt_ids"].masked_fill(batch["prompt_mask"] == 0, IGNORE_INDEX)
    with torch.no_grad():
        theirs, other = (tiny.model(input_ids=ids, attention_mask=mask, labels=torch.cat([first, batch["labels"]], 1),
                                    **extra).loss for first in (prompt_ignored, with_prompt))  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, other, atol=1e-3)


def test_two_mle_steps_lower_the_loss_and_move_only_what_trains(tiny):
    model = tiny.train()
    try:
        batch = batch_of(model)
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = mle_loss(model(batch), batch["labels"])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        assert losses[-1] < losses[0], losses
        assert moved and moved <= trained
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(before[n])
        model.eval()


def test_beam_captions_equal_generate(tiny):
    """Beam search with ``generate``'s rule for finished hypotheses (``decode.finished_beams=set_aside``) gives
    ``generate(num_beams=3)``'s best caption per image."""
    enc = processor_batch(tiny, pictures(3, seed=1))
    cfg = DecodeConfig(strategy="beam", beam_size=3, max_length=6, finished_beams="set_aside")
    got = tiny.generate(ours(enc), cfg)
    with torch.no_grad():
        theirs = tiny.model.generate(**enc, max_new_tokens=6, num_beams=3, do_sample=False, length_penalty=1.0)
    for row, seq in enumerate(theirs[:, enc["input_ids"].shape[1] :].tolist()):
        n = int(got.lengths[row])
        assert got.sequences[row, :n].tolist() == seq[:n], row
        # beam search pads with EOS: generation_config's first stop token (Gemma 3's <eos>, its captions' end token
        # being <end_of_turn>)
        assert all(t in (tiny.pad_token_id, *tiny.end_token_ids) for t in seq[n:]), row


def target_ends(vlm: Vlm) -> list[int]:
    """The last token of each training target of a batch of ``vlm`` (what ends a caption it learns)."""
    batch = batch_of(vlm)
    return batch["input_ids"].gather(1, batch["attention_mask"].sum(1, keepdim=True) - 1)[:, 0].tolist()  # (B,)


def generate_ending_at(model: Any, enc: dict, token: int, steps: int = 6) -> list[list[int]]:
    """``generate``'s greedy tokens after the prompt once ``token`` is made to win where the first row's second token
    did (its output-embedding row raised), so that the model ends an answer with it within ``steps`` tokens."""
    start = enc["input_ids"].shape[1]
    with torch.no_grad():
        first = model.generate(**enc, max_new_tokens=steps, do_sample=False)[:, start:]
        head = model.get_output_embeddings().weight
        head[token] = head[first[0, 1]] * 3
        return model.generate(**enc, max_new_tokens=steps, do_sample=False)[:, start:].tolist()


def assert_greedy_equal(got: Any, theirs: list[list[int]], pad: int) -> None:
    """finecap's greedy ``got`` holds ``generate``'s tokens up to each row's end, and ``generate`` only padding
    after it."""
    for row, seq in enumerate(theirs):
        n = int(got.lengths[row])
        assert got.sequences[row, :n].tolist() == seq[:n], row
        assert all(t == pad for t in seq[n:]), row


def test_gemma3_captions_end_with_end_of_turn_where_generate_stops(tmp_path):
    """Gemma 3 as ``google/gemma-3-*-it`` is (the tiny builder's): the tokenizer's EOS is ``<eos>``,
    ``generation_config.eos_token_id`` is ``[<eos>, <end_of_turn>]`` and the chat template ends an assistant turn with
    ``<end_of_turn>``. Training targets end with ``<end_of_turn>``; finecap's greedy captions equal ``generate``'s
    when the model ends its answer with ``<end_of_turn>`` (its head made to prefer it at the second step); the saved
    ``generation_config.json`` stops at ``<end_of_turn>`` first."""
    from transformers import GenerationConfig

    from finecap.train.checkpoint import write_generation_config

    model, processor = tiny_family("gemma3")
    tok = processor.tokenizer
    eos, eot = tok.convert_tokens_to_ids("<eos>"), tok.convert_tokens_to_ids("<end_of_turn>")
    assert (tok.eos_token_id, model.generation_config.eos_token_id) == (eos, [eos, eot])
    vlm = Vlm(model, processor, source="tiny-gemma3").eval()
    assert vlm.eos_token_id == eot and vlm.stop_token_ids() == [eot, eos]
    assert set(target_ends(vlm)) == {eot}
    enc = processor_batch(vlm, pictures(2, seed=1))
    theirs = generate_ending_at(model, enc, eot)
    got = vlm.generate(ours(enc), DecodeConfig(strategy="greedy", max_length=6))
    assert eot in theirs[0]
    assert_greedy_equal(got, theirs, vlm.pad_token_id)
    write_generation_config(tmp_path, DecodeConfig(), tok, vlm.end_token_ids)
    assert GenerationConfig.from_pretrained(tmp_path).eos_token_id == [eot, eos]


LLAVA_ONEVISION_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\\n' + content['text'] }}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""llava-hf/llava-onevision-qwen2-*-ov-hf's chat template (its ``chat_template.json``, as transformers' processor
tests of LLaVA-OneVision write it): ChatML over Qwen2's ``<|im_start|>`` / ``<|im_end|>``, an assistant turn opened by
``<|im_start|>assistant `` (a space, then the answer after a newline) while the generation prompt ends
``<|im_start|>assistant\\n``. The tiny builder keeps LLaVA-1.5's ``USER:`` / ``ASSISTANT:`` shape, which the committed
GPU check's ``family:llava_onevision`` record was measured on (two more tokens would redraw its weights)."""


def test_llava_onevision_in_its_checkpoints_chatml_format_ends_captions_with_im_end(tmp_path):
    """The tiny LLaVA-OneVision given its checkpoints' format: the tokenizer's EOS and the model's stop token
    ``<|im_end|>``, and :data:`LLAVA_ONEVISION_CHATML`. The prompt is that template's generation prompt; what the
    template writes after an answer is ``<|im_end|>`` (the assistant turn's own opening, ``assistant \\n``, is not the
    generation prompt's, so nothing is written between them); training targets end with ``<|im_end|>``, which no
    caption's own ``<|im_end|>`` text becomes; finecap's greedy captions equal ``generate``'s when the model ends its
    answer with ``<|im_end|>``."""
    from finecap.models.vlm import answer_context

    model, processor = tiny_family("llava_onevision")
    tok = processor.tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    end = tok.eos_token_id
    with torch_seeded(0):
        model.resize_token_embeddings(len(tok))
    model.generation_config.eos_token_id = end
    processor.chat_template = LLAVA_ONEVISION_CHATML
    vlm = Vlm(model, processor, source="tiny-llava_onevision-chatml").eval()
    prompt = vlm.section.prompt
    assert vlm.prompt_text == f"<|im_start|>user <image>\n{prompt}<|im_end|><|im_start|>assistant\n"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    assert answer_context(processor, messages, vlm.prompt_text) == ("", "<|im_end|>")
    assert vlm.eos_token_id == end and vlm.stop_token_ids() == [end] and vlm.caption_prefix == ""
    assert set(target_ends(vlm)) == {end}
    said = batch_of(vlm, ["a sign reading <|im_end|> on a wall"])["labels"][0].tolist()
    assert said[-1] == end and end not in said[:-1]
    enc = processor_batch(vlm, pictures(2, seed=1))
    theirs = generate_ending_at(model, enc, end)
    got = vlm.generate(ours(enc), DecodeConfig(strategy="greedy", max_length=6))
    assert end in theirs[0]
    assert_greedy_equal(got, theirs, vlm.pad_token_id)


@pytest.mark.parametrize("family", ["idefics2", "idefics3"], ids=["family-idefics2", "family-idefics3"])
def test_a_turn_end_the_models_stops_lack_ends_captions_and_joins_the_stops(family, tmp_path):
    """Idefics2/3 as ``HuggingFaceM4/Idefics3-8B-Llama3`` is: the chat template ends an assistant turn with
    ``<end_of_utterance>`` (a special token), while the tokenizer's EOS is another token and the model's stop tokens
    are the EOS ids alone. Training targets end with ``<end_of_utterance>`` (they ended with the tokenizer's EOS, a
    format the chat template never shows the model), finecap's greedy decoding stops there, the caption holding no
    text generated after the turn's end, and the model's generation config, a saved folder's and a run checkpoint's
    ``generation_config.json`` stop there first, so ``generate`` gives finecap's captions (it ran past
    ``<end_of_utterance>``, the text after it kept in the caption)."""
    from transformers import GenerationConfig

    from finecap.train.checkpoint import write_generation_config

    model, processor = tiny_family(family)
    tok = processor.tokenizer
    tok.eos_token = "<eos>"  # as Idefics3-8B-Llama3's <|end_of_text|>, Idefics2-8b's </s>
    eos, eou = tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_utterance>")
    model.generation_config.eos_token_id = [eos]
    vlm = Vlm(model, processor, source=f"tiny-{family}").eval()
    assert vlm.eos_token_id == eou and vlm.stop_token_ids() == [eou, eos]
    assert set(target_ends(vlm)) == {eou}
    enc = processor_batch(vlm, pictures(2, seed=1))
    write_generation_config(tmp_path, DecodeConfig(strategy="greedy", max_length=6), tok, vlm.end_token_ids)
    assert GenerationConfig.from_pretrained(tmp_path).eos_token_id == [eou, eos]
    assert GenerationConfig.from_pretrained(vlm.save(tmp_path / "saved")).eos_token_id == [eou, eos]
    theirs = generate_ending_at(model, enc, eou)
    got = vlm.generate(ours(enc), DecodeConfig(strategy="greedy", max_length=6))
    n = theirs[0].index(eou) + 1  # the model ends its answer within the 6 tokens
    assert got.sequences[0, :n].tolist() == theirs[0][:n] and int(got.lengths[0]) == n
    assert got.texts[0] == tok.decode(theirs[0][: n - 1], skip_special_tokens=True).strip()
    assert_greedy_equal(got, theirs, vlm.pad_token_id)


def test_captions_stop_at_the_turn_end_and_hold_no_template_text(tiny):
    """Each family's model made to end its answer with the token that ends an assistant turn in its chat template
    (:attr:`Vlm.eos_token_id`, its output-embedding row raised at the second step): ``generate`` stops there and
    finecap's greedy captions hold ``generate``'s tokens up to it, the turn end last; the caption text is the answer's
    tokens decoded, without the turn end or any other text of the chat template around the answer."""
    from finecap.models.vlm import answer_context

    eot = tiny.eos_token_id
    model = tiny.model
    head = model.get_output_embeddings().weight
    saved = head[eot].detach().clone()
    try:
        enc = processor_batch(tiny, pictures(2, seed=1))
        theirs = generate_ending_at(model, enc, eot)
        got = tiny.generate(ours(enc), DecodeConfig(strategy="greedy", max_length=6))
    finally:
        with torch.no_grad():
            head[eot] = saved
    n = theirs[0].index(eot) + 1  # generate stopped at the turn end, within the 6 tokens
    assert all(t == tiny.pad_token_id for t in theirs[0][n:])
    assert got.sequences[0, :n].tolist() == theirs[0][:n] and int(got.lengths[0]) == n
    text = got.texts[0]
    assert text == tiny.tokenizer.decode(theirs[0][: n - 1], skip_special_tokens=True).strip()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": tiny.section.prompt}]}]
    before, after = answer_context(tiny.processor, messages, tiny.prompt_text)
    residue = [w for w in (*tiny.prompt_text.split(), *before.split(), *after.split()) if not w.isalpha()]
    assert residue and not [w for w in residue if w in text], (text, residue)


PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 4, "pan_and_scan_max_num_crops": 3,
                "pan_and_scan_min_ratio_to_activate": 1.2}  # fmt: skip
"""Gemma 3's pan-and-scan at the tiny model's 16 px: a wide image is read as crops besides the whole image."""


def test_gemma3_pan_and_scan_captions_equal_generate():
    """Gemma 3 with ``do_pan_and_scan`` (``vlm.processor_kwargs``): images of three aspect ratios, the wider ones
    read as crops besides the whole image (more pixel rows than images); finecap's greedy captions equal
    ``generate``'s on the processor's batch (pixel rows read per image token: one row per image crashed, the image
    features and image tokens not matching)."""
    from finecap.config import VlmBackboneConfig

    model, processor = tiny_family("gemma3")
    vlm = Vlm(model, processor, VlmBackboneConfig(processor_kwargs=PAN_AND_SCAN), source="tiny-gemma3").eval()
    g = torch.Generator().manual_seed(0)
    ims = [Image.fromarray((torch.rand(16, w, 3, generator=g) * 255).byte().numpy()) for w in (16, 48, 32)]
    batch = vlm.encoder.preprocess(ims)
    assert batch["pixel_values"].shape[0] > len(ims)  # crops were made
    enc = dict(processor(text=[vlm.prompt_text] * 3, images=[[im] for im in ims], padding=True, return_tensors="pt",
                         add_special_tokens=False, **PAN_AND_SCAN))  # fmt: skip
    assert torch.equal(enc["input_ids"], batch["prompt_ids"])
    got = vlm.generate(batch, DecodeConfig(strategy="greedy", max_length=6))
    with torch.no_grad():
        theirs = model.generate(**enc, max_new_tokens=6, do_sample=False)[:, enc["input_ids"].shape[1] :]
    for row, seq in enumerate(theirs.tolist()):
        n = int(got.lengths[row])
        assert got.sequences[row, :n].tolist() == seq[:n], row


def levers_model(family: str, checkpointing: bool) -> Vlm:
    """A tiny ``family`` VLM with finecap's GPU levers: bf16 frozen weights, LoRA on the language model (float32,
    B drawn at random so the adapters matter), gradient checkpointing on or off (``memory.prepare_training``)."""
    from finecap.config import load
    from finecap.models import lora, memory

    model, processor = tiny_family(family)
    cfg = load(
        None,
        [
            "model.kind=vlm",
            "model.dtype=bfloat16",
            "train.mixed_precision=bf16",
            "lora.lm=true",
            "lora.rank=4",
            "lora.alpha=8",
            f"train.gradient_checkpointing={str(checkpointing).lower()}",
        ],
    )
    with torch_seeded(0):  # the adapters' A matrices alike in both models (tiny_family leaves torch's seed alone)
        vlm = memory.prepare_training(lora.configure_training(Vlm(model, processor, source=family), cfg), cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in vlm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return vlm.train()  # fmt: skip


def loss_and_grads(model: Vlm, batch: dict) -> tuple[float, dict[str, torch.Tensor], tuple[int, int]]:
    """The MLE loss under bf16 autocast, the adapters' gradients, and how often a linear layer of the first
    language-model layer ran in the forward pass and in the backward pass (where checkpointing runs it again)."""
    layer = next(m for n, m in module_path(model.model, model.family.language_model).named_modules()
                 if n.endswith("layers.0"))  # fmt: skip
    linear = next(m for m in layer.modules() if isinstance(m, torch.nn.Linear))
    calls = []
    handle = linear.register_forward_hook(lambda *_: calls.append(1))
    try:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = mle_loss(model(batch), batch["labels"])
        forward = len(calls)
        loss.backward()
    finally:
        handle.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, (forward, len(calls) - forward)


def test_bf16_lora_and_checkpointing_give_the_losses_without_checkpointing(tiny):
    """bf16 weights + autocast + LoRA with gradient checkpointing (the prompt and caption in one own forward,
    recomputed in the backward pass) give the loss and adapter gradients of the same model without it (the same one
    own forward); a caption holding the image token (a sampled one can) is scored after the prompt's cache, both
    passes checkpointed (:func:`finecap.models.memory.checkpointing_with_cache`). bf16 rounding: 2e-2 relative."""
    family = tiny.model.config.model_type
    plain, checkpointed = levers_model(family, False), levers_model(family, True)
    batch = batch_of(plain)
    held = dict(batch, input_ids=batch["input_ids"].clone())
    held["input_ids"][0, 1] = plain.image_token_id
    # (forward, backward) calls of the first layer: one own forward, run again in the backward pass under
    # checkpointing; for the image token the prompt pass and the caption pass after its cache, each run again
    for b, expect, expect_ckpt in ((batch, (1, 0), (1, 1)), (held, (2, 0), (2, 2))):
        loss, grads, calls = loss_and_grads(plain, b)
        loss_ckpt, grads_ckpt, calls_ckpt = loss_and_grads(checkpointed, b)
        assert (calls, calls_ckpt) == (expect, expect_ckpt)
        assert abs(loss_ckpt - loss) <= 2e-2 * abs(loss), (loss, loss_ckpt)
        assert set(grads) == set(grads_ckpt) and any("lora_" in n for n in grads)  # adapters and the projector
        for name, grad in grads.items():
            scale = float(grad.abs().max()) or 1.0
            assert float((grads_ckpt[name] - grad).abs().max()) <= 5e-2 * scale, name


def test_every_module_from_vision_into_the_language_model_trains_with_the_projector(tiny):
    """Qwen3-VL's DeepStack mergers project intermediate vision layers into its first decoder layers, as its merger
    projects the last: they stayed frozen under ``vlm.train_projector`` while the merger trained."""
    assert tiny.section.train_projector
    tiny.apply_trainable()
    names = {n for n, _ in tiny.model.named_parameters()}
    deepstack = {n for n in names if "deepstack_merger_list" in n}
    assert bool(deepstack) == (tiny.model.config.model_type == "qwen3_vl")
    trains = {n for n, p in tiny.model.named_parameters() if p.requires_grad}
    assert deepstack <= trains
    projector = {n for n in names if n.startswith(tiny.family.projector + ".")}
    assert projector and projector <= trains


def test_default_lora_targets_resolve_in_both_parts_and_leave_the_projector_out(tiny):
    """The family row's LoRA targets name linear layers of its language model and its vision tower (a fused
    ``gate_up_proj``, GLM-4V's, would leave ``gate_proj`` matching nothing), never the projector nor the head."""
    from finecap.models import lora

    for part in ("lm", "encoder"):
        got = lora.resolve_targets(part, tiny.lora_module(part), tiny.lora_default_targets(part))
        assert got, part
        projector = tiny.family.projector.removeprefix(tiny.family.vision + ".")
        assert not [n for n in got if n.startswith(projector) or "lm_head" in n], part


@pytest.mark.parametrize("family", sorted(FAMILIES), ids=[family_id(f) for f in sorted(FAMILIES)])
def test_a_saved_folder_loads_with_auto_model_and_gives_finecaps_logits(family, tmp_path):
    """A fine-tuned captioner (every weight of the language model, projector and tower moved) saved by
    :meth:`Vlm.save` loads with ``AutoModelForImageTextToText`` as the family's own class, whose forward on
    ``[prompt, caption]`` gives finecap's teacher-forced caption logits (1e-5 relative) on a padded batch."""
    from transformers import AutoModelForImageTextToText

    model, processor = tiny_family(family)
    vlm = Vlm(model, processor, source=family, train_encoder=True).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in vlm.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    batch = batch_of(vlm)
    with torch.no_grad():
        ours = vlm(batch)  # (B, T, V) caption logits
    loaded = AutoModelForImageTextToText.from_pretrained(vlm.save(tmp_path / "ckpt")).eval()
    assert type(loaded) is type(model)
    caption = batch["input_ids"]
    T = caption.shape[1]
    extra = {k: batch[k] for k in vlm.family.image_inputs if k in batch}
    extra |= {k: torch.cat([batch[k], torch.zeros_like(caption)], 1) for k in vlm.family.token_inputs}
    ids = torch.cat([batch["prompt_ids"], caption], 1)[:, :-1]
    if vlm.family.mrope:
        extra["mm_token_type_ids"] = (ids == vlm.image_token_id).int()
    mask = torch.cat([batch["prompt_mask"], batch["attention_mask"]], 1)[:, :-1]
    with torch.no_grad():
        theirs = loaded(input_ids=ids, attention_mask=mask, **extra).logits[:, -T:]
    real = batch["attention_mask"].bool()  # padding positions of captions are never read
    assert relative(ours[real], theirs[real]) < 1e-5


def test_adapters_on_the_original_base_and_the_merged_export_caption_like_the_run(tiny, tmp_path):
    """From a saved folder of the family: finecap's greedy captions with LoRA on both parts equal ``generate``'s of
    (1) peft's whole-model adapter (``adapter/``) on the *original* base loaded by ``AutoModelForImageTextToText``, and
    (2) the merged export (``finecap.models.export.export_merged``) loaded by ``AutoModelForImageTextToText`` alone."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText
    from transformers.utils import is_torchvision_available

    from finecap.models.export import export_merged
    from helpers.vlm_families import save_family

    family = tiny.model.config.model_type
    if family == "mistral3" and not is_torchvision_available():
        pytest.skip("PixtralProcessor loads from a folder only with torchvision (built here through a stand-in)")
    folder = save_family(tmp_path / "base", family)
    model = Vlm.from_pretrained(folder)
    # every projector moved (Qwen3-VL's DeepStack mergers too): the adapter must carry them all
    model = adapted(model, torch.nn.ModuleList([module_path(model.model, p) for p in model.family.projectors]))
    enc = processor_batch(model, pictures(3, seed=1))
    start, greedy = enc["input_ids"].shape[1], dict(max_new_tokens=6, do_sample=False)
    got = model.generate(ours(enc), DecodeConfig(strategy="greedy", max_length=6))
    out = model.save(tmp_path / "ckpt")
    base = AutoModelForImageTextToText.from_pretrained(folder).eval()
    with torch.no_grad():
        plain = base.generate(**enc, **greedy)[:, start:].tolist()
        on_base = PeftModel.from_pretrained(base, str(out / "adapter")).eval().generate(**enc, **greedy)
        merged = AutoModelForImageTextToText.from_pretrained(export_merged(out, tmp_path / "merged")).eval()
        exported = merged.generate(**enc, **greedy)
    assert on_base[:, start:].tolist() != plain  # the adapter was applied
    for theirs in (on_base[:, start:].tolist(), exported[:, start:].tolist()):
        for row, seq in enumerate(theirs):
            n = int(got.lengths[row])
            assert got.sequences[row, :n].tolist() == seq[:n], row
            assert all(t in (model.pad_token_id, model.eos_token_id) for t in seq[n:]), row


# --------------------------------------------------------------------------------------------------------------------
# Refusals: one line, before any weight is read
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def safetensors_reads(monkeypatch) -> list[str]:
    """Every safetensors file opened (``safe_open`` where transformers and safetensors hold it, ``load_file``)."""
    import safetensors
    import safetensors.torch
    import transformers.modeling_utils as modeling_utils

    reads: list[str] = []

    def counting(original):
        def wrapper(path, *args, **kwargs):
            reads.append(str(path))
            return original(path, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(modeling_utils, "safe_open", counting(modeling_utils.safe_open))
    monkeypatch.setattr(safetensors, "safe_open", counting(safetensors.safe_open))
    monkeypatch.setattr(safetensors.torch, "load_file", counting(safetensors.torch.load_file))
    return reads


REFUSALS = {
    "paligemma": "prefix-LM .* nearest supported family: gemma3",
    "mllama": "cross-attention .* nearest supported family: llava_next",
    "blip-2": "Q-Former.* nearest supported family: idefics2",
    "florence2": "encoder-decoder .* nearest supported family: idefics3",
    "kimi_vl": "not a transformers model and exists only as remote code .* nearest supported families",
    "vipllava": "not a supported VLM family; supported: gemma3, glm4v",
}


@pytest.mark.parametrize("model_type", sorted(REFUSALS), ids=[f"family-refused-{t}" for t in sorted(REFUSALS)])
def test_refused_family_is_one_line_before_any_weight_is_read(tmp_path, safetensors_reads, model_type):
    """A checkpoint folder whose ``config.json`` names a refused / unsupported / remote-code-only ``model_type`` (its
    weights are a real model's) stops with one line naming ``vlm.name`` and the nearest family, no weight read."""
    import json

    from finecap.models.presets import save_tiny_vlm

    folder = save_tiny_vlm(tmp_path / "ckpt", "llava")
    Vlm.from_pretrained(folder)
    assert safetensors_reads, "the counter sees a normal load"  # the test can fail
    safetensors_reads.clear()
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    if model_type == "kimi_vl":
        config["auto_map"] = {"AutoConfig": "configuration_kimi_vl.KimiVLConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"^vlm.name={folder}: .*{REFUSALS[model_type]}") as caught:
        Vlm.from_pretrained(folder)
    assert "\n" not in str(caught.value)
    assert safetensors_reads == []


def test_a_processor_option_the_family_does_not_take_is_refused_before_weights(tmp_path, safetensors_reads):
    from finecap.config import load
    from finecap.models.backbones import build_model
    from finecap.models.presets import save_tiny_vlm

    folder = save_tiny_vlm(tmp_path / "ckpt", "qwen2_vl")
    with pytest.raises(ValueError, match="vlm.processor_kwargs: 'max_pixel' is not an argument of Qwen2VL") as caught:
        build_model(load(None, ["model.kind=vlm", f"vlm.name={folder}", "vlm.processor_kwargs={max_pixel: 1568}"]))
    assert "\n" not in str(caught.value) and safetensors_reads == []


def test_a_lower_bound_over_the_processors_own_upper_one_is_refused_before_weights(tmp_path, safetensors_reads):
    """Without a budget the upper bound is the checkpoint's processor's own: named as such."""
    from finecap.config import load
    from finecap.models.backbones import build_model
    from finecap.models.presets import save_tiny_vlm

    folder = save_tiny_vlm(tmp_path / "ckpt", "qwen2_vl")  # its processor: min_pixels = max_pixels = 256
    with pytest.raises(ValueError, match=r"^vlm.processor_kwargs.min_pixels=4096 is over Qwen2VLImageProcessor\w*'s "
                                         "own size.longest_edge=256"):  # fmt: skip
        build_model(load(None, ["model.kind=vlm", f"vlm.name={folder}", "vlm.processor_kwargs={min_pixels: 4096}"]))
    assert safetensors_reads == []


def test_docs_family_table_is_generated_from_the_family_rows_family():
    """docs/vlm.md's family table is :func:`finecap.models.vlm.family_table`'s output (regenerate it on a change)."""
    from pathlib import Path

    from finecap.models.vlm import FAMILY_TABLE_BEGIN, FAMILY_TABLE_END, REFUSED, family_table

    page = (Path(__file__).parents[2] / "docs" / "vlm.md").read_text()
    start, end = page.index(FAMILY_TABLE_BEGIN), page.index(FAMILY_TABLE_END) + len(FAMILY_TABLE_END)
    assert page[start:end] == family_table()
    for model_type in [*FAMILIES, *REFUSED]:
        assert f"| `{model_type}` |" in page[start:end]


@pytest.mark.parametrize("family", sorted(FAMILIES), ids=[family_id(f) for f in sorted(FAMILIES)])
def test_a_trained_vision_tower_trains_only_what_the_image_features_reach(family):
    """``model.train_encoder=true`` trains the tower's weights that the language model's inputs depend on, no more:
    LLaVA reads a hidden layer, not its tower's ``post_layernorm``; Gemma 3's and LLaVA-OneVision's SigLIP pooling
    head is never run into the features. They counted as trained (``--dry-run``'s counts, :func:`finecap.models.
    memory.parameter_counts`) and stopped a 2-process run at its second step (DDP: parameters that were not used
    in producing loss). After one AdamW step (a parameter without a gradient does not move) what trains is what
    moved; Idefics3's tower trains whole."""
    from finecap.models.memory import parameter_counts

    model, processor = tiny_family(family)
    vlm = Vlm(model, processor, source=family, train_encoder=True).train()
    tower = module_path(vlm.model, vlm.family.vision)
    trained = {n for n, p in vlm.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in vlm.named_parameters()}
    opt = torch.optim.AdamW([p for p in vlm.parameters() if p.requires_grad], lr=1e-2)
    batch = batch_of(vlm)
    mle_loss(vlm(batch), batch["labels"]).backward()
    opt.step()
    moved = {n for n, p in vlm.named_parameters() if not torch.equal(p, before[n])}
    assert trained == {n for n, p in vlm.named_parameters() if p.grad is not None}  # what DDP asks
    # the tiny Qwen3-VL's last DeepStack merger feeds the output of its last language-model layer at the image
    # tokens, which no caption logit reads: a zero gradient (a projector, trained by vlm.train_projector), so its
    # zero biases stay put
    still = {n for n in trained - moved if n.startswith("model.model.visual.deepstack_merger_list.1.")}
    assert trained - still == moved, sorted(trained ^ moved)
    counts = parameter_counts(vlm)
    assert sum(n for part in counts.values() for n in part.get("trainable", {}).values()) == sum(
        p.numel() for n, p in vlm.named_parameters() if n in trained
    )
    frozen = {n for n, p in tower.named_parameters() if not p.requires_grad}
    if family in ("llava", "llava_next"):
        assert frozen == {"post_layernorm.weight", "post_layernorm.bias"}
    if family in ("gemma3", "llava_onevision"):
        assert frozen and all(n.startswith(("head.", "post_layernorm.")) for n in frozen), sorted(frozen)
    if family == "idefics3":
        assert not frozen


UNREACHED_LAYERS = {"llava": ".layers.1.", "gemma3": ".head.", "llava_onevision": ".head."}
"""Where each tiny family's tower has linear layers the image features never reach: the LLaVA tower's last layer
(its language model reads the first hidden layer, ``vision_feature_layer=-2`` of 2 layers, LLaVA-1.5's choice) and
the SigLIP pooling head of Gemma 3 and LLaVA-OneVision."""


def tower_lora(family: str) -> Vlm:
    """A tiny ``family`` VLM with LoRA (rank 2) on its trained vision tower and a frozen language model (SR-V; LLaVA
    reading its first hidden layer)."""
    from finecap.config import load
    from finecap.models import lora

    model, processor = tiny_family(family)
    if family == "llava":
        model.config.vision_feature_layer = -2
    cfg = load(None, ["model.kind=vlm", "model.train_encoder=true", "model.train_lm=false", "lora.encoder=true",
                      "lora.rank=2"])  # fmt: skip
    return lora.configure_training(Vlm(model, processor, source=family), cfg).train()


@pytest.mark.parametrize("family", sorted(UNREACHED_LAYERS))
def test_tower_adapters_are_made_and_saved_only_where_the_image_features_reach(family, tmp_path):
    """LoRA on a trained tower adapts only the layers the image features reach: adapters on the others stayed
    frozen at zero (their layers never reach the loss) and were saved in ``encoder_lora/`` and ``adapter/``. Every
    adapter trains and gets a gradient; the saved files hold the same adapters and load back."""
    from safetensors import safe_open

    vlm = tower_lora(family)
    unread = UNREACHED_LAYERS[family]
    tower = {n for n, _ in vlm.named_parameters() if ".vision_tower." in n and "lora_" in n}
    assert tower and not any(unread in n for n in tower), sorted(n for n in tower if unread in n)[:4]
    assert all(vlm.get_parameter(n).requires_grad for n in tower)
    batch = batch_of(vlm)
    mle_loss(vlm(batch), batch["labels"]).backward()
    assert tower == {n for n in tower if vlm.get_parameter(n).grad is not None}
    out = vlm.save(tmp_path / "ckpt")
    for file in (out / "encoder_lora" / "adapter_model.safetensors", out / "adapter" / "adapter_model.safetensors"):
        with safe_open(str(file), "pt") as f:
            keys = list(f.keys())
        assert keys and not any(unread in k for k in keys), file
    again = Vlm.from_checkpoint(out)
    assert {n for n, _ in again.named_parameters() if ".vision_tower." in n and "lora_" in n} == tower


def test_a_checkpoint_with_adapters_on_unreached_tower_layers_still_loads_and_resumes(monkeypatch, tmp_path):
    """Checkpoints saved before adapters were left off unreached layers hold adapters on them: they load as saved
    (strictly: the file's adapters, no more, no fewer), and a run continuing them keeps them (the same settings,
    not merged into the base weights and made afresh), frozen; so does a run continuing a checkpoint without them."""
    from finecap.config import load
    from finecap.models import lora

    unread = UNREACHED_LAYERS["llava"]
    with monkeypatch.context() as m:
        m.setattr(Vlm, "lora_unreached", lambda self, part: frozenset())  # the old behaviour: every target
        old = tower_lora("llava")
    assert any(unread in n for n, _ in old.named_parameters() if "lora_" in n)
    out = old.save(tmp_path / "old")
    vlm = Vlm.from_checkpoint(out)
    adapters = {n: p for n, p in vlm.named_parameters() if ".vision_tower." in n and "lora_" in n}
    assert adapters.keys() == {n for n, _ in old.named_parameters() if ".vision_tower." in n and "lora_" in n}
    cfg = load(None, ["model.kind=vlm", "model.train_encoder=true", "model.train_lm=false", "lora.encoder=true",
                      "lora.rank=2"])  # fmt: skip
    lora.configure_training(vlm, cfg)
    kept = {n: p for n, p in vlm.named_parameters() if ".vision_tower." in n and "lora_" in n}
    assert kept.keys() == adapters.keys() and all(kept[n] is adapters[n] for n in kept) and not vlm.base_changed
    assert {n for n, p in kept.items() if not p.requires_grad} == {n for n in kept if unread in n}
    new = Vlm.from_checkpoint(tower_lora("llava").save(tmp_path / "new"))  # and one saved without them
    adapters = {n: p for n, p in new.named_parameters() if "lora_" in n}
    lora.configure_training(new, cfg)
    assert all(new.get_parameter(n) is p for n, p in adapters.items()) and not new.base_changed


def test_targets_that_only_reach_unread_tower_layers_are_refused():
    from finecap.config import load
    from finecap.models import lora

    model, processor = tiny_family("gemma3")
    cfg = load(None, ["model.kind=vlm", "model.train_encoder=true", "lora.encoder=true", "lora.rank=2",
                      "lora.encoder_targets=[head.mlp.fc1]"])  # fmt: skip
    with pytest.raises(ValueError, match=r"lora.encoder_targets: head.mlp.fc1 never reach the captioner's output"):
        lora.configure_training(Vlm(model, processor, source="gemma3"), cfg)


def test_the_tower_probe_runs_once_per_captioner(monkeypatch):
    """What the image features reach depends only on the architecture and its config: probed once (at the build),
    not again when the adapters are made or at each ``apply_trainable``."""
    from finecap.models import lora, vlm

    calls = []
    probe = vlm.reached_parameters
    monkeypatch.setattr(vlm, "reached_parameters", lambda *a: calls.append(1) or probe(*a))
    model = tower_lora("llava")
    model.apply_trainable()
    lora.set_trainable(model, lm=True, encoder=True)
    assert len(calls) == 1
    assert {n for n, p in model.named_parameters() if p.requires_grad and ".vision_tower." in n} == {
        n for n, _ in model.named_parameters() if ".vision_tower." in n and "lora_" in n
    }


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "gemma3"])
def test_a_tower_that_trains_builds_on_the_meta_device(family):
    # a sharded run's other processes build the captioner on the meta device (train.strategy=fsdp), where the probe
    # of what the image features reach cannot run ("Tensor.item() cannot be called on meta tensors"): it is skipped
    # there, and sharding.match_main gives such a process the main one's flags
    model, processor = tiny_family(family)
    vlm = Vlm(model.to("meta"), processor, source=family, train_encoder=True)
    assert all(p.is_meta for p in vlm.parameters()) and any(p.requires_grad for p in vlm.parameters())


def test_a_mistral3_image_of_one_image_token_is_refused_naming_it_and_the_smallest_size(tmp_path):
    """Mistral 3's own forward fails on a batch of one image of one image token (transformers 5.24's
    ``get_image_features`` squeezes its single feature row away): finecap's collator refuses such an image, naming the
    image's file, its size and the smallest the family takes (from the config: ``patch_size x spatial_merge_size``
    px). An image one pixel over that unit gives two tokens and is captioned, alone or batched."""
    from finecap.data.datasets import CaptionDataset, model_collator
    from finecap.data.images import ImageRefused
    from finecap.data.records import DataError, Record

    model, processor = tiny_family("mistral3")
    vlm = Vlm(model, processor, source="tiny-mistral3").eval()
    unit = model.config.vision_config.patch_size * model.config.spatial_merge_size
    assert unit == 8  # the tiny model's: 4 px patches merged 2 x 2
    small = Image.fromarray((torch.rand(7, 5, 3) * 255).byte().numpy())  # 5 x 7 px
    with pytest.raises(RuntimeError, match="split_with_sizes"):  # the model's own forward on the processor's output
        vlm.model(**processor_batch(vlm, [small]))
    small.save(tmp_path / "small.png")
    data = CaptionDataset([Record("small", tmp_path / "small.png", "train", ["a red circle"])], per_caption=False)
    collate = model_collator(vlm, 8)
    with pytest.raises(DataError, match=r"^image of record 'small' \(.*small\.png\): 5 x 7 pixels \(8 x 8 after the "
                                        r"processor\) gives .* one image token.* side over 8 pixels .*patch_size=4 x "
                                        r"spatial_merge_size=2"):  # fmt: skip
        collate([data[0]])
    with pytest.raises(ImageRefused, match="8 x 8 pixels"):  # one merge unit exactly: one token
        vlm.encoder.preprocess([Image.new("RGB", (unit, unit))])
    over = Image.new("RGB", (unit + 1, 1), (200, 30, 30))  # a side over the unit: 2 tokens
    for images in ([over], [over, small.resize((16, 16))]):
        batch = vlm.encoder.preprocess(images)
        assert int((batch["prompt_ids"][0] == vlm.image_token_id).sum()) == 2
        with torch.no_grad():
            first, _ = vlm.start(vlm.prompt_of(batch))
        assert torch.isfinite(first).all() and first.shape[0] == len(images)


def test_a_mistral3_image_budget_that_refuses_every_image_is_refused_when_the_model_is_set_up():
    """``vlm.image_max_pixels`` of one merge unit or less (64 on the tiny model: 8 x 8 px) caps every image's longest
    side at 8 px, one image token or none, which Mistral 3 refuses: it was refused only when the first image arrived
    (every image, one by one); now the model is refused when it is set up, naming the option and the smallest value
    that works, (8 + 1)^2 = 81, under which an image is taken."""
    from finecap.config import VlmBackboneConfig

    model, processor = tiny_family("mistral3")
    for budget in (1, 64, 80):
        with pytest.raises(ValueError, match=rf"^vlm.image_max_pixels={budget}: .*\(every image refused\).*smallest "
                                             r"value that works is vlm.image_max_pixels=81 .*patch_size=4 x "
                                             r"spatial_merge_size=2"):  # fmt: skip
            Vlm(model, processor, VlmBackboneConfig(image_max_pixels=budget), source="tiny-mistral3")
    vlm = Vlm(model, processor, VlmBackboneConfig(image_max_pixels=81), source="tiny-mistral3")
    batch = vlm.encoder.preprocess([Image.new("RGB", (200, 200), (200, 30, 30))])
    assert int((batch["prompt_ids"][0] == vlm.image_token_id).sum()) >= 2
