"""Demo stages at unit level (no training): a finished stage is reused only on the inputs it recorded, the VCB
and transfer tables of a quick demo are titled as quick, and the VCB tables measure what NDLB's Tables 2-3 do
(ClipSc, references of the trained caption field, HolisticCap bags, SR-L with LoRA)."""

import json
import logging
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest

from finecap.app import demo as demo_mod
from finecap.app import demo_transfer, demo_vcb
from finecap.app.demo import demo_runner, load_demo_config
from finecap.config import ClipCapBackboneConfig, WorldConfig
from finecap.report.table import QUICK_TITLE
from finecap.runs import FINGERPRINTS_FILE
from finecap.stages import StageRunner
from finecap.stages.pool import worker_setup
from finecap.train.fingerprint import FingerprintMismatch, data_fingerprint, write_fingerprints
from finecap.world.make import make_world
from helpers.waiting import until

SIZES = {"n_train": 4, "n_val": 2, "n_test": 3, "image_size": 32}


def _world(folder: Path, seed: int) -> list[str]:
    make_world(WorldConfig(**SIZES, seed=seed), folder, progress=False)
    return [f"world.out={folder}", f"world.seed={seed}", *(f"world.{k}={v}" for k, v in SIZES.items())]


def _demo(tmp_path: Path, items: list[str], quick: bool = True, train=None) -> StageRunner:
    """The demo's stage runner on ``items``; ``train`` stands in for the training recipe (none: the real one)."""
    items = [*items, f"run.cache_dir={tmp_path / 'cache'}"]
    demo = demo_runner(load_demo_config(None, items, quick), items, quick, tmp_path / "run")
    if train is not None:
        demo.train = train
    return demo


# --------------------------------------------------------------------------------------------------------------------
# A finished stage is reused only when its run recorded the same inputs
# --------------------------------------------------------------------------------------------------------------------


def test_a_finished_stage_on_other_inputs_is_refused_not_reused(tmp_path, caplog):
    trained: list[tuple[str, bool]] = []

    def fake_train(cfg, *, resume, overwrite):
        trained.append((cfg.run.dir, overwrite))

    first = _demo(tmp_path, _world(tmp_path / "world_a", seed=0), train=fake_train)
    out = first.stage_dir("mle")
    out.mkdir(parents=True)
    write_fingerprints(out, first.stage_config("mle"))  # what training records
    (out / "DONE").write_text("ok\n")
    recorded = json.loads((out / FINGERPRINTS_FILE).read_text())["data"]

    caplog.set_level(logging.INFO, logger="finecap")
    assert first.train_stage("mle") is False  # the same inputs: reused
    assert trained == [] and f"mle: already trained ({out}); skipping" in caplog.messages

    # The demo re-run on another world (world.seed changed): the stage's run is not silently reused.
    other = _demo(tmp_path, _world(tmp_path / "world_b", seed=1), train=fake_train)
    now = data_fingerprint(other.stage_config("mle"))
    assert now["id"] != recorded["id"]
    with pytest.raises(FingerprintMismatch) as e:
        other.train_stage("mle")
    message = str(e.value)
    assert message.startswith("demo stage 'mle' was trained on other inputs than its configuration names now")
    assert f"data fingerprint {recorded['id']} at {recorded['path']} (recorded) differs from {now['id']}" in message
    assert f"world_key: '{recorded['world_key']}' -> '{now['world_key']}'" in message and "--force" in message
    assert "--data" not in message and "a stage reads the data its configuration names" in message
    assert trained == []
    # nor is it reported: the report scored its captions against the other world's references and images
    from finecap.app.demo import stage_report

    with pytest.raises(FingerprintMismatch, match="demo stage 'mle' was trained on other inputs"):
        stage_report(other)
    # --force (demo.force): the stage trains again, over its old run.
    forced = _demo(tmp_path, [*other.items, "demo.force=true"], train=fake_train)
    assert forced.train_stage("mle") is True
    assert trained == [(str(out), True)]


