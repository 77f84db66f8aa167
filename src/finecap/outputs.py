"""Where a command may write: never through a symbolic link, never over one of its own inputs, never over a file
finecap did not make (unless the user passes ``--force``).

Three checks, used by every writer and every command that takes an output path:

- :func:`refuse_link`: a symbolic link where finecap is about to write (planted in a run folder someone shared:
  links survive ``tar xf``) is refused with an error naming the link and its target; it is never written through.
  The atomic writers (:func:`finecap.utils.files.atomic_write_bytes`, :func:`finecap.utils.folders.atomic_replace_dir`,
  :func:`finecap.utils.files.open_append`) call it.
- :func:`check_not_input`: a command resolves its outputs and its inputs to real paths (links and ``..`` followed,
  hard links compared by inode) and refuses an output that is one of its inputs, with or without ``--force``; and
  :func:`check_not_among` refuses one that is a file its data set names (an image beside the references file).
- :func:`check_replaceable`: an output file that already exists is replaced only when finecap made it: its content
  was recorded by :func:`remember` when finecap wrote it as an output of the same kind (:data:`KINDS`; a SHA-256 of
  the bytes, kept in ``<finecap home>/made/``: recognised by content, never by name), or the command's own test of
  the content says so (a run's ``config.yaml``). Any other file needs ``--force``: a file finecap wrote and the user
  then edited (a report page touched up by hand) is the user's.

A long command also calls :func:`check_writable` first, so that an output no file can be written at is refused
before its work, not after.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "preds.json").write_text("[]")
    >>> check_not_input(d / "preds.json", {"--predictions": d / "preds.json"}, option="--out")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    finecap.utils.files.OutputRefused: --out: .../preds.json is also the command's --predictions; ...
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from finecap.utils.files import (
    TEMPORARY_SUFFIX,
    OutputRefused,
    atomic_write_bytes,
    refuse_link,
    strict_json,
    temporary_prefix,
)

__all__ = [
    "OutputRefused",
    "check_not_among",
    "check_not_input",
    "check_output_file",
    "check_replaceable",
    "made_by_finecap",
    "refuse_link",
    "remember",
    "write_output",
    "strict_json",
    "write_output_json",
]

log = logging.getLogger(__name__)

MADE_DIR = "made"
"""Folder of the finecap home holding one file per output finecap wrote and its kind, ``<SHA-256>.<kind>``
(:func:`remember`); an earlier finecap's record, a file ``<SHA-256>`` holding one kind, is still read."""


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same real path, or (both existing) the same inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_not_input(out: str | Path, inputs: Mapping[str, str | Path | None], *, option: str) -> None:
    """:class:`OutputRefused` when ``out`` is one of ``inputs`` (``{what: path}``, e.g. ``{"--predictions": p}``;
    ``None`` entries skipped) or lies inside an input that is a folder (a world, a data set folder)."""
    out = Path(out)
    for what, path in inputs.items():
        if path is None or str(path) == "":
            continue
        path = Path(path)
        if _same(out, path):
            raise OutputRefused(
                f"{option}: {out} is also the command's {what}; writing it would destroy the input: choose another "
                f"{option}"
            )
        if path.is_dir() and Path(os.path.realpath(out)).is_relative_to(os.path.realpath(path)):
            raise OutputRefused(
                f"{option}: {out} lies inside the command's {what} ({path}), which it reads: choose another {option}"
            )


def check_not_among(out: str | Path, files: Iterable[str | Path], *, what: str, option: str) -> None:
    """:class:`OutputRefused` when ``out`` is an existing file that is one of ``files`` (``what`` they are: ``"an
    image of --references"``), by inode: links, ``..`` and hard links included. The check for the many files a data
    set names (its images, which may lie beside its file rather than in a folder :func:`check_not_input` is given):
    one ``stat`` each, and none when ``out`` does not exist (a file that is not there is none of them)."""
    try:
        mine = os.stat(out)
    except OSError:
        return
    for path in files:
        try:
            theirs = os.stat(path)
        except OSError:  # a file not there (or not readable) is not the output
            continue
        if os.path.samestat(mine, theirs):
            raise OutputRefused(f"{option}: {out} is also {what} ({path}); writing it would destroy the input: "
                                f"choose another {option}")  # fmt: skip


