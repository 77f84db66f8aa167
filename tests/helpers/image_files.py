"""Image files for the tests of reading images (tests/data/test_image_containment.py, tests/app/test_caption_images.py,
tests/app/test_bad_inputs.py): small valid PNGs, a PNG header declaring a decompression bomb, and broken files of every
kind with the reason their error gives."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from PIL import Image

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n" \
         b"-----END OPENSSH PRIVATE KEY-----\n"  # fmt: skip
RED, GREEN, BLUE = (200, 30, 30), (30, 200, 30), (30, 30, 200)


def png(path: Path, color: tuple[int, int, int] = RED, size: tuple[int, int] = (8, 8)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG of a few dozen bytes whose header declares ``width`` x ``height`` pixels (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )
    return path


def truncated_png(path: Path) -> Path:
    """A 64 x 64 PNG cut in half."""
    png(path, size=(64, 64))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def corrupt_png(path: Path) -> Path:
    """A 64 x 64 PNG whose compressed pixels are partly zeroed."""
    png(path, size=(64, 64))
    data = bytearray(path.read_bytes())
    data[60:80] = b"\x00" * 20  # inside the compressed pixels
    path.write_bytes(bytes(data))
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


BROKEN = {
    "empty": (lambda p: _write(p, b""), "the file is empty"),
    "text": (lambda p: _write(p, SECRET), "not an image"),
    "truncated": (truncated_png, "damaged image"),
    "corrupt": (corrupt_png, "damaged image"),
    "eps": (
        lambda p: _write(p, b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n"),
        "not an image",
    ),  # PIL reads EPS by running Ghostscript: not a format finecap decodes
    "folder": (lambda p: p.mkdir() or p, "a folder"),
    "fifo": (lambda p: os.mkfifo(p) or p, "not a regular file"),  # reading it would block forever
    "missing": (lambda p: p, "no such file"),
}
"""Broken image files by kind: ``(make(path) -> path, a text the error reading it holds)``."""
