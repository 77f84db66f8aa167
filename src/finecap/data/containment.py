"""Image paths: a data set names only files inside its image folder.

**Image paths stay inside the data set's image folder** (the image root its format reads relative paths against,
``data.images`` when given): every record naming a file is checked when the data set is read, on real paths (``..``
and symbolic links resolved), and one naming a file outside is refused, naming the data file, the record, the path
and ``data.allow_outside_paths``, the option that allows it (:class:`ImageFolder`). A ``folder`` data set's caption
files are checked the same way before they are opened (docs/reliability.md, "Reading only what you named").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from finecap.data.records import DataError

ALLOW_OUTSIDE = "data.allow_outside_paths"
"""The option that lets a data set name image files outside its image folder (:class:`ImageFolder`)."""


class ImageFolder:
    """Where a data set's records may name image files: inside its image folder(s) ``roots`` (the ``images`` root
    the reader resolves relative paths against), after resolving ``..`` and symbolic links (real paths). A record
    naming a file elsewhere (``../secret.png``, ``/home/me/.ssh/id_rsa``, a link leading out) is refused with a
    :class:`DataError` naming the record (``where``: the data file and the entry), the path and
    ``data.allow_outside_paths``, which (``allow``) turns the check off. Records with embedded images (no file) are
    not checked.

    Example::

        >>> folder = ImageFolder("/data/coco")
        >>> folder.check("/data/coco/val/1.jpg", "/data/coco/captions.jsonl, line 1", "val/1.jpg")
        >>> folder.check("/data/coco/../secret.png", "/data/coco/captions.jsonl, line 2", "../secret.png")
        Traceback (most recent call last):
        ...
        finecap.data.records.DataError: /data/coco/captions.jsonl, line 2: image path '../secret.png' resolves to /data/secret.png, outside the data set's image folder /data/coco; refused (a data set names only files inside its folder): set data.images to the folder holding the images, or data.allow_outside_paths=true to allow it
    """  # noqa: E501

    def __init__(self, roots: str | Path | tuple[str | Path, ...], allow: bool = False) -> None:
        roots = roots if isinstance(roots, tuple) else (roots,)
        self.allow = allow
        self.reals = [os.path.realpath(r) for r in roots]
        self.prefixes = tuple(r.rstrip(os.sep) + os.sep for r in self.reals)
        self._dirs: dict[str, str] = {}

    def real_path(self, path: str | Path) -> str:
        """``os.path.realpath(path)``, resolving each folder once (a data set holds many files per folder)."""
        text = os.fspath(path)
        head, tail = os.path.split(text)
        if tail in ("", os.curdir, os.pardir):
            return os.path.realpath(text)
        folder = self._dirs.get(head)
        if folder is None:
            folder = self._dirs[head] = os.path.realpath(head or os.curdir)
        real = os.path.join(folder, tail)
        return os.path.realpath(real) if os.path.islink(real) else real

    def inside(self, path: str | Path) -> bool:
        real = self.real_path(path)
        return real in self.reals or real.startswith(self.prefixes)

    def check(self, path: str | Path, where: str, written: Any, what: str = "image path") -> None:
        """Refuse ``path`` (of record ``where``, written ``written`` in the data file) unless it lies inside;
        ``what`` names the file in the error (an image path, a caption file of a ``folder`` data set)."""
        if self.allow or self.inside(path):
            return
        raise DataError(
            f"{where}: {what} {str(written)!r:.300} resolves to {self.real_path(path)}, outside the data set's "
            f"image folder {' or '.join(self.reals)}; refused (a data set names only files inside its folder): set "
            f"data.images to the folder holding the images, or {ALLOW_OUTSIDE}=true to allow it"
        )
