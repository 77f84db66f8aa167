"""``finecap retriever train`` and ``finecap retriever probe``: train the world encoder once and check its quality.

:func:`ensure_world_encoder` returns the cached world encoder of a configuration
(:func:`finecap.models.world_encoder_cache.world_encoder_path`), training it first when it is missing
(:func:`train_world_encoder`); it makes the world first if needed (:func:`finecap.world.make.ensure_world`), and
says what it makes or trains, and where, in one logged line (INFO) each. ``retriever train`` and ``probe`` call it
directly; the demo and ``train`` (on its main process) reach it through :func:`finecap.train.prepare.prepare` before
anything loads the encoder; every other reader (``bags build``, ``eval``, the library) only loads
(:func:`finecap.models.retriever.load_retriever`, whose error names ``finecap retriever train`` when it is missing).
:func:`probe` measures the quality bar: linear probes of scene attributes on frozen image features and caption
retrieval against 99 distractors.

Training (``retriever.*``): AdamW (weight decay 0.05, none on the logit scale), 5% linear warmup then cosine decay,
gradient clipping at 1. Each step takes a batch of training images and

- a symmetric InfoNCE loss between the images and one reference caption per image (drawn at random each time);
- the same loss between ``retriever.dense_fraction`` of the images (a random subset) and their dense captions, the
  dense texts scored against every image of the batch (dense captions are long, so a subset halves their cost);
- ``retriever.aux_weight`` x the mean auxiliary cross-entropy from the scene graphs on the (unnormalised) image
  embedding, through linear heads that are discarded after training: the main object's shape, colour, size and
  position, the background and the object count (:func:`finecap.world.scene.scene_labels`), and per grid cell its
  shape, colour, size and pattern (or empty). It stands in for what a pretrained CLIP already knows. On the default
  world, weights 1, 2.5 and 5 gave colour-probe accuracies 0.900, 0.929 and 0.937 (reference R@1 0.602, 0.633,
  0.633); 5 is the default.

After training, in-batch retrieval accuracy (image -> caption and caption -> image, top-1 in batches of
``retriever.batch_size`` validation images) is logged and stored in ``encoder.json``.


Concurrent trainers of the same encoder (several processes started at once) each build their folder in a temporary
directory of their own; the first to finish renames it into place and the others discard theirs.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from finecap.config import Config
from finecap.data.formats.world import read_world
from finecap.home import cache_dir as resolve_cache_dir
from finecap.home import world_path
from finecap.metrics.retrieval import random_distractors, rd_retrieval
from finecap.models.retriever import Retriever, load_retriever
from finecap.models.world_encoder import MAIN_LABELS, load_split
from finecap.models.world_encoder_cache import encoder_dir
from finecap.outputs import check_output_file, check_replaceable, check_writable, write_output_json
from finecap.train.world_encoder import ensure_world_encoder
from finecap.utils.reading import read_json
from finecap.world.facts import facts, is_true
from finecap.world.make import ensure_world, load_scenes
from finecap.world.scene import LABEL_SIZES

log = logging.getLogger(__name__)

PROBED = ("shape", "color", "size", "position")
"""Main-object labels the quality bar requires a linear probe to decode at >= :data:`PROBE_BAR`."""
PROBE_BAR = 0.9
REF_BAR, DENSE_BAR = 0.6, 0.95
"""R@1 against 99 random distractors required of reference and dense captions."""


def main(cfg: Config) -> Path:
    """``finecap retriever train``: the world encoder (trained or from the cache), or ``retriever.checkpoint``."""
    if cfg.retriever.checkpoint:
        log.info("retriever.checkpoint=%s: nothing to train", cfg.retriever.checkpoint)
        return Path(cfg.retriever.checkpoint)
    ensure_world(cfg, make=True)  # its data is the world: checked (and made) even when the encoder exists
    path = ensure_world_encoder(cfg)
    info = read_json(path / "encoder.json")
    print(json.dumps({"encoder": str(path), "train_seconds": info["train_seconds"],
                      "in_batch_accuracy": info["in_batch_accuracy"]}, indent=2))  # fmt: skip
    return path


# --------------------------------------------------------------------------------------------------------------------
# Probe: the quality bar
# --------------------------------------------------------------------------------------------------------------------


def linear_probe(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, n_classes: int, l2: float = 1e-4,
    max_iter: int = 300,
) -> tuple[float, torch.Tensor]:  # fmt: skip
    """Multinomial logistic regression (features standardised on the training set, L-BFGS, L2 ``l2`` on the
    weights) fitted on ``train_x (N, D)`` -> returns (training accuracy, test predictions ``(M,)``)."""
    mu, sd = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    xtr, xte = (train_x - mu) / sd, (test_x - mu) / sd
    lin = nn.Linear(xtr.shape[1], n_classes)
    nn.init.zeros_(lin.weight)
    nn.init.zeros_(lin.bias)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(lin(xtr), train_y) + l2 * lin.weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        train_acc = float((lin(xtr).argmax(1) == train_y).float().mean())
        return train_acc, lin(xte).argmax(1)


def retrieval_ceiling(
    texts: list[str], targets: np.ndarray, scenes: list[Any], n: int, draws: int, seed: int
) -> float:
    """R@1 of an oracle that knows every scene graph and picks uniformly among the images consistent with all facts
    a caption states (same distractor draws as the metric): the best any retriever can do without priors."""

    stated = [facts(t) for t in texts]
    fits: dict[tuple[int, int], bool] = {}
    vals = []
    for d in range(draws):
        cands = random_distractors(len(texts), len(scenes), targets, n, np.random.default_rng((seed, d)))
        for q, row in enumerate(cands):
            k = 0
            for c in row.tolist():
                key = (q, c)
                if key not in fits:
                    fits[key] = all(is_true(f, scenes[c]) for f in stated[q])
                k += fits[key]
            vals.append(1.0 / (1 + k))
    return float(np.mean(vals))


def probe(cfg_or_paths: Config | tuple[str | Path, str | Path], out: str | Path | None = None,
          ceiling: bool = True, progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """The encoder quality bar: linear probes on frozen image features + caption retrieval against 99 distractors.

    Args:
        cfg_or_paths: a :class:`~finecap.config.Config` (probes ``retriever.checkpoint`` or the world encoder of the
            config, on the world of ``world.*``, made or trained first when missing; loaded as the metrics load it,
            :func:`~finecap.models.retriever.load_retriever`: its captions read as ``retriever.long_text`` says) or
            ``(encoder_dir, world_dir)`` (``long_text=truncate``).
        out: JSON file for the results (default ``<encoder_dir>/probe.json``, never over a file finecap did not
            make; a Hub checkpoint has no folder: then ``out`` is needed); checked before the world, the encoder or
            the probe is made (:func:`probe_out`).
        ceiling: also compute the oracle R@1 ceiling of reference captions (:func:`retrieval_ceiling`).

    Probes are fitted on the training split's features and scored on the test split: main object ``shape``,
    ``color``, ``size``, ``position`` (bar: >= 0.9 each), plus ``background`` and ``count``. Retrieval: every
    reference caption (5 per test image) and every dense caption against 99 random test distractors, 3 seeded draws
    (bar: R@1 >= 0.6 and >= 0.95).
    """
    cache_dir: Path | None = None
    if isinstance(cfg_or_paths, Config):
        cfg = cfg_or_paths
        trained = not cfg.retriever.checkpoint  # the world encoder, trained below when missing
        probe_out(out, cfg.retriever.checkpoint or encoder_dir(cfg), world_path(cfg.world), trained)  # before work
        world, cache_dir = ensure_world(cfg, make=True, progress=progress), resolve_cache_dir(cfg.run)
        enc = cfg.retriever.checkpoint or str(ensure_world_encoder(cfg, progress=progress))
        t0 = time.perf_counter()  # the probe's time: the world and encoder made above are not part of it
        retriever = load_retriever(cfg)  # as the metrics and the reward read it: retriever.long_text, its batch size
    else:
        enc, world = str(cfg_or_paths[0]), Path(cfg_or_paths[1])
        probe_out(out, enc, world)
        t0 = time.perf_counter()
        retriever = Retriever.from_pretrained(enc)
    records = read_world(world)
    train = [r for r in records if r.split == "train"]
    test = [r for r in records if r.split == "test"]
    if len(test) < 2 or not train:
        raise ValueError(f"{world}: the probe needs training images and at least 2 test images")
    train_data = load_split(world, "train", train, progress=False)
    test_data = load_split(world, "test", test, progress=False)
    ftr = retriever.image_features(train, cache_dir)  # (N, D) unnormalised
    fte = retriever.image_features(test, cache_dir)  # (M, D)
    result: dict[str, Any] = {"encoder": enc, "world": str(world), "n_train": len(train), "n_test": len(test)}
    probes, single = {}, np.array([int(t) == 0 for t in test_data.main[:, MAIN_LABELS.index("count")]])
    for j, label in enumerate(MAIN_LABELS):
        train_acc, pred = linear_probe(ftr, train_data.main[:, j], fte, LABEL_SIZES[label])
        right = (pred == test_data.main[:, j]).numpy()
        probes[label] = {
            "test": float(right.mean()),
            "train": train_acc,
            "test_one_object": float(right[single].mean()) if single.any() else None,
            "test_several_objects": float(right[~single].mean()) if (~single).any() else None,
        }
    result["probe"] = probes

    n = min(99, len(test) - 1)
    img = F.normalize(fte, dim=-1)
    ref_texts = [c for caps in test_data.refs for c in caps]
    ref_targets = np.repeat(np.arange(len(test)), [len(c) for c in test_data.refs])
    ref_scores = (retriever.embed_texts(ref_texts) @ img.T).numpy()  # (5M, M)
    dense_scores = (retriever.embed_texts(test_data.dense) @ img.T).numpy()  # (M, M)
    retrieval = {"n_distractors": n, "draws": 3,
                 "reference": rd_retrieval(ref_scores, ref_targets, n, draws=3, seed=0),
                 "dense": rd_retrieval(dense_scores, None, n, draws=3, seed=0)}  # fmt: skip
    if ceiling:
        scenes = load_scenes(world)
        test_scenes = [scenes[i] for i in test_data.ids]
        retrieval["reference_oracle_R@1"] = retrieval_ceiling(ref_texts, ref_targets, test_scenes, n, 3, 0)
    result["retrieval"] = retrieval
    checks = {f"probe/{k}": probes[k]["test"] >= PROBE_BAR for k in PROBED}
    checks["reference/R@1"] = retrieval["reference"]["R@1"] >= REF_BAR
    checks["dense/R@1"] = retrieval["dense"]["R@1"] >= DENSE_BAR
    result["bar"] = {"probe": PROBE_BAR, "reference_R@1": REF_BAR, "dense_R@1": DENSE_BAR, "passed": checks,
                     "all_passed": all(checks.values())}  # fmt: skip
    info = Path(enc) / "encoder.json"
    if info.exists():
        meta = read_json(info)
        result["train_seconds"] = meta.get("train_seconds")
        result["in_batch_accuracy"] = meta.get("in_batch_accuracy")
    result["probe_seconds"] = round(time.perf_counter() - t0, 1)
    out = probe_out(out, enc, world)  # again: the encoder trained above holds the default, a file may have appeared
    assert out is not None
    write_output_json(out, result, "probe")
    result["out"] = str(out)
    return result


def probe_out(out: str | Path | None, enc: str | Path, world: Path, trained: bool = False) -> Path | None:
    """The file :func:`probe` writes for ``out`` and the retriever ``enc`` probed on ``world``, or ``None`` while
    ``enc`` is a folder not made yet (``trained``: it is the world encoder's, trained first when missing).

    ``OutputRefused`` for a given ``out`` that is the retriever or lies inside it or the world (which the probe
    reads), is a file of the user's (never replaced: probe has no ``--force``), or where no file can be written; for
    the default, ``<enc>/probe.json``, when it is a file of the user's there (one was replaced). ``ValueError`` when
    ``out`` is missing and ``enc`` is no local folder (a Hub name: never the working directory)."""
    if out is not None:  # the user's path: not an input, not a file of theirs, a place a file can be made
        check_output_file(out, {"the retriever": enc, "world": world}, force=False, kind="probe", force_flag=None)
        check_writable(out)
        return Path(out)
    if not Path(enc).is_dir():
        if trained:
            return None
        raise ValueError(f"retriever probe: {enc} is no local folder to keep probe.json in; give --out FILE")
    default = Path(enc) / "probe.json"  # beside the retriever, never over a file of the user's there
    check_replaceable(default, force=False, option="--out", kind="probe", force_flag=None)
    return default


def probe_main(cfg: Config, out: str | Path | None = None) -> dict[str, Any]:
    """``finecap retriever probe``: run :func:`probe` and print a short table."""
    res = probe(cfg, out)
    rows = [f"{k:<12} {v['test']:.3f}" for k, v in res["probe"].items()]
    ret = res["retrieval"]
    rows.append(
        f"ref R@1      {ret['reference']['R@1']:.3f}"
        + (f"  (oracle ceiling {ret['reference_oracle_R@1']:.3f})" if "reference_oracle_R@1" in ret else "")
    )
    rows.append(f"dense R@1    {ret['dense']['R@1']:.3f}")
    print("linear probe (test accuracy) and RD-{} retrieval:\n  ".format(ret["n_distractors"]) + "\n  ".join(rows))
    verdict = "PASSED" if res["bar"]["all_passed"] else "NOT met"
    print(f"quality bar {verdict}: {res['bar']['passed']}; wrote {res['out']}")
    return res