def test_an_unfinished_run_on_other_inputs_is_refused_naming_the_demos_ways_out(tmp_path):
    """A stage folder holding a run that never finished (a killed stage, or `finecap train demo/mle` wrote it) on
    other inputs: training's own refusal, with the demo's ways out (--force, --out) beside it."""
    from finecap.train.fingerprint import check_run

    def resuming_train(cfg, *, resume, overwrite):  # what training checks first when it resumes
        assert resume
        check_run(cfg.run.dir, cfg)

    first = _demo(tmp_path, _world(tmp_path / "world_a", seed=0))
    out = first.stage_dir("mle")
    out.mkdir(parents=True)
    write_fingerprints(out, first.stage_config("mle"))
    (out / "checkpoints" / "last" / "state").mkdir(parents=True)  # a checkpoint, no DONE: an unfinished run
    (out / "checkpoints" / "last" / "trainer_state.json").write_text('{"step": 1}')
    other = _demo(tmp_path, _world(tmp_path / "world_b", seed=1), train=resuming_train)
    other.check_inputs = lambda stage: None  # the world and retriever stages it needs: not run in this test
    with pytest.raises(FingerprintMismatch) as e:
        other.train_stage("mle")
    message = str(e.value)
    assert message.startswith(f"demo stage 'mle': the unfinished run in {out} was trained on other inputs")
    assert "data fingerprint" in message and "--force" in message and "--out" in message
    assert "--data" not in message  # training's hint: finecap demo has no --data
    assert not (out / "DONE").exists()


# --------------------------------------------------------------------------------------------------------------------
# Quick runs are labelled quick in the VCB and transfer tables
# --------------------------------------------------------------------------------------------------------------------

ROW = {"Length": 3.0, "CIDEr-D": 0.5}
FIELDS = {"original": ["h1", "h2", "h3"], "blend": ["blend"], "visual": ["visual"], "holistic": ["holistic"]}
HOLISTIC_BAGS = {3: [[1, 2, 3]]}
HUMAN_BAGS = {3: [[1, 3, 2]]}


def _fake_context() -> demo_vcb.Context:
    """Two test images whose every caption field names the field and the image (``blend 2``)."""
    records = [SimpleNamespace(image_id=i, captions=[f"h{k} {i}" for k in (1, 2, 3)]) for i in (1, 2)]
    fields = {i: {f: [f"{c} {i}" for c in caps] for f, caps in FIELDS.items()} for i in (1, 2)}
    return demo_vcb.Context(records, {1: None, 2: None}, "retriever", HOLISTIC_BAGS, HUMAN_BAGS, fields)


def _fake_demo(tmp_path: Path, quick: bool) -> SimpleNamespace:
    run_dir = tmp_path / ("quick" if quick else "full")
    return SimpleNamespace(cfg=load_demo_config(None, [], quick), quick=quick, run_dir=run_dir,
                           stage_dir=lambda stage: run_dir / stage)  # fmt: skip


@pytest.mark.parametrize("quick", [True, False])
def test_vcb_results_md_is_titled_quick_for_a_quick_demo(tmp_path, monkeypatch, quick, capsys):
    demo = _fake_demo(tmp_path, quick)
    monkeypatch.setattr(demo_vcb, "_context", lambda demo: _fake_context())
    monkeypatch.setattr(demo_vcb, "evaluate", lambda *a, **k: dict(ROW))
    monkeypatch.setattr(demo_vcb, "faithfulness", lambda caption, scene: SimpleNamespace(n_correct=1, n_stated=1))
    (demo.run_dir / "mle").mkdir(parents=True)
    (demo.run_dir / "mle" / "captions_test.json").write_text(json.dumps([{"image_id": 1, "caption": "a b"}]))
    rows = demo_vcb.stage_report(demo)
    assert set(rows) == {"mle"}
    table = (demo.run_dir / "vcb_results.md").read_text()
    assert table.startswith(QUICK_TITLE + "\n\nCaption fields of the test split") == quick
    assert (QUICK_TITLE in table) == quick and (QUICK_TITLE in capsys.readouterr().out) == quick


