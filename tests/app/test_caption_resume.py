"""``finecap caption`` keeps its work when stopped and resumes (docs/caption.md#a-stopped-run-resumes): captions are
appended per batch to ``<out>.partial.jsonl``; the same command again skips the images captioned and writes the
results byte for byte as a run never stopped would, then removes the partial file.

A run is stopped after N batches by making :func:`finecap.caption.batch_captions` raise ``KeyboardInterrupt`` (Ctrl-C)
on its call N + 1 (:class:`helpers.caption_batches.Batches`); a run resumed with another number of processes is in
tests/app/test_caption_resume_processes.py. The captioner is the coloured-shape ClipCap of
tests/app/test_caption_images.py."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import finecap.app.caption
import finecap.app.caption_partial
import finecap.caption
from finecap.app.caption_partial import PartialResults
from finecap.outputs import OutputRefused
from helpers.caption_batches import Batches
from helpers.cli import run_cli
from helpers.shapes import results

GREEDY = ("decode.strategy=greedy", "decode.batch_size=4")
SAMPLED = ("decode.strategy=sample", "decode.temperature=5", "decode.batch_size=4")  # run.seed: per-image seeds


def argv(run: Path, shapes: dict, out: Path, what: str, more: tuple[str, ...]) -> list[str]:
    """``finecap caption`` of the 24 training images (``--images``) or of the run's val split."""
    where = ["--images", str(shapes["data"])] if what == "images" else ["--split", "val"]
    return ["caption", "--checkpoint", str(run), "--out", str(out), *more, *where]


def stopped(run, shapes, out, what, more, monkeypatch, after: int) -> str:
    """Run the command, stopped after ``after`` batches; its stderr (it must fail)."""
    with monkeypatch.context() as m:
        Batches(m, stop_after=after)
        code, _, err = run_cli(argv(run, shapes, out, what, more))
    assert code != 0, err
    return err


