"""Splits for records whose data set names none: a JSONL line without ``"split"``, the images of a ``folder`` data set
(their split is :data:`finecap.data.records.NO_SPLIT` when read).

The user says how to split them with ``data.val_fraction`` and ``data.test_fraction`` (seeded by
``data.split_seed``, not ``run.seed``, so that runs of several seeds share one split); without them every such image
is ``train``. Records whose data set names their split keep it.

**By image id, not by position.** Each image's split follows from its own id: ``u`` = the first 8 bytes of
SHA-256 of ``"<data.split_seed>:<image id>"`` as a number in [0, 1); ``u < test_fraction`` is ``test``, then
``u < test_fraction + val_fraction`` is ``val``, the rest ``train``. Adding or removing images never moves another
image to another split, and a folder read anywhere splits the same way. The shares are therefore approximate (each
image goes to ``val`` with probability ``val_fraction``): 1,000 images with ``data.val_fraction=0.1`` give about 100
(85 to 115 nine times in ten). One exception, for tiny data sets only: a split asked for (its fraction > 0) that
hashing leaves empty takes the training image of lowest ``u``, and when hashing leaves train empty, the held-out
image of highest ``u`` (of a split holding two or more) moves to train, so that a run finds an image there.

Example::

    >>> from pathlib import Path
    >>> from finecap.data.records import Record
    >>> records = [Record(f"{k}.jpg", Path(f"{k}.jpg"), "") for k in range(1000)]
    >>> split = assign_splits(records, val_fraction=0.1, test_fraction=0.1)
    >>> {s: sum(r.split == s for r in split) for s in ("train", "val", "test")}
    {'train': 783, 'val': 103, 'test': 114}
    >>> grown = assign_splits([*records, Record("new.jpg", Path("new.jpg"), "")], val_fraction=0.1, test_fraction=0.1)
    >>> [r.split for r in grown[:1000]] == [r.split for r in split]
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finecap.data.formats import data_format
from finecap.data.records import NO_SPLIT, Record
from finecap.utils.once import SaidOnce

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


def split_value(image_id: Any, seed: int = 0) -> float:
    """The number in [0, 1) that places ``image_id`` (module docstring): SHA-256 of ``"<seed>:<id>"``."""
    digest = hashlib.sha256(f"{seed}:{image_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(
    records: Sequence[Record], *, val_fraction: float = 0.0, test_fraction: float = 0.0, seed: int = 0
) -> list[Record]:
    """``records`` with every :data:`~finecap.data.records.NO_SPLIT` record given ``train``, ``val`` or ``test`` by
    its id (module docstring); the others unchanged, order kept."""
    if not any(r.split == NO_SPLIT for r in records):
        return list(records)
    values = {i: split_value(r.image_id, seed) for i, r in enumerate(records) if r.split == NO_SPLIT}
    chosen = {}
    for i, u in values.items():
        chosen[i] = "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"
    for split, fraction in (("test", test_fraction), ("val", val_fraction)):  # tiny data sets: no split left empty
        trains = sorted((u, i) for i, u in values.items() if chosen[i] == "train")
        if fraction > 0 and split not in chosen.values() and len(trains) > 1:
            chosen[trains[0][1]] = split
    _keep_one_train(records, values, chosen, val_fraction + test_fraction)
    return [dataclasses.replace(r, split=chosen[i]) if i in chosen else r for i, r in enumerate(records)]


def _keep_one_train(records: Sequence[Record], values: dict[int, float], chosen: dict[int, str], held: float) -> None:
    """When hashing left no image in train (a tiny data set: 2 images, ``data.val_fraction=0.5``, both in val) and
    the fractions leave train a share (``held`` < 1), the held-out image of highest ``u`` of a split holding two or
    more moves to train (in place, in ``chosen``), so that training finds an image there."""
    if held >= 1 or "train" in chosen.values() or any(r.split in ("train", "restval") for r in records):
        return
    counts = Counter(chosen.values())
    movable = [(u, i) for i, u in values.items() if counts[chosen[i]] > 1]
    if movable:
        chosen[max(movable)[1]] = "train"


_SAID = SaidOnce()


def split_unsplit(cfg: Any, records: Sequence[Record], path: str | Path) -> tuple[list[Record], int]:
    """:func:`assign_splits` with ``cfg.data``'s fractions and seed, and how many records named no split. Says what
    it did, once per data set and outcome in a command (a log line with the counts; :mod:`finecap.utils.once`)."""
    unsplit = sum(r.split == NO_SPLIT for r in records)
    if not unsplit:
        return list(records), 0
    d = cfg.data
    out = assign_splits(records, val_fraction=d.val_fraction, test_fraction=d.test_fraction, seed=d.split_seed)
    counts = Counter(r.split for r, before in zip(out, records, strict=True) if before.split == NO_SPLIT)
    key = (str(path), len(records), tuple(sorted(counts.items())), d.val_fraction, d.test_fraction, d.split_seed)
    if _SAID.first(key):
        of = f"{unsplit} of {len(records)} images" if unsplit < len(records) else f"all {unsplit} images"
        if d.val_fraction or d.test_fraction:
            shares = ", ".join(f"{counts[s]} {s}" for s in SPLITS)
            how = f"data.val_fraction={d.val_fraction:g}, data.test_fraction={d.test_fraction:g}, data.split_seed"
            log.info("data: %s of %s name no split; by image-id hash (%s=%d): %s", of, path, how, d.split_seed, shares)
        else:
            log.info("data: %s of %s name no split: all train (set data.val_fraction / data.test_fraction to hold "
                     "some out)", of, path)  # fmt: skip
    return out, unsplit


def missing_split_advice(split: str, fmt: str | None, records: Sequence[Record], unsplit: int) -> str:
    """What to add when no record is in ``split``: the format's way of naming a split (:attr:`Format.split_hint
    <finecap.data.formats.Format.split_hint>`), and
    for records that named none, the fraction that holds images out for it (for train: the fractions that held them
    all out)."""
    how = (data_format(fmt).split_hint if fmt else "") or "the records' splits"
    if not unsplit:
        return f"give some records split {split!r} ({how})"
    option = {"val": "data.val_fraction", "test": "data.test_fraction"}.get(split)
    shares = ", ".join(f"{n} {s}" for s, n in sorted(Counter(r.split for r in records).items()))
    if option:
        held_out = f"set {option} (e.g. {option}=0.1) to hold out a share by image-id hash, or "
    else:  # train: the fractions held every unsplit image out (one image, data.val_fraction > 0)
        held_out = "lower data.val_fraction / data.test_fraction (they hold out images by id hash), or "
    return f"{unsplit} of {len(records)} images name no split (now {shares}): {held_out}give them their split ({how})"
