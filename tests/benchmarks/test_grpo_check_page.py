"""The GRPO check page of issue 50 (benchmarks/paper_tables/grpo.py, docs/reproductions/grpo.md): its runs are what
its text says (SCST's reward, batch, samples, steps and learning rate; GRPO's group advantages and clipped surrogate;
the KL only where named), its declared signs and primary cell, and the header of a page without a paper's text. That
the committed page regenerates from the committed data is tests/benchmarks/test_paper_tables.py's parametrized test
over every page; its committed result files are checked in tests/benchmarks/test_committed_results.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # as `python benchmarks/paper_tables.py` has it
import paper_tables as pt  # noqa: E402  (the package benchmarks/paper_tables/)
from paper_tables.grpo import GRPO_COLUMNS  # noqa: E402


def run_config(key: str):
    """The configuration of grid run ``key`` as the runner makes it: its demo recipe under the demo's settings, then
    its overrides."""
    from finecap.config import load
    from finecap.recipes.settings import DEMO_BASE

    run = pt.RUNS[key]
    return load(f"demo/{run.recipe}", list(run.overrides), base=DEMO_BASE)


def test_grpo_runs_match_scst_where_the_page_says_and_differ_where_grpo_does():
    scst, grpo, grpo_kl = (run_config(k) for k in ("scst", "grpo", "grpo_kl"))
    for cfg in (grpo, grpo_kl):  # the same reward, batch, sampled captions, steps and optimizer as SCST
        for section, name in (("train", "batch_size"), ("train", "max_steps"), ("train", "lr"),
                              ("train", "schedule"), ("train", "weight_decay"), ("train", "grad_clip"),
                              ("rl", "samples"), ("rl", "rewards"), ("rl", "temperature"),
                              ("rl", "strategy"), ("decode", "strategy"), ("decode", "beam_size")):  # fmt: skip
            assert getattr(getattr(cfg, section), name) == getattr(getattr(scst, section), name), (section, name)
        assert (cfg.grpo.advantage, cfg.grpo.scale_rewards, cfg.grpo.policy_loss) == ("group", "group", "clipped")
        assert (cfg.grpo.iterations, cfg.grpo.loss_aggregation) == (1, "sequence")
    assert (scst.grpo.advantage, scst.rl.baseline, scst.grpo.policy_loss, scst.grpo.kl_coef) == (
        "baseline", "greedy", "reinforce", 0.0
    )  # fmt: skip
    assert (scst.train.batch_size, scst.rl.samples, scst.rl.rewards) == (64, 5, {"cider": 1.0})
    # the KL only in GRPO + KL, with demo/grpo_sr_cider's beta; every run from the seed's MLE start
    from finecap.config import load

    assert grpo.grpo.kl_coef == 0.0 and grpo_kl.grpo.kl_coef == load("demo/grpo_sr_cider").grpo.kl_coef == 0.04
    assert {pt.RUNS[k].init for k in ("scst", "grpo", "grpo_kl")} == {"mle"}
    assert pt.RUNS["grpo"].recipe == pt.RUNS["grpo_kl"].recipe == "grpo_cider"


def test_the_checks_signs_and_primary_cell_are_the_declared_ones():
    """↑ where Liang (2025) claims an effect, = elsewhere; the primary cell GRPO against SCST on CIDEr-D."""
    tables = {t.id: t for t in pt.GRPO.tables}
    assert set(tables) == {"check_grpo", "check_kl"}
    assert all(t.heading.startswith("finecap check: ") for t in tables.values())
    labels = [c.label for c in GRPO_COLUMNS]
    assert labels == ["CIDEr-D", "Div-2 (sampled)", "Length", "fact precision", "fact recall"]
    assert [c.key for c in GRPO_COLUMNS] == ["CIDEr-D", "sample/Div-2", "Length", "faith/precision", "faith/recall"]
    rows = {r.id: r for r in tables["check_grpo"].rows}
    assert rows["grpo"].vs == rows["grpo_kl"].vs == ("scst",) and not rows["scst"].vs and not rows["mle"].vs
    assert rows["grpo"].expect == rows["grpo_kl"].expect == (+1, +1, 0, 0, 0)
    (kl,) = [r for r in tables["check_kl"].rows if r.vs]
    assert (kl.run, kl.vs, kl.expect) == ("grpo_kl", ("grpo",), (0, +1, 0, 0, 0))
    assert tables["check_grpo"].primary == (pt.Primary("grpo", "scst", "CIDEr-D"),) and not tables["check_kl"].primary
    assert pt.primary_runs(pt.GRPO.tables) == ["grpo", "scst"]  # what --run-seeds would repeat
    assert pt.runs_of(pt.GRPO, pt.GRPO.tables) == ["mle", "scst", "grpo", "grpo_kl"]
    assert {"cider", "length", "faithfulness"} <= set(pt.GRPO.metrics) and pt.GRPO.diversity  # sampled Div-2


@pytest.mark.parametrize("paper", ["grpo", "sle"])
def test_a_page_without_a_papers_text_says_so_in_its_header(paper):
    page = pt.render_page(pt.PAPERS[paper], {}, {})
    title, generated = page.splitlines()[0], page.splitlines()[2]
    if paper == "grpo":
        assert title == "# GRPO against SCST on the world: a finecap check (issue 50)"
        assert "shared/papers" not in page and "Not a paper's page" in page
    else:
        assert title.endswith(": the paper's tables on the world")
        assert generated.endswith("The paper's text: `shared/papers/003_c4a4bb2d7c995365.txt`.")
