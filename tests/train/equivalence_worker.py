"""Worker of tests/train/test_equivalence.py: trains each configuration given as JSON ``[[overrides...], ...]``, one
after the other, in this (possibly ``accelerate launch``-ed) process group."""

import json
import sys

from finecap.config import load
from finecap.train.run import train

if __name__ == "__main__":
    from finecap.utils.system import leave_process_group

    for overrides in json.loads(sys.argv[1]):
        train(load(None, overrides))
    leave_process_group()  # as the finecap command does: a gloo group alive at exit may abort the process
