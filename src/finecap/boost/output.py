"""Writing a boosted data set in the format it was read in (``finecap boost --out DIR``).

Every image keeps its record and gains ``"boost": {"original": [...], "<step>": [...], ...}`` (all caption fields
computed, each a list; a failed step holds the human captions); its ordinary captions become those of
``boost.mode``. :func:`finecap.data.caption_fields.select_captions` (``data.captions``, ``bags.text_from``) reads the
fields back.

- ``world``: ``DIR/dataset.json`` (Karpathy layout), with ``scenes.jsonl``, ``dense.json`` and ``world.json`` copied
  and ``DIR/images`` a symbolic link to the source images, so ``DIR`` is a world folder for every command;
- ``karpathy``: ``DIR/<file name>`` with ``sentences`` replaced (``raw``, and ``tokens`` made as Karpathy's:
  lower-cased, punctuation removed, :func:`finecap.utils.text.karpathy_tokens`);
- ``coco``: ``DIR/<file name>`` with ``annotations`` replaced (one per caption, renumbered, in the order the images
  were read) and the source's kept as ``original_annotations`` (a file boosted again keeps the first source's);
  images without a caption annotation are left as they are (they were not read, so not boosted). A file without an
  ``images`` list gains one, ``{"id", "boost"}`` per image of the annotations in the order read (no ``file_name``, as
  the source had none), so that its boost fields are read back;
- ``jsonl``: ``DIR/<file name>`` with ``captions`` replaced and image paths made absolute (links kept, not
  resolved to their targets); a line without ``id`` gains the one it was read with (the image path as written), so
  the ids stay the source's.

Karpathy, world and JSONL files are read again to be written, entry by entry beside the records boosted: an entry
whose id or image file is not its record's (the file changed during the run) is refused, naming the file and the
entry, and nothing is written.

Karpathy and COCO files name images relative to an image root: read them with ``data.images`` set to the source
root (the default, the file's folder, is now ``DIR``). Read a boosted JSONL the same way: its image paths are
absolute, outside ``DIR``, and a data set names only files inside its image folder (``data.allow_outside_paths``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finecap.data.json_files import json_lines
from finecap.data.records import Record
from finecap.utils.files import (
    atomic_write_bytes,
    atomic_write_text,
    refuse_link,
    replace_durably,
    strict_json,
    write_json,
)
from finecap.utils.reading import DATA_FILE, jsonl_rows_are, read_bounded, read_json, unfinished_line
from finecap.utils.text import karpathy_tokens
from finecap.world.make import content_hashes

WRITABLE = ("world", "karpathy", "coco", "jsonl")
"""Formats :func:`write_boosted` writes (``data.format``); a Hugging Face data set is boosted after exporting it."""


def check_writable(fmt: str) -> None:
    """``ValueError`` naming ``data.format`` unless :func:`write_boosted` can write ``fmt``."""
    if fmt not in WRITABLE:
        raise ValueError(f"data.format={fmt}: finecap boost writes {', '.join(WRITABLE)} only")


BOOST_FILES = ("boost.json", "cache.jsonl", "failures.jsonl")
"""Files ``finecap boost`` keeps in its output folder besides the data set (and the lock while it runs)."""


def dataset_file(fmt: str, source: str | Path) -> Path:
    """The data set file of ``source`` (a world folder's ``dataset.json``)."""
    source = Path(source)
    return source / "dataset.json" if fmt == "world" and source.is_dir() else source


def output_paths(fmt: str, source: str | Path, out_dir: str | Path) -> list[Path]:
    """Every path :func:`finecap.app.boost.main` writes into ``out_dir`` for a data set ``source`` in ``fmt``."""
    source, out_dir = dataset_file(fmt, source), Path(out_dir)
    paths = [out_dir / source.name, *(out_dir / name for name in BOOST_FILES)]
    if fmt == "world":
        paths += [out_dir / name for name in ("scenes.jsonl", "dense.json", "world.json", "images")]
    return paths


JSONL_KEYS = {"cache.jsonl": {"key", "step", "image_id", "answer"}, "failures.jsonl": {"image_id", "step", "error"}}
"""The keys of every line of the two JSONL files a boost run writes (:class:`finecap.boost.engine.AnswerCache`, the
failures list)."""


CUT_LINE_START = {"cache.jsonl": b'{"key": "'}
"""How a line of boost's JSONL files that a kill may cut begins (:meth:`finecap.boost.engine.AnswerCache.put`'s
``json.dumps``); ``failures.jsonl`` is written whole (atomically), so none of its lines is ever cut."""


def is_boost_file(path: Path) -> bool:
    """Whether ``path`` (one of :data:`BOOST_FILES`) reads as what finecap boost writes there, by content: a
    ``boost.json`` summary (``status``, ``mode``, ``source``), or JSONL lines with :data:`JSONL_KEYS`, of which only
    ``cache.jsonl``'s last may be cut by a kill, and then begins as its lines do (:data:`CUT_LINE_START`). A file of
    that name with other content is the user's (a line of text without a newline too: boost would append to it or
    replace it); so is one too large to be finecap's (:data:`~finecap.utils.reading.METADATA` for the summary,
    :data:`~finecap.utils.reading.DATA_FILE` for the logs)."""
    try:
        if path.name == "boost.json":
            summary = read_json(path)
            return isinstance(summary, dict) and {"status", "mode", "source"} <= set(summary)
        cut, start = unfinished_line(path), CUT_LINE_START.get(path.name, b"")  # bytes: a kill may cut a character
        if cut and not (start and (cut.startswith(start) or start.startswith(cut))):
            return False
        return jsonl_rows_are(path, lambda row: isinstance(row, dict) and JSONL_KEYS[path.name] <= set(row))
    except (OSError, ValueError):
        return False


def check_outputs(fmt: str, source: str | Path, out_dir: str | Path, images: str | Path | None = None) -> None:
    """Check, writing nothing, that boosting ``source`` into ``out_dir`` is safe; ``ValueError`` naming the path
    otherwise. Refused: an output folder equal to or inside the source's folder (or the image root ``images``), a
    folder holding files but none of a boost run, an output path that is a folder, an unwritable folder."""
    from finecap.locks import LOCK_NAME

    check_writable(fmt)
    source, out_dir = dataset_file(fmt, source), Path(out_dir)
    if source.name in BOOST_FILES:  # the boosted copy keeps the source's name: boost's own file would replace it
        raise ValueError(f"{source}: a data set named {source.name} would be written over by finecap boost's own "
                         f"{source.name} in --out; copy or rename it")  # fmt: skip
    out = out_dir.resolve()
    for folder, what in ((source.parent, "the source data set's folder"), (images, "the image folder (data.images)")):
        if folder is None or str(folder) == "":
            continue
        folder = Path(folder).resolve()
        if out == folder or folder in out.parents:
            raise ValueError(
                f"--out {out_dir}: inside {what} {folder}; finecap boost never writes into its source data: choose "
                "a folder outside it"
            )
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ValueError(f"--out {out_dir}: exists and is not a folder")
        for path in output_paths(fmt, source, out_dir):
            if not (path.name == "images" and fmt == "world"):  # the one link boost makes itself (to the images)
                refuse_link(path)  # before the first request, not after every answer was paid for
        names = {p.name for p in out_dir.iterdir()} - {LOCK_NAME}
        foreign = [out_dir / n for n in sorted(names & set(BOOST_FILES))
                   if (out_dir / n).is_file() and not is_boost_file(out_dir / n)]  # fmt: skip
        if foreign:
            raise ValueError(
                f"--out {out_dir}: {', '.join(map(str, foreign))} is not finecap boost's (recognised by content, not "
                "by name); finecap boost writes into an empty or new folder, or one it wrote before"
            )
        if names and not names & set(BOOST_FILES):
            raise ValueError(
                f"--out {out_dir}: the folder holds files but no finecap boost output ({', '.join(BOOST_FILES)}); "
                "finecap boost writes into an empty or new folder, or one it wrote before"
            )
    for path in output_paths(fmt, source, out_dir):
        if path.name == "images" and fmt == "world":
            if path.exists() and not path.is_symlink():  # boost makes a link there; a real folder is someone's
                raise ValueError(f"--out {out_dir}: {path} is a folder, not the link to the images boost makes")
        elif path.is_dir():
            raise ValueError(f"--out {out_dir}: {path} is a folder; finecap boost would write a file there")
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out_dir}: {existing} is not a writable folder")


