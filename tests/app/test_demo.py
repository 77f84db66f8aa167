"""`finecap demo --quick` end to end: every stage runs, writes its outputs, and a re-run skips finished work."""

import json

import pytest

from finecap.app.cli import main
from finecap.data.bags_file import read_bags
from finecap.data.formats import read_dataset
from finecap.data.results import read_results
from finecap.metrics.suite import evaluate
from finecap.report.table import QUICK_TITLE
from helpers.quick_demo import own_copy

pytestmark = pytest.mark.slow


@pytest.fixture
def own_demo(quick_demo_run, tmp_path, monkeypatch):
    """A copy of the session's quick demo (tests/conftest.py) for a test that runs more stages into it."""
    return own_copy(quick_demo_run, tmp_path, monkeypatch)


def test_quick_demo_writes_table_captions_and_checkpoints(quick_demo_run):
    run_dir = quick_demo_run.run_dir
    results = json.loads((run_dir / "results.json").read_text())
    expected = {"human", "mle", "smile", "scst", "sle", "discritune", "sr_bagcurri", "grpo_sr_cider", "blip_mle",
                "blip_smile", "vlm_mle", "vlm_smile"}  # fmt: skip
    assert expected <= set(results)
    for stage, row in results.items():
        for key in ("Length", "faith/precision", "faith/recall", "RD19/R@1", "bag3/R@1", "CIDEr-D"):
            assert key in row, (stage, key)
        assert 0.0 <= row["RD19/R@1"] <= 1.0 and 0.0 <= row["faith/precision"] <= 1.0
    assert results["human"]["faith/precision"] == 1.0  # reference captions state only true facts
    for stage in ("mle", "smile", "scst", "blip_smile"):
        assert (run_dir / stage / "checkpoints" / "best" / "model").is_dir()
        captions = json.loads((run_dir / "captions" / f"{stage}.json").read_text())
        assert len(captions) == 100 and all(c["caption"] for c in captions)
    assert "sample/Div-2" in results["scst"] and "beam/mBLEU-4" in results["mle"]
    for key in ("RD19/R@5", "CLIPScore", "listener/RD19/R@1", "listener/RD19/exploit", "listener/bag3/R@1"):
        assert key in results["mle"], key
    # every row on the scene-family test world (10 families of 10): family R@1, the hard RD, its bags
    for stage, row in results.items():
        assert row["family/n"] == 100 and row["hardRD19/n"] == 100 and row["family/size"] == 10, stage
        for key in ("family/R@1", "hardRD19/R@1", "hardRD19/R@5", "bag3/R@1", "bag7/R@1"):
            assert 0.0 <= row[key] <= 1.0, (stage, key)
        assert row["hardRD19/R@1"] <= row["hardRD19/R@5"]
    for s in (3, 5, 7):  # every curated bag kept (bags.keep_hardest 1): the kept bags are the curated ones
        human = results["human"]
        assert human[f"bag{s}/bags"] == human[f"bag{s}/curated"] > 0
        assert human[f"bag{s}/alpha"] == pytest.approx(human[f"bag{s}/alpha_curated"])
        assert human[f"bag{s}/n"] == s * human[f"bag{s}/bags"]  # every family image is captioned
    assert (run_dir / "mle" / "captions_families10_test.json").exists()  # made by the stage, beside its test captions
    # Reference captions state only true facts, so no distractor has strictly more support than the target: every
    # caption whose target is not tied for first is placed first (expected R@1 >= 1 - tie rate).
    human = results["human"]
    assert human["listener/RD19/R@1_expected"] >= 1.0 - human["listener/RD19/tie_rate"] - 1e-12
    table = (run_dir / "results.md").read_text()
    assert table.startswith(QUICK_TITLE + "\n\n| stage |") and "| smile |" in table  # quick is labelled quick
    assert "hardRD19/R@1" in table.splitlines()[2] and "bags of 3 (of" in table  # the headline column, the bags
    assert (run_dir / "report.html").stat().st_size > 0  # the HTML report (tests/report/test_browser.py opens it)


def test_report_bag_gallery_shows_the_bags_the_table_scores(quick_demo_run):
    """The bag columns score the scene-family world's bags, so the report's bag gallery shows those: the first bags
    of each size of ``families10/bags_test.json``, read with each stage's captions of the family world (the human
    row: each family image's first reference)."""
    run_dir = quick_demo_run.run_dir
    saved = json.loads((run_dir / "bag_outcomes.json").read_text())
    family_bags = run_dir / "families10" / "bags_test.json"
    assert saved["bags"] == str(family_bags.resolve())
    bags = read_bags(family_bags)
    shown = {key: next(iter(rows.values())) for key, rows in saved["outcomes"].items()}
    assert shown and all([o["image"] for o in outcomes] == bags[int(key.split("/")[0])][int(key.split("/")[1])]
                         for key, outcomes in shown.items())  # fmt: skip
    family = {i: c[0] for i, c in read_results(run_dir / "mle" / "captions_families10_test.json").items()}
    assert all(o["caption"] == family[o["image"]] for rows in saved["outcomes"].values() for o in rows["mle"])


def test_rerun_skips_finished_stages(own_demo, capsys):
    run_dir, argv = own_demo.run_dir, own_demo.argv
    before = (run_dir / "mle" / "checkpoints" / "best" / "trainer_state.json").stat().st_mtime_ns
    assert main([*argv, "--stages", "world,mle"]) == 0
    assert "mle: already trained" in capsys.readouterr().err  # a status line: the `finecap` logger, to stderr
    assert (run_dir / "mle" / "checkpoints" / "best" / "trainer_state.json").stat().st_mtime_ns == before