@pytest.mark.parametrize("quick", [True, False])
def test_transfer_results_md_is_titled_quick_for_a_quick_demo(tmp_path, quick, capsys):
    demo = _demo(tmp_path, [], quick=quick)
    table = demo_transfer.write_tables(demo, {"human": dict(ROW)}, "Shifted domain:")
    assert (demo.run_dir / "transfer" / "results.md").read_text() == table + "\n"
    assert table.startswith(QUICK_TITLE + "\n\n| stage | Length | CIDEr-D |") == quick
    assert table.startswith("| stage | Length | CIDEr-D |") != quick
    assert json.loads((demo.run_dir / "transfer" / "results.json").read_text()) == {"human": ROW}
    assert (QUICK_TITLE in capsys.readouterr().out) == quick


# --------------------------------------------------------------------------------------------------------------------
# The VCB tables measure what NDLB's Tables 2-3 do
# --------------------------------------------------------------------------------------------------------------------


class Recorder:
    """Stands in for ``evaluate``: records each call and returns one value per metric key the tables read."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, predictions, references, *, metrics, bags=None, **kwargs) -> dict[str, float]:
        self.calls.append({"references": references, "metrics": list(metrics), "bags": bags, **kwargs})
        n = len(self.calls)
        return {"CIDEr-D": float(n), "BLEU-4": n / 10, "ClipSc": 30.0 + n, "bag3/R@1": n / 100,
                "listener/bag3/R@1": n / 1000, "listener/RD19/R@1": 0.5}  # fmt: skip


@pytest.mark.parametrize(
    "stage, field",
    [("mle", "original"), ("sr_l", "original"), ("discritune", "original"), ("mle_blend", "blend"),
     ("sr_l_blend", "blend"), ("mle_holistic", "holistic"), ("sr_l_holistic", "holistic"),
     ("discritune_holistic", "holistic")],
)  # fmt: skip
def test_captioners_are_scored_against_their_own_caption_field_and_the_human_captions(monkeypatch, stage, field):
    """NDLB Table 3: n-gram metrics against the references of the caption field the captioner was trained on (all
    human captions for the human-caption stages), ClipSc, bags built from HolisticCap; beside them, labelled, BLEU-4 /
    CIDEr-D against human captions 2-5 and bag R@1 on the human-caption bags."""
    ctx = _fake_context()
    record = Recorder()
    monkeypatch.setattr(demo_vcb, "evaluate", record)
    row = demo_vcb.score_stage(ctx, None, stage, {1: "a caption", 2: "another"})
    main, human_bags, human_refs = record.calls
    expected = {i: [f"{c} {i}" for c in FIELDS[field]] for i in (1, 2)}
    assert main["references"] == expected and main["bags"] is HOLISTIC_BAGS
    assert {"clipscore", "bags", "bleu", "cider", "retrieval", "listener"} <= set(main["metrics"])
    assert human_bags["bags"] is HUMAN_BAGS and human_bags["references"] is None
    assert human_refs["references"] == {i: [f"h{k} {i}" for k in (2, 3)] for i in (1, 2)}  # captions 2-5
    assert (row["CIDEr-D"], row["BLEU-4"], row["ClipSc"], row["bag3/R@1"]) == (1.0, 0.1, 31.0, 0.01)
    assert row["human bags/bag3/R@1"] == 0.02 and row["human bags/listener/bag3/R@1"] == 0.002
    assert "human bags/listener/RD19/R@1" not in row  # only the bag columns of the second set of bags
    assert (row["human refs/CIDEr-D"], row["human refs/BLEU-4"]) == (3.0, 0.3)


def test_vcb_tables_show_clipsc_both_references_and_both_bags(tmp_path, monkeypatch):
    demo = _fake_demo(tmp_path, quick=False)
    monkeypatch.setattr(demo_vcb, "_context", lambda demo: _fake_context())
    monkeypatch.setattr(demo_vcb, "evaluate", Recorder())
    monkeypatch.setattr(demo_vcb, "faithfulness", lambda caption, scene: SimpleNamespace(n_correct=2, n_stated=3))
    for stage in ("mle", "sr_l_holistic"):
        (demo.run_dir / stage).mkdir(parents=True)
        (demo.run_dir / stage / "captions_test.json").write_text(json.dumps([{"image_id": 1, "caption": "a b"}]))
    demo_vcb.stage_report(demo)
    out = json.loads((demo.run_dir / "vcb_results.json").read_text())
    assert set(out["models"]) == {"mle", "sr_l_holistic"}
    assert set(out["captions"]) == set(demo_vcb.FIELD_ROWS)
    assert out["captions"]["HolisticCap"]["false facts"] == 1.0  # 3 stated, 2 true
    table = (demo.run_dir / "vcb_results.md").read_text()
    lines = table.splitlines()
    fields_header, models_header, human_bags_header = (a for a, b in pairwise(lines) if b.startswith("| --- "))
    assert fields_header.startswith("| caption |") and "| ClipSc |" in fields_header
    assert "| BLEU-4 | CIDEr-D | human refs/BLEU-4 | human refs/CIDEr-D |" in models_header
    assert "| ClipSc | bag3/R@1 |" in models_header
    assert human_bags_header.startswith("| row | human bags/bag3/R@1 |")
    assert "| sr_l_holistic | SR-L (NDLB, LoRA) from mle_holistic |" in table
    assert "bags built from the HolisticCap captions" in table


def test_holistic_bags_are_built_from_the_holisticcap_captions_of_the_boosted_data(tmp_path, monkeypatch):
    demo = _fake_demo(tmp_path, quick=True)
    built = []
    monkeypatch.setattr(demo_vcb, "reuse_bags", lambda cfg, **kw: built.append((cfg.bags.text_from, kw)) or kw["out"])
    path = demo_vcb.holistic_bags(demo)
    assert path == demo.run_dir / "bags_test_holistic.json"
    ((text_from, kw),) = built
    assert text_from == "holistic" and kw["data"] == demo.run_dir / "world_holistic" / "dataset.json"
    assert kw["split"] == "test" and kw["out"] == path
    assert demo.cfg.bags.text_from == "original"  # the demo's own (human-caption) bags are left alone


def test_the_boosted_data_is_made_again_when_the_boost_settings_change(tmp_path, monkeypatch, caplog):
    """boost_holistic reads its data set back only when made since the visual expert trained with the boost.* settings
    of now (its boost.json); the fake boost records them as `finecap boost` does (tests/boost/test_boost_command.py
    checks that record against the real command)."""
    from finecap.app import boost as app_boost
    from helpers.fake_boost import recording_boost

    boosted: list = []
    monkeypatch.setattr(app_boost, "main", recording_boost(boosted))
    demo = _demo(tmp_path, [])
    (demo.stage_dir("visual_expert")).mkdir(parents=True)
    (demo.stage_dir("visual_expert") / "DONE").write_text("ok\n")
    demo_vcb.stage_boost(demo)
    assert len(boosted) == 1 and boosted[0].vlm_model == str(demo.best_checkpoint("visual_expert"))
    demo_vcb.stage_boost(_demo(tmp_path, []))  # the same settings: read back
    assert len(boosted) == 1

    caplog.set_level(logging.INFO, logger="finecap")
    demo_vcb.stage_boost(_demo(tmp_path, ["boost.few_shot=false"]))  # another prompt: other captions
    assert len(boosted) == 2 and boosted[1].few_shot is False
    assert any("was boosted otherwise (boost.few_shot: True -> False)" in m for m in caplog.messages)
    demo_vcb.stage_boost(_demo(tmp_path, ["boost.few_shot=false"]))
    assert len(boosted) == 2

    out = demo_vcb.boosted_dir(demo)
    record = json.loads((out / "boost.json").read_text())
    (out / "boost.json").write_text(json.dumps({**record, "status": "failed"}))  # a later run that stopped
    demo_vcb.stage_boost(_demo(tmp_path, ["boost.few_shot=false"]))
    assert len(boosted) == 3


def test_sr_l_stages_are_ndlb_sr_l_and_differ_from_discritune_only_where_ndlb_does(tmp_path):
    """NDLB Table 3 rows 4-6: LoRA of rank 32 on GPT-2's attention (alpha 16, the released code's), sampling at
    T = 0.3; everything else as the demo's DiscriTune rows (same start, lr, steps, reward)."""
    demo = _demo(tmp_path, [], quick=False)
    for stage, start, field in (("sr_l", "mle", "original"), ("sr_l_blend", "mle_blend", "blend"),
                                ("sr_l_holistic", "mle_holistic", "holistic")):  # fmt: skip
        cfg = demo.stage_config(stage)
        assert cfg.train.init_from == str(demo.stage_dir(start) / "checkpoints" / "best")
        assert cfg.data.captions == field
        assert (cfg.lora.lm, cfg.lora.encoder, cfg.lora.rank, cfg.lora.alpha) == (True, False, 32, 16.0)
        assert (cfg.model.train_lm, cfg.model.train_encoder) == (True, False)
        ours = cfg.to_dict()
        theirs = demo.stage_config(stage.replace("sr_l", "discritune") if stage != "sr_l" else "discritune").to_dict()
        differ = {f"{s}.{k}" for s in ours for k in ours[s] if ours[s][k] != theirs[s].get(k)}
        assert differ == {"run.name", "run.dir", "train.weight_decay", "rl.strategy", "rl.temperature",
                          "rl.scaled_logprob", "lora.lm", "lora.alpha", "lora.lm_targets"}, stage  # fmt: skip


