"""Worker of tests/train/test_equivalence.py: trains each configuration given as JSON ``[[overrides...], ...]``, one
after the other, in this (possibly ``accelerate launch``-ed) process group."""

import json
import sys

from finecap.config import load
from finecap.train.run import train

if __name__ == "__main__":
    for overrides in json.loads(sys.argv[1]):
        train(load(None, overrides))
