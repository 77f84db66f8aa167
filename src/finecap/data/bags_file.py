"""The bags file of ``finecap bags build`` read back (:func:`read_bags`): ``{"bags": {size: [{"images": [id, ...],
"similarity"?}, ...]}}``, every bag of at least two image ids and of the size it is listed under, the bags of one size
disjoint, ``similarity`` a finite number when present. Its writer is :mod:`finecap.app.bags` (the bags themselves:
:mod:`finecap.data.truematch`). Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path

from finecap.data.json_files import load_json
from finecap.data.records import DataError, check_id, repeated_ids, type_name
from finecap.utils.text import short_repr


def _finite(value: float) -> bool:
    """Whether ``value`` is a finite float (a 400-digit integer is not: formatting it overflows)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def check_bag_size(size: int, images: list, where: str) -> None:
    """Refuse a bag listed under ``size`` that holds another number of images: the metric reports each bag under its
    own length (``bag{len}/...``), so a bag of 3 listed under 5 would be scored, and its value overwritten, as a bag
    of 3. ``where`` names the bag in the error (the file and ``bags["5"][0]``).

    Example::

        >>> check_bag_size(5, [1, 2, 3], 'bags["5"][0]')
        Traceback (most recent call last):
        ...
        finecap.data.records.DataError: bags["5"][0] holds 3 images but is listed under bag size 5
    """
    if len(images) != size:
        raise DataError(f"{where} holds {len(images)} images but is listed under bag size {size}")


def read_bags(path: str | Path, *, disjoint: bool = True) -> dict[int, list[list[int | str]]]:
    """Read a bags file of ``finecap bags build`` into ``{size: [[image_id, ...], ...]}``.

    Accepts ``{"bags": {size: [bag, ...]}}`` where a bag is ``{"images": [...], ...}`` (what the command writes,
    :mod:`finecap.data.truematch`) or a plain list of image ids; every bag holds at least two images, and a bag's
    ``similarity``, when present, is a number (the review page and the report print it as one). An image named twice
    in one bag, an image in two bags of one size (a bag's images are ranked within that bag alone, so the bags of a
    size are disjoint, as Algorithm 2 of NDLB makes them), a bag whose number of images is not the size it is listed
    under (:func:`check_bag_size`), or two keys naming one size (``"3"`` and ``"03"``) is an error naming the bags.
    ``disjoint=False`` lets bags of one size share images: the review page (:mod:`finecap.data.curation`) reads any
    bags so; the metrics never take them (:func:`finecap.metrics.retrieval.bag_columns`). Ids are kept as written; an
    int and its string are one image (``1`` and ``"1"``, as a data set's ids are read), here and where the metrics
    match the bags' ids with the images' (:func:`finecap.data.records.id_keys`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: bags file not found (build one with `finecap bags build`)")
    data = load_json(path)
    raw = data.get("bags") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected an object with 'bags': {{size: [{{'images': [...]}}, ...]}}")
    out: dict[int, list[list[int | str]]] = {}
    keys: dict[int, str] = {}
    for key, items in raw.items():
        try:
            size = int(key)
        except ValueError:
            raise DataError(f"{path}: bags key {short_repr(key)} is not a bag size") from None
        if size in keys:  # "3" and "03": the second list would silently replace the first
            raise DataError(f"{path}: bags keys {short_repr(keys[size])} and {short_repr(key)} both name bag size "
                            f"{size}; list the bags of one size under one key")  # fmt: skip
        keys[size] = key
        if not isinstance(items, list):
            raise DataError(f"{path}: bags[{key!r}] must be a list")
        bags = []
        bag_of: dict[str, int] = {}  # image id as text (1 and "1": one image): the first bag of this size holding it
        for j, b in enumerate(items):
            images = b.get("images") if isinstance(b, dict) else b
            if not isinstance(images, list) or len(images) < 2:
                raise DataError(f"{path}: bags[{key!r}][{j}] must hold a list of at least two image ids")
            for item in images:
                check_id(item, f"{path}: bags[{key!r}][{j}]")
            repeated = repeated_ids(images)  # 1 and "1" too: one image (check_unique_ids reads a data set so)
            if repeated:  # a bag of 3 naming an image twice holds 2: not a bag of 3
                twice = short_repr([group[0] for group in repeated])  # each as first written
                raise DataError(
                    f"{path}: bags[{key!r}][{j}] names image(s) {twice} more than once; a bag's images are distinct"
                )
            check_bag_size(size, images, f"{path}: bags[{key!r}][{j}]")
            again = [i for i in images if str(i) in bag_of] if disjoint else []
            if again:  # the metric would rank that image's caption in one of the two bags only
                raise DataError(
                    f"{path}: bags[{key!r}][{j}] holds image {short_repr(again[0])}, already in "
                    f"bags[{key!r}][{bag_of[str(again[0])]}]; the bags of one size are disjoint (NDLB Algorithm 2: an "
                    "image is in one bag of each size, where its caption is ranked)"
                )
            bag_of.update(dict.fromkeys(map(str, images), j))
            similarity = b.get("similarity") if isinstance(b, dict) else None
            if similarity is not None and (isinstance(similarity, bool) or not isinstance(similarity, int | float)
                                           or not _finite(similarity)):  # fmt: skip
                raise DataError(
                    f"{path}: bags[{key!r}][{j}]: 'similarity' must be a number (finite: the bag's mean cosine "
                    "similarity), "
                    f"got {type_name(similarity)} {short_repr(similarity)}"
                )
            bags.append(images)
        out[size] = bags
    return out
