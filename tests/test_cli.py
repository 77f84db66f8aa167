"""The CLI parses, builds the configuration and reports errors without a traceback; text-only commands start
without torch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from finecap.app.cli import main


def test_config_prints_resolved(capsys):
    assert main(["config", "world.n_train=42"]) == 0
    assert "n_train: 42" in capsys.readouterr().out


def test_config_describe(capsys):
    assert main(["config", "--describe"]) == 0
    out = capsys.readouterr().out
    assert "world.image_size (int, default 64" in out or "world.image_size (int, default" in out


def test_bad_override_is_a_clean_error(capsys):
    assert main(["config", "train.schedule=exponential"]) == 2
    err = capsys.readouterr().err
    assert "train.schedule" in err and "linear, cosine, constant" in err


def test_missing_recipe_is_a_clean_error(tmp_path, capsys):
    assert main(["config", str(tmp_path / "nope.yaml")]) == 2
    assert "recipe file not found" in capsys.readouterr().err


EVAL_SCRIPT = """
import json, sys
from finecap.app.cli import main
code = main(sys.argv[1:])
heavy = {m: m in sys.modules for m in ("torch", "transformers", "datasets", "pyarrow")}
print(json.dumps({"code": code, **heavy}))
"""


def _run_eval(tmp_path: Path, metrics: str) -> dict:
    """Run `finecap eval --metrics METRICS` on two hand-made images in a fresh interpreter; return its exit code and
    whether torch / transformers were imported by the end."""
    refs = tmp_path / "refs.jsonl"
    refs.write_text(
        json.dumps({"id": 1, "image": "1.png", "captions": ["a red circle", "a big red circle"]}) + "\n"
        + json.dumps({"id": 2, "image": "2.png", "captions": ["a blue square", "a small blue square"]}) + "\n"
    )  # fmt: skip
    for name in ("1.png", "2.png"):
        (tmp_path / name).write_bytes(b"")  # image metrics check that the files exist
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": 1, "caption": "A red circle."},
                                                       {"image_id": 2, "caption": "a blue square"}]))  # fmt: skip
    argv = ["eval", "--predictions", str(tmp_path / "results.json"), "--references", str(refs), "--metrics", metrics,
            "--out", str(tmp_path / "eval.json"), f"run.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", EVAL_SCRIPT, *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_text_only_eval_imports_no_torch(tmp_path):
    # `finecap eval` on n-gram metrics is a text job: it must start without torch or transformers (seconds each).
    state = _run_eval(tmp_path, "bleu,rouge,cider,length,vocab")
    assert state == {"code": 0, "torch": False, "transformers": False, "datasets": False, "pyarrow": False}
    scores = json.loads((tmp_path / "eval.json").read_text())
    assert scores["BLEU-1"] == pytest.approx(1.0) and scores["Length"] == 3.0


def test_image_metric_eval_does_import_torch(tmp_path):
    # The same harness sees torch when a group needs it: CLIPScore loads the retriever (torch, transformers), which
    # then stops the command (exit 2) because no world encoder has been trained for this configuration.
    state = _run_eval(tmp_path, "clipscore")
    assert {k: state[k] for k in ("code", "torch", "transformers")} == {"code": 2, "torch": True, "transformers": True}


def test_eval_prints_json_to_stdout_without_out_on_id_only_coco_references(tmp_path, capsys):
    # A COCO reference file whose images carry only `id` (pycocotools reads it; many scripts write it), results with
    # extra fields (`score`, `id`), no --out: `--format json` prints exactly the JSON scores on stdout.
    refs = {
        "images": [{"id": 1}, {"id": 2}],
        "annotations": [{"image_id": 1, "id": 10, "caption": "A red circle."},
                        {"image_id": 2, "id": 11, "caption": "A blue square."}],
    }  # fmt: skip
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "res.json").write_text(json.dumps([{"image_id": 1, "caption": "a red circle", "score": -1.5},
                                                   {"image_id": 2, "caption": "a blue square", "id": 3}]))  # fmt: skip
    argv = ["eval", "--predictions", str(tmp_path / "res.json"), "--references", str(tmp_path / "refs.json"),
            "--metrics", "bleu,rouge", "--format", "json"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr()
    scores = json.loads(out.out)  # nothing but the JSON on stdout
    assert scores["BLEU-1"] == pytest.approx(1.0) and scores["ROUGE-L"] == pytest.approx(1.0)
    assert "2 images of" in out.err
    assert main(argv[:-2]) == 0  # default: the table, still without --out
    assert "| BLEU-1 " in capsys.readouterr().out and not list(tmp_path.glob("*eval*"))