@pytest.mark.slow
@pytest.mark.parametrize(("what", "more"), [("images", GREEDY), ("images", SAMPLED), ("split", SAMPLED)])
def test_a_stopped_run_resumes_to_the_bytes_of_a_run_never_stopped(run, shapes, tmp_path, monkeypatch, what, more):
    whole = tmp_path / "whole.json"
    assert run_cli(argv(run, shapes, whole, what, more))[0] == 0
    expected = whole.read_bytes()
    total = len(json.loads(expected))

    out = tmp_path / "out.json"
    err = stopped(run, shapes, out, what, more, monkeypatch, after=1)
    partial = tmp_path / "out.json.partial.jsonl"
    kept = 4 if what == "images" else min(4, total)
    assert not out.exists() and len(partial.read_text().splitlines()) == 1 + kept  # the header, then one per image
    assert f"{kept} image(s) captioned are kept in {partial}" in err and "run the same command again" in err
    header = json.loads(partial.read_text().splitlines()[0])
    assert header["finecap"] == "finecap caption partial results"
    assert header["header"]["decode"]["strategy"] == more[0].removeprefix("decode.strategy=")

    if what == "images":  # stopped again, later, on the resumed run: both runs' captions kept
        stopped(run, shapes, out, what, more, monkeypatch, after=2)
        assert len(partial.read_text().splitlines()) == 1 + 12
        kept = 12
    counted = Batches(monkeypatch)
    assert run_cli(argv(run, shapes, out, what, more))[0] == 0
    assert out.read_bytes() == expected  # the same bytes as the run never stopped
    assert not partial.exists()
    assert counted.calls * 4 >= total - kept and counted.calls < -(-total // 4)  # only the images left were decoded


@pytest.mark.slow
@pytest.mark.parametrize("more", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_run_resumes_at_another_batch_size_with_one_warning(run, shapes, tmp_path, monkeypatch, more):
    # an out-of-memory kill's fix is a smaller batch: each image is decoded alone, so the run resumes (with one warning
    # naming the batch sizes the kept captions were decoded at) instead of discarding them. On the CPU the tiny
    # ClipCap's captions are the same bytes at any batch size (on a GPU a batch's shape may change the last digits)
    whole = tmp_path / "whole.json"
    assert run_cli(argv(run, shapes, whole, "images", more))[0] == 0  # decode.batch_size=4
    other = tmp_path / "other.json"
    assert run_cli(argv(run, shapes, other, "images", (*more, "decode.batch_size=3")))[0] == 0
    assert other.read_bytes() == whole.read_bytes()

    out, partial = tmp_path / "out.json", tmp_path / "out.json.partial.jsonl"
    stopped(run, shapes, out, "images", more, monkeypatch, after=1)  # 4 captions at 4
    err = stopped(run, shapes, out, "images", (*more, "decode.batch_size=2"), monkeypatch, after=2)  # 4 more at 2
    said = "of the 4 captions kept, 4 at decode.batch_size=4 were decoded; the rest are decoded at decode.batch_size=2"
    assert err.count("captions kept, ") == 1 and said in err, err
    assert "8 image(s) captioned are kept" in err, err
    rows = [json.loads(line) for line in partial.read_text().splitlines()]
    assert rows[0]["header"]["decode"]["batch_size"] == 4  # the header as the run began; lines decoded at 2 say so
    assert [row.get("batch_size") for row in rows[1:]] == [None] * 4 + [2] * 4

    code, _, err = run_cli(argv(run, shapes, out, "images", (*more, "decode.batch_size=3")))
    assert code == 0, err
    said = (
        "of the 8 captions kept, 4 at decode.batch_size=2, 4 at decode.batch_size=4 were decoded; the rest are "
        "decoded at decode.batch_size=3"
    )
    assert err.count("captions kept, ") == 1 and said in err, err
    assert out.read_bytes() == whole.read_bytes() and not partial.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "tail",
    [
        '{"image": 8, "capt',  # killed in the middle of a line
        '{"image": 8, "capt' + "\0" * 3000,  # the machine stopped: the file's end never written, read back as zeros
    ],
    ids=["kill", "crash"],
)
def test_a_line_cut_short_is_left_out_with_a_warning_and_decoded_again(run, shapes, tmp_path, monkeypatch, tail):
    # the partial file is not synced line by line (docs/caption.md#a-stopped-run-resumes): after a crash its last line
    # may be cut short, or zeros; it is left out and decoded again, and the warning says so (it said nothing)
    whole = tmp_path / "whole.json"
    assert run_cli(argv(run, shapes, whole, "images", SAMPLED))[0] == 0
    out = tmp_path / "out.json"
    stopped(run, shapes, out, "images", SAMPLED, monkeypatch, after=2)
    partial = tmp_path / "out.json.partial.jsonl"
    with partial.open("a") as f:
        f.write(tail)
    code, _, err = run_cli(argv(run, shapes, out, "images", SAMPLED))
    assert code == 0 and f"{partial}: its last line was cut short" in err, err
    assert "resuming from" in err and "8 image(s) already captioned" in err, err
    assert out.read_bytes() == whole.read_bytes() and not partial.exists()


def written_on_a_full_disk(run, shapes, whole, out, monkeypatch):
    """Caption the images into ``whole``, then again into ``out`` on a disk found full when ``out`` is written (at
    the very end); the second command's exit code and standard error."""
    assert run_cli(argv(run, shapes, whole, "images", GREEDY))[0] == 0

    def disk_full(path, captions):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    with monkeypatch.context() as m:
        m.setattr(finecap.app.caption, "write_results", disk_full)
        code, _, err = run_cli(argv(run, shapes, out, "images", GREEDY))
    return code, err


@pytest.mark.slow
def test_results_that_cannot_be_written_keep_the_partial_file_and_release_the_lock(run, shapes, tmp_path, monkeypatch):
    # a disk full when --out is written, at the very end: the command failed naming --out, but said nothing of the
    # captions kept, and left its lock file behind. Now it says where they are kept, releases the lock, and the same
    # command again writes them without decoding any image; a lock file a dead process left does not stop it
    whole, out = tmp_path / "whole.json", tmp_path / "out.json"
    code, err = written_on_a_full_disk(run, shapes, whole, out, monkeypatch)
    partial, lock = tmp_path / "out.json.partial.jsonl", tmp_path / ".out.json.caption.lock"
    assert code == 2 and f"finecap: error: {out}: no space left on device" in err, err
    said = f"the results could not be written to {out}; 24 image(s) captioned are kept in {partial}: run the same"
    assert said in err, err
    assert len(partial.read_text().splitlines()) == 1 + 24 and not out.exists() and not lock.exists()

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()  # a run killed while it held the lock (SIGKILL, a power cut) leaves its record, no lock
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": 0, "command": "finecap"}))
    counted = Batches(monkeypatch)
    code, _, err = run_cli(argv(run, shapes, out, "images", GREEDY))
    assert code == 0 and f"taking over the lock of pid {dead.pid} on host" in err, err
    assert counted.calls == 0 and out.read_bytes() == whole.read_bytes()
    assert not partial.exists() and not lock.exists()


@pytest.mark.slow
def test_results_that_cannot_be_written_say_how_another_out_keeps_the_captions(run, shapes, tmp_path, monkeypatch):
    # a disk full when --out is written: the error's hint, "free space or write elsewhere (--out)", led to a new --out
    # that found no partial file and decoded every image again. It says to copy the partial file beside the new
    # --out, named after it; done so, the command with that --out writes the results without decoding an image
    whole, out = tmp_path / "whole.json", tmp_path / "out.json"
    code, err = written_on_a_full_disk(run, shapes, whole, out, monkeypatch)
    partial = tmp_path / "out.json.partial.jsonl"
    hint = (f"finecap: error: {out}: no space left on device (the disk is full); free space or write elsewhere (--out "
            f"NEW), after copying {partial} to NEW.partial.jsonl beside it, to keep its captions")  # fmt: skip
    assert code == 2 and hint in err.splitlines(), err

    new = tmp_path / "elsewhere" / "new.json"
    new.parent.mkdir()
    shutil.copy(partial, tmp_path / "elsewhere" / "new.json.partial.jsonl")
    counted = Batches(monkeypatch)
    code, _, err = run_cli(argv(run, shapes, new, "images", GREEDY))
    assert code == 0 and "24 image(s) already captioned" in err, err
    assert counted.calls == 0 and new.read_bytes() == whole.read_bytes()
    assert sorted(p.name for p in new.parent.iterdir()) == ["new.json"]  # its partial file removed, the lock too


@pytest.mark.slow
def test_other_settings_are_refused_naming_them_and_force_starts_over(run, shapes, tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    stopped(run, shapes, out, "images", GREEDY, monkeypatch, after=1)
    partial = tmp_path / "out.json.partial.jsonl"
    before = partial.read_bytes()
    shorter = (*GREEDY, "decode.max_length=3")
    code, _, err = run_cli(argv(run, shapes, out, "images", shorter))
    assert code == 2 and "decode.max_length: 6 before, 3 now" in err and "--force" in err, err
    assert partial.read_bytes() == before and not out.exists()  # refused before anything is written
    whole = tmp_path / "whole.json"
    assert run_cli(argv(run, shapes, whole, "images", shorter))[0] == 0
    assert run_cli([*argv(run, shapes, out, "images", shorter), "--force"])[0] == 0
    assert out.read_bytes() == whole.read_bytes() and not partial.exists()


@pytest.mark.slow
def test_the_captions_a_refusal_and_force_discard_are_counted_without_older_skipped_lines(run, shapes, tmp_path,
                                                                                          monkeypatch):  # fmt: skip
    # an earlier finecap wrote a "skipped" line for an image --skip-bad-images left out; such lines are read and
    # passed over (no caption of theirs is kept), but the refusal and --force's warning counted them as captions
    out = tmp_path / "out.json"
    stopped(run, shapes, out, "images", GREEDY, monkeypatch, after=1)  # one batch of 4 captioned
    partial = tmp_path / "out.json.partial.jsonl"
    with partial.open("a") as f:
        f.write(json.dumps({"image": "a_bad.png", "skipped": "not an image"}) + "\n")
    shorter = (*GREEDY, "decode.max_length=3")
    code, _, err = run_cli(argv(run, shapes, out, "images", shorter))
    assert code == 2 and "(its 4 captions discarded)" in err, err
    code, _, err = run_cli([*argv(run, shapes, out, "images", shorter), "--force"])
    assert code == 0 and "and its 4 captions discarded" in err, err


@pytest.mark.slow
def test_a_file_finecap_did_not_write_at_the_partial_name_is_never_touched(run, shapes, tmp_path):
    out = tmp_path / "out.json"
    theirs = tmp_path / "out.json.partial.jsonl"
    theirs.write_text('{"image": 0, "captions": ["mine"]}\n')
    for force in ([], ["--force"]):
        code, _, err = run_cli([*argv(run, shapes, out, "images", GREEDY), *force])
        assert code == 2 and f"{theirs} exists and finecap did not write it" in err, err
    assert theirs.read_text() == '{"image": 0, "captions": ["mine"]}\n' and not out.exists()


@pytest.mark.slow
def test_a_run_a_bad_image_stopped_resumes_with_skip_bad_images(run, shapes, tmp_path, monkeypatch):
    images = tmp_path / "images"
    shutil.copytree(shapes["data"], images)
    (images / "zz_bad.png").write_bytes(b"not a png")  # the last image: the run stops at its last batch
    out, whole = tmp_path / "out.json", tmp_path / "whole.json"
    command = ["caption", "--checkpoint", str(run), *SAMPLED, "--images", str(images)]
    code, _, err = run_cli([*command, "--out", str(out)])
    assert code == 2 and "zz_bad.png" in err and "24 image(s) captioned are kept" in err, err
    counted = Batches(monkeypatch)
    assert run_cli([*command, "--skip-bad-images", "--out", str(out)])[0] == 0
    assert counted.calls == 0  # the bad image's batch held only it: nothing left to decode
    assert run_cli([*command, "--skip-bad-images", "--out", str(whole)])[0] == 0
    assert out.read_bytes() == whole.read_bytes() and not (tmp_path / "out.json.partial.jsonl").exists()


@pytest.mark.slow
def test_the_partial_file_holds_no_url_credentials_given_again_and_the_run_resumes(run, shapes, tmp_path, monkeypatch):
    # a stored config.yaml masks a URL's credentials; `finecap caption RUN` is given them again as an override
    # (finecap.config.secrets): the header of the partial file, kept when the run stops, wrote them as given
    secret = "pa55-c4pt10n-q9"
    more = (*GREEDY, f"data.path=https://me:{secret}@data.example/set.json")
    out = tmp_path / "out.json"
    err = stopped(run, shapes, out, "images", more, monkeypatch, after=1)
    partial = tmp_path / "out.json.partial.jsonl"
    assert secret not in err and "4 image(s) captioned are kept" in err, err
    header = json.loads(partial.read_text().splitlines()[0])["header"]
    assert header["data"]["path"] == "https://***@data.example/set.json"
    assert secret.encode() not in partial.read_bytes()
    counted = Batches(monkeypatch)
    code, _, err = run_cli(argv(run, shapes, out, "images", more))  # the same command resumes: its header is the same
    assert code == 0 and counted.calls == 5 and not partial.exists(), err


@pytest.mark.slow
def test_images_a_stopped_run_skipped_are_read_again_when_it_resumes(run, shapes, tmp_path, monkeypatch):
    # a run with --skip-bad-images left a bad image out and was stopped; resumed, that image is read again, as a run
    # never stopped would read it: without the option it stops the run naming it (no results, no list of skipped
    # images); mended meanwhile, it is captioned
    images = tmp_path / "images"
    shutil.copytree(shapes["data"], images)
    bad = images / "a_bad.png"  # the first image: in the first batch
    bad.write_bytes(b"not a png")
    out = tmp_path / "out.json"
    command = ["caption", "--checkpoint", str(run), *SAMPLED, "--images", str(images), "--out"]
    with monkeypatch.context() as m:
        Batches(m, stop_after=1)
        code, _, err = run_cli([*command, str(out), "--skip-bad-images"])
    partial = tmp_path / "out.json.partial.jsonl"
    rows = [json.loads(line) for line in partial.read_text().splitlines()[1:]]
    assert code != 0 and [row["image"] for row in rows if "captions" in row] == [1, 2, 3], err  # 0 left out

    code, _, err = run_cli([*command, str(out)])  # resumed without --skip-bad-images
    assert code == 2 and "a_bad.png" in err, err
    assert not out.exists() and not (tmp_path / "out.json.skipped.json").exists()

    shutil.copy(images / "red" / "0.png", bad)  # mended: captioned as a run never stopped captions it
    whole = tmp_path / "whole.json"
    assert run_cli([*command, str(whole)])[0] == 0
    assert run_cli([*command, str(out)])[0] == 0
    assert out.read_bytes() == whole.read_bytes() and not partial.exists()
    assert json.loads(out.read_text())[0]["image_id"] == "a_bad.png"


@pytest.mark.slow
def test_the_same_command_run_again_while_it_runs_is_refused_naming_it(run, shapes, tmp_path, monkeypatch):
    # a job started twice: both runs would append to one partial file, the second resuming from the first's lines,
    # and the first to end would remove it under the other. The second is refused, naming the first, before it reads
    # or writes anything; the first ends as a run alone does
    out, alone = tmp_path / "out.json", tmp_path / "alone.json"
    assert run_cli(argv(run, shapes, alone, "images", GREEDY))[0] == 0
    second: list[tuple[int, str, str]] = []
    real = finecap.caption.batch_captions

    def first_batch(*args, **kwargs):
        if not second:  # while the first run captions its first batch, the same command again
            second.append((-1, "", ""))
            second[0] = run_cli(argv(run, shapes, out, "images", GREEDY))
        return real(*args, **kwargs)

    monkeypatch.setattr(finecap.caption, "batch_captions", first_batch)
    code, _, err = run_cli(argv(run, shapes, out, "images", GREEDY))
    later, _, later_err = second[0]
    assert later == 2 and f"{out}: another finecap caption is writing it (pid " in later_err, later_err
    assert code == 0, err
    assert out.read_bytes() == alone.read_bytes() and not (tmp_path / "out.json.partial.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no lock file left


def write_split(path: Path, names: list[str]) -> None:
    """A JSONL data set at ``path`` (in the folder of the shape images) whose ``test`` split is ``names``, in order."""
    path.write_text("".join(json.dumps({"image": n, "captions": ["a shape"], "split": "test"}) + "\n" for n in names))


def on_split(run: Path, data: Path) -> list[str]:
    """``finecap caption`` of the ``test`` split of ``data``, sampled, up to ``--out``'s value."""
    return ["caption", "--checkpoint", str(run), *SAMPLED, "--data", str(data), "--split", "test", "--out"]


NAMES = [f"{color}/{i}.png" for i in range(3) for color in ("red", "blue", "green", "yellow")]  # 12: three batches
EDITS = {  # how the data set changed between the kill and the resume, and what the refusal says of it
    "removed": (
        NAMES[1:],
        "images: 12 before, 11 now; of the 4 images captioned, 1 not in the split now (first: 'red/0.png')",
    ),
    "moved": (
        [NAMES[1], NAMES[0], *NAMES[2:]],
        "of the 4 images captioned, 2 at another place (first: 'red/0.png', image 1 before, 2 now)",
    ),
    "added": ([*NAMES, "red/5.png"], "images: 12 before, 13 now; of the 4 images captioned, every one at its place"),
}


@pytest.mark.slow
@pytest.mark.parametrize("edit", EDITS)
def test_a_split_changed_since_the_run_stopped_is_refused_naming_what_changed(run, shapes, tmp_path, monkeypatch,
                                                                               edit):  # fmt: skip
    # the data set edited between the kill and the resume: resumed, the run would keep the captions of the old list
    # and sample the moved images from the seeds of their old places. It is refused as other --images are, naming
    # what changed; --force starts over and writes what a run over the new split writes
    images = tmp_path / "images"
    shutil.copytree(shapes["data"], images)
    data, out, whole = images / "data.jsonl", tmp_path / "out.json", tmp_path / "whole.json"
    write_split(data, NAMES)
    command = on_split(run, data)
    with monkeypatch.context() as m:
        Batches(m, stop_after=1)
        code, _, err = run_cli([*command, str(out)])
    partial = tmp_path / "out.json.partial.jsonl"
    assert code != 0 and "4 image(s) captioned are kept" in err, err
    before = partial.read_bytes()
    names, said = EDITS[edit]
    write_split(data, names)
    code, _, err = run_cli([*command, str(out)])
    assert code == 2 and said in err and "files: " in err and "--force to start over" in err, err
    assert partial.read_bytes() == before and not out.exists()  # refused before anything is written
    assert run_cli([*command, str(whole)])[0] == 0
    assert run_cli([*command, str(out), "--force"])[0] == 0
    assert out.read_bytes() == whole.read_bytes() and not partial.exists()


@pytest.mark.slow
def test_a_split_image_at_another_path_is_refused(run, shapes, tmp_path, monkeypatch):
    # the same ids, one at another file: the header's digest holds the files as --images' does
    images = tmp_path / "images"
    shutil.copytree(shapes["data"], images)
    data, out = images / "data.jsonl", tmp_path / "out.json"
    lines = [{"image": n, "id": k, "captions": ["a shape"], "split": "test"} for k, n in enumerate(NAMES)]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    command = [*on_split(run, data), str(out)]
    with monkeypatch.context() as m:
        Batches(m, stop_after=1)
        assert run_cli(command)[0] != 0
    lines[0]["image"] = "blue/5.png"  # image 0 captioned from red/0.png
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _, err = run_cli(command)
    assert code == 2 and "files: " in err and "every one at its place" in err and "--force" in err, err


def old_partial(partial: Path) -> None:
    """Make ``partial`` a split's file as finecap wrote it before it recorded the split's images: no ``images`` and
    ``files`` in its header, no ``place`` in its lines."""
    rows = [json.loads(line) for line in partial.read_text().splitlines()]
    for key in ("images", "files"):
        rows[0]["header"].pop(key, None)
    for row in rows[1:]:
        row.pop("place", None)
    partial.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.slow
def test_a_split_partial_file_of_an_earlier_finecap_resumes_with_a_warning(run, shapes, tmp_path, monkeypatch):
    # its header names no images, so the split cannot be checked: resumed, said; an image it captioned that is not in
    # the split now is refused as a changed split is
    images = tmp_path / "images"
    shutil.copytree(shapes["data"], images)
    data, out, whole = images / "data.jsonl", tmp_path / "out.json", tmp_path / "whole.json"
    write_split(data, NAMES)
    command = on_split(run, data)
    assert run_cli([*command, str(whole)])[0] == 0
    partial = tmp_path / "out.json.partial.jsonl"
    with monkeypatch.context() as m:
        Batches(m, stop_after=1)
        assert run_cli([*command, str(out)])[0] != 0
    old_partial(partial)
    before = partial.read_bytes()

    write_split(data, NAMES[1:])  # red/0.png, captioned, left the split
    code, _, err = run_cli([*command, str(out)])
    assert code == 2 and "1 not in the split now (first: 'red/0.png')" in err and "--force" in err, err
    assert partial.read_bytes() == before and not out.exists()

    write_split(data, NAMES)
    counted = Batches(monkeypatch)
    code, _, err = run_cli([*command, str(out)])
    assert code == 0 and "did not record the images of the split" in err and "its 4 captions are resumed" in err, err
    assert counted.calls == 2 and out.read_bytes() == whole.read_bytes() and not partial.exists()


@pytest.mark.slow
def test_a_split_run_with_skip_bad_images_resumes(run, shapes, tmp_path, monkeypatch):
    # the header names the split's images, those --skip-bad-images leaves out too (read again when it resumes): the
    # same split resumes, to the bytes of a run never stopped
    images = tmp_path / "images"
    shutil.copytree(shapes["data"], images)
    (images / "bad.png").write_bytes(b"not a png")
    data, out, whole = images / "data.jsonl", tmp_path / "out.json", tmp_path / "whole.json"
    write_split(data, [*NAMES[:6], "bad.png", *NAMES[6:]])
    command = [*on_split(run, data), str(out), "--skip-bad-images"]
    with monkeypatch.context() as m:
        Batches(m, stop_after=1)
        code, _, err = run_cli(command)
    assert code != 0 and "4 image(s) captioned are kept" in err, err
    counted = Batches(monkeypatch)
    code, _, err = run_cli(command)
    assert code == 0 and "resuming from" in err and counted.calls == 2, err
    assert run_cli([*on_split(run, data), str(whole), "--skip-bad-images"])[0] == 0
    assert out.read_bytes() == whole.read_bytes() and not (tmp_path / "out.json.partial.jsonl").exists()


@pytest.mark.slow
def test_a_split_image_samples_the_same_whether_an_earlier_image_was_skipped(run, shapes, tmp_path, monkeypatch):
    # sampling's seeds follow an image's place in the split as the data set lists it, a skipped image counted (as
    # --images counts the files): mending a bad image (the same file, now decoding) changes no other image's caption,
    # and a run stopped after it captioned images behind the bad one resumes, once mended, to the bytes of a run over
    # the mended split. Seeds by place among the images kept would shift every image behind the bad one
    images = tmp_path / "images"
    shutil.copytree(shapes["data"], images)
    bad = images / "bad.png"
    bad.write_bytes(b"not a png")
    data, skipped, mended = images / "data.jsonl", tmp_path / "skipped.json", tmp_path / "mended.json"
    write_split(data, [*NAMES[:6], "bad.png", *NAMES[6:]])  # place 6: batches 0-3, 4 5 7 8, 9-12
    command = on_split(run, data)
    assert run_cli([*command, str(skipped), "--skip-bad-images"])[0] == 0
    out = tmp_path / "out.json"
    with monkeypatch.context() as m:  # stopped after two batches: the captions of places 7 and 8 kept
        Batches(m, stop_after=2)
        code, _, err = run_cli([*command, str(out), "--skip-bad-images"])
    assert code != 0 and "8 image(s) captioned are kept" in err, err

    bad.write_bytes((images / NAMES[0]).read_bytes())  # mended in place
    assert run_cli([*command, str(mended)])[0] == 0
    before, after = results(skipped), results(mended)
    assert set(after) - set(before) == {"bad.png"}
    assert before == {k: v for k, v in after.items() if k != "bad.png"}  # no other image's caption changed
    counted = Batches(monkeypatch)
    code, _, err = run_cli([*command, str(out)])
    assert code == 0 and "resuming from" in err and counted.calls == 2, err  # the mended image and places 9-12
    assert out.read_bytes() == mended.read_bytes() and not (tmp_path / "out.json.partial.jsonl").exists()


HEADER = {"decode": {"strategy": "greedy", "batch_size": 4}, "seed": 0}


def partial_file(path: Path, header: dict, *rows: dict) -> None:
    """A partial results file as finecap writes it: the header line, then ``rows``."""
    lines = [{"finecap": "finecap caption partial results", "header": header}, *rows]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_other_processes_files_are_moved_into_the_main_ones_once(tmp_path, caplog):
    # a launched run stopped: each process kept its part in its own file; the resumed run (here of one process)
    # reads them all, moves the others' lines into its own file (an image twice, the move killed before the removal:
    # once), with the batch size each was decoded at, and removes their files
    out = tmp_path / "out.json"
    partial_file(tmp_path / "out.json.partial.jsonl", HEADER, {"image": 0, "captions": ["a"]})
    at_8 = {**HEADER, "decode": {**HEADER["decode"], "batch_size": 8}}
    partial_file(tmp_path / "out.json.partial.1.jsonl", at_8, {"image": 0, "captions": ["a"]},
                 {"image": 5, "captions": ["b"]})  # fmt: skip
    partial_file(tmp_path / "out.json.partial.2.jsonl", HEADER, {"image": 9, "captions": ["c"], "batch_size": 2})
    partial = PartialResults(out, HEADER)
    with caplog.at_level(logging.INFO, logger="finecap.app.caption"):
        done = partial.open(force=False)
    partial.close()
    assert done == {0: ["a"], 5: ["b"], 9: ["c"]} and partial.kept == 3
    rows = [json.loads(line) for line in (tmp_path / "out.json.partial.jsonl").read_text().splitlines()[1:]]
    assert rows == [{"image": 0, "captions": ["a"]}, {"image": 5, "captions": ["b"], "batch_size": 8},
                    {"image": 9, "captions": ["c"], "batch_size": 2}]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json.partial.jsonl"]
    said = [r.getMessage() for r in caplog.records if "captions kept" in r.getMessage()]
    assert len(said) == 1 and "1 at decode.batch_size=2, 1 at decode.batch_size=4, 1 at decode.batch_size=8" in said[0]


def test_another_processes_file_made_otherwise_or_not_finecaps_is_refused_untouched(tmp_path):
    out, main = tmp_path / "out.json", tmp_path / "out.json.partial.jsonl"
    partial_file(main, HEADER, {"image": 0, "captions": ["a"]})
    other = tmp_path / "out.json.partial.1.jsonl"
    partial_file(other, {**HEADER, "seed": 1}, {"image": 5, "captions": ["b"]})
    before = main.read_bytes(), other.read_bytes()
    with pytest.raises(OutputRefused, match=f"{other}: the partial results of a stopped run made otherwise \\(seed"):
        PartialResults(out, HEADER).open(force=False)
    other.write_text('{"image": 5, "captions": ["mine"]}\n')
    for force in (False, True):
        with pytest.raises(OutputRefused, match=f"{other} exists and finecap did not write it"):
            PartialResults(out, HEADER).open(force=force)
    assert main.read_bytes() == before[0] and other.read_text() == '{"image": 5, "captions": ["mine"]}\n'
    assert not list(tmp_path.glob(".*"))  # the lock released


def test_a_process_file_the_main_process_did_not_see_is_left_as_it_is(tmp_path, caplog):
    # the main process found no file of process 1's name (another file system): one there all the same is not
    # written over; that process keeps nothing as it captions
    out, theirs = tmp_path / "out.json", tmp_path / "out.json.partial.1.jsonl"
    theirs.write_text("an earlier run's, on this machine's disk\n")
    partial = PartialResults(out, HEADER, rank=1)
    assert partial.start() is False and "the main process did not find it" in caplog.text
    assert partial.close(remove=True) == 0 and theirs.read_text() == "an earlier run's, on this machine's disk\n"
    mine = PartialResults(tmp_path / "mine.json", HEADER, rank=1)
    assert mine.start() is True
    mine.add({3: ["d"]})
    mine.close()
    lines = [json.loads(line) for line in (tmp_path / "mine.json.partial.1.jsonl").read_text().splitlines()]
    assert lines == [{"finecap": "finecap caption partial results", "header": HEADER}, {"image": 3, "captions": ["d"]}]


def test_a_partial_file_is_never_there_without_its_header(tmp_path, monkeypatch):
    # it was made empty and the header appended: a machine stopping before the system wrote the header back left an
    # empty file, which the next run refused as not finecap's. It is made with its header, written aside and renamed
    seen = []
    real = finecap.app.caption_partial.open_append

    def opening(path):
        seen.append(Path(path).read_text() if Path(path).exists() else None)
        return real(path)

    monkeypatch.setattr(finecap.app.caption_partial, "open_append", opening)
    partial = PartialResults(tmp_path / "out.json", HEADER)
    partial.open(force=False)
    partial.close()
    assert [json.loads(text) if text else text for text in seen] == [
        {"finecap": "finecap caption partial results", "header": HEADER}
    ]
