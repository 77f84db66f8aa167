"""What a finished training stage of a :class:`~finecap.stages.StageRunner` makes on the test split: its best
captioner, its captions, several captions per image and their set-level diversity. Each is written once into the
stage's folder and read back on the next run (made again with the runner's ``force``, or when the stage was trained
again since: :meth:`~finecap.stages.StageRunner.made_since_training`); the demo's report and the papers' grids read
them alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from finecap.caption import generate_captions
from finecap.config import DecodeConfig
from finecap.config.sections.decode import BEAM_ONLY
from finecap.data.records import id_from_key
from finecap.data.results import read_results, write_results
from finecap.metrics.suite import evaluate_items
from finecap.models.backbones import load_captioner
from finecap.models.first_token import decode_unshifted
from finecap.runs import model_dir
from finecap.stages.runner import StageRunner
from finecap.utils.files import write_json
from finecap.utils.reading import DATA_FILE, read_json
from finecap.utils.rng import seed_everything

SAMPLES = 5
"""Captions per test image of :func:`stage_samples` (the exploration paper's set-level diversity)."""


def best_model(runner: StageRunner, stage: str) -> Any:
    """The stage's best checkpoint as a captioner in eval mode, its captions written without the shift token of
    SMILE's first-token shifting when its stage's configuration or its ``captioner.json`` says its weights emit one
    (:func:`finecap.models.first_token.decode_unshifted`)."""
    model = load_captioner(model_dir(runner.best_checkpoint(stage))).eval()
    return decode_unshifted(model, runner.stage_config(stage))


def caption_stage(runner: StageRunner, stage: str) -> Path:
    """Test-split captions of the stage's best checkpoint, decoded with its ``decode.*`` (beam 5 in the demo):
    ``<stage>/captions_test.json``."""
    out = runner.stage_dir(stage) / "captions_test.json"
    if not runner.force and runner.made_since_training(stage, out):
        return out
    cfg = runner.stage_config(stage)
    captions = generate_captions(best_model(runner, stage), cfg, "test")
    write_results(out, {i: c[0] for i, c in captions.items()})
    return out


def caption_world(runner: StageRunner, stage: str, world: Any, tag: str, force: bool | None = None) -> dict[Any, str]:
    """Test-split captions of another world (``world``: a :class:`finecap.config.WorldConfig`, made beforehand) by the
    stage's best checkpoint, decoded with its ``decode.*`` (beam 5 in the demo) and kept in
    ``<stage>/captions_<tag>_test.json``: the shifted domain's, the scene families'. The other world's test split is
    captioned whatever data set the stage trained on (the VCB stages train on a boosted copy of the world through
    ``data.path`` / ``data.captions``). Made again when ``force`` (default: the runner's ``force``) or when the stage
    was trained again since (:meth:`~finecap.stages.StageRunner.made_since_training`)."""
    path = world_captions_file(runner.stage_dir(stage), tag)
    if (runner.force if force is None else force) or not runner.made_since_training(stage, path):
        cfg = world_config(runner.stage_config(stage), world)
        write_results(path, {i: c[0] for i, c in generate_captions(best_model(runner, stage), cfg, "test").items()})
    return {i: c[0] for i, c in read_results(path).items()}


def world_captions_file(stage_dir: Path, tag: str) -> Path:
    """Where a stage keeps its test captions of another world: ``<stage>/captions_<tag>_test.json``."""
    return stage_dir / f"captions_{tag}_test.json"


def world_config(cfg: Any, world: Any) -> Any:
    """``cfg`` reading the world ``world`` (a :class:`finecap.config.WorldConfig`) with its original captions, in
    place of whatever data set ``cfg`` names: no ``data.path`` (a boosted copy, another corpus) and no
    ``data.images`` (a corpus's image folder, which would be looked up instead of the world's own images)."""
    data = dataclasses.replace(cfg.data, path="", images="", format="world", captions="original")
    return dataclasses.replace(cfg, world=world, data=data)


def stage_samples(runner: StageRunner, stage: str, mode: str) -> dict[Any, list[str]]:
    """:data:`SAMPLES` captions per test image of the stage's best checkpoint: ``sample`` (the whole distribution at
    T = 1: ``decode.top_k`` / ``top_p`` off, as the rollouts sample) or ``beam`` (the top 5: the stage's beam options
    where the stage itself decodes with beams, else beam search's defaults), kept in
    ``<stage>/samples_test_<mode>.json``."""
    path = runner.stage_dir(stage) / f"samples_test_{mode}.json"
    if not runner.force and runner.made_since_training(stage, path):
        return {id_from_key(k): v for k, v in read_json(path, DATA_FILE).items()}  # ids written with str(id)
    cfg = runner.stage_config(stage)
    if mode == "sample":
        settings: dict[str, Any] = {"strategy": "sample", "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    else:  # a greedy stage's beam options are read nowhere else (a recipe setting them is warned about)
        own = cfg.decode if cfg.decode.strategy == "beam" else DecodeConfig()
        settings = {"strategy": "beam", **{k: getattr(own, k) for k in BEAM_ONLY if k != "beam_size"}}
    decode = dataclasses.replace(cfg.decode, beam_size=SAMPLES, num_return_sequences=SAMPLES, **settings)
    model = best_model(runner, stage)
    seed_everything(cfg.run.seed)  # sampled captions depend on the seed only, not on what this process ran before
    samples = generate_captions(model, cfg, "test", decode=decode)
    write_json(path, {str(k): v for k, v in samples.items()})
    return samples


def diversity_metrics(runner: StageRunner, stage: str, references: dict[Any, list[str]]) -> dict[str, float]:
    """Div-1, Div-2, mBLEU-4 over 5 captions per image (exploration paper Sec. 3.2) and CIDEr-D: the mean over the 5
    samples for ``sample``, the top beam's for ``beam`` (the paper's beam-search numbers are top-beam scores)."""
    return diversity_metrics_items(runner, stage, references)[0]


def diversity_metrics_items(
    runner: StageRunner, stage: str, references: dict[Any, list[str]]
) -> tuple[dict[str, float], dict[Any, dict[str, float]]]:
    """:func:`diversity_metrics` and the per-image values of its means by image id: ``<mode>/Div-1``,
    ``<mode>/Div-2`` and ``<mode>/CIDEr-D`` (the image's CIDEr-D averaged over the samples it is scored on; mBLEU-4
    has none, :func:`finecap.metrics.suite.evaluate_items`)."""
    out: dict[str, float] = {}
    items: dict[Any, dict[str, float]] = {}
    for mode in ("sample", "beam"):
        samples = stage_samples(runner, stage, mode)
        first = {i: c[0] for i, c in samples.items()}
        corpus, per = evaluate_items(first, references, metrics=["diversity"], samples=samples, cfg=runner.cfg)
        out.update({f"{mode}/{k}": v for k, v in corpus.items()})
        ranks = range(1 if mode == "beam" else SAMPLES)  # beam: captions come best first, c[0] is the top beam
        scored = [evaluate_items({i: c[j] for i, c in samples.items()}, references, metrics=["cider"]) for j in ranks]
        out[f"{mode}/CIDEr-D"] = sum(c["CIDEr-D"] for c, _ in scored) / len(scored)
        for i in samples:
            row = items.setdefault(i, {})
            row.update({f"{mode}/{k}": v for k, v in per.get(i, {}).items() if k in ("Div-1", "Div-2")})
            row[f"{mode}/CIDEr-D"] = sum(p[i]["CIDEr-D"] for _, p in scored) / len(scored)
    return out, items
