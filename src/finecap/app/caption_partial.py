"""The partial results files of a ``finecap caption`` run (docs/caption.md#a-stopped-run-resumes): the captions a
run makes, kept beside ``--out`` as they are made, so that a run stopped (Ctrl-C, a kill, out of memory, results that
could not be written) resumes from them, with any number of processes. :class:`PartialResults` writes, checks and
reads them (one file per process: :func:`partial_path`); :func:`kept_where` says where a stopped run's captions are
kept. :mod:`finecap.app.caption` (the command) makes the header they start with and calls them."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from finecap.locks import output_lock
from finecap.outputs import OutputRefused, strict_json
from finecap.utils.files import atomic_write_bytes, open_append, refuse_link, sync_to_disk

log = logging.getLogger("finecap.app.caption")  # the command's: its lines were logged there before they moved here

PARTIAL_SUFFIX = ".partial.jsonl"
"""What the partial results file of ``--out X`` is named: ``X.partial.jsonl`` beside it (docs/caption.md)."""

PROCESS_PARTIAL = ".partial.{rank}.jsonl"
"""What the partial results file of process ``rank`` (not the main one) of a run of several is named, beside ``--out``:
``X.partial.3.jsonl`` (:func:`partial_path`)."""

PARTIAL_MARK = "finecap caption partial results"
"""The ``finecap`` value of a partial results file's first line: how finecap knows the file is its own."""


LOCK_SUFFIX = ".caption.lock"
"""The lock file of ``--out X`` (:class:`PartialResults`), held while the run captions: ``.X.caption.lock`` beside
it, removed when the run ends (docs/caption.md#a-stopped-run-resumes)."""


def beside(out: str | Path, suffix: str) -> Path:
    """The file of ``out`` named with ``suffix`` after its whole name, in its folder: ``beside("results.json",
    PARTIAL_SUFFIX)`` is ``results.json.partial.jsonl`` (the partial results), with
    :data:`finecap.app.caption.SKIPPED_SUFFIX` the list of skipped images."""
    out = Path(out)
    return out.with_name(out.name + suffix)


def batch_size_of(header: dict) -> Any:
    """The ``decode.batch_size`` a partial file's ``header`` records (``None`` when it records none)."""
    return (header.get("decode") or {}).get("batch_size")


def batch_size_free(header: dict) -> dict:
    """``header`` without ``decode.batch_size``: what a resumed run must match. Each image is decoded alone (greedy,
    beam search and seeded sampling take nothing from the other images of a batch), so a run an out-of-memory kill
    stopped resumes at a smaller batch (docs/caption.md#a-stopped-run-resumes)."""
    if not isinstance(header.get("decode"), dict):
        return header
    return {**header, "decode": {k: v for k, v in header["decode"].items() if k != "batch_size"}}


