"""The demo's set-level diversity samples (finecap.stages.outputs): what decodes them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from finecap.config import load
from finecap.stages import outputs


@pytest.mark.parametrize(
    ("overrides", "mode", "expected"),
    [
        # a stage override of top_k / top_p (read by no greedy stage) cut the "T = 1" samples to a truncated
        # distribution: they draw from the whole one, as the rollouts do
        (["decode.top_k=5", "decode.top_p=0.5"], "sample",
         {"strategy": "sample", "temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_return_sequences": 5}),
        # a greedy stage's beam options are read nowhere else: beam search's defaults
        (["decode.length_penalty=0.2"], "beam",
         {"strategy": "beam", "beam_size": 5, "num_return_sequences": 5, "length_penalty": 1.0}),
        # a stage decoding with beams keeps its own
        (["decode.strategy=beam", "decode.beam_size=3", "decode.length_penalty=0.2"], "beam",
         {"strategy": "beam", "beam_size": 5, "num_return_sequences": 5, "length_penalty": 0.2}),
    ],
)  # fmt: skip
def test_diversity_samples_decode_by_the_protocol_not_by_unread_options(tmp_path, monkeypatch, overrides, mode,
                                                                        expected):  # fmt: skip
    cfg = load(None, overrides)
    seen = {}

    def generate(model, cfg, split, decode):
        seen.update({k: getattr(decode, k) for k in expected})
        return {1: ["a caption"] * 5}

    monkeypatch.setattr(outputs, "generate_captions", generate)
    monkeypatch.setattr(outputs, "best_model", lambda runner, stage: None)
    runner = SimpleNamespace(stage_dir=lambda stage: tmp_path, force=True, stage_config=lambda stage: cfg)
    assert outputs.stage_samples(runner, "mle", mode) == {1: ["a caption"] * 5}
    assert seen == expected