KINDS = (
    "results",
    "scores",
    "per-image",
    "bags",
    "report",
    "config",
    "probe",
    "questions",
    "plot",
    "plot-list",
    "bag-outcomes",
    "skipped",
)
"""What an output file is, as :func:`remember` records it: COCO results (``caption``, the demo's captions), scores
and per-image scores (``eval``), a bags file, a report page, a run's stored configuration, a retriever probe, a
questions file (``finecap questions make``), a report's plot (``<run>/plots/*.png``) and the list of the plots it wrote
there (:mod:`finecap.report.plot_files`), bag outcomes
(``<run>/bag_outcomes.json``) or the list of images ``caption --skip-bad-images`` left out (``<out>.skipped.json``). A
command replaces without ``--force`` only a file of its own kind: ``caption --out RUN/config.yaml`` is refused."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str | None:
    """The SHA-256 of a regular file, read in chunks (``None`` for anything else: a FIFO or a device is never read)."""
    try:
        if not path.is_file():
            return None
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def _made_dir() -> Path:
    from finecap.home import home

    return home() / MADE_DIR


def remember(data: bytes, kind: str) -> None:
    """Record that finecap wrote a file of ``kind`` (:data:`KINDS`) holding ``data``, so that an ``--out`` of that
    kind naming it later may replace it. Best effort: an unwritable finecap home costs only that (a warning), as
    the output itself is already written. Each (content, kind) has a file of its own, written atomically: two
    processes recording the same bytes as two kinds keep both, and a kill or a full disk leaves no half record."""
    try:
        atomic_write_bytes(_record(digest(data), kind), kind.encode())
    except (OSError, OutputRefused) as e:  # OutputRefused: a link planted at the record, never written through
        log.warning("finecap could not record that it wrote this output (%s); naming it as --out again will need "
                    "--force", e)  # fmt: skip


def made_by_finecap(path: str | Path, kinds: Iterable[str] = KINDS) -> bool:
    """Whether ``path`` is a regular file holding exactly what finecap once wrote as one of ``kinds``
    (:func:`remember`)."""
    found = file_digest(Path(path))
    return found is not None and recorded_as(found, kinds)


def recorded_as(sha256: str, kinds: Iterable[str] = KINDS) -> bool:
    """Whether finecap recorded writing bytes of SHA-256 ``sha256`` as one of ``kinds`` (:func:`remember`): for a
    caller that has the file's digest already (:func:`made_by_finecap` reads the file for it)."""
    kinds = set(kinds)
    if any(_record(sha256, kind).is_file() for kind in kinds):
        return True
    try:  # an earlier finecap's record: one file per SHA-256, holding one kind
        return (_made_dir() / sha256).read_text().strip() in kinds
    except OSError:
        return False


def _record(sha256: str, kind: str) -> Path:
    """The file recording that finecap wrote bytes of SHA-256 ``sha256`` as ``kind`` (:func:`remember`)."""
    return _made_dir() / f"{sha256}.{kind}"


def write_output(path: str | Path, data: bytes | str, kind: str) -> None:
    """Write a command's output file of ``kind`` (``str``: UTF-8) atomically, never through a link, and
    :func:`remember` it as finecap's."""
    data = data.encode("utf-8") if isinstance(data, str) else data
    atomic_write_bytes(path, data)
    remember(data, kind)


def write_output_json(path: str | Path, obj: Any, kind: str, indent: int | None = 2) -> None:
    """:func:`write_output` of ``obj`` as strict JSON (:func:`strict_json`, plus a final newline)."""
    write_output(path, strict_json(obj, indent=indent) + "\n", kind)


