"""Worker of tests/engines/test_vllm_rollouts_ddp.py: trains each configuration given as JSON ``[[overrides...],
...]``, one after the other, in this ``accelerate launch``-ed process group; and the reward those runs pay
(``rl.rewards={'vllm_ddp_worker:words': 1.0}``: this folder is on the path of a script it runs, and of the tests)."""

import json
import sys

import torch

from finecap.rewards import RewardOutput


class Words:
    """Pays for length: the caption's number of words (it differs between an image's samples, so every step moves
    the policy)."""

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"words": total})


def words(cfg):
    return Words()


if __name__ == "__main__":
    from finecap.config import load
    from finecap.train.run import train
    from finecap.utils.system import leave_process_group

    for overrides in json.loads(sys.argv[1]):
        train(load(None, overrides))
    leave_process_group()  # as the finecap command does: a gloo group alive at exit may abort the process
