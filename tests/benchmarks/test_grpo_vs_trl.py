"""``benchmarks/grpo_vs_trl.py --quick`` (issue 65): finecap's GRPO steps and TRL's ``GRPOTrainer`` on the same tiny
VLM, reward and images, both timed and compared, so that the comparison cannot rot."""

from __future__ import annotations

import math

import pytest

from helpers.scripts import benchmark


def test_quick_comparison_times_both_sides(monkeypatch, tmp_path):
    pytest.importorskip("trl")
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    module = benchmark("grpo_vs_trl")
    out = module.main(["--quick", "--threads", "1", "--json", str(tmp_path / "out.json")])
    assert (out["images"], out["group"], out["tokens"], out["steps"]) == (2, 2, 4, 2)
    for side in ("finecap", "trl"):
        assert len(out[side]["steps"]) == 1 and out[side]["seconds_per_step"] > 0
        assert out[side]["captions_per_second"] == pytest.approx(4 / out[side]["seconds_per_step"])
    assert math.isclose(out["ratio"], out["finecap"]["captions_per_second"] / out["trl"]["captions_per_second"])
    assert (tmp_path / "out.json").exists()