def test_vcb_group_after_the_quick_demo(own_demo):
    """The optional Visual Caption Boosting group (finecap.app.demo_vcb) on the quick demo's world and checkpoints."""
    run_dir, argv = own_demo.run_dir, own_demo.argv
    assert main([*argv, "--stages", "vcb"]) == 0
    out = json.loads((run_dir / "vcb_results.json").read_text())
    assert set(out["captions"]) == {"human (1st caption)", "BlendCap", "VisualCap", "HolisticCap"}
    assert set(out["models"]) == {"mle", "mle_blend", "mle_holistic", "sr_l", "sr_l_blend", "sr_l_holistic",
                                  "discritune", "discritune_blend", "discritune_holistic"}  # fmt: skip
    fields = out["captions"]
    # Exact by construction: BlendCap states only human facts (all true) and at least as many as one caption;
    # HolisticCap keeps all of BlendCap's and drops every VisualCap fact contradicting a human one.
    assert fields["BlendCap"]["faith/precision"] == 1.0
    assert fields["BlendCap"]["true facts"] >= fields["human (1st caption)"]["true facts"]
    assert fields["HolisticCap"]["true facts"] >= fields["BlendCap"]["true facts"]
    assert fields["HolisticCap"]["false facts"] <= fields["VisualCap"]["false facts"]
    for row in (*fields.values(), *out["models"].values()):  # the fact-based listener beside the CLIP retriever
        assert 0.0 <= row["listener/RD19/R@1"] <= 1.0 and 0.0 <= row["listener/bag3/R@1"] <= 1.0
    for row in (*fields.values(), *out["models"].values()):  # NDLB's ClipSc; the human-caption bags beside
        # ClipSc = 100 * max(mean cos, 0) and CLIPScore = 2.5 * mean(max(cos, 0)), so 0 <= ClipSc <= 40 * CLIPScore
        # (the quick world encoder is barely trained: its mean cosine may be negative, making ClipSc 0)
        assert 0.0 <= row["ClipSc"] <= 40 * row["CLIPScore"] + 1e-9 and row["CLIPScore"] > 0.0
        assert 0.0 <= row["human bags/bag3/R@1"] <= 1.0
    # NDLB Table 3 scores a captioner against the references of the caption field it was trained on: recomputed
    # here from the boosted data set and the stage's captions; human captions 2-5 beside them, labelled.
    boosted = {r.image_id: r.boosted for r in read_dataset("world", run_dir / "world_holistic", check_images=False)}
    for stage, field in (("mle_holistic", "holistic"), ("sr_l_blend", "blend"), ("sr_l", "original")):
        captions = {i: c[0] for i, c in read_results(run_dir / stage / "captions_test.json").items()}
        row = out["models"][stage]
        for refs, prefix in (({i: boosted[i][field] for i in captions}, ""),
                             ({i: boosted[i]["original"][1:] for i in captions}, "human refs/")):  # fmt: skip
            assert evaluate(captions, refs, metrics=["cider"])["CIDEr-D"] == pytest.approx(row[prefix + "CIDEr-D"])
    # TrueMatch bags built from the HolisticCap captions (NDLB Sec. 3), the demo's own from the human captions
    assert json.loads((run_dir / "bags_test_holistic.json").read_text())["fingerprint"]["captions"] == "holistic"
    assert json.loads((run_dir / "bags_test.json").read_text())["fingerprint"]["captions"] == "original"
    # SR-L trained the LM through LoRA adapters (NDLB's setting), DiscriTune fully
    for stage in ("sr_l", "sr_l_blend", "sr_l_holistic"):
        adapter = json.loads((run_dir / stage / "checkpoints/best/model/lm_lora/adapter_config.json").read_text())
        assert (adapter["r"], adapter["lora_alpha"]) == (32, 16.0)
    assert not (run_dir / "discritune_holistic" / "checkpoints/best/model/lm_lora").exists()
    assert set(out["timings"]) >= {"visual_expert", "boost_holistic", "captions_holistic", "mle_holistic",
                                   "sr_l_holistic"}  # fmt: skip
    boosted = json.loads((run_dir / "world_holistic" / "boost.json").read_text())
    assert boosted["status"] == "ok" and boosted["failed"] == 0 and boosted["boosted"] == boosted["images"] == 440
    assert (run_dir / "vcb_results.md").read_text().startswith(QUICK_TITLE + "\n\nCaption fields")  # quick: labelled


def test_transfer_stage_scores_every_trained_stage_on_the_shifted_domain(own_demo):
    run_dir, argv = own_demo.run_dir, own_demo.argv
    assert main([*argv, "--stages", "transfer"]) == 0
    results = json.loads((run_dir / "transfer" / "results.json").read_text())
    assert (run_dir / "transfer" / "results.md").read_text().startswith(QUICK_TITLE + "\n\n| stage |")
    assert {"human", "mle", "smile", "discritune"} <= set(results)
    for row in results.values():
        for key in ("BLEU-4", "CIDEr-D", "faith/precision", "RD19/R@1", "listener/RD19/R@1", "bag3/R@1"):
            assert key in row
    assert results["human"]["faith/precision"] == 1.0  # the shifted annotators state only true facts too
    captions = json.loads((run_dir / "mle" / "captions_shifted_test.json").read_text())
    assert len(captions) == 100