def test_sr_l_recipe_adapts_only_the_attention_of_the_world_lm(tmp_path):
    """What demo/sr_l trains on the world's GPT-2: the mapper fully, LoRA on attn.c_attn and attn.c_proj of every
    block (not the MLP, whose projection is also named c_proj), nothing of the base LM (embeddings included)."""
    import torch

    from finecap.config import load
    from finecap.models import lora
    from finecap.models.clipcap import ClipCap
    from finecap.models.presets import build_world_lm
    from finecap.recipes import resolve_recipe

    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=2, hidden=32, heads=2)
    model = lora.configure_training(
        ClipCap(lm, tok, 16, ClipCapBackboneConfig(prefix_length=2)), load(resolve_recipe("demo/sr_l"))
    )
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    adapted = {n.split(".lora_")[0].removeprefix("lm.base_model.model.").removesuffix(".base_layer")
               for n in names if "lora_" in n}  # fmt: skip
    assert adapted == {f"transformer.h.{i}.attn.{m}" for i in (0, 1) for m in ("c_attn", "c_proj")}
    assert all(n.startswith("mapper.") or "lora_" in n for n in names) and any(n.startswith("mapper.") for n in names)
    lora_a = next(m for n, m in model.named_modules() if n.endswith("h.0.attn.c_attn"))
    assert lora_a.r["default"] == 32 and lora_a.scaling["default"] == 0.5  # alpha / rank = 16 / 32


