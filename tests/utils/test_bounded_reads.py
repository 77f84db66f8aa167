"""Bounded reads (issue 48): files read whole.

``finecap.utils.reading.read_bounded`` / ``read_lines``: 10 GB sparse files (no disk taken) as a caption ``.txt``, a
``captions.jsonl`` / ``captions.csv`` sidecar, a JSONL data set, references, predictions, a bags file, a run's
``metrics.jsonl`` (report, resume), captions and results files, a checkpoint's ``config.yaml`` and boost's cache end in
one ``finecap: error:`` line naming the file and the limit (exit 2), never a ``MemoryError``; the same inputs of normal
size work; a FIFO or a growing file cannot read past a limit. The image budget (class 6):
tests/data/test_image_size_limits.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from PIL import Image

from finecap.utils.reading import DATA_FILE, LINE, FileTooLarge, SizeLimit, read_bounded, read_lines
from helpers.cli import error_line, succeeds

TEN_GB = 10**10


def sparse(path: Path, head: bytes = b"", size: int = TEN_GB) -> Path:
    """``head`` then zero bytes up to ``size``: a 10 GB file that takes no disk (a hole), made in an instant."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    st = path.stat()
    assert st.st_size == size and st.st_blocks * 512 < 2**20, "not sparse: the file system filled the hole"
    return path


def _said_too_large(line: str, path: Path, limit: str, *, where: str = "") -> None:
    assert line.startswith(f"finecap: error: {path}{where}: too large ("), line
    assert f"finecap reads at most {limit}" in line, line


DATA_LIMIT = "2,147,483,648 bytes (2 GiB) of a data file"
LINE_LIMIT = "16,777,216 bytes (16 MiB) of a line"


@pytest.fixture
def eval_inputs(tmp_path) -> dict:
    """Predictions and references of normal size, for ``finecap eval --metrics bleu`` (text only)."""
    refs = tmp_path / "refs"
    refs.mkdir()
    for name, caption in (("cat", "a cat on a mat"), ("dog", "a dog in a park")):
        Image.new("RGB", (8, 8)).save(refs / f"{name}.png")
        (refs / f"{name}.txt").write_text(caption + "\n")
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps([{"image_id": "cat.png", "caption": "a cat on a mat"},
                                       {"image_id": "dog.png", "caption": "a dog"}]))  # fmt: skip
    rows = [{"id": "cat.png", "image": "cat.png", "captions": ["a cat on a mat"]},
            {"id": "dog.png", "image": "dog.png", "captions": ["a dog in a park"]}]  # fmt: skip
    jsonl = tmp_path / "refs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    coco = tmp_path / "captions_test.json"
    coco.write_text(json.dumps({"images": [{"id": "cat.png", "file_name": "cat.png"}, {"id": "dog.png", "file_name":
                                "dog.png"}], "annotations": [{"image_id": r["id"], "caption": r["captions"][0]}
                                                             for r in rows]}))  # fmt: skip
    return {"folder": refs, "predictions": predictions, "jsonl": jsonl, "coco": coco, "tmp": tmp_path}


def _eval(inputs: dict, references: Path, predictions: Path | None = None, *more) -> list:
    return ["eval", "--predictions", predictions or inputs["predictions"], "--references", references, "--metrics",
            "bleu", "--images", inputs["folder"], *more]  # fmt: skip


def _plant_txt(inputs: dict) -> tuple[list, Path, str, str]:
    txt = sparse(inputs["folder"] / "dog.txt", b"a dog in a park\n")
    return _eval(inputs, inputs["folder"]), txt, "", "1,048,576 bytes (1 MiB) of a caption file"


def _plant_sidecar_jsonl(inputs: dict) -> tuple[list, Path, str, str]:
    for txt in inputs["folder"].glob("*.txt"):
        txt.unlink()
    head = json.dumps({"image": "cat.png", "captions": ["a cat on a mat"]}) + "\n"
    sidecar = sparse(inputs["folder"] / "captions.jsonl", head.encode())
    return _eval(inputs, inputs["folder"]), sidecar, ", line 2", LINE_LIMIT


