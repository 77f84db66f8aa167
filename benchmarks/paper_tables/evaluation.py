"""What a run of the grid is scored on for a paper: the test split with the paper's metric groups and bags, and
the other test worlds its tables read (the shifted domain, the scene families)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fluency import train_fluency_lm
from .runner import ensure_boosted
from .runs import RUNS
from .schema import Paper

if TYPE_CHECKING:
    from finecap.stages import StageRunner

log = logging.getLogger(__name__)


def unavailable_metrics(paper: Paper) -> dict[str, str]:
    from finecap.metrics.meteor import meteor_unavailable_reason

    out = {}
    if "meteor" in paper.metrics and (reason := meteor_unavailable_reason()) is not None:
        out["METEOR"] = reason
    return out


EXTRA_PREFIXES = ("shifted/", "family/")
"""Metric-key prefixes of the evaluations on other test worlds: ``shifted/`` the shifted domain (DiscriTune's
cross-domain columns), ``family/`` the scene families (the ImageCoDe analogue; every run is scored on them,
:func:`family_metrics`)."""
SHIFTED_METRICS = ("length", "bleu", "cider", "meteor", "retrieval")


def extra_evaluations(paper: Paper, key: str) -> set[str]:
    """The prefixes of :data:`EXTRA_PREFIXES` that a column of a runnable table of ``paper`` reads from run
    ``key``: the other test worlds this run is evaluated on for the paper."""
    out = set()
    for table in paper.tables:
        if not table.runnable:
            continue
        for row in table.rows:
            if row.run != key:
                continue
            for column in table.columns:
                out |= {p for p in EXTRA_PREFIXES if (row.prefix + column.key).startswith(p)}
    return out


def run_references(grid: StageRunner, key: str, records: Sequence[Any]) -> dict[Any, list[str]]:
    """The test references run ``key`` is scored against: references 2-5 of each image (the first is the human
    row's) for the human captions; the run's own caption field otherwise (NDLB scores models trained on boosted
    captions against the boosted references)."""
    from finecap.data.datasets import load_records

    if RUNS[key].captions == "original":
        return {r.image_id: r.captions[1:] for r in records}
    return {r.image_id: list(r.captions) for r in load_records(grid.stage_config(key), "test")}


def other_world_captions(grid: StageRunner, key: str, world: Any, tag: str) -> dict[Any, str]:
    """Test-split captions of another world (``world``: a :class:`finecap.config.WorldConfig`) by run ``key``'s best
    checkpoint, decoded with its ``decode.*`` and kept in ``<run>/captions_<tag>_test.json``; the human run's are the
    first reference of each image."""
    from finecap.data.references import load_references
    from finecap.stages.outputs import caption_world

    if RUNS[key].recipe is None:
        refs = load_references(grid.cfg, other_world_dir(grid, world), split="test")
        return {r.image_id: r.captions[0] for r in refs.records}
    return caption_world(grid, key, world, tag)


def other_world_dir(grid: StageRunner, world: Any) -> Path:
    from finecap.app.prepare import prepare

    return prepare(dataclasses.replace(grid.cfg, world=world), {"world"}, make=True).world


def shifted_metrics(grid: StageRunner, paper: Paper, key: str, retriever: Any) -> dict[str, float]:
    """Run ``key`` on the shifted domain's test split (as the demo's transfer stage: captioned zero-shot, scored
    against references 2-5 with the training world's retriever), keys prefixed ``shifted/``."""
    from finecap.data.references import load_references
    from finecap.metrics.suite import evaluate
    from finecap.world.shift import shifted_world

    world = shifted_world(grid.cfg.world)
    refs = load_references(grid.cfg, other_world_dir(grid, world), split="test", check_images=True)
    predictions = other_world_captions(grid, key, world, "shifted")
    references = {r.image_id: r.captions[1:] for r in refs.records}
    groups = [g for g in SHIFTED_METRICS if not (g == "meteor" and unavailable_metrics(paper))]
    scores = evaluate(predictions, references, metrics=groups, retriever=retriever, images=refs.records,
                      cfg=grid.cfg)  # fmt: skip
    return {f"shifted/{k}": v for k, v in scores.items()}


def family_metrics(grid: StageRunner, key: str, retriever: Any, required: bool = True) -> dict[str, float]:
    """Run ``key`` on the scene-family test world, as every row of the demo (:mod:`finecap.app.demo_families`):
    ``family/R@k`` (the ImageCoDe analogue: each image ranked among the members of its family), the hard RD
    ``hardRD{N}/*`` (its family members among the N distractors) and the family world's TrueMatch bags (the hardest
    share ``bags.keep_hardest``) as ``family/bag{s}/*``, prefixed because a paper's ``bag{s}/`` columns are the test
    split's bags (:func:`paper_bags`). Every run is scored so, whatever columns its paper reads; a world whose test
    split holds no whole family (a tiny test world) is said and skipped, unless ``required`` (a column reads it)."""
    from finecap.app.demo_families import family_captions, family_scores, family_world
    from finecap.metrics import families

    if not required and grid.cfg.world.n_test < families.FAMILY_SIZE:
        log.warning("%s: no scene-family metrics: world.n_test=%d holds no family of %d", key, grid.cfg.world.n_test,
                    families.FAMILY_SIZE)  # fmt: skip
        return {}
    family = family_world(grid)
    predictions = family_captions(grid, key if RUNS[key].recipe is not None else None, family)
    scores = family_scores(grid, family, predictions, retriever)
    return {("family/" + k if k.startswith("bag") else k): v for k, v in scores.items()}


def evaluate_run(grid: StageRunner, paper: Paper, key: str) -> dict[str, float]:
    """The paper's metrics of run ``key`` on the test split (beam-5 captions of its best checkpoint), on the other
    test worlds its tables read (:func:`extra_evaluations`), and on the scene families (:func:`family_metrics`)."""
    from finecap.data.datasets import load_records
    from finecap.data.formats import read_results
    from finecap.home import world_path
    from finecap.metrics.suite import evaluate
    from finecap.models.retriever import load_retriever
    from finecap.stages.outputs import caption_stage, diversity_metrics
    from finecap.world.make import load_scenes

    cfg = grid.cfg
    if paper.fluency_lm:
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, lm=str(train_fluency_lm(grid))))
    metrics = [m for m in paper.metrics if not (m == "meteor" and unavailable_metrics(paper))]
    extras = extra_evaluations(paper, key)
    records = load_records(cfg, "test")
    scenes_by_id = load_scenes(world_path(cfg.world))
    references = run_references(grid, key, records)
    if RUNS[key].recipe is None:
        predictions = {r.image_id: r.captions[0] for r in records}
    else:
        predictions = {i: c[0] for i, c in read_results(caption_stage(grid, key)).items()}
    retriever = load_retriever(cfg) if set(metrics) & {"retrieval", "bags", "clipscore"} or extras else None
    scores = evaluate(predictions, references, metrics=metrics, retriever=retriever, images=records,
                      scenes={r.image_id: scenes_by_id[int(r.image_id)] for r in records},
                      bags=paper_bags(grid, paper) if "bags" in metrics else None, cfg=cfg)  # fmt: skip
    if paper.diversity and RUNS[key].recipe is not None:
        scores.update(diversity_metrics(grid, key, references))
    if "shifted/" in extras:
        scores.update(shifted_metrics(grid, paper, key, retriever))
    scores.update(family_metrics(grid, key, retriever or load_retriever(grid.cfg), required="family/" in extras))
    return scores


def paper_bags(grid: StageRunner, paper: Paper) -> dict[int, list[list[Any]]]:
    """The test split's TrueMatch bags for ``paper``, built once into the seed's folder: the demo's (from the human
    captions, ``bags_test.json``), or from the text embeddings of the caption field ``paper.bags_from`` of the
    boosted data set (``bags.text_from``)."""
    from finecap.app.bags import main as build_bags  # the `finecap bags build` command
    from finecap.data.formats import read_bags

    cfg, data = grid.cfg, None
    path = grid.run_dir / ("bags_test.json" if paper.bags_from == "original" else f"bags_test_{paper.bags_from}.json")
    if not path.exists():
        if paper.bags_from != "original":
            data = ensure_boosted(grid)
            cfg = dataclasses.replace(cfg, bags=dataclasses.replace(cfg.bags, text_from=paper.bags_from))
        build_bags(cfg, data=data, split="test", sizes=cfg.eval.bag_sizes, out=path)
    return read_bags(path)