def check_replaceable(
    out: str | Path,
    *,
    force: bool,
    option: str,
    kind: str,
    ours: Callable[[Path], bool] | None = None,
    force_flag: str | None = "--force",
    advice: str | None = None,
) -> None:
    """:class:`OutputRefused` when ``out`` exists and may not be replaced: a link (always); anything but a regular
    file; a file that is not finecap's output of ``kind`` (:func:`made_by_finecap`, or ``ours(out)``), unless
    ``force``. ``force_flag``: how the user asks for it (``None``: the command has no such option). ``advice``: what
    that last refusal says to do instead, naming the file alone, for a caller whose options are not the command's
    (the demo's report stage: :func:`finecap.app.demo.write_demo_report`)."""
    out = Path(out)
    refuse_link(out)
    if not out.exists():
        return
    if out.is_dir():
        raise OutputRefused(f"{option}: {out}: is a directory, but a file is expected here (name a file)")
    if not out.is_file():
        raise OutputRefused(f"{option}: {out}: is not a regular file (a pipe or a device?); name a file")
    if force or made_by_finecap(out, (kind,)) or (ours is not None and ours(out)):
        return
    if advice is not None:
        raise OutputRefused(
            f"{out} exists and finecap did not make it as a {kind} file (or it was changed since); {advice}"
        )
    how = (
        f"pass {force_flag} to replace it, or choose another {option}"
        if force_flag
        else (f"move it away, or choose another {option}")
    )
    raise OutputRefused(
        f"{option}: {out} exists and finecap did not make it as a {kind} file (or it was changed since); {how}"
    )


def check_writable(out: str | Path, *, option: str = "--out") -> None:
    """:class:`OutputRefused` when a file cannot be written at ``out``, said before a long command's work rather than
    after it (``finecap caption`` of 100,000 images): the nearest folder of ``out`` that exists must be a folder
    in which a file can be made, which is tried (a temporary file, removed at once; no folder is made). A typo
    through a file (``results.json/out.json``), a read-only file system, a folder of another user."""
    out = Path(out).absolute()
    where = out.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise OutputRefused(f"{option}: {out}: {where} is not a folder; choose another {option}")
    try:
        fd, tmp = tempfile.mkstemp(dir=where, prefix=temporary_prefix(out.name), suffix=TEMPORARY_SUFFIX)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise OutputRefused(
            f"{option}: {out}: cannot write in {where} ({(e.strerror or str(e)).lower()}); choose another {option}"
        ) from None


def check_output_file(
    out: str | Path,
    inputs: Mapping[str, str | Path | None],
    *,
    force: bool,
    kind: str,
    option: str = "--out",
    ours: Callable[[Path], bool] | None = None,
    force_flag: str | None = "--force",
    advice: str | None = None,
) -> Path:
    """Both checks for one output file of a command (:func:`check_not_input`, then :func:`check_replaceable`);
    returns ``out`` as a path."""
    check_not_input(out, inputs, option=option)
    check_replaceable(out, force=force, option=option, kind=kind, ours=ours, force_flag=force_flag, advice=advice)
    return Path(out)


def check_outputs(
    outs: Iterable[tuple[str, str | Path | None, str]], inputs: Mapping[str, str | Path | None], *, force: bool
) -> None:
    """:func:`check_output_file` for each ``(option, path, kind)`` of ``outs`` (no path: skipped), and two outputs
    that name one file refused, saying so (``--out and --per-image are the same file (s.json); name two files``)."""
    named = [(option, Path(path), kind) for option, path, kind in outs if path]
    for i, (option, path, _) in enumerate(named):
        for other, other_path, _ in named[:i]:
            if _same(path, other_path):
                raise OutputRefused(f"{other} and {option} are the same file ({path}); name two files")
    for option, path, kind in named:
        check_output_file(path, inputs, force=force, option=option, kind=kind)
