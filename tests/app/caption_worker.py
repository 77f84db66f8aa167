"""One process of tests/app/test_caption_resume_processes.py (started 2 times by ``accelerate launch``): ``finecap
caption`` with :func:`finecap.caption.batch_captions` recording the images of each batch this process decodes (their
``index``: the place in the list or split) into ``<folder>/rank<r>.json``, and, when ``stop_after`` is a number,
stopping this process as Ctrl-C does on its batch after that many.

argv: ``FOLDER STOP_AFTER ARGS...`` (``STOP_AFTER``: ``-`` never stops); the exit code is the command's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import finecap.caption
from finecap.app.cli import main

folder, stop_after, *argv = sys.argv[1:]
real = finecap.caption.batch_captions
decoded: list[list[int]] = []


def recording(engine, batch, decode, seed=None):
    if stop_after != "-" and len(decoded) == int(stop_after):
        raise KeyboardInterrupt
    decoded.append(batch["index"].tolist())
    return real(engine, batch, decode, seed)


finecap.caption.batch_captions = recording
code = main(argv)
Path(folder, f"rank{os.environ['RANK']}.json").write_text(json.dumps(decoded))
sys.exit(code)
