"""One process of tests/app/test_caption_resume_processes.py (started 2 times by ``accelerate launch``): ``finecap
caption`` with :func:`finecap.caption.batch_captions` recording the images of each batch this process decodes (their
``index``: the place in the list or split) into ``<folder>/rank<r>.json``, and, when ``stop_after`` is a number,
stopping this process as Ctrl-C does on its batch after that many.

argv: ``FOLDER STOP_AFTER ARGS...``; ``STOP_AFTER``: ``-`` never stops, a number stops every process after that many
batches, numbers by rank (``0,1``) each process after its own (``-`` among them: that one never stops). The
environment may add (set by the test for both processes):

- ``CAPTION_WORKER_AWAIT=PATH:LINES``: a process stops only once the file ``PATH`` holds ``LINES`` lines (another
  process's partial file: what it kept is on the disk before this one stops);
- ``CAPTION_WORKER_FULL_DISK=RANK``: process ``RANK``'s partial results file cannot be made (the disk full).

The exit code is the command's."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path

import finecap.caption
from finecap.app.caption_partial import PartialResults
from finecap.app.cli import main

folder, stop_after, *argv = sys.argv[1:]
rank = int(os.environ["RANK"])
stops = stop_after.split(",")
stop = stops[rank] if len(stops) > 1 else stops[0]
real = finecap.caption.batch_captions
decoded: list[list[int]] = []


def awaited() -> None:
    """Return once the file of ``CAPTION_WORKER_AWAIT`` holds its lines (at once without it); 120 s at most."""
    if "CAPTION_WORKER_AWAIT" not in os.environ:
        return
    path, lines = os.environ["CAPTION_WORKER_AWAIT"].rsplit(":", 1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(path) and len(Path(path).read_text().splitlines()) >= int(lines):
            return
        time.sleep(0.01)


def recording(engine, batch, decode, seed=None):
    if stop != "-" and len(decoded) == int(stop):
        awaited()
        raise KeyboardInterrupt
    decoded.append(batch["index"].tolist())
    return real(engine, batch, decode, seed)


def full_disk(self):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))


finecap.caption.batch_captions = recording
if os.environ.get("CAPTION_WORKER_FULL_DISK") == str(rank):
    PartialResults.start = full_disk
code = main(argv)
Path(folder, f"rank{rank}.json").write_text(json.dumps(decoded))
sys.exit(code)
