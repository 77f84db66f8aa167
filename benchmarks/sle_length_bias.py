"""Which sampled captions SLE's diversity term pushes up: the diversity advantage of each of the s captions sampled
for an image (``finecap.objectives.exploration.diversity_advantages``: ``(2/s) sum_k (d_jk - b)``, the BLEU-3/4
distance of the exploration paper) set against the caption's length relative to the image's other samples.

    FINECAP_HOME=<home of the run> python benchmarks/sle_length_bias.py runs/effects/seed2 --stage mle

Samples ``s = 5`` captions at T = 1 (the SLE recipe's rollouts) for each validation image from the stage's best
checkpoint and prints, over all samples: the mean diversity advantage by length relative to the image's mean
(shorter by more than one word, within one word, longer by more than one word), the Pearson correlation of the
advantage with the signed and with the absolute relative length, and the same for the CIDEr-D reward of each
sample (against all the image's references) as the precision term sees it. The settings are the run's own (its
``config.yaml`` differences from the demo's defaults, as ``benchmarks/training_noise.py`` reads them).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SAMPLES = 5


def length_bins(relative: np.ndarray, values: np.ndarray) -> dict[str, tuple[float, int]]:
    """Mean of ``values`` (and count) for samples shorter than the image's mean by more than a word, within a word,
    longer by more than a word.

    >>> length_bins(np.array([-2.0, 0.5, 3.0, -1.5]), np.array([1.0, 0.0, -1.0, 3.0]))
    {'shorter': (2.0, 2), 'within one word': (0.0, 1), 'longer': (-1.0, 1)}
    """
    masks = {"shorter": relative < -1, "within one word": np.abs(relative) <= 1, "longer": relative > 1}
    return {name: (float(values[m].mean()) if m.any() else float("nan"), int(m.sum())) for name, m in masks.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a demo run directory")
    p.add_argument("--stage", default="mle", help="the stage whose best checkpoint samples (default mle)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from finecap.caption import generate_captions
    from finecap.data.datasets import load_records
    from finecap.metrics.diversity import caption_length
    from finecap.metrics.suite import evaluate_items
    from finecap.objectives.exploration import caption_distances, diversity_advantages
    from finecap.stages import finished_stages
    from finecap.stages.outputs import best_model
    from finecap.utils.rng import seed_everything

    run = Path(args.run)
    demo = finished_stages(run, [args.stage])  # the stage as it trained: its own config.yaml
    stage_cfg = demo.stage_config(args.stage)
    decode = dataclasses.replace(stage_cfg.decode, strategy="sample", temperature=1.0, beam_size=SAMPLES,
                                 num_return_sequences=SAMPLES)  # fmt: skip
    seed_everything(args.seed)
    samples = generate_captions(best_model(demo, args.stage), stage_cfg, "val", decode=decode)
    ids = sorted(samples)
    flat = [c for i in ids for c in samples[i]]
    advantage = diversity_advantages(caption_distances(flat, SAMPLES)).numpy().reshape(-1)  # (N,)
    lengths = np.array([caption_length(c) for c in flat], dtype=float).reshape(len(ids), SAMPLES)
    relative = (lengths - lengths.mean(axis=1, keepdims=True)).reshape(-1)
    references = {r.image_id: r.captions for r in load_records(stage_cfg, "val")}
    keys = [(i, j) for i in ids for j in range(SAMPLES)]  # each image's references repeated s times: CIDEr-D's
    _, per_sample = evaluate_items({(i, j): samples[i][j] for i, j in keys},  # document frequencies are unchanged
                                   {(i, j): references[i] for i, j in keys}, metrics="cider")  # fmt: skip
    cider = np.array([per_sample[k]["CIDEr-D"] for k in keys])
    print(f"{run} {args.stage}: {len(ids)} validation images x {SAMPLES} samples at T = 1")
    print("| samples | n | mean diversity advantage | mean CIDEr-D |")
    print("| --- | --- | --- | --- |")
    adv_bins, cider_bins = length_bins(relative, advantage), length_bins(relative, cider)
    for name, (mean, n) in adv_bins.items():
        print(f"| {name} | {n} | {mean:+.4f} | {cider_bins[name][0]:.3f} |")
    for label, x in (("signed", relative), ("absolute", np.abs(relative))):
        print(f"correlation with the {label} relative length: diversity advantage "
              f"{np.corrcoef(x, advantage)[0, 1]:+.3f}, CIDEr-D {np.corrcoef(x, cider)[0, 1]:+.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