@pytest.mark.slow
def test_side_stages_give_the_same_results_whatever_the_job_count(tmp_path, capsys, monkeypatch):
    """Stages that start from MLE run side by side (demo.jobs) with demo.stage_threads threads each; the captions and
    the results table do not depend on how many run at once.

    The report stage runs in full up to ``results.json`` (its numbers are what is compared); the HTML page it then
    draws from them (:func:`finecap.app.demo.write_demo_report`: plots, galleries, about a sixth of this test's CPU)
    is not compared here and is stood in for by a recorder of its calls (the page a demo writes:
    tests/app/test_demo.py and tests/report/test_report_outputs.py)."""
    from finecap.app.cli import main

    pages: list[Path] = []
    monkeypatch.setattr(demo_mod, "write_demo_report", pages.append)
    stages = "world,retriever,mle,smile,mle_continued,report"  # report: sampled diversity of mle, mle_continued
    results = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        assert main(["demo", "--quick", "--out", str(out), "--stages", stages, f"demo.jobs={jobs}"]) == 0
        assert pages[-1] == out  # the report stage reached its page, after results.json
        results[jobs] = out
        err = capsys.readouterr().err  # the side stages' own lines, from worker processes with demo.jobs=2
        assert err.count("train: 12 steps") == 3 and "beside 1 others" in err or jobs == 1
    for stage in ("mle", "smile", "mle_continued"):
        a, b = (json.loads((results[j] / stage / "captions_test.json").read_text()) for j in (1, 2))
        assert a == b, stage
    a, b = (json.loads((results[j] / "results.json").read_text()) for j in (1, 2))
    assert a == b
    timings = json.loads((results[2] / "timings.json").read_text())
    assert set(timings) == set(stages.split(","))