def _plant_sidecar_csv(inputs: dict) -> tuple[list, Path, str, str]:
    for txt in inputs["folder"].glob("*.txt"):
        txt.unlink()
    sidecar = sparse(inputs["folder"] / "captions.csv", b"image,caption\ncat.png,a cat on a mat\n")
    return _eval(inputs, inputs["folder"]), sidecar, ", line 3", LINE_LIMIT


def _plant_jsonl_data(inputs: dict) -> tuple[list, Path, str, str]:
    head = inputs["jsonl"].read_bytes()
    return _eval(inputs, sparse(inputs["jsonl"], head)), inputs["jsonl"], ", line 3", LINE_LIMIT


def _plant_references(inputs: dict) -> tuple[list, Path, str, str]:
    return _eval(inputs, sparse(inputs["coco"], b'{"images": [')), inputs["coco"], "", DATA_LIMIT


def _plant_predictions(inputs: dict) -> tuple[list, Path, str, str]:
    predictions = sparse(inputs["predictions"], b'[{"image_id": "cat.png", "caption": "a cat"}, ')
    return _eval(inputs, inputs["jsonl"], predictions), predictions, "", DATA_LIMIT


def _plant_bags(inputs: dict) -> tuple[list, Path, str, str]:
    bags = sparse(inputs["tmp"] / "bags.json", b'{"bags": {"3": [')
    return _eval(inputs, inputs["jsonl"], None, "--bags", bags), bags, "", DATA_LIMIT


PLANTS = {"caption .txt": _plant_txt, "captions.jsonl sidecar": _plant_sidecar_jsonl,
          "captions.csv sidecar": _plant_sidecar_csv, "jsonl data set": _plant_jsonl_data,
          "coco references": _plant_references, "predictions": _plant_predictions,
          "bags file": _plant_bags}  # fmt: skip
NORMAL = {"caption .txt": "folder", "captions.jsonl sidecar": "folder", "captions.csv sidecar": "folder",
          "jsonl data set": "jsonl", "coco references": "coco", "predictions": "jsonl",
          "bags file": "jsonl"}  # fmt: skip


@pytest.mark.parametrize("kind", list(PLANTS))
def test_a_sparse_10_gb_input_of_eval_is_one_line(eval_inputs, kind):
    assert "BLEU-4" in succeeds(_eval(eval_inputs, eval_inputs[NORMAL[kind]]))  # normal sizes work
    argv, planted, where, limit = PLANTS[kind](eval_inputs)
    _said_too_large(error_line(argv), planted, limit, where=where)


def test_the_data_limit_is_set_by_an_environment_variable(eval_inputs, monkeypatch):
    argv = _eval(eval_inputs, eval_inputs["jsonl"])
    size = eval_inputs["predictions"].stat().st_size
    monkeypatch.setenv("FINECAP_MAX_DATA_BYTES", str(size))
    assert "BLEU-4" in succeeds(argv)  # a limit of the file's size: read
    monkeypatch.setenv("FINECAP_MAX_DATA_BYTES", str(size - 1))
    line = error_line(argv)
    assert line.startswith(f"finecap: error: {eval_inputs['predictions']}: too large ({size:,} bytes)")
    assert f"at most {size - 1:,} bytes" in line and "set FINECAP_MAX_DATA_BYTES=BYTES" in line
    monkeypatch.setenv("FINECAP_MAX_DATA_BYTES", "2GB")
    assert "FINECAP_MAX_DATA_BYTES='2GB': must be a whole number of bytes" in error_line(argv)


