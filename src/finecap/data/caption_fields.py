"""Which caption field of a data set is used: the human captions, a field written by ``finecap boost`` or, on the
world, the dense caption (``data.captions`` for training, ``bags.text_from`` for TrueMatch bag embeddings).

A data set written by ``finecap boost`` (:mod:`finecap.boost.output`) stores every caption field of an image in
its ``"boost"`` object (``original``, ``blend``, ``visual``, ``holistic``; each a list of captions) and its ordinary
caption list holds the boosted mode's captions; :class:`~finecap.data.records.Record` carries that object as
``boosted``. ``original`` on a data set never boosted is its ordinary caption list; ``dense`` reads the world's
``dense.json`` (one dense caption per image, every fact of the scene: what the visual expert learns from).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from finecap.config import CaptionField
from finecap.data.records import Record
from finecap.utils.reading import DATA_FILE, read_json

CAPTION_FIELDS: tuple[str, ...] = get_args(CaptionField)


def select_captions(
    records: Sequence[Record], name: str, path: str | Path, key: str = "data.captions"
) -> list[Record]:
    """``records`` with ``captions`` replaced by field ``name`` (read from data set file ``path``); an image whose
    field is missing raises ``ValueError`` naming ``key`` and the file.

    Example::

        >>> r = Record(1, Path("1.png"), "train", ["a holistic caption"], {"original": ["a", "b"]})
        >>> select_captions([r], "original", "boosted.json")[0].captions
        ['a', 'b']
    """
    if name not in CAPTION_FIELDS:
        raise ValueError(f"{key}: unknown caption field {name!r}; valid: {', '.join(CAPTION_FIELDS)}")
    if name == "original" and not any(r.boosted for r in records):
        return list(records)
    if name == "dense":
        dense_file = Path(path).parent / "dense.json"
        if not dense_file.exists():
            raise ValueError(f"{key}=dense: {dense_file} not found (dense captions exist only in world data sets)")
        dense = read_json(dense_file, DATA_FILE)
        missing = [r.image_id for r in records if str(r.image_id) not in dense]
        if missing:
            raise ValueError(
                f"{key}=dense: {len(missing)} images have no dense caption in {dense_file}: {missing[:5]}"
            )
        return [dataclasses.replace(r, captions=[dense[str(r.image_id)]]) for r in records]
    missing = [r.image_id for r in records if name not in r.boosted]
    if missing:
        hint = " (run `finecap boost` and point data.path at its output)" if len(missing) == len(records) else ""
        raise ValueError(
            f"{key}={name}: {len(missing)} of {len(records)} images of {path} have no {name!r} captions{hint}; "
            f"first: {missing[:5]}"
        )
    return [dataclasses.replace(r, captions=list(r.boosted[name])) for r in records]
