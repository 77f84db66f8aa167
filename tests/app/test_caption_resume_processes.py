"""``finecap caption`` resumed with another number of processes (docs/caption.md#a-stopped-run-resumes): a run stopped
in one process resumes under ``accelerate launch`` of 2 CPU processes, and a launched run stopped resumes in one, to
the bytes of a one-process run never stopped. The images left are shared evenly between the processes, each sampled
from the seed of its place in the whole list (``decode.temperature=5``: another seed, other captions).

The launched processes run tests/app/caption_worker.py, which records the images of each batch a process decodes
and stops a process as Ctrl-C does; a run in this process is stopped by :class:`helpers.caption_batches.Batches`.
The captioner is the coloured-shape ClipCap of tests/app/test_caption_images.py, on 12 of its images (3 batches of
4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers.caption_batches import Batches
from helpers.cli import run_cli
from helpers.launch import launch_bounded, two_processes

SAMPLED = ("decode.strategy=sample", "decode.temperature=5", "decode.batch_size=4")
NAMES = [f"{color}/{i}.png" for i in range(3) for color in ("red", "blue", "green", "yellow")]
WORKER = Path(__file__).with_name("caption_worker.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.accelerator.is_available(), reason="it launches CPU processes on a CPU-only machine"),
]


@pytest.fixture
def images(shapes, tmp_path) -> Path:
    """A folder of 12 of the shape images (:data:`NAMES`), with ``data.jsonl``: a data set whose ``test`` split is
    them, in that order."""
    folder = tmp_path / "images"
    for name in NAMES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shapes["data"] / name, folder / name)
    lines = [{"image": f"images/{name}", "captions": ["a shape"], "split": "test"} for name in NAMES]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def command(run: Path, images: Path, what: str, out: Path) -> list[str]:
    """``finecap caption`` of the 12 images, as ``--images`` or as the ``test`` split of ``data.jsonl``, sampled."""
    where = ["--images", str(images)] if what == "images" else ["--data", str(images.parent / "data.jsonl")]
    return ["caption", "--checkpoint", str(run), *SAMPLED, *where, "--out", str(out)]


def launched(
    argv: list[str], tmp_path: Path, stop_after: int | str | None = None, succeed: bool | None = None
) -> tuple[str, list[list[list[int]] | None]]:
    """``finecap ARGV`` in 2 launched processes, each stopped after ``stop_after`` batches (a number for both, or
    ``"0,1"``: each its own; the launch then fails, unless ``succeed`` says otherwise): what they printed, and the
    batches each process decoded (the images' places; ``None``: the process was killed before it recorded them)."""
    folder = tmp_path / "decoded"
    folder.mkdir()
    cmd = [*two_processes(), str(WORKER), str(folder), "-" if stop_after is None else str(stop_after), *argv]
    succeed = stop_after is None if succeed is None else succeed
    err = launch_bounded(cmd, tmp_path / "launch.log", timeout=300, succeed=succeed)
    records = [folder / f"rank{rank}.json" for rank in range(2)]
    return err, [json.loads(path.read_text()) if path.exists() else None for path in records]


def test_a_run_stopped_in_one_process_resumes_in_two(run, images, tmp_path, monkeypatch):
    # the 2 processes started over (each its half of the 12), left the partial file behind, and a resumed run split
    # the whole list, not what was left: the process whose half was captioned would have idled
    whole, out = tmp_path / "whole.json", tmp_path / "out.json"
    assert run_cli(command(run, images, "images", whole))[0] == 0
    with monkeypatch.context() as m:
        Batches(m, stop_after=1)
        code, _, err = run_cli(command(run, images, "images", out))
    partial = tmp_path / "out.json.partial.jsonl"
    assert code != 0 and f"4 image(s) captioned are kept in {partial}" in err, err

    err, decoded = launched(command(run, images, "images", out), tmp_path)
    assert f"resuming from {partial}: 4 image(s) already captioned" in err, err[-3000:]
    assert decoded == [[[4, 5, 6, 7]], [[8, 9, 10, 11]]]  # the 8 left, 4 each, at their places in the list
    assert out.read_bytes() == whole.read_bytes()  # sampled from the seeds of their places: a run never stopped's
    assert not partial.exists() and not (tmp_path / "out.json.partial.1.jsonl").exists()  # the other process's
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nor the lock


def test_a_launched_run_stopped_resumes_in_one_process(run, images, tmp_path, monkeypatch):
    # each process keeps its own part's captions as it makes them, in a file of its own: a launched run kept the
    # main process's part alone (the other's reached it at the end only), and the resumed run decoded it again
    whole, out = tmp_path / "whole.json", tmp_path / "out.json"
    code, _, err = run_cli(command(run, images, "split", whole))
    assert code == 0, err
    partial, other = tmp_path / "out.json.partial.jsonl", tmp_path / "out.json.partial.1.jsonl"
    # the main process stops once the other's header + 4 lines are on the disk: it counts the other's file as it is
    # when it stops, and on a loaded machine it could stop before the other had written its batch
    monkeypatch.setenv("CAPTION_WORKER_AWAIT", f"{other}:5")
    err, decoded = launched(command(run, images, "split", out), tmp_path, stop_after=1)
    assert decoded == [[[0, 1, 2, 3]], [[6, 7, 8, 9]]]  # each process's first batch of its half, then stopped
    said = f"8 image(s) captioned are kept: 4 in {partial} (the main process's) and 4 in {tmp_path}/"
    assert said + "out.json.partial.<rank>.jsonl (1 other process's): run the same command" in err, err[-3000:]
    for path, places in [(partial, range(4)), (other, range(6, 10))]:
        lines = path.read_text().splitlines()
        assert json.loads(lines[0])["finecap"] == "finecap caption partial results"  # each file with its header
        rows = [json.loads(line) for line in lines[1:]]
        assert [(row["image"], row["place"]) for row in rows] == [(f"images/{NAMES[k]}", k) for k in places]

    counted = Batches(monkeypatch)
    code, _, err = run_cli(command(run, images, "split", out))
    assert code == 0 and f"resuming from {partial}: 8 image(s) already captioned" in err, err
    assert counted.calls == 1  # 4, 5, 10 and 11: 1 batch of 4
    assert out.read_bytes() == whole.read_bytes() and not partial.exists() and not other.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nor the lock


def test_a_partial_file_made_otherwise_is_refused_once_by_two_processes(run, images, tmp_path, monkeypatch):
    # the main process alone reads and checks the file; its refusal stops the other process too (relayed, not left
    # waiting for the captions it holds) and is said once, the file untouched
    out = tmp_path / "out.json"
    with monkeypatch.context() as m:
        Batches(m, stop_after=1)
        assert run_cli(command(run, images, "images", out))[0] != 0
    partial = tmp_path / "out.json.partial.jsonl"
    before = partial.read_bytes()
    cmd = [*two_processes(), "-m", "finecap.app.cli", *command(run, images, "images", out), "decode.max_length=3"]
    err = launch_bounded(cmd, tmp_path / "launch.log", timeout=300, succeed=False)
    said = [line for line in err.splitlines() if "finecap: error:" in line]
    assert len(said) == 1 and "decode.max_length: 6 before, 3 now" in said[0] and "--force" in said[0], err[-3000:]
    assert partial.read_bytes() == before and not out.exists()


def test_a_stopped_launch_says_what_another_process_kept_when_the_main_one_kept_nothing(
    run, images, tmp_path, monkeypatch
):
    # the warning that captions are kept, and how to resume them, was the main process's alone: stopped before its
    # first batch, it said nothing, though the other process's file held 4 captions, which a resumed run reads
    whole, out = tmp_path / "whole.json", tmp_path / "out.json"
    code, _, err = run_cli(command(run, images, "split", whole))
    assert code == 0, err
    partial, other = tmp_path / "out.json.partial.jsonl", tmp_path / "out.json.partial.1.jsonl"
    monkeypatch.setenv("CAPTION_WORKER_AWAIT", f"{other}:5")  # the main process stops once its header + 4 lines are in
    err, decoded = launched(command(run, images, "split", out), tmp_path, stop_after="0,1")
    assert decoded == [[], [[6, 7, 8, 9]]]  # the main process stopped before its first batch, the other after one
    said = f"stopped; 4 image(s) captioned are kept: 4 in {tmp_path}/out.json.partial.<rank>.jsonl (1 other process's)"
    assert said + ": run the same command again to resume" in err, err[-3000:]
    assert not partial.exists() and len(other.read_text().splitlines()) == 1 + 4  # the main process's held none

    counted = Batches(monkeypatch)
    code, _, err = run_cli(command(run, images, "split", out))
    assert code == 0 and f"resuming from {partial}: 4 image(s) already captioned" in err, err
    assert counted.calls == 2  # the 8 left (0 to 5, 10, 11): 2 batches of 4
    assert out.read_bytes() == whole.read_bytes() and not partial.exists() and not other.exists()


def test_a_process_that_cannot_make_its_partial_file_stops_every_process_said_once(run, images, tmp_path, monkeypatch):
    # process 1 could not make its own partial file (a disk full): it stopped alone, and the main process captioned
    # its part, then waited for the other's at a collective until the launcher killed it (its lock file and partial
    # file left behind). Now every process stops there together (finecap.errors.together), before any decodes, the
    # main process saying the other's error once, its own files removed
    out = tmp_path / "out.json"
    monkeypatch.setenv("CAPTION_WORKER_FULL_DISK", "1")
    err, decoded = launched(command(run, images, "images", out), tmp_path, succeed=False)
    assert decoded == [[], []], err[-3000:]  # both stopped cleanly, neither decoded a batch
    said = [line for line in err.splitlines() if "finecap: error:" in line]
    other = tmp_path / "out.json.partial.1.jsonl"
    expected = f"finecap: error: process 1 of 2: {other}: no space left on device (the disk is full)"
    assert len(said) == 1 and said[0].startswith(expected), err[-3000:]
    assert "[rank0]" not in err and "[rank1]" not in err, err[-3000:]  # no process's traceback
    assert not [p for p in tmp_path.iterdir() if "out.json" in p.name]  # no partial file, no lock, no results
