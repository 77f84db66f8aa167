"""``benchmarks/vlm_step.py --shared-prompt`` runs (one timed step at a small shape) and counts the language model's
positions as the arithmetic says: B P + N (L - 1) with the prompt shared, N (P + L - 1) repeated."""

from __future__ import annotations

from helpers.scripts import benchmark


def test_shared_prompt_mode_counts_the_positions_it_saves(tmp_path):
    module = benchmark("vlm_step")
    images, samples, tokens = 2, 3, 5
    out = tmp_path / "out.json"
    results = module.main(["--shared-prompt", "--images", str(images), "--samples", str(samples), "--image-tokens",
                           "16", "--tokens", str(tokens), "--steps", "1", "--json", str(out)])  # fmt: skip
    P, N = results["prompt_tokens"], images * samples
    assert P > 16  # the image tokens and the chat template's text
    assert results["shared prompt"]["positions"] == images * P + N * (tokens - 1)
    assert results["prompt per sample"]["positions"] == N * (P + tokens - 1)
    assert results["shared prompt"]["median_s"] > 0 and out.exists()
