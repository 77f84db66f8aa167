"""The proof that distribution is right: one optimizer step with 2 CPU processes x batch b, and with 1 process x
batch b x 2 accumulation steps, gives the parameters of 1 process x batch 2b, for MLE, SMILE (its sequence and
random subsets: each caption's random subset is seeded by its index, not drawn from a generator per process), SCST
(sampled captions, CIDEr-D, greedy baseline) and self-retrieval (DiscriTune-style: retrieval reward against the
global batch, running-mean baseline); and, over several steps with a resume in between, for a VLM whose vision
tower trains through LoRA adapters (:func:`test_vlm_tower_lora_two_processes_and_resume_equal_accumulation`).

The runs log the same step: the loss and its parts, the gradient norm and the objectives' step values (``accuracy``,
``reward``, ``advantage_std``, ...: :data:`STEP_VALUES`), within 1e-6 (relative; 1e-5 for the gradient norm).

Dropout is off (``clipcap.tiny_dropout=0``) and RL sampling is seeded per image (``finecap.decode.sample``), so the
three runs compute the same function of the same data; what differs is only how the global batch is split, which
the loop's item-weighted normalisation must undo. Tolerances: the runs sum the same numbers in different orders
(float32), and AdamW's first step is ``lr * g / (|g| + eps)``, whose slope at g = 0 is ``lr / eps``: an element
whose gradient is within float noise (~1e-10) of zero can move by ``lr * 1e-10 / 1e-8``, 1% of the learning rate.
So the test allows at most 0.1% of the elements to differ by more than 1e-6 and none by more than 5% of the
learning rate. Measured on the 2-core development machine: MLE and SMILE at most 5e-7; SCST one element of 21,952
at 1.3e-5 (its other elements below 1e-6, with rewards, loss and gradient norm equal to 7 digits). A loop that
averaged micro-batch means instead of weighting them by their item counts failed at once (differences of 2 x lr:
Adam's first step is nearly ``lr * sign(g)`` and signs flip).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finecap.config import load
from finecap.runs import METRICS_FILE, checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.equivalence import OBJECTIVES, compare, overrides, weights
from helpers.shared_launch import vlm_tower_run

# The objectives' logged step values, besides the loss, that the three runs must log alike (the loss's tolerance):
# each is reduced over every micro-batch and process of the step before it is divided (finecap.objectives.token_means:
# a mean over every token, caption or image, the std over every caption), and the three runs compute the same tokens
# and captions (dropout off, sampling seeded per image, not drawn in process order; SR's retrieval reward and its
# running mean reduced over the global batch), so only the order of the sums differs. MLE's ``accuracy`` and SMILE's
# ``mle_loss``: token means over the step's labels; the REINFORCE family's ``reward``, ``reward_greedy``,
# ``baseline``, ``logprob`` and ``sample_words``: means over its captions; ``advantage_std``: the std over its
# captions' advantages; ``distinct_samples``: a mean over its images; ``reward_greedy/failed``: the share of its
# greedy captions a reward could not score (the monitor's step count).
# What each comparison can see: the accumulation run, a step value made of its last micro-batch only (or of the
# micro-batches' stds); the 2-process run, one whose processes' sums were not all-reduced, but only in ``mle_loss``
# (the processes hold different numbers of tokens) and ``advantage_std`` (a std): every value is logged as the mean
# of the processes' values (finecap.train.logging.mean_over_processes), which for a mean over captions or images is
# the step's when, as here, each process holds 8 images, all scored. Both checked by breaking TokenMeans.
# At this first step some are constants, whose comparison sees only that each run logs them (finite): ``accuracy`` 0
# (the random ClipCap predicts no label), SCST's ``distinct_samples`` 1 (every image's 3 samples differ) and
# ``reward_greedy/failed`` 0, SR's ``baseline`` 0 (the running mean before any step) and ``sample_words`` 8 (every
# greedy caption is decode.max_length's 8 words).
# Not compared, as not equal by construction: a reward's parts (``reward/cider``, ``reward/retrieval/*``) and the
# monitor's measures (``monitor/*``), the mean of the micro-batches' values (equal here only because every
# micro-batch holds 8 images, all scored); ``tokens`` (the micro-batches' mean count); ``time/*``.
STEP_VALUES = {
    "mle": ["accuracy"],
    "smile": ["mle_loss"],
    "smile_random": ["mle_loss"],
    "scst": ["reward", "reward_greedy", "reward_greedy/failed", "baseline", "logprob", "sample_words", "advantage_std",
             "distinct_samples"],
    "sr": ["reward", "baseline", "logprob", "sample_words", "advantage_std"],
}  # fmt: skip


def logged(run: Path, key: str) -> float:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(e for e in events if e["split"] == "train")["values"][key]


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU-only machine")
def test_two_processes_and_accumulation_equal_one_big_batch(world_args, clip_dir, tmp_path, shared_launch):
    """The 2-process runs: one step of each objective over 2 processes x 8 in the shared launch
    (:func:`helpers.shared_launch.equivalence_runs`), whose feature cache the one-process runs share."""
    folder = shared_launch / "equivalence"
    args = dict(world=world_args, clip=clip_dir, cache=folder / "cache")
    unequal = {}  # the step values (STEP_VALUES) the runs logged unlike, of every objective: asserted after them all
    assert STEP_VALUES.keys() == OBJECTIVES.keys()
    for name in OBJECTIVES:
        big = train(load(None, overrides(name, tmp_path / f"{name}-big", batch=16, accum=1, **args)))
        accum = train(load(None, overrides(name, tmp_path / f"{name}-accum", batch=8, accum=2, **args)))
        reference = weights(big)
        compare(reference, weights(accum), f"{name}: 1 process x 8 x 2 accumulation steps vs 1 x 16")
        compare(reference, weights(folder / f"{name}-2proc"), f"{name}: 2 processes x 8 vs 1 x 16")
        # the step really moved the weights (so equality is not that of untouched parameters)
        events = [json.loads(line) for line in (big / "metrics.jsonl").read_text().splitlines()]
        train_event = next(e for e in events if e["split"] == "train")
        assert train_event["values"]["grad_norm"] > 0
        # the logged loss and its parts are the step's (item-weighted over every micro-batch), not means of
        # micro-batch means
        runs = (big, accum, folder / f"{name}-2proc")
        parts = [k for k in train_event["values"] if k.startswith("loss/")]
        assert parts, train_event
        for key in ("loss", *parts):
            losses = [logged(run, key) for run in runs]
            assert losses[1] == pytest.approx(losses[0], rel=1e-6), (name, key, losses)
            assert losses[2] == pytest.approx(losses[0], rel=1e-6), (name, key, losses)
        # ... and so is the gradient: Adam's first step hardly sees a gradient's scale, its norm does
        norms = [logged(run, "grad_norm") for run in runs]
        assert norms[1] == pytest.approx(norms[0], rel=1e-5) and norms[2] == pytest.approx(norms[0], rel=1e-5), (
            name,
            norms,
        )
        # ... and so are the objective's step values (STEP_VALUES), over every token and caption of the global batch
        for key in STEP_VALUES[name]:
            values = [logged(run, key) for run in runs]  # 1 x 16, 1 x 8 x 2 accumulation steps, 2 processes x 8
            if not all(v == pytest.approx(values[0], rel=1e-6) for v in values[1:]):
                unequal[f"{name}: {key}"] = values
    assert not unequal, unequal


def adapter_files(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The LoRA adapter files of the run's last checkpoint (paths in its ``model/`` folder) and their tensors."""
    model = model_dir(checkpoint_dir(run, "last"))
    return {str(f.relative_to(model)): load_file(f) for f in sorted(model.rglob("adapter_model.safetensors"))}


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU-only machine")
def test_vlm_tower_lora_two_processes_and_resume_equal_accumulation(world_args, tmp_path, shared_launch):
    """A tiny LLaVA whose tower trains through LoRA adapters only (language model and projector frozen: the gradient
    goes through the frozen projector) and whose language model reads the tower's first of 2 layers, so no adapters
    go on the second (a parameter without gradient stops DDP, launched with ``find_unused_parameters=False``, at its
    second step): 2 processes x batch 4 for 2 steps, resumed in 2 processes for a third (in the shared launch:
    :func:`helpers.shared_launch.vlm_tower_runs`), log the losses and gradient norms of 1 process x batch 4 x 2
    accumulation steps, and save the same adapters (names, shapes, values within the bounds of the module docstring),
    checkpoint files and nothing more but the second process's own state."""
    folder = shared_launch / "vlm_tower"
    one = train(load(None, vlm_tower_run(folder, world_args, tmp_path / "one", 4, 2, 3)))

    def steps(run_dir: Path) -> dict[int, dict[str, float]]:
        events = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
        train_events = [e for e in events if e["split"] == "train"]
        assert len(train_events) == len({e["step"] for e in train_events}), run_dir  # written once
        return {e["step"]: e["values"] for e in train_events}

    logged_one, logged_two = steps(one), steps(folder / "two")
    assert sorted(logged_two) == sorted(logged_one) == [1, 2, 3]
    for step, values in logged_one.items():
        assert logged_two[step]["loss"] == pytest.approx(values["loss"], rel=1e-6), step
        assert logged_two[step]["grad_norm"] == pytest.approx(values["grad_norm"], rel=1e-5), step
    assert len({v["loss"] for v in logged_one.values()}) == 3  # the adapters learn

    info = json.loads((checkpoint_dir(folder / "two", "last") / "trainer_state.json").read_text())
    assert info["step"] == 3 and info["num_processes"] == 2
    files = {r: {str(f.relative_to(checkpoint_dir(r, "last"))) for f in checkpoint_dir(r, "last").rglob("*")
                 if f.is_file()} for r in (one, folder / "two")}  # fmt: skip
    assert files[folder / "two"] - files[one] == {"state/process_1.json", "state/process_1.safetensors"}
    assert files[one] <= files[folder / "two"]
    adapters_one, adapters_two = adapter_files(one), adapter_files(folder / "two")
    assert sorted(adapters_one) == sorted(adapters_two) == ["adapter/adapter_model.safetensors",
                                                            "encoder_lora/adapter_model.safetensors"]  # fmt: skip
    tower = adapters_one["encoder_lora/adapter_model.safetensors"]
    assert tower and all(".layers.0." in name for name in tower), sorted(tower)  # none on the unreached layer
    assert all(tower[k].abs().max() > 0 for k in tower if "lora_B" in k)  # B starts at zero: it moved
    for name, tensors in adapters_one.items():
        assert {k: v.shape for k, v in adapters_two[name].items()} == {k: v.shape for k, v in tensors.items()}, name
        compare(tensors, adapters_two[name], f"{name}: 2 processes x 4, resumed, vs 1 x 4 x 2 accumulation steps")