def link_images(link: Path, images: Path) -> None:
    """``link`` -> ``images``: the boosted world's images are the source world's. A link left by an earlier run into
    the same folder that points elsewhere (another world boosted there; a world since deleted) is replaced, at once
    (a new link renamed over it, durably: :func:`~finecap.utils.files.replace_durably`): its images would be another
    world's under the same file names."""
    if link.is_symlink() and Path(os.readlink(link)) == images:
        return
    for attempt in itertools.count():  # a name nothing holds: whatever is there (a user's file) is never touched
        fresh = link.with_name(f".{link.name}.{os.getpid()}{f'.{attempt}' if attempt else ''}.tmp")
        try:
            os.symlink(images, fresh, target_is_directory=True)  # fails on an existing name, never replaces it
            break
        except FileExistsError:
            continue
    try:
        replace_durably(fresh, link)  # replaces a link, never a folder (check_outputs refuses a real folder there)
    except BaseException:
        fresh.unlink(missing_ok=True)  # the link made just above
        raise


def _check_aligned(n_raw: int, records: Sequence[Record], path: Path) -> None:
    if n_raw != len(records):
        raise ValueError(f"{path}: {n_raw} entries in the file but {len(records)} records were read; file changed?")


def _check_entry(i: int, image_id: Any, file: str, record: Record, path: Path) -> None:
    """``ValueError`` naming ``path`` unless entry ``i`` of the source, read again to be written (id ``image_id``,
    image ``file`` as written), is the image ``record`` that was boosted: a source changed during the run would give
    an image another's captions."""
    parts = Path(file).parts
    if image_id == record.image_id and Path(record.path).parts[-len(parts) :] == parts:
        return
    raise ValueError(
        f"{path}: changed while boost ran: entry {i} is now image {image_id!r} ({file}), but image "
        f"{record.image_id!r} ({record.path}) was boosted there; re-run with the same --out to boost the file as it "
        "is now (answers already given come from the cache)"
    )


