"""``data.format=coco``: COCO caption annotations (``captions_val2014.json``).

``{"images": [{"id", "file_name"?}], "annotations": [{"image_id", "caption"}]}``, in every variant pycocotools reads
(:func:`read_coco_captions`: ``file_name`` optional for text metrics, extra fields ignored, images without captions
dropped). The split is read from the file name (``train``/``val``/``test``, ``trainval`` as ``train``,
:func:`~finecap.data.records.split_from_name`) unless given. Default image root: the JSON file's folder. Detected: a
JSON object with ``annotations``.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

from finecap.data.containment import ImageFolder
from finecap.data.formats import DataSource, Format
from finecap.data.json_files import load_json, peek_json
from finecap.data.records import (
    MAX_LISTED,
    DataError,
    Record,
    check_image_files,
    clean_captions,
    float_ids_note,
    id_key,
    integral_id,
    invisible,
    is_id,
    needs_cleaning,
    read_boosted,
    require,
    require_id,
    require_image,
    split_from_name,
)
from finecap.utils.text import short_repr

log = logging.getLogger(__name__)

FOLDERISH = ("/", ".", os.sep)
"""How a ``file_name`` that may name a folder (``"."``, ``"sub/"``, ``"a/.."``) ends: the fast loop leaves such
names, and empty ones, to the checking loop (:func:`~finecap.data.records.require_image`), which refuses them."""


def read_coco_captions(
    path: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    split: str | None = None,
    allow_outside: bool = False,
) -> list[Record]:
    """Read COCO caption annotations (``captions_val2014.json`` layout); one record per image, in file order.

    Accepts the variants pycocotools' ``COCO`` class (hence pycocoevalcap) reads: ``images`` entries with only an
    ``id`` (text metrics need no image file; such a record's path is ``<images>/<id>`` and ``check_images`` names
    the missing ``file_name``), extra fields anywhere (ignored), images without annotations (dropped: nothing to
    evaluate or train on), and no ``images`` list at all (images are then those of the annotations, in order).
    A ``file_name`` given must name a file: ``""``, ``"."`` or ``"sub/"`` is refused naming the image
    (:func:`~finecap.data.records.require_image`; pycocotools reads it, and its path would be the image folder).
    An integral float id (``42.0``) is read as its integer, as pycocotools reads it (one warning says how many);
    refused, each named, where pycocotools reads on: an image listed twice in ``images``, an annotation whose
    ``image_id`` is not in ``images``, and an empty caption (pycocoevalcap would score against it as an empty
    reference; these are mistakes in a file, not captions).
    Image paths must lie inside ``images`` (:class:`~finecap.data.containment.ImageFolder`) unless ``allow_outside``.
    """
    path = Path(path)
    root = Path(images) if images is not None else path.parent
    folder = ImageFolder(root, allow_outside)
    split = split or split_from_name(path)
    data = load_json(path)
    anns = require(data, "annotations", list, f"{path}")
    imgs = require(data, "images", list, f"{path}") if "images" in data else None
    by_id: dict[int | str, tuple[str | None, list[str]]] = {}
    boosts: dict[int | str, dict[str, list[str]]] = {}
    checked = True
    try:  # well-formed images in one tight loop (no boosted captions); the checking loop below names the first bad one
        for img in imgs or ():
            image_id, file_name = img["id"], img.get("file_name")
            if (
                not is_id(image_id)
                or image_id in by_id
                or "boost" in img
                or (type(file_name) is not str and (file_name is not None or "file_name" in img))
                or (type(file_name) is str and (not file_name or file_name.isspace() or file_name.endswith(FOLDERISH)))
            ):
                raise TypeError
            by_id[image_id] = (file_name, [])
    except (KeyError, TypeError, AttributeError):
        checked = False
    floats: list[float] = []  # integral float ids (42.0), read as pycocotools reads them: the integers
    if not checked:
        by_id.clear()
        for i, img in enumerate(imgs):
            where = f"{path}: images[{i}]"
            image_id = require_id(img, "id", where, floats)
            file_name = require_image(img, "file_name", f"{where} (id {image_id})") if "file_name" in img else None
            if image_id in by_id:
                raise DataError(f"{where}: duplicate image id {short_repr(image_id)}")
            by_id[image_id] = (file_name, [])
            boosts[image_id] = read_boosted(img, where)
    bad = False
    try:  # well-formed annotations in one tight loop; the checking loop below names the first bad one
        if imgs is None:
            for ann in anns:
                by_id.setdefault(ann["image_id"], (None, []))
        for ann in anns:
            caption = ann["caption"]
            if type(caption) is not str or not is_id(ann["image_id"]):
                raise TypeError
            by_id[ann["image_id"]][1].append(caption)
    except (KeyError, TypeError):
        bad = True
    if bad:
        if imgs is None:  # the images are the annotations', made again below (the fast loop kept ids as written)
            by_id.clear()
        for entry in by_id.values():
            entry[1].clear()
        for i, ann in enumerate(anns):
            where = f"{path}: annotations[{i}]"
            image_id = require_id(ann, "image_id", where, floats)
            caption = require(ann, "caption", str, where)
            if image_id not in by_id:
                if imgs is not None:
                    other = id_key(image_id, by_id)  # 1 beside an image "id": "1": one written as a string
                    hint = (f" (an 'images' entry has id {short_repr(other)}, a {type(other).__name__}: write both "
                            "ids alike)") if other is not None else ""  # fmt: skip
                    raise DataError(f"{where}: image_id {short_repr(image_id)} is not in 'images'{hint}")
                by_id[image_id] = (None, [])
            by_id[image_id][1].append(caption)
    if floats:
        log.warning("data: %s", float_ids_note(path, floats))
    records = []
    no_file = []
    for image_id, (file_name, caps) in by_id.items():
        if not caps:
            continue
        stripped = [c.strip() for c in caps]
        joined = "".join(stripped)
        if not all(stripped) or needs_cleaning(joined) or (not joined.isascii() and any(map(invisible, stripped))):
            # an empty or invisible caption is named, a line break made a space
            stripped = clean_captions(caps, f"{path}: image id {image_id}" + (f" ({file_name})" if file_name else ""))
        if file_name is None:
            no_file.append(image_id)
        image_path = root / (file_name or str(image_id))
        folder.check(image_path, f"{path}: image id {image_id!r}", file_name or image_id)
        records.append(Record(image_id, image_path, split, stripped, boosts.get(image_id) or {}))
    if not records:
        raise DataError(f"{path}: no image has a caption annotation")
    if imgs:
        said_split(imgs, path, split)
    if check_images:
        if no_file:
            raise DataError(
                f"{path}: {len(no_file)} image(s) have no 'file_name', e.g. ids {no_file[:MAX_LISTED]}; image "
                "metrics and training from images need it (text metrics do not)"
            )
        check_image_files(records, path, root)
    return records


def said_split(imgs: list, path: Path, split: str) -> None:
    """Warn when ``images`` entries carry a ``"split"`` naming another split than ``split``, the file's: a COCO file
    is one split (pycocotools reads no such key), so those images are read into ``split`` all the same, and a
    command reading that split (``finecap caption --data``) would take images the data set puts in train or val.
    Such data keeps its splits as JSONL or Karpathy (docs/data.md)."""
    other: Counter[str] = Counter()
    for img in imgs:
        said = img.get("split") if isinstance(img, dict) else None
        if isinstance(said, str) and {"restval": "train"}.get(key := said.strip().lower(), key) != split:
            other[said] += 1
    if other:
        shown = ", ".join(f"{short_repr(w)} ({n})" for w, n in other.most_common(MAX_LISTED))
        log.warning("data: %s: %d of %d images name another split than the file's in a 'split' key (%s), which a "
                    "COCO file does not read: all are in split %r, as its name says; to keep each image's split, "
                    "write the data as JSONL or in the Karpathy format (docs/data.md)", path, other.total(),
                    len(imgs), shown, split)  # fmt: skip


def uncaptioned_images(path: str | Path) -> set[int | str]:
    """The ids of the images ``path``'s ``images`` list holds without a caption annotation, which
    :func:`read_coco_captions` drops (nothing to evaluate or train on): for an error naming them so."""
    data = load_json(Path(path))
    imgs = data.get("images") if isinstance(data, dict) else None
    anns = data.get("annotations") if isinstance(data, dict) else None
    listed = {i for img in imgs or () if isinstance(img, dict) and is_id(i := integral_id(img.get("id")))}
    return listed - {integral_id(a.get("image_id")) for a in anns or () if isinstance(a, dict)}


def _read(source: DataSource) -> list[Record]:
    return read_coco_captions(source.path, source.images, source.check_images, allow_outside=source.allow_outside)


def _detect(path: Path) -> Path | None:
    data = peek_json(path) if path.is_file() else None
    return path if isinstance(data, dict) and "annotations" in data else None


FORMAT = Format(
    "coco",
    _read,
    detect=_detect,
    split_hint=(
        "a COCO file holds the one split its name says (train or trainval, val or test, else test) and data.path "
        "reads one file: to train, which needs train and val, write the split files into one JSONL (a few lines: "
        'docs/data.md, "Training on COCO caption files") or the captions in the Karpathy format'
    ),
)