def test_side_stages_are_those_nothing_starts_from(tmp_path):
    side_stages = _demo(tmp_path, []).side_stages
    assert side_stages(["world", "retriever", "mle", "smile", "scst", "blip_mle", "blip_smile", "report"]) == {
        "smile", "scst", "blip_smile"}  # fmt: skip
    assert side_stages(["mle", "report"]) == {"mle"}  # nothing starts from it: it may run beside others


# --------------------------------------------------------------------------------------------------------------------
# Faults: a stage killed before its first checkpoint, a killed demo's workers, two demos on one run directory
# --------------------------------------------------------------------------------------------------------------------

EVENT = json.dumps({"step": 10, "epoch": 0.1, "split": "train", "values": {"loss": 1.0}}) + "\n"


def _killed_stage(tmp_path: Path, checkpoints: list[str]) -> tuple[StageRunner, Path, list[tuple[bool, bool]]]:
    """The ``mle`` stage's folder as a kill left it: a partial event log and the given checkpoint folders; the
    engine's ``train`` replaced by its run-directory check (``prepare_run_dir``), which is what decides here."""
    from finecap.runs import MODEL_SUBDIR
    from finecap.train.state import prepare_run_dir

    calls: list[tuple[bool, bool]] = []

    def fake_train(cfg, *, resume, overwrite):
        calls.append((resume, overwrite))
        prepare_run_dir(Path(cfg.run.dir), resume=resume, overwrite=overwrite)

    demo = _demo(tmp_path, _world(tmp_path / "world", seed=0), train=fake_train)
    out = demo.stage_dir("mle")
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text(EVENT)
    for name in checkpoints:  # a checkpoint's model folder (weights not needed: nothing loads them here)
        (out / "checkpoints" / name / MODEL_SUBDIR).mkdir(parents=True)
        (out / "checkpoints" / name / MODEL_SUBDIR / "config.json").write_text("{}")
    return demo, out, calls


@pytest.mark.parametrize("left", [[], [".last.tmp"]])  # killed in its first steps, or saving its first checkpoint
def test_a_stage_killed_before_its_first_checkpoint_trains_again_from_the_start(tmp_path, caplog, left):
    demo, out, calls = _killed_stage(tmp_path, left)
    (out / "notes.txt").write_text("mine")  # a user's file beside the run files: kept
    caplog.set_level(logging.WARNING, logger="finecap")
    assert demo.train_stage("mle") is True
    assert calls == [(False, True)]
    assert (
        "demo stage 'mle': its earlier run in" in caplog.text and "stopped before saving a checkpoint" in caplog.text
    )
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()  # the engine starts afresh
    assert (out / "notes.txt").read_text() == "mine" and (out / "DONE").exists()


def test_a_killed_stage_with_a_saved_but_not_resumable_checkpoint_is_refused_and_kept(tmp_path):
    from finecap.runs import MODEL_SUBDIR

    demo, out, calls = _killed_stage(tmp_path, ["best"])  # best saved, killed before last
    with pytest.raises(ValueError) as e:
        demo.train_stage("mle")
    message = str(e.value)
    assert message.startswith(f"demo stage 'mle': {out} holds an unfinished run with no checkpoint to resume from")
    assert "best (the best model, without optimizer state: not resumable)" in message
    assert message.endswith("re-run it alone with --stages mle --force (demo.force=true), or give the demo another "
                            "run directory (--out)")  # fmt: skip
    assert calls == [] and (out / "checkpoints" / "best" / MODEL_SUBDIR / "config.json").exists()
    assert not (out / "DONE").exists()


def test_a_stage_killed_before_its_first_checkpoint_keeps_a_foreign_file_where_run_files_go(tmp_path):
    demo, out, calls = _killed_stage(tmp_path, [])
    (out / "metrics.jsonl").write_text("a,b\n1,2\n")  # not finecap's event log: the overwrite refuses it
    with pytest.raises(ValueError, match="holds files finecap did not make"):
        demo.train_stage("mle")
    # refused by the runner before it changes anything of the stage (finecap.train.state.check_run_folder), so
    # before training is called
    assert (out / "metrics.jsonl").read_text() == "a,b\n1,2\n" and calls == []


