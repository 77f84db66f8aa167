"""COCO results files ``[{"image_id", "caption"}]``: the one reader (:func:`read_results`) and the one writer
(:func:`write_results`) of generated captions.

Extra fields (``score``, ``id``) are ignored; an image listed several times keeps all its captions, as pycocotools'
``loadRes`` does. Read within :data:`~finecap.utils.reading.DATA_FILE`; nothing here imports torch.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

from finecap.data.json_files import load_json
from finecap.data.records import (
    MAX_LISTED,
    DataError,
    check_id,
    float_ids_note,
    is_id,
    require,
    require_id,
    type_name,
)
from finecap.outputs import write_output
from finecap.utils.text import short_repr

log = logging.getLogger(__name__)


def read_results(path: str | Path) -> dict[int | str, list[str]]:
    """Read COCO results ``[{"image_id", "caption"}]`` into ``{image_id: [caption, ...]}``, in file order.

    An image listed several times keeps every caption, in the order of the file: this is what pycocotools'
    ``COCO.loadRes`` does (it numbers every entry and ``imgToAnns[image_id]`` lists them all). Its caption scorers
    (pycocoevalcap's BLEU, ROUGE-L, CIDEr) then assert exactly one caption per image, so they reject such a file;
    ``finecap eval`` refuses it too, naming the ids, unless the ``diversity`` group is asked for: an image's captions
    are then its samples, and its first caption is scored by the other groups (:mod:`finecap.app.eval`). An empty
    list gives ``{}``. Anything but a list is a :class:`DataError`, as ``loadRes`` refuses it; a JSON object's says
    what it holds when it is a ``{image_id: caption}`` mapping (with a one-line conversion) or COCO caption
    annotations (the references given for the results). An integral float id (``42.0``, as pandas writes an id
    column) is read as its integer, as pycocotools reads it (a dict key, ``42.0 == 42``), and one warning says how
    many there were; any other float (``42.5``, NaN) is refused, naming the entry.
    """
    path = Path(path)
    data = load_json(path)
    if not isinstance(data, list):
        raise DataError(
            f"{path}: COCO results must be a list of {{'image_id', 'caption'}} objects, got {type_name(data)}"
            + _what_it_is(path, data)
        )
    out: dict[int | str, list[str]] = {}
    try:  # well-formed entries in one tight loop; the checking loop below names the first bad one
        for rec in data:
            image_id, caption = rec["image_id"], rec["caption"]
            if not is_id(image_id) or type(caption) is not str:
                raise TypeError
            out.setdefault(image_id, []).append(caption)
        return out
    except (KeyError, TypeError):
        out.clear()
    floats: list[float] = []
    for i, rec in enumerate(data):
        where = f"{path}: [{i}]"
        image_id = require_id(rec, "image_id", where, floats)
        out.setdefault(image_id, []).append(require(rec, "caption", str, where))
    if floats:
        log.warning("%s", float_ids_note(path, floats))
    return out


def _what_it_is(path: Path, data: object) -> str:
    """What a JSON object read as COCO results holds, when it is one of the two files given for results by mistake
    (``""`` otherwise): COCO caption annotations (the references), or a mapping ``{image_id: caption}``, with the
    one-line conversion to a list."""
    if not isinstance(data, dict):
        return ""
    if isinstance(data.get("annotations"), list):
        return ": this is a COCO caption annotations file ('annotations'), the references of a data set, not results"
    if data and all(type(c) is str for c in data.values()):
        convert = (
            "python -c \"import json, sys; print(json.dumps([{'image_id': i, 'caption': c} for i, c in "
            f'json.load(open(sys.argv[1])).items()]))" {shlex.quote(str(path))} > results.json'
        )
        return f" mapping {len(data)} ids to captions ({{image_id: caption}}); write it as a list, e.g. {convert}"
    return ""


def empty_captions_note(captions: dict[int | str, str], what: str) -> str | None:
    """A line saying how many of ``captions`` (image id -> caption) are empty or white space alone, with the first
    ids, or ``None`` when none is: ``finecap caption`` and ``finecap eval`` log it, since an empty caption is scored
    as it is (``what``: what the captions are, for the line).

    >>> empty_captions_note({1: "a cat", 2: " ", 3: ""}, "the captions")
    '2 of the captions (of 3) are empty, e.g. image ids [2, 3]'
    """
    empty = [i for i, c in captions.items() if not c.strip()]
    if not empty:
        return None
    return f"{len(empty)} of {what} (of {len(captions)}) are empty, e.g. image ids {empty[:MAX_LISTED]}"


def write_results(path: str | Path, captions: dict[int | str, str]) -> None:
    """Write ``{image_id: caption}`` as COCO results ``[{"image_id", "caption"}]`` (atomically, in dict order; never
    through a link; remembered as finecap's, :func:`finecap.outputs.write_output`)."""
    rows = []
    for image_id, caption in captions.items():
        if not isinstance(caption, str):
            raise DataError(
                f"{path}: caption of image {short_repr(image_id)} must be a string, got {type_name(caption)}"
            )
        check_id(image_id, str(path))
        rows.append({"image_id": image_id, "caption": caption})
    write_output(path, json.dumps(rows, indent=None) + "\n", "results")


# ---------------------------------------------------------------------------------------------------------------------
# TrueMatch bags