def write_boosted(
    fmt: str,
    source: str | Path,
    out_dir: str | Path,
    records: Sequence[Record],
    fields: Sequence[dict[str, list[str]]],
    mode: str,
) -> Path:
    """Write the boosted data set; returns the file written (the world's ``dataset.json``)."""
    check_outputs(fmt, source, out_dir)
    source, out_dir = dataset_file(fmt, source), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / source.name
    if fmt in ("world", "karpathy"):
        raw = read_json(source, DATA_FILE)
        _check_aligned(len(raw["images"]), records, source)
        for i, (img, r) in enumerate(zip(raw["images"], records)):  # ids and files as the Karpathy reader reads them
            image_id = img["cocoid"] if "cocoid" in img else img.get("imgid", i)
            _check_entry(i, image_id, os.path.join(img.get("filepath", ""), img.get("filename", "")), r, source)
        for img, f in zip(raw["images"], fields):
            img["sentences"] = [{"raw": c, "tokens": karpathy_tokens(c)} for c in f[mode]]
            img["boost"] = f
        write_json(out, raw, indent=None)
        if fmt == "world":
            for name in ("scenes.jsonl", "dense.json"):
                if (source.parent / name).exists():
                    atomic_write_bytes(out_dir / name, read_bounded(source.parent / name, DATA_FILE))
            if (source.parent / "world.json").exists():  # the copy's own content hashes: its captions are boosted
                meta = read_json(source.parent / "world.json")
                write_json(out_dir / "world.json", {**meta, "sha256": content_hashes(out_dir)})
            link_images(out_dir / "images", (source.parent / "images").resolve())
    elif fmt == "coco":
        raw = read_json(source, DATA_FILE)
        by_id = dict(zip((r.image_id for r in records), fields, strict=True))
        annotations: list[dict[str, Any]] = []
        if "images" not in raw:  # the images were those of the annotations: listed, to carry their boost fields
            raw["images"] = [{"id": image_id} for image_id in by_id]
        for img in raw["images"]:  # images without a caption were not read: they stay as they are
            if img["id"] in by_id:
                img["boost"] = by_id[img["id"]]
        for image_id, f in by_id.items():
            annotations += [{"id": len(annotations) + 1, "image_id": image_id, "caption": c} for c in f[mode]]
        raw.setdefault("original_annotations", raw["annotations"])  # boosted again: the first source's are kept
        raw["annotations"] = annotations
        write_json(out, raw, indent=None)
    elif fmt == "jsonl":
        lines = [record for _, record in json_lines(source)]  # as the reader read them
        _check_aligned(len(lines), records, source)
        for i, (row, r) in enumerate(zip(lines, records)):  # the ids and files as the JSONL reader reads them
            _check_entry(i, row.get("id", row.get("image")), str(row.get("image", "")), r, source)
        rows = []
        for row, r, f in zip(lines, records, fields):
            row.setdefault("id", r.image_id)  # the image path as written: the ids stay those of the source
            row["image"] = str(Path(r.path).absolute())  # the path the source names: a link kept, not its target
            row["captions"] = f[mode]
            row["boost"] = f
            rows.append(strict_json(row, indent=None))
        atomic_write_text(out, "\n".join(rows) + "\n")
    else:
        check_writable(fmt)
    return out
