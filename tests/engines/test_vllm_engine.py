"""vLLM generates what finecap's decoder generates (float32, tiny Idefics3 captioner; tests/engines/conftest.py):
greedy captions token for token, the log-probs of finecap's ``forward`` to 1e-5, seeded samples repeatable and
independent of the batch, beam search through ``LLM.beam_search``. The engine was started without weights
(``load_format="dummy"``) and sent the captioner's from memory: its folder holds no weight file."""

from __future__ import annotations

import pytest
import torch

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import DecodeConfig  # noqa: E402
from finecap.data.datasets import model_collator  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

MAX_LENGTH = 16
IMAGES = images(6)


def first_divergence(captioner, batch, ours, theirs) -> str:
    """Where two greedy decodings first differ, with the captioner's logit gap between the two tokens there (a
    near-tie, a gap ~1e-5, is float32 rounding; a large gap is a real difference)."""
    for row in range(len(ours)):
        a, b = ours.sequences[row].tolist(), theirs.sequences[row].tolist()
        t = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if t is None:
            continue
        one = {k: v[row : row + 1] for k, v in batch.items()}
        with torch.no_grad():  # teacher forcing: logits[:, t] predicts token t
            logits = captioner.caption_logits(
                captioner.image_conditioning(one), ours.sequences[row : row + 1, : t + 1]
            )
        gap = float(logits[0, t, a[t]] - logits[0, t, b[t]])
        return f"first divergence: image {row}, token {t}: finecap {a[t]}, vLLM {b[t]}, logit gap {gap:.3g}"
    return "the tokens agree where both have them; the lengths differ"


@pytest.fixture(scope="module")
def batch(captioner):
    return captioner.encoder.preprocess(IMAGES)


@pytest.fixture(scope="module")
def greedy(captioner, batch, engine):
    cfg = DecodeConfig(max_length=MAX_LENGTH)
    return captioner.generate(batch, cfg), engine.generate_images(IMAGES, cfg)


def test_greedy_captions_are_token_identical(captioner, batch, greedy):
    ours, theirs = greedy
    assert torch.equal(ours.sequences, theirs.sequences), first_divergence(captioner, batch, ours, theirs)
    assert theirs.lengths.tolist() == ours.lengths.tolist()
    assert theirs.texts == ours.texts
    assert min(theirs.lengths.tolist()) < MAX_LENGTH <= max(theirs.lengths.tolist())  # some stopped at EOS, some not
    assert (theirs.sequences[torch.arange(len(theirs)), theirs.lengths - 1] == captioner.tokenizer.eos_token_id).any()


def test_logprobs_equal_the_captioners_forward(captioner, batch, greedy, engine):
    ours, theirs = greedy
    torch.testing.assert_close(theirs.token_logprobs, ours.token_logprobs, atol=1e-5, rtol=0)
    cfg = DecodeConfig(strategy="sample", num_return_sequences=3, max_length=MAX_LENGTH, temperature=0.7, top_k=20)
    sampled = engine.generate_images(IMAGES, cfg, seeds=torch.arange(6))
    with torch.no_grad():
        scores = captioner(batch, sequences=sampled.sequences, mask=sampled.mask, image_index=sampled.image_index)
    assert sampled.mask.sum() > 0 and (sampled.token_logprobs[sampled.mask] < 0).all()
    # vLLM's raw log-probs: the model's distribution at temperature 1, before top-k (finecap's convention)
    torch.testing.assert_close(sampled.token_logprobs, scores.logprobs, atol=1e-5, rtol=0)
    assert sampled.scores.tolist() == pytest.approx(sampled.token_logprobs.sum(1).tolist())


def test_seeded_sampling_is_repeatable_and_batch_independent(engine):
    cfg = DecodeConfig(strategy="sample", num_return_sequences=3, max_length=MAX_LENGTH, temperature=1.0)
    seeds = torch.tensor([11, 12, 13, 14, 15, 16])
    first = engine.generate_images(IMAGES, cfg, seeds=seeds)
    again = engine.generate_images(IMAGES, cfg, seeds=seeds)
    assert torch.equal(first.sequences, again.sequences)
    reversed_batch = engine.generate_images(IMAGES[::-1], cfg, seeds=seeds.flip(0))
    for image in range(6):
        mine = [first.sequences[image * 3 + j, : first.lengths[image * 3 + j]].tolist() for j in range(3)]
        row = (5 - image) * 3  # the image's first sample in the reversed batch
        other = [reversed_batch.sequences[row + j, : reversed_batch.lengths[row + j]].tolist() for j in range(3)]
        assert mine == other, image
        assert len({tuple(s) for s in mine}) > 1  # the n samples of an image are different draws
    other_seeds = engine.generate_images(IMAGES, cfg, seeds=seeds + 100)
    assert not torch.equal(first.sequences[:, :4], other_seeds.sequences[:, :4])


def test_beam_search(captioner, batch, greedy, engine):
    one = engine.generate_images(IMAGES, DecodeConfig(strategy="beam", beam_size=1, max_length=MAX_LENGTH))
    assert torch.equal(one.sequences, greedy[1].sequences)  # one beam is greedy
    cfg = DecodeConfig(strategy="beam", beam_size=3, num_return_sequences=2, max_length=MAX_LENGTH)
    beams = engine.generate_images(IMAGES, cfg)
    assert len(beams) == 12 and beams.image_index.tolist() == [i for i in range(6) for _ in range(2)]
    assert (beams.scores.view(6, 2)[:, 0] >= beams.scores.view(6, 2)[:, 1]).all()  # best first
    with torch.no_grad():
        scores = captioner(batch, sequences=beams.sequences, mask=beams.mask, image_index=beams.image_index)
    torch.testing.assert_close(beams.token_logprobs, scores.logprobs, atol=1e-5, rtol=0)