def differences(old: object, new: object, where: str = "") -> list[str]:
    """What differs between two headers (JSON values), as ``key: OLD before, NEW now`` (nested keys dotted)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in differences(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))]  # fmt: skip
    return [] if old == new else [f"{where or 'header'}: {json.dumps(old)} before, {json.dumps(new)} now"]


def split_changes(lines: list[dict], places: dict[Any, int]) -> str:
    """What became of the images a split's partial file captioned (``lines``, each with its ``"place"`` then, the
    place of an earlier finecap's line unknown) in the split now (``places``: image id -> place), e.g. ``of the 4
    images captioned, 1 not in the split now (first: 'red/0.png'), 2 at another place (first: 'red/2.png', image 3
    before, 2 now)``.

    Example::

        >>> rows = [{"image": 7, "place": 0, "captions": []}, {"image": 8, "place": 1, "captions": []}]
        >>> print(split_changes(rows, {8: 1, 9: 0}))
        of the 2 images captioned, 1 not in the split now (first: 7)
        >>> print(split_changes(rows, {8: 0, 7: 1}))
        of the 2 images captioned, 2 at another place (first: 7, image 1 before, 2 now)
        >>> print(split_changes(rows, {7: 0, 8: 1, 9: 2}))
        of the 2 images captioned, every one at its place: the split's other images or files changed
    """
    captioned = [row for row in lines if "captions" in row]
    gone = [row["image"] for row in captioned if row["image"] not in places]
    moved = [(row["image"], row["place"]) for row in captioned
             if row["image"] in places and row.get("place", places[row["image"]]) != places[row["image"]]]  # fmt: skip
    said = [f"{len(gone)} not in the split now (first: {gone[0]!r})"] if gone else []
    if moved:
        first, place = moved[0]
        now = places[first] + 1
        said.append(f"{len(moved)} at another place (first: {first!r}, image {place + 1} before, {now} now)")
    if not said:
        said = ["every one at its place: the split's other images or files changed"]
    return f"of the {len(captioned)} images captioned, " + ", ".join(said)


class PartialResults:
    """The partial results files of a ``finecap caption`` run (docs/caption.md#a-stopped-run-resumes): strict JSON
    lines, the first ``{"finecap": PARTIAL_MARK, "header": HEADER}`` (what makes the captions), then one line per
    image captioned, ``{"image": KEY, "captions": [...]}``, appended and flushed per batch (with ``"batch_size"``
    when it was decoded at another ``decode.batch_size`` than the header's: a run resumed at another). ``KEY``: the
    image's index in the images named (``--images``) or its id (a split, whose lines also hold ``"place"``, the
    image's place in the split, which a refusal names when the split changed: :func:`split_changes`). An image left out
    (``--skip-bad-images``) has no line: a resumed run reads it again, as a run never stopped would (still bad, it is
    left out again, or without ``--skip-bad-images`` stops the run; mended, it is captioned). ``{"image": KEY,
    "skipped": REASON}`` lines, which an earlier finecap wrote for those, are read and passed over. The file is made
    with its header whole (written aside, then renamed into place), so a machine that stops never leaves it empty;
    the lines after are not synced one by one: a last line the crash cut short is dropped with a warning
    (:meth:`read`) and its images decoded again.

    Each process of a run keeps its own part as it makes it: ``rank`` 0 (the main process) in ``<out>.partial.jsonl``
    (:data:`PARTIAL_SUFFIX`), process ``r`` in ``<out>.partial.r.jsonl`` (:func:`partial_path`), made by
    :meth:`start` once the main process has opened its own.

    :meth:`open` (the main process) takes the lock of ``out`` (:func:`finecap.locks.output_lock`: a second run of the
    command while this one runs is refused, naming it, before it reads the files), then refuses a file of those names
    finecap did not write (with or without ``--force``), and one whose header is not ``header`` unless ``force`` (then
    every one is started over), ``decode.batch_size`` aside (:func:`batch_size_free`: resumed, with one warning naming
    the batch sizes the kept captions were decoded at); it moves the other processes' lines into its own file (an
    earlier run's, of any number of processes) and returns the images already captioned. A split's file whose header
    names no images (written before finecap recorded them: :func:`finecap.app.caption.listed_images`) but is
    ``header`` otherwise is resumed with a warning that the split could not be checked, unless an image it captioned
    is not in the split now (refused as another header).
    :meth:`close` closes the file (removed first when asked), then releases the lock. ``places``: a split's, each
    image id's place in it now (``None``: ``--images``, whose keys are places)."""

    def __init__(self, out: Path, header: dict, places: dict[Any, int] | None = None, rank: int = 0) -> None:
        self.out, self.path = out, partial_path(out, rank)
        self.header = json.loads(strict_json(header))  # as it reads back from the file
        self.places = places
        self.kept = 0
        self.batch_size = batch_size_of(self.header)  # what this run decodes at
        self.file_batch_size = self.batch_size  # what the file's header says: its lines without a batch_size's
        self.file: Any = None
        self.lock = contextlib.ExitStack()

    @staticmethod
    def read(path: Path) -> tuple[dict | None, list[dict], int]:
        """The header of the file ``path`` (``None``: not finecap's), its image lines, and the
        length of its whole lines: a last line cut short (no newline after it: a kill, or a machine that stopped
        before the system wrote the file's end, maybe as zero bytes) is left out."""
        data = path.read_bytes()
        lines, end, header = [], 0, None
        for number, raw in enumerate(data.split(b"\n"), 1):
            if end + len(raw) >= len(data):  # no newline after it: cut short when the run was killed
                break
            try:
                row = json.loads(raw)
            except ValueError:
                row = None
            if number == 1:
                if not (isinstance(row, dict) and row.get("finecap") == PARTIAL_MARK and "header" in row):
                    return None, [], 0
                header = row["header"]
            elif isinstance(row, dict) and "image" in row and ("captions" in row or "skipped" in row):
                lines.append(row)
            else:
                raise OutputRefused(f"{path}:{number}: not a line of captions finecap writes; move the file "
                                    "away (or remove it) to start over")  # fmt: skip
            end += len(raw) + 1
        return header, lines, end

    def open(self, force: bool) -> dict[Any, list[str]]:
        """Check the files (class docstring), open this one for appending (made with its header when new); the
        captions of the images they hold, ``{KEY: [caption, ...]}``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock.pop_all() as taken:  # released on an error here; else kept until close()
            taken.enter_context(output_lock(self.path.parent, name=f".{self.out.name}{LOCK_SUFFIX}",
                                            holder="finecap caption", log=log.warning, guards=self.out))  # fmt: skip
            done = self._open(force)
            self.lock = taken.pop_all()
        return done

    def _open(self, force: bool) -> dict[Any, list[str]]:
        files = [p for p in [self.path, *other_partials(self.out)] if p.exists() or p.is_symlink()]
        read: list[tuple[Path, dict, list[dict], int]] = []
        for path in files:  # every one finecap's and made as this run makes its captions, or none is touched
            refuse_link(path)
            header, lines, end = self.read(path) if path.is_file() else (None, [], 0)
            if header is None:
                raise OutputRefused(
                    f"--out: {path} exists and finecap did not write it (the partial results files of --out are "
                    f"named so); move it away, or choose another --out"
                )
            read.append((path, header, lines, end))
        captioned = len({row["image"] for _, _, lines, _ in read for row in lines if "captions" in row})
        if force and read:
            log.warning("caption: --force: starting over, %s and its %d captions discarded",
                        ", ".join(str(path) for path, *_ in read), captioned)  # fmt: skip
            for path, *_ in read:
                path.unlink()
            read = []
        for path, header, lines, _ in read:
            same = batch_size_free(header) == batch_size_free(self.header)
            if not same and not self.unlisted_split(path, header, lines):
                changed = differences(batch_size_free(header), batch_size_free(self.header))
                if self.places is not None and header.get("files") != self.header["files"]:
                    changed.append(split_changes(lines, self.places))
                raise OutputRefused(
                    f"{path}: the partial results of a stopped run made otherwise ("
                    + "; ".join(changed)
                    + f"): rerun it as it was to resume, or pass --force to start over (its {captioned} captions "
                    "discarded)"
                )
        kept: dict[Path, list[dict]] = {}  # each file's lines of captions, with the batch size each was decoded at
        for path, header, lines, end in read:
            if end < path.stat().st_size:
                log.warning("caption: %s: its last line was cut short (the run was killed, or the machine stopped, "
                            "while it was written): left out, its images are decoded again", path)  # fmt: skip
            size = batch_size_of(header)
            kept[path] = [{**row, "batch_size": row.get("batch_size", size)} for row in lines if "captions" in row]
            if path == self.path:
                os.truncate(self.path, end)  # a last line cut short
                self.file_batch_size = size
        if not self.path.exists():
            self.create(self.path)
        self.file = open_append(self.path)
        every = kept.get(self.path, [])  # then the other processes' lines: into this file, their files removed
        others = [path for path in kept if path != self.path]
        if others:
            seen, moved = {row["image"] for row in every}, []
            for row in (row for path in others for row in kept[path]):
                if row["image"] not in seen:  # a kill between the move and the removal: read twice, kept once
                    seen.add(row["image"])
                    moved.append(row)
            self.write(*map(self.line, moved))
            sync_to_disk(self.path)  # before the files they came from go
            for path in others:
                path.unlink()
            every = every + moved
        done = {row["image"]: row["captions"] for row in every}  # a skipped image: read again
        self.kept = len(done)
        if done:
            log.info("caption: resuming from %s: %d image(s) already captioned", self.path, len(done))
            self.say_batch_sizes([row["batch_size"] for row in every])
        return done

    def start(self) -> bool:
        """Make this process's own file (a process other than the main one, once the main one has opened its own:
        :meth:`open`, which found none of this name) and open it for appending; ``False`` when a file of its name
        is there all the same (the main process, on a file system this one does not share, could not see it): it is
        left as it is, and this process's captions are not kept as it makes them."""
        if self.path.exists() or self.path.is_symlink():
            log.warning("caption: %s is there, but the main process did not find it (is --out on a file system "
                        "every process shares?): left as it is; this process's captions are not kept as it makes "
                        "them", self.path)  # fmt: skip
            return False
        self.create(self.path)
        self.file = open_append(self.path)
        return True

    def create(self, path: Path) -> None:
        """Make the file ``path`` holding the header line alone, whole: written aside and renamed into place, synced
        (:func:`~finecap.utils.files.atomic_write_bytes`), so that a machine that stops never leaves it empty."""
        atomic_write_bytes(path, (strict_json({"finecap": PARTIAL_MARK, "header": self.header}, indent=None)
                                  + "\n").encode())  # fmt: skip

    def line(self, row: dict) -> dict:
        """``row`` (a kept line, with the batch size it was decoded at) as this file writes it: its batch size only
        when not the file's header's."""
        size = row["batch_size"]
        return {**{k: v for k, v in row.items() if k != "batch_size"},
                **({"batch_size": size} if size != self.file_batch_size else {})}  # fmt: skip

    def say_batch_sizes(self, kept: list[Any]) -> None:
        """Warn once when the kept captions (``kept``: the batch size each was decoded at) were decoded at another
        ``decode.batch_size`` than this run's."""
        sizes = Counter(kept)
        if set(sizes) <= {self.batch_size}:
            return
        said = ", ".join(f"{n} at decode.batch_size={size}" for size, n in sorted(sizes.items(), key=str))
        log.warning("caption: resuming %s: of the %d captions kept, %s were decoded; the rest are decoded at "
                    "decode.batch_size=%s. Each image is decoded alone (greedy, beam, seeded samples), but a batch's "
                    "shape changes the last digits of GPU arithmetic: the captions may differ from an uninterrupted "
                    "run's where the model's top tokens nearly tie", self.path, len(kept), said,
                    self.batch_size)  # fmt: skip

    def unlisted_split(self, path: Path, header: dict, lines: list[dict]) -> bool:
        """Whether ``header``, a split's written before finecap recorded its images (no ``"files"``), is this run's
        otherwise and every image its ``lines`` captioned is in the split now: resumed, with a warning that the
        split's images could not be checked (docs/caption.md#a-stopped-run-resumes)."""
        if self.places is None or "files" in header:
            return False
        listed = {k: v for k, v in self.header.items() if k not in ("images", "files")}
        if batch_size_free(header) != batch_size_free(listed):
            return False
        if any(row["image"] not in self.places for row in lines if "captions" in row):
            return False
        log.warning("caption: %s was written by a finecap that did not record the images of the split, so they are "
                    "not checked: its %d captions are resumed as they are; if the data set (or its images) changed "
                    "since the run stopped, pass --force to start over", path,
                    sum("captions" in row for row in lines))  # fmt: skip
        return True

    def write(self, *rows: dict) -> None:
        self.file.write("".join(strict_json(row, indent=None) + "\n" for row in rows))
        self.file.flush()

    def add(self, made: dict[Any, list[str]]) -> None:
        """Append a batch's captions, ``{KEY: [caption, ...]}``."""
        where = (lambda k: {"place": self.places[k]}) if self.places is not None else (lambda k: {})
        size = {"batch_size": self.batch_size} if self.batch_size != self.file_batch_size else {}
        self.write(*({"image": k, **where(k), "captions": caps, **size} for k, caps in made.items()))
        self.kept += len(made)

    def elsewhere(self, processes: int) -> str:
        """How to write the results elsewhere without decoding the captions kept again, as the error of results that
        could not be written says it (:func:`finecap.errors.elsewhere_by`): another ``--out NEW`` resumes from
        ``NEW.partial.jsonl`` (and, of several processes, ``NEW.partial.<rank>.jsonl``) alone, so these files are
        copied there first; ``processes``: the run's number of processes."""
        new = Path("NEW")
        if processes > 1 and other_partials(self.out):
            return (f"write elsewhere (--out NEW), after copying {self.path} and each "
                    f"{partial_path(self.out, '<rank>')} to {partial_path(new)} and {partial_path(new, '<rank>')} "
                    "beside it, to keep their captions")  # fmt: skip
        return (
            f"write elsewhere (--out NEW), after copying {self.path} to {partial_path(new)} beside it, to keep its "
            "captions"
        )

    def close(self, remove: bool = False) -> int:
        """Close the file (and remove it when ``remove``), then release the lock; the number of images it holds."""
        if self.file is not None:
            self.file.close()
            if remove:
                self.path.unlink(missing_ok=True)
        self.lock.close()
        return self.kept


def kept_where(partial: PartialResults, processes: int) -> str:
    """Where the captions of a stopped run are kept, as the main process says it (``partial``: its own file): ``4
    image(s) captioned are kept in X``; of several processes, every process's part, the other processes' as their
    files hold them now (:func:`images_kept`), whether the main process kept any or not: ``8 image(s) captioned are
    kept: 4 in X (the main process's) and 4 in X.partial.<rank>.jsonl (1 other process's)``. ``""`` when no
    process kept any."""
    if processes == 1:
        return f"{partial.kept} image(s) captioned are kept in {partial.path}" if partial.kept else ""
    theirs = [n for n in map(images_kept, other_partials(partial.out)) if n]
    parts = [f"{partial.kept} in {partial.path} (the main process's)"] if partial.kept else []
    if theirs:
        whose = "1 other process's" if len(theirs) == 1 else f"{len(theirs)} other processes'"
        parts.append(f"{sum(theirs)} in {partial_path(partial.out, '<rank>')} ({whose})")
    return f"{partial.kept + sum(theirs)} image(s) captioned are kept: {' and '.join(parts)}" if parts else ""


def images_kept(path: Path) -> int:
    """The number of images whose captions the partial results file ``path`` holds now (0 when it is not one
    finecap wrote, or cannot be read: what a stopped run says, never a reason to fail)."""
    try:
        header, lines, _ = PartialResults.read(path)
    except (OSError, OutputRefused):
        return 0
    return len({row["image"] for row in lines if "captions" in row}) if header is not None else 0


def partial_path(out: Path, rank: int | str = 0) -> Path:
    """The partial results file of process ``rank`` for ``--out out``: ``results.json.partial.jsonl`` for the main
    process (:data:`PARTIAL_SUFFIX`), ``results.json.partial.3.jsonl`` for process 3 (:data:`PROCESS_PARTIAL`)."""
    return beside(out, PARTIAL_SUFFIX if rank == 0 else PROCESS_PARTIAL.format(rank=rank))


def other_partials(out: Path) -> list[Path]:
    """The partial results files of processes other than the main one beside ``out`` (:func:`partial_path`), by
    rank: those of the run now, or of an earlier run of any number of processes."""
    pattern = re.compile(re.escape(out.name) + r"\.partial\.([1-9][0-9]*)\.jsonl")
    try:
        found = [(int(m.group(1)), p) for p in out.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    except FileNotFoundError:
        return []
    return [p for _, p in sorted(found)]
