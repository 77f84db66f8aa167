"""Worker of tests/train/test_fsdp*.py and helpers.shared_launch: trains each ``[overrides, resume]`` given as JSON,
one after the other, in this ``accelerate launch``-ed process group (``train.strategy=fsdp`` among the overrides, or
DDP, the default); a first item ``--recipe=NAME`` names the recipe they go on."""

import json
import sys

from finecap.config import load
from finecap.train.run import train

if __name__ == "__main__":
    from finecap.utils.system import leave_process_group

    for overrides, resume in json.loads(sys.argv[1]):
        recipe = overrides.pop(0).split("=", 1)[1] if overrides and overrides[0].startswith("--recipe=") else None
        train(load(recipe, overrides), resume=resume)
    leave_process_group()  # as the finecap command does: a gloo group alive at exit may abort the process
