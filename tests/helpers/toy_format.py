"""A data set format of one's own, plugged in by dotted path as docs/architecture.md ("How to add a data format")
says: ``data.format=helpers.toy_format:FORMAT``.

Flickr8k's caption file (``Flickr8k.token.txt``): one ``<image file>#<n><TAB><caption>`` per line, five lines per
image (``1000268201_693b08cb0e.jpg#0<TAB>A child in a pink dress is climbing up a set of stairs .``). One record per
image with its captions in file order; no split (``data.val_fraction`` / ``data.test_fraction`` hold some out); images
relative to ``data.images`` (default: the file's folder) and inside it. What finecap gives every format for free:
the file's SHA-256 as its fingerprint, its records cached while the file is unchanged.
"""

from __future__ import annotations

import contextlib

from finecap.data.containment import ImageFolder
from finecap.data.formats import DataSource, Format
from finecap.data.records import NO_SPLIT, DataError, Record, check_image_files
from finecap.utils.reading import read_lines


def read_tokens(source: DataSource) -> list[Record]:
    """The records of a Flickr8k token file (module docstring); a bad line is a ``DataError`` naming it."""
    root = source.images or source.path.parent
    folder = ImageFolder(root, source.allow_outside)  # image paths stay inside the image root
    records: dict[str, Record] = {}
    with contextlib.closing(read_lines(source.path)) as lines:  # streamed, each line within finecap's bound
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{source.path}, line {lineno}"
            name, tab, caption = line.rstrip("\r\n").partition("\t")
            image = name.rpartition("#")[0] or name
            if not tab or not caption.strip():
                raise DataError(f"{where}: expected '<image>#<n><TAB><caption>'")
            if image not in records:
                folder.check(root / image, where, image)
                records[image] = Record(image, root / image, NO_SPLIT)
            records[image].captions.append(caption.strip())
    found = list(records.values())
    if source.check_images:
        check_image_files(found, source.path, root)
    return found


FORMAT = Format("flickr8k-tokens", read_tokens)
