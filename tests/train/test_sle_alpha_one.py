"""Sequence-level exploration with ``sle.alpha=1.0`` is SCST, end to end: the same tiny ClipCap, start, data and seed
trained through ``finecap train``'s entry point gives the same parameters and the same greedy and beam captions
(tests/objectives/test_exploration.py checks the loss alone on a stand-in model)."""

import torch

from finecap.caption import generate_captions
from finecap.config import DecodeConfig
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train


def test_sle_with_alpha_one_trains_the_same_model_as_scst(make_cfg):
    start = checkpoint_dir(train(make_cfg("train.max_steps=8", run="mle")), "best")
    common = (f"train.init_from={start}", "train.max_steps=4", "train.batch_size=8", "train.lr=1e-3",
              "train.warmup_steps=0", "rl.samples=3", "decode.max_length=8")  # fmt: skip
    scst = train(make_cfg("train.objective=reinforce", *common, run="scst"))
    sle = train(make_cfg("train.objective=sle", "sle.alpha=1.0", *common, run="sle"))

    initial = ClipCap.from_checkpoint(model_dir(start)).state_dict()
    models = [ClipCap.from_checkpoint(model_dir(checkpoint_dir(run, "last"))) for run in (scst, sle)]
    a, b = (m.state_dict() for m in models)
    assert any(not torch.equal(initial[k], a[k]) for k in a)  # SCST moved the model: the comparison is not vacuous
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert different == []  # bit for bit

    cfg = make_cfg()
    for decode in (DecodeConfig(strategy="greedy", max_length=8), DecodeConfig(strategy="beam", beam_size=3,
                                                                                max_length=8)):  # fmt: skip
        captions = [generate_captions(m, cfg, "val", decode=decode, progress=False) for m in models]
        assert captions[0] == captions[1] and len(captions[0]) == 8
