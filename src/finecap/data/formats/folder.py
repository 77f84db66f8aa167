"""``data.format=folder``: a folder of images, with their captions beside them or none.

The images: every file under the folder whose name ends in one of :data:`~finecap.data.images.IMAGE_SUFFIXES` (any
case; recursive, linked folders followed once, hidden files and folders skipped: :func:`folder_images`). Their
captions come from one of: a sidecar ``captions.jsonl`` (``{"image": relative path, "captions": [...], "split"?}``
per line), a sidecar ``captions.csv`` (``image,caption[,split]`` header, one row per caption, several rows per
image), or a ``.txt`` file next to each image (``cat.jpg`` + ``cat.txt``, its suffix in any case as an image's:
``cat.TXT``; one caption per line: :func:`caption_txts`); or none. The image id is the image's path relative to the
folder, with ``/`` (``"cats/001.jpg"``). Images without captions are records with an empty caption list
(captioning reads them; training and evaluation refuse them, :func:`finecap.data.references.require_captions`). The
folder is its own image root; every file read, caption files too, must lie inside it
(:class:`~finecap.data.containment.ImageFolder`). A caption ``.txt`` is read within
:data:`~finecap.utils.reading.CAPTION_TEXT` (1 MiB).

Detected: a folder holding an image file, at any depth (not hidden). Not cached by modification time (a folder
changes below its own). Fingerprint: its images' relative paths and sizes, and the SHA-256 of its caption files.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finecap.data.containment import ImageFolder
from finecap.data.formats import DataSource, Format
from finecap.data.hashing import sha256_files
from finecap.data.images import IMAGE_SUFFIXES, UNREAD_IMAGE_SUFFIXES
from finecap.data.json_files import json_lines
from finecap.data.records import (
    MAX_LISTED,
    NO_SPLIT,
    DataError,
    Record,
    SplitKeys,
    check_image_path,
    clean_captions,
    clean_text,
    other_normalisation,
    require,
)
from finecap.utils.reading import CAPTION_TEXT, read_bounded, read_lines
from finecap.utils.text import one_line, short_repr

log = logging.getLogger(__name__)

CAPTION_FILES = ("captions.jsonl", "captions.csv")
"""The sidecar caption files a ``folder`` data set may hold at its top (:func:`read_folder`; at most one)."""


def _walk_error(error: OSError) -> None:
    raise DataError(f"{error.filename}: cannot list the folder ({(error.strerror or one_line(error)).lower()})")


def folder_images(root: str | Path, say_unread: bool = False) -> list[str]:
    """The image files under ``root`` (:data:`~finecap.data.images.IMAGE_SUFFIXES`, any case), as sorted paths
    relative to ``root`` with ``/``: every subfolder, linked ones too (each real folder once), but hidden files and
    folders (``.name``: ``.git``, macOS ``._photo.jpg`` files) skipped. A folder that cannot be listed, and an image
    whose path is not UTF-8 (:func:`utf8_name`), are a :class:`DataError` naming it. ``say_unread``: a warning
    names the images in a format finecap does not decode (:data:`~finecap.data.images.UNREAD_IMAGE_SUFFIXES`: HEIC,
    raw...), left out."""
    found, unread = [], []
    seen: set[str] = set()
    for dirpath, dirs, files in os.walk(root, onerror=_walk_error, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link back up, or a second link to one folder
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = Path(os.path.relpath(dirpath, root)).as_posix()
        for name in files:
            if not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES):
                found.append(utf8_name(name if rel == "." else f"{rel}/{name}", root))
            elif say_unread and not name.startswith(".") and name.lower().endswith(UNREAD_IMAGE_SUFFIXES):
                unread.append(name if rel == "." else f"{rel}/{name}")
    if unread:
        kinds = sorted({Path(name).suffix.lower() for name in unread})
        more = len(unread) - MAX_LISTED
        shown = ", ".join(sorted(unread)[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")
        log.warning("%s: %d image file(s) left out, in a format finecap does not decode (%s): %s; convert them to "
                    "JPEG or PNG to use them", root, len(unread), " ".join(kinds), shown)  # fmt: skip
    return sorted(found)


def utf8_name(name: str, folder: str | Path) -> str:
    """``name`` (an image's path under ``folder``, as :func:`os.listdir` gives it) when it is UTF-8; a name of other
    bytes (``caf\\xe9.jpg`` written in Latin-1; Python holds such bytes as lone surrogates) is a :class:`DataError`
    naming the file with its bytes escaped and saying to rename it: its image id would be no text a JSON file holds
    (or a JSON reader other than Python's reads), and the image could not be split by its id's hash."""
    try:
        name.encode()
    except UnicodeEncodeError:
        raw = os.fsencode(name).decode("utf-8", "backslashreplace")
        raise DataError(f"{Path(folder) / raw}: the file name is not UTF-8 (its image id could not be written as "
                        "JSON text): rename it") from None  # fmt: skip
    return name


@dataclass
class _Entry:
    """What a folder's caption file says about one image."""

    captions: list[str]
    split: str
    where: str


def _relative_image(image: str, where: str) -> str:
    check_image_path(image, where, "'image'")  # "" or ".": the folder itself, not one of its images
    if os.path.isabs(image):
        raise DataError(f"{where}: image {short_repr(image)} must be a path relative to the folder")
    return Path(os.path.normpath(image)).as_posix()


def _sidecar_jsonl(path: Path) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
    splits = SplitKeys(path)
    for where, rec in json_lines(path):
        image = _relative_image(require(rec, "image", str, where), where)
        caps = require(rec, "captions", list, where)
        split = splits.read(rec, where)
        if "id" in rec:
            raise DataError(
                f"{where}: 'id' is not read here: a folder's image ids are the images' relative paths (to keep your "
                f"ids, read the file as JSONL: data.format=jsonl data.path={path})"
            )
        if image in entries:
            raise DataError(f"{where}: image {image!r} is listed again (first at {entries[image].where}); give each "
                            "image one line with all its captions")  # fmt: skip
        entries[image] = _Entry(clean_captions(caps, where) if caps else [], split, where)
    splits.say()
    return entries


def _sidecar_csv(path: Path) -> dict[str, _Entry]:
    """The entries of ``captions.csv``, read strictly (``strict=True``): a quote never closed, or text after a closing
    quote, is a :class:`DataError` naming the line where the row began (Python's csv module otherwise reads every line
    after an unclosed quote into one caption, the images of those lines left uncaptioned)."""
    entries: dict[str, _Entry] = {}
    done = 0  # the lines of the rows read whole
    try:  # line by line, each within LINE; -sig: the byte-order mark spreadsheets write
        with contextlib.closing(read_lines(path, encoding="utf-8-sig", newline="")) as lines:
            reader = csv.DictReader(lines, strict=True)
            splits = SplitKeys(path)
            columns = reader.fieldnames or []
            done = reader.line_num
            missing = [c for c in ("image", "caption") if c not in columns]
            if missing:
                raise DataError(
                    f"{path}: no column {' or '.join(map(repr, missing))} in the header (columns: "
                    f"{', '.join(map(repr, columns)) or 'none'}); expected image,caption[,split]: one row per caption"
                )
            twice = [c for c in ("image", "caption", "split") if columns.count(c) > 1]
            if twice:  # csv.DictReader keeps the last column's cell and drops the others
                raise DataError(
                    f"{path}: column {twice[0]!r} is named {columns.count(twice[0])} times in the header (columns: "
                    f"{', '.join(map(repr, columns))}); a row's cells under it would be read from one of them: name "
                    "each column once (one row per caption)"
                )
            for row in reader:
                where = f"{path}, line {reader.line_num}"
                if None in row:  # more cells than the header names: an unquoted comma cut a caption
                    raise DataError(f"{where}: {len(columns) + len(row[None])} cells for the header's {len(columns)} "
                                    f"({', '.join(columns)}); quote a caption holding a comma: "
                                    '"a dog, running on a beach"')  # fmt: skip
                written = (row.get("image") or "").strip()
                if not written:
                    raise DataError(f"{where}: empty 'image' cell")
                image = _relative_image(written, where)
                caption = clean_text(row.get("caption") or "", where, "the caption")
                cell = {"split": (row.get("split") or "").strip()} if "split" in columns else {}
                split = splits.read(cell, where)
                entry = entries.setdefault(image, _Entry([], split, where))
                if split != entry.split:
                    raise DataError(f"{where}: image {image!r} has split {split!r} here but {entry.split!r} at "
                                    f"{entry.where}; give each image one split")  # fmt: skip
                if caption:  # an empty cell lists the image (and its split) without a caption
                    entry.captions.append(caption)
                done = reader.line_num
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    except csv.Error as e:
        raise DataError(
            f"{path}, line {done + 1}: not CSV ({e}): a quoted cell runs from its opening quote to the "
            'next quote followed by a comma or a line end; write a quote inside one as two ("")'
        ) from None
    splits.say()
    return entries


def _caption_txt(path: Path) -> list[str]:
    try:
        text = read_bounded(path, CAPTION_TEXT).decode("utf-8-sig")  # a 10 GB .txt is not read; -sig: a BOM
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    lines = enumerate(re.split(r"\r\n|\r|\n", text), 1)  # a caption a line; a tab or separator in one is a space
    return [clean_text(line, f"{path}, line {k}", "the caption") for k, line in lines if line.strip()]


def caption_txts(folder: Path, images: list[str]) -> dict[str, list[str]]:
    """``{caption .txt: [images]}``: the ``.txt`` file beside each of ``images`` (paths relative to ``folder``) with
    its name up to the suffix (``cats/001.JPG``: ``cats/001.txt``, ``cats/001.TXT``), the suffix in any case as an
    image's is; images without one are left out. Two such files of one image (``a.txt`` and ``a.TXT``, on a file
    system telling them apart) are a :class:`DataError` naming both."""
    listed: dict[str, dict[str, list[str]]] = {}  # a folder of images -> {name less ".txt": [.txt names]}
    out: dict[str, list[str]] = {}
    for image in images:
        parent, _, name = image.rpartition("/")
        if parent not in listed:
            names: dict[str, list[str]] = {}
            with os.scandir(folder / parent if parent else folder) as entries:
                for entry in entries:
                    if entry.name.lower().endswith(".txt") and not entry.name.startswith(".") and entry.is_file():
                        names.setdefault(entry.name[:-4], []).append(entry.name)
            listed[parent] = names
        found = sorted(listed[parent].get(name.rsplit(".", 1)[0], []))
        if len(found) > 1:
            shown = " and ".join(f"{parent}/{t}" if parent else t for t in found)
            raise DataError(f"{folder}: {shown} are both captions of {image}; keep one (an image's captions come from "
                            "one place)")  # fmt: skip
        if found:
            out.setdefault(f"{parent}/{found[0]}" if parent else found[0], []).append(image)
    return out


def _as_file(path: Path) -> str:
    """How to read the file ``path`` instead: ``"; it reads as data.format=jsonl: pass that"``, the format detection
    would pick (:func:`finecap.data.formats.detect_format`), or ``""`` when none recognises it."""
    from finecap.data.formats import detect_format

    try:
        fmt, _ = detect_format(path)
    except (OSError, ValueError):  # no format recognises it: the message stays as it is
        return ""
    return f"; it reads as data.format={fmt}: pass that"


def read_folder(
    path: str | Path, images: str | Path | None = None, check_images: bool = True, allow_outside: bool = False
) -> list[Record]:
    """Read a folder of images (module docstring, ``folder``): one record per image file under ``path``
    (:func:`folder_images`) and per image a caption file names, sorted by image id, the path relative to the folder
    (``"cats/001.jpg"``). Captions come from ``captions.jsonl`` or ``captions.csv`` at the top of the folder, else
    from a ``.txt`` file next to each image; an image without any has none. Splits are those the sidecar names, else
    :data:`NO_SPLIT`. Every file read, linked ones too (images, ``captions.jsonl`` / ``captions.csv``, each
    ``.txt``), must lie inside the folder (:class:`~finecap.data.containment.ImageFolder`: checked before a caption
    file is opened) unless ``allow_outside``; ``images`` (``data.images``), when given, must be the folder itself."""
    path = Path(path)
    if not path.is_dir():
        if not path.exists():
            raise DataError(f"{path}: no such folder (data.format=folder reads a folder of images)")
        raise DataError(f"{path}: a file, not a folder (data.format=folder reads a folder of images){_as_file(path)}")
    if images is not None and os.path.realpath(images) != os.path.realpath(path):
        raise DataError(f"{path}: data.format=folder: the folder is the image root; data.images (or --images) must be "
                        f"empty or the folder itself, got {images}")  # fmt: skip
    folder = ImageFolder(path, allow_outside)
    scanned = folder_images(path, say_unread=True)
    sidecars = [path / name for name in CAPTION_FILES if (path / name).is_file()]
    if len(sidecars) > 1:
        raise DataError(f"{path}: holds both {' and '.join(p.name for p in sidecars)}; keep one (an image's captions "
                        "come from one place)")  # fmt: skip
    entries: dict[str, _Entry] = {}
    if sidecars:
        sidecar = sidecars[0]
        folder.check(sidecar, str(path), sidecar.name, what="caption file")  # a link out is refused, as an image's
        entries = _sidecar_jsonl(sidecar) if sidecar.suffix == ".jsonl" else _sidecar_csv(sidecar)
    txts = caption_txts(path, scanned)
    if txts and sidecars:
        raise DataError(
            f"{path}: captions in both {sidecars[0].name} and per-image .txt files (e.g. {next(iter(txts))}); keep "
            "one (an image's captions come from one place)"
        )
    for txt, imgs in txts.items():
        if len(imgs) > 1:
            raise DataError(f"{path / txt}: the captions of several images ({', '.join(imgs)}); rename the images so "
                            "that each has its own .txt")  # fmt: skip
        folder.check(path / txt, f"{path}: {txt}", txt, what="caption file")  # read only inside, as images are
        entries[imgs[0]] = _Entry(_caption_txt(path / txt), NO_SPLIT, str(path / txt))
    known = set(scanned)
    extra = [image for image in entries if image not in known]  # named by the sidecar, not found by the scan
    if not scanned and not extra:
        raise DataError(f"{path}: no image files in this folder or below it (file names ending in "
                        f"{', '.join(IMAGE_SUFFIXES)}, any case; hidden files and folders are skipped)")  # fmt: skip
    records = []
    for image in sorted([*scanned, *extra]):
        entry = entries.get(image)
        image_path = path / image
        folder.check(image_path, entry.where if entry else f"{path}: {image}", image)
        records.append(Record(image, image_path, entry.split if entry else NO_SPLIT, entry.captions if entry else []))
    missing = [r for r in records if not r.path.is_file()] if check_images else []
    if missing:  # named by the caption file but not there (or there in another Unicode form), or a broken link
        shown = ", ".join(f"{r.image_id}{other_normalisation(r.path)}" for r in missing[:MAX_LISTED])
        shown += ", ..." if len(missing) > MAX_LISTED else ""
        raise DataError(
            f"{sidecars[0] if sidecars else path}: {len(missing)} of {len(records)} images are not image files in "
            f"the folder {path} ({shown}); image paths are relative to the folder"
        )
    return records


def holds_images(folder: Path) -> bool:
    """Whether ``folder`` or a folder below it (not hidden) holds an image file (stops at the first)."""
    for _dirpath, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if any(not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES) for f in files):
            return True
    return False


def _read(source: DataSource) -> list[Record]:
    return read_folder(source.path, source.images, source.check_images, source.allow_outside)


def _fingerprint(folder: Path, source: str) -> dict[str, Any]:
    """Its images (relative path, size) and caption files (module docstring)."""
    h = hashlib.sha256()
    captions = [folder / name for name in CAPTION_FILES if (folder / name).is_file()]
    scanned = folder_images(folder)
    for rel in scanned:
        try:
            size = os.stat(folder / rel).st_size
        except OSError:  # a broken link: reading the data set names it
            size = -1
        h.update(f"{rel}\0{size}\n".encode())
    captions += [folder / txt for txt in caption_txts(folder, scanned)]
    return {"images": h.hexdigest(), "sha256": sha256_files(folder, sorted(set(captions))), "kind": "folder"}


FORMAT = Format(
    "folder",
    _read,
    detect=lambda path: path if path.is_dir() and holds_images(path) else None,
    fingerprint=_fingerprint,
    cached=False,
    own_image_root=True,
    split_hint='a "split" key on the lines of captions.jsonl, or a split column in captions.csv',
    caption_hint="a captions.jsonl or captions.csv row, or a .txt file next to each image (one caption per line)",
)