def test_a_second_demo_on_the_same_run_directory_is_refused(tmp_path):
    from finecap.locks import OutputLocked, output_lock

    demo = _demo(tmp_path, [f"run.dir={tmp_path / 'run'}", "demo.stages=[world]"])
    demo.run_dir.mkdir()
    with output_lock(demo.run_dir, name=demo_mod.DEMO_LOCK, holder="finecap demo") as first:
        with pytest.raises(OutputLocked) as e:
            demo_mod.main(demo.cfg)
        assert f"another finecap demo is writing to this folder (pid {first['pid']}" in str(e.value)
        assert "--out" in str(e.value)
    assert sorted(p.name for p in demo.run_dir.iterdir()) == []  # the refused demo wrote nothing (no config.yaml)


WORKER_SCRIPT = """
import logging, multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from finecap.stages.pool import worker_setup
if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=context, initializer=worker_setup,
                               initargs=(context.Queue(), logging.INFO))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 600)  # a stage still training
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_demos_stage_workers_end_with_it(tmp_path):
    """A demo killed from outside (SIGKILL here: no cleanup runs) leaves no worker training on as an orphan."""
    import contextlib
    import signal
    import subprocess
    import sys

    import psutil  # a dependency of accelerate, so always installed with finecap

    script = tmp_path / "parent.py"
    script.write_text(WORKER_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = psutil.Process(int(parent.stdout.readline()))
        assert worker.ppid() == parent.pid and worker.is_running()
        parent.send_signal(signal.SIGKILL)
        parent.wait()

        def running() -> bool:  # a zombie (ended, not yet reaped by its new parent) counts as ended
            try:
                return worker.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        until(lambda: not running(), "the pool's worker outlived its killed parent", timeout=60, every=0.2)
    finally:
        parent.kill()
        if worker is not None and worker.is_running():  # the orphan this test looks for, when the check failed
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()


def test_the_users_recipe_fills_in_every_stage_beneath_its_own_recipe(tmp_path):
    """``finecap demo RECIPE``: the recipe's settings reach every training stage (not only the demo's own
    configuration) where the stage's recipe leaves them open; what a stage's recipe sets stays the stage's, and
    --quick and the key=value overrides apply above both."""
    from finecap.app.demo import read_recipe

    recipe = tmp_path / "mine.yaml"
    recipe.write_text("world:\n  seed: 7\n  n_train: 5000\neval:\n  n_distractors: 49\n"
                      "train:\n  objective: sle\n  max_steps: 999\n")  # fmt: skip
    items = ["train.lr=0.004"]
    for quick in (False, True):
        demo = demo_runner(load_demo_config(str(recipe), items, quick), items, quick, tmp_path / "run",
                           read_recipe(str(recipe)))  # fmt: skip
        assert demo.cfg.world.seed == 7 and demo.cfg.world.n_train == (300 if quick else 5000)
        for stage in ("mle", "scst", "smile_random", "blip_mle"):
            cfg = demo.stage_config(stage)
            assert cfg.world == demo.cfg.world, stage  # the demo's world, in every stage
            assert cfg.eval.n_distractors == (19 if quick else 49), stage  # open in the stage recipes; quick above
            assert cfg.train.lr == 0.004, stage  # the override, above every recipe
        objectives = {s: demo.stage_config(s).train.objective for s in ("mle", "scst", "sle", "smile_random")}
        assert objectives == {"mle": "mle", "scst": "reinforce", "sle": "sle", "smile_random": "smile"}
        assert demo.stage_config("smile_random").smile.subset == "random"  # the stage's variant still applies
        assert demo.stage_config("scst").train.max_steps == (12 if quick else 100)  # set by demo/scst itself
        assert demo.stage_config("mle").train.max_steps == (12 if quick else 999)  # demo/mle leaves it open


def test_another_worlds_test_split_is_read_from_that_world_whatever_data_set_the_stage_trained_on(tmp_path):
    """caption_world's configuration (stages.outputs.world_config): a stage trained on a corpus of its own
    (data.path, with data.images naming that corpus's image folder, as the paper tables' one-detail corpora) captions
    another world's test split from that world's own images; the corpus's image folder used to be kept, so every
    image of the other world was looked up there and none existed."""
    from finecap.data.datasets import load_records
    from finecap.stages.outputs import world_config

    _world(tmp_path / "other", seed=3)
    (tmp_path / "corpus-images").mkdir()
    corpus = [f"data.path={tmp_path / 'corpus.json'}", "data.format=karpathy",
              f"data.images={tmp_path / 'corpus-images'}", "data.captions=holistic"]  # fmt: skip
    cfg = load_demo_config(None, corpus, quick=True)
    other = WorldConfig(**SIZES, seed=3, out=str(tmp_path / "other"))
    records = load_records(world_config(cfg, other), "test")
    assert len(records) == SIZES["n_test"]
    assert all(r.path.is_file() and r.path.is_relative_to(tmp_path / "other") for r in records)
    assert world_config(cfg, other).data.captions == "original"


def test_the_quick_demo_keeps_out_of_the_folders_of_the_full_demo_and_the_demo_recipes(tmp_path, monkeypatch):
    from finecap.config import load
    from finecap.home import ENV

    monkeypatch.setenv(ENV, str(tmp_path / "home"))
    runs = tmp_path / "home" / "runs"
    assert demo_mod.demo_dir(load_demo_config(None, [], False), False) == runs / "demo"
    assert demo_mod.demo_dir(load_demo_config(None, [], True), True) == runs / "demo-quick"
    # the demo/* recipes chain through <runs>/demo (the full demo's folder, never the quick one's)
    assert load("demo/grpo_cider").train.init_from.startswith("demo/mle/")
    out = tmp_path / "mine"
    assert demo_mod.demo_dir(load_demo_config(None, [f"run.dir={out}"], True), True) == out  # --out wins


def test_a_stage_worker_leaves_out_the_library_warnings_the_command_leaves_out(monkeypatch):
    """The demo's stage workers are processes of their own: the CLI's filter of torchvision's and bitsandbytes'
    warnings (finecap.library_warnings) did not reach them, and the quick demo printed both."""
    import queue

    from finecap.library_warnings import SILENCED

    monkeypatch.setenv("TQDM_DISABLE", "1")
    finecap_logger = logging.getLogger("finecap")
    kept = (finecap_logger.handlers[:], finecap_logger.level, finecap_logger.propagate)
    loggers = {name: logging.getLogger(name) for name in SILENCED}
    filters = {name: logger.filters[:] for name, logger in loggers.items()}
    try:
        worker_setup(queue.Queue(), logging.INFO)  # as the pool's initializer runs it in each worker
        for name, texts in SILENCED.items():
            record = logging.LogRecord(name, logging.WARNING, __file__, 1, f"x {texts[0]} y", None, None)
            assert not loggers[name].filter(record), name  # left out
            other = logging.LogRecord(name, logging.WARNING, __file__, 1, "another warning", None, None)
            assert loggers[name].filter(other)  # the library's other warnings still show
    finally:
        finecap_logger.handlers[:], finecap_logger.level, finecap_logger.propagate = kept
        for name, logger in loggers.items():
            logger.filters[:] = filters[name]


@pytest.mark.parametrize("quick", [True, False])
def test_no_demo_stage_sets_an_option_its_run_never_reads(tmp_path, caplog, monkeypatch, quick):
    """Each training stage's configuration as the demo layers it (its recipe, its ablation's overrides, the quick
    settings, the VCB stages' data set) warns of no option it never reads: the smile_random ablation
    (smile.subset=random over demo/smile) once set smile.include_eos, which only the other subsets read."""
    monkeypatch.setattr(demo_vcb, "mle_steps", lambda demo: 100)  # the full demo counts them in its world's data
    demo = _demo(tmp_path, [], quick)
    for stage in demo.training_stages():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="finecap.config"):
            demo.stage_config(stage)
        assert not [r.getMessage() for r in caplog.records if "changes nothing" in r.getMessage()], stage