def test_a_caption_the_engines_context_cuts_short_is_refused_naming_it(captioner, engine, greedy):
    """The engine's context is 128 tokens (vllm.max_model_len, conftest.py); a prompt of ~20 and 120 caption tokens
    do not fit it, and vLLM would end the captions that do not stop before as if at decode.max_length."""
    prompt = captioner.encoder.preprocess(IMAGES[:1])["prompt_ids"].shape[1]
    assert 128 - prompt < 120
    with pytest.raises(ValueError, match=r"short of decode.max_length=120.*vllm.max_model_len"):
        engine.generate_images(IMAGES, DecodeConfig(max_length=120))


def test_a_beam_search_the_engines_context_cannot_hold_is_refused_naming_it(captioner, engine, greedy):
    """vLLM's beam search decodes every beam to decode.max_length: with a prompt of ~20 tokens, 120 more do not fit
    the engine's context of 128, and vLLM fails at the step whose request fills it, naming neither option."""
    cfg = DecodeConfig(strategy="beam", beam_size=2, max_length=120)
    with pytest.raises(ValueError, match=r"decode.max_length=120.*vllm.max_model_len.*lower decode.max_length$"):
        engine.generate_images(IMAGES[:2], cfg)
    fits = DecodeConfig(strategy="beam", beam_size=2, max_length=MAX_LENGTH)  # the engine still serves
    assert len(engine.generate_images(IMAGES[:2], fits)) == 2


def test_beam_search_refuses_a_captioner_with_an_end_token_besides_eos(engine, greedy):
    """vLLM's beam search stops at the tokenizer's EOS only: a beam runs through another of the captioner's end
    tokens (Qwen2-VL-Instruct's <|endoftext|> beside its EOS <|im_end|>), where finecap's beam search ends it."""
    cfg = DecodeConfig(strategy="beam", beam_size=3, max_length=MAX_LENGTH)
    beams = engine.generate_images(IMAGES, cfg)
    eos = engine.tokenizer.eos_token_id
    inner = next(t for t in beams.sequences[0, : beams.lengths[0] - 1].tolist() if t != eos)  # a mid-caption token
    ends = engine.ends
    engine.ends = (eos, inner)
    try:
        with pytest.raises(ValueError, match=r"also end with .*; beam search with decode.engine=finecap$"):
            engine.generate_images(IMAGES, cfg)
    finally:
        engine.ends = ends


@pytest.mark.parametrize("step", [0, 3], ids=["first-step", "mid-caption"])
def test_a_beam_search_vllm_aborted_is_refused_not_returned_cut_short(engine, greedy, monkeypatch, step):
    """vLLM 0.32's ``LLM.beam_search`` runs one request per beam and step; where a step's request of an image is
    aborted (finish reason ``abort``: the engine paused or stopped), it ends that image's search and returns the beams
    it had as completed, cut short (at the first step: the prompt alone), ranked as if they had ended. The abort is
    made here at vLLM's own request call, from ``step`` on; the rest of the search is vLLM's."""
    cfg = DecodeConfig(strategy="beam", beam_size=2, max_length=MAX_LENGTH)
    run = engine.llm._render_and_run_requests
    calls = []

    def aborting(*args, **kwargs):
        outputs = run(*args, **kwargs)
        if kwargs.get("output_type") is not None and len(calls) >= step:
            for out in outputs:
                out.outputs[0].finish_reason = "abort"
        calls.append(1)
        return outputs

    monkeypatch.setattr(engine.llm, "_render_and_run_requests", aborting)
    with pytest.raises(RuntimeError, match=r"vLLM aborted the beam search of image 0 of the batch .*no captions"):
        engine.generate_images(IMAGES[:2], cfg)
    monkeypatch.undo()
    assert len(engine.generate_images(IMAGES[:2], cfg)) == 2  # the engine still serves


def test_collated_batches_decode_as_images_do(engine, greedy):
    """The captioning loops' route: the collator runs the engine's preprocessing, generate reads the batch."""
    items = [{"caption": "", "image": im, "image_id": i, "references": [], "index": i} for i, im in enumerate(IMAGES)]
    batch = model_collator(engine, 1)(items)
    assert engine.generate(batch, DecodeConfig(max_length=MAX_LENGTH)).texts == greedy[1].texts


def test_the_engines_folder_holds_no_weight_file_while_it_serves(captioner, engine, greedy):
    """The captioner's weights reached the engine from memory (the greedy captions above are the captioner's); the
    folder vLLM was built from holds its config and processor files only, kilobytes."""
    from finecap.engines.vllm import WEIGHT_FILES

    files = sorted(p.name for p in engine.folder.iterdir())
    assert {"config.json", "generation_config.json", "processor_config.json", "tokenizer.json"} <= set(files), files
    assert [p.name for pattern in WEIGHT_FILES for p in engine.folder.glob(f"**/{pattern}")] == []
    assert not any(name.endswith((".safetensors", ".bin")) for name in files), files
    size = sum(p.stat().st_size for p in engine.folder.rglob("*") if p.is_file())
    weights = sum(p.numel() * p.element_size() for p in captioner.parameters())
    assert size < weights / 10, f"{size} bytes in {files}, {weights} of weights"  # 7.6 kB against 221 kB
    assert engine.llm.llm_engine.vllm_config.load_config.load_format == "dummy"