def _report_run(root: Path) -> Path:
    """A run folder a report reads: results, one stage's captions and training log."""
    run = root / "run"
    (run / "captions").mkdir(parents=True)
    (run / "mle").mkdir()
    (run / "results.json").write_text(json.dumps({"mle": {"BLEU-4": 0.1, "Length": 3.0}}))
    (run / "captions" / "mle.json").write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}]))
    events = [{"step": 1, "split": "train", "values": {"loss": 2.0}}, {"step": 1, "split": "val", "values": {"x": 1}}]
    (run / "mle" / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


@pytest.mark.parametrize(("name", "head", "where", "limit"), [
    ("mle/metrics.jsonl", b'{"step": 1, "split": "train", "values": {"loss": 2.0}}\n', "", DATA_LIMIT),
    ("captions/mle.json", b'[{"image_id": 1, "caption": "a"}, ', "", DATA_LIMIT),
    ("results.json", b'{"mle": ', "", DATA_LIMIT),
    ("bags_test.json", b'{"bags": ', "", DATA_LIMIT),
])  # fmt: skip
def test_a_sparse_10_gb_file_of_a_run_folder_is_one_line_in_report(tmp_path, name, head, where, limit):
    run = _report_run(tmp_path)
    succeeds(["report", run, "--out", tmp_path / "ok.html"])  # normal sizes work
    planted = sparse(run / name, head)
    _said_too_large(error_line(["report", run, "--out", tmp_path / "r.html"]), planted, limit, where=where)
    assert not (tmp_path / "r.html").exists()


def test_a_metrics_line_past_the_line_limit_is_named(tmp_path):
    run = _report_run(tmp_path)
    log = run / "mle" / "metrics.jsonl"
    sparse(log, log.read_bytes(), size=LINE.limit() * 2)  # 32 MiB of holes: under the file limit, one long line
    _said_too_large(error_line(["report", run, "--out", tmp_path / "r.html"]), log, LINE_LIMIT, where=", line 3")


def test_a_checkpoints_sparse_config_is_one_line(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = copy / "checkpoints" / "best" / "config.yaml"
    sparse(config, config.read_bytes())
    line = error_line(["caption", "--checkpoint", copy / "checkpoints" / "best", "--out", tmp_path / "c.json",
                       "--images", tmp_path])  # fmt: skip
    _said_too_large(line, config, "67,108,864 bytes (64 MiB) of a finecap file")


@pytest.mark.slow
def test_resume_names_a_sparse_metrics_log(run, shapes, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    recipe = shutil.copy(copy / "config.yaml", tmp_path / "recipe.yaml")  # the run's own settings
    log = sparse(copy / "metrics.jsonl", (copy / "metrics.jsonl").read_bytes())
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()}
    line = error_line(["train", recipe, "--out", copy, "--resume", "train.max_steps=121"])
    _said_too_large(line, log, DATA_LIMIT)
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()} == before  # nothing rewritten


def test_boosts_sparse_cache_is_named(tmp_path):
    from finecap.boost.engine import AnswerCache

    head = json.dumps({"key": "k", "step": "visual", "image_id": 1, "answer": "a cat"}) + "\n"
    cache = sparse(tmp_path / "cache.jsonl", head.encode())
    with pytest.raises(
        FileTooLarge, match=rf"^{re.escape(str(cache))}, line 2: too large \(more than 16,777,216 bytes\)"
    ):
        AnswerCache(cache)
    normal = tmp_path / "normal.jsonl"
    normal.write_text(head + head[:10])  # a last line cut by a kill
    answers = AnswerCache(normal)
    assert answers.get("k") == "a cat"
    answers.close()
    assert normal.read_text().endswith("\n")  # the next answer starts on its own line


def test_a_fifo_or_growing_file_cannot_read_past_the_limit(tmp_path):
    limit = SizeLimit("test file", 1000, "a test")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # st_size 0: only the read itself can stop it
    writer = threading.Thread(target=lambda: _feed(fifo, 5000))
    writer.start()
    with pytest.raises(FileTooLarge, match=rf"^{re.escape(str(fifo))}: too large \(more than 1,000 bytes\)"):
        read_bounded(fifo, limit)
    writer.join(timeout=10)
    lines = tmp_path / "lines"
    lines.write_text("short\n" + "x" * 5000 + "\n")
    with pytest.raises(FileTooLarge, match=r", line 2: too large"):
        list(read_lines(lines, line=limit))
    with contextlib.closing(read_lines(lines, line=limit)) as streamed:
        assert next(streamed) == "short\n"  # streamed: the first line is read before the second is refused
    with pytest.raises(FileTooLarge, match=r"too large \(5,007 bytes "):
        list(read_lines(lines, total=limit, line=DATA_FILE))


def _feed(fifo: Path, n: int) -> None:
    with contextlib.suppress(BrokenPipeError), open(fifo, "wb") as f:
        for _ in range(n // 100):
            f.write(b"x" * 100)
