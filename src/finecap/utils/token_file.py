"""A secret token read from a file of the user's (``--token-file``): the bearer token of ``finecap serve-reward`` and
the access token of ``finecap bags review``, both read by :func:`read_token` (a token given as an argument is
visible to every user of the machine in ``ps``; a file of the user's, mode 600, is not).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def shared_bits(mode: int) -> str:
    """What the group and other bits of a file's ``mode`` let other users do, in words (``""`` when none is set).

    >>> shared_bits(0o640), shared_bits(0o604), shared_bits(0o664)
    ('readable by its group', 'readable by other users', 'readable and writable by its group, readable by other users')
    >>> shared_bits(0o666), shared_bits(0o600)
    ('readable and writable by its group and by other users', '')
    """
    said: dict[str, list[str]] = {}
    for who, bits in (("its group", (stat.S_IRGRP, stat.S_IWGRP, stat.S_IXGRP)),
                      ("other users", (stat.S_IROTH, stat.S_IWOTH, stat.S_IXOTH))):  # fmt: skip
        can = [word for word, bit in zip(("readable", "writable", "executable"), bits, strict=True) if mode & bit]
        if can:
            said.setdefault(" and ".join(can), []).append(who)
    return ", ".join(f"{can} by {' and by '.join(whom)}" for can, whom in said.items())


TOKEN_FILE_BYTES = 65_536
"""Bytes a token file may hold at most: a token is one line."""


def read_token(path: str | os.PathLike) -> str:
    """The bearer token in the file ``path`` (its first line, stripped): refused when the file is missing, empty, no
    regular file (a FIFO blocked the command for ever, a device such as ``/dev/zero`` is endless), larger than
    :data:`TOKEN_FILE_BYTES`, another user's (on a shared machine another user may have made the file first, in a
    shared folder, knowing the token it holds), or open to other users in any way (a group or other bit of its mode: a
    token others can read is no secret, one they can write is not yours), the message naming the bits set
    (:func:`shared_bits`). What is checked is the file read (``fstat`` of the file opened, not of its name)."""
    file = Path(path)
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):  # before opening: opening a device may act on it
            raise ValueError(f"--token-file {file}: not a regular file: the token is read from a file of one line")
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ValueError(f"--token-file {file}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced between the two looks
            raise ValueError(f"--token-file {file}: not a regular file: the token is read from a file of one line")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise ValueError(f"--token-file {file}: owned by another user (uid {info.st_uid}): a token file someone "
                             "else made is not yours; write your own, chmod 600")  # fmt: skip
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"--token-file {file}: {shared_bits(info.st_mode)} (mode {stat.filemode(info.st_mode)}); "
                             f"chmod 600 {file}")  # fmt: skip
        if info.st_size > TOKEN_FILE_BYTES:
            raise ValueError(f"--token-file {file}: {info.st_size:,} bytes, more than a token file's "
                             f"{TOKEN_FILE_BYTES:,}: its first line is the token")  # fmt: skip
        data = os.read(fd, TOKEN_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f"--token-file {file}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--token-file {file}: not UTF-8 text") from None
    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    if len(token) < 16 or not token.isascii() or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(  # ASCII: a header's other bytes are read as Latin-1, and such a token never matches
            f"--token-file {file}: its first line must be a token of at least 16 printable ASCII characters "
            "without spaces (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token
