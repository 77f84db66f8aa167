"""The family contract (issue 62): every supported VLM family (``finecap.models.vlm.FAMILIES``) against its own
model. A tiny random instance of each (tests/helpers/vlm_families.py: 2 language-model and 2 vision layers, weights
from N(0, 0.2) so the image matters; its own processor class, a named stand-in where that needs a package not
installed here) is checked for:

- first-token logits equal to the model's own forward on each image alone (1e-5 relative), for one image and for
  several images of different sizes batched with left padding;
- greedy captions equal to ``model.generate``'s tokens on the processor's batch;
- per-token log-probs of sampled captions (finecap's decoder and finecap's scoring forward) equal to a teacher-forced
  run of the model's own forward on prompt + caption;
- two MLE steps that lower the loss and move only what trains.

``pytest -k family`` selects it (the ids say ``family``). The measured largest relative logit difference of each
family is printed (``-s`` or ``-rP``) and kept in :data:`LOGIT_DIFFERENCES`.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from finecap.config import DecodeConfig
from finecap.models.vlm import FAMILIES, Vlm
from finecap.objectives.mle import mle_loss
from helpers.vlm import batch_of
from helpers.vlm_families import family_id, tiny_family

LOGIT_DIFFERENCES: dict[str, float] = {}
"""family -> the largest relative difference of finecap's first-token logits to the model's own forward."""


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
    and P. Per-token processor outputs (Qwen's ``mm_token_type_ids``, Gemma 3's ``token_type_ids``) are 0 over the
    caption, as the processor gives them for text."""
    enc = processor_batch(model, [image])
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
    LOGIT_DIFFERENCES[family] = max(diff, LOGIT_DIFFERENCES.get(family, 0.0))
    print(f"{family}: {n} image(s), padded={bool((enc['attention_mask'] == 0).any())}, max relative logit "
          f"difference {diff:.2e} (logit scale {float(reference.abs().max()):.2f})")  # fmt: skip
    assert diff < 1e-5
    if n > 1:  # the image matters: different images, different next-token distributions
        assert relative(reference[0], reference[1]) > 1e-2


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
            losses.append(float(loss))
        moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        assert losses[-1] < losses[0], losses
        assert moved and moved <= trained
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(before[n])
        model.eval()


def test_zz_family_logit_differences_report():
    """Prints every family's largest relative logit difference measured above (run with ``-s``)."""
    for family, diff in sorted(LOGIT_DIFFERENCES.items()):
        print(f"family {family}: max relative first-token logit difference to its own forward {diff:.2e}")


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


def test_docs_family_table_is_generated_from_the_family_rows_family():
    """docs/vlm.md's family table is :func:`finecap.models.vlm.family_table`'s output (regenerate it on a change)."""
    from pathlib import Path

    from finecap.models.vlm import FAMILY_TABLE_BEGIN, FAMILY_TABLE_END, REFUSED, family_table

    page = (Path(__file__).parents[2] / "docs" / "vlm.md").read_text()
    start, end = page.index(FAMILY_TABLE_BEGIN), page.index(FAMILY_TABLE_END) + len(FAMILY_TABLE_END)
    assert page[start:end] == family_table()
    for model_type in [*FAMILIES, *REFUSED]:
        assert f"| `{model_type}` |" in page[start:end]
