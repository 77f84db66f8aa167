"""What a run of the grid is scored on for a paper: the test split with the paper's metric groups and bags, and
the other test worlds its tables read (the shifted domain, the scene families)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fluency import train_fluency_lm
from .runner import ensure_boosted
from .runs import RUNS
from .schema import Paper
from .shift_tokens import shift_token_metrics

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
    from finecap.train.prepare import prepare

    return prepare(dataclasses.replace(grid.cfg, world=world), {"world"}, make=True).world


def shifted_metrics(grid: StageRunner, paper: Paper, key: str, retriever: Any) -> tuple[dict[str, float], ItemGroup]:
    """Run ``key`` on the shifted domain's test split (as the demo's transfer stage: captioned zero-shot, scored
    against references 2-5 with the training world's retriever), keys prefixed ``shifted/``."""
    from finecap.data.references import load_references
    from finecap.metrics.suite import evaluate_items
    from finecap.world.shift import shifted_world

    world = shifted_world(grid.cfg.world)
    refs = load_references(grid.cfg, other_world_dir(grid, world), split="test", check_images=True)
    predictions = other_world_captions(grid, key, world, "shifted")
    references = {r.image_id: r.captions[1:] for r in refs.records}
    groups = [g for g in SHIFTED_METRICS if not (g == "meteor" and unavailable_metrics(paper))]
    scores, per_image = evaluate_items(predictions, references, metrics=groups, retriever=retriever,
                                       images=refs.records, cfg=grid.cfg)  # fmt: skip
    return {f"shifted/{k}": v for k, v in scores.items()}, item_group(per_image, "shifted/")


def family_metrics(
    grid: StageRunner, key: str, retriever: Any, required: bool = True
) -> tuple[dict[str, float], ItemGroup | None]:
    """Run ``key`` on the scene-family test world, as every row of the demo (:mod:`finecap.app.demo_families`):
    ``family/R@k`` (the ImageCoDe analogue: each image ranked among the members of its family), the hard RD
    ``hardRD{N}/*`` (its family members among the N distractors) and the family world's TrueMatch bags (the hardest
    share ``bags.keep_hardest``) as ``family/bag{s}/*``, prefixed because a paper's ``bag{s}/`` columns are the test
    split's bags (:func:`paper_bags`); and their per-image values (:func:`item_group`). Every run is scored so,
    whatever columns its paper reads; a world whose test split holds no whole family (a tiny test world) is said and
    skipped, unless ``required`` (a column reads it)."""
    from finecap.app.demo_families import family_captions, family_scores_items, family_world, has_families
    from finecap.metrics import families

    if not required and not has_families(grid.cfg):
        log.warning("%s: no scene-family metrics: world.n_test=%d holds no family of %d", key, grid.cfg.world.n_test,
                    families.FAMILY_SIZE)  # fmt: skip
        return {}, None
    family = family_world(grid)
    predictions = family_captions(grid, key if RUNS[key].recipe is not None else None, family)
    scores, per_image = family_scores_items(grid, family, predictions, retriever)

    def name(k: str) -> str:
        return "family/" + k if k.startswith("bag") else k

    per_image = {i: {name(k): v for k, v in values.items()} for i, values in per_image.items()}
    return {name(k): v for k, v in scores.items()}, item_group(per_image)


HUMAN_PREFIX = "human/"
LENGTH_MATCHED = "lenmatched/"


def reference_openings(predictions: dict[Any, str], references: dict[Any, list[str]]) -> dict[Any, str]:
    """The length-matched baseline of :func:`boosted_field_metrics`: for each image, its first reference cut to as
    many words as the prediction has (the whole reference when the prediction is longer).

    >>> reference_openings({1: "a red circle", 2: "x"}, {1: ["a big red circle on grass"], 2: ["a cross"]})
    {1: 'a big red', 2: 'a'}
    """
    return {i: " ".join(references[i][0].split()[: len(p.split())]) for i, p in predictions.items()}


def boosted_field_metrics(predictions: dict[Any, str], own: dict[Any, list[str]], human: dict[Any, list[str]],
                          cfg: Any = None) -> dict[str, float]:  # fmt: skip
    """Scores of a run trained on a boosted caption field beside its own-field CIDEr-D (``CIDEr-D`` against the
    field's one templated reference, which tracks caption length: the Gaussian length penalty of CIDEr-D and the
    n-grams a longer caption can share with a long reference):

    - ``human/BLEU-4``, ``human/CIDEr-D``: against the image's human references ``human`` (references 2-5, as the
      runs on the human captions are scored);
    - ``lenmatched/baseline CIDEr-D``: own-field CIDEr-D of the length-matched baseline (:func:`reference_openings`:
      each image's own reference cut to the run caption's word count, the best a caption of that length can match
      the reference by being its opening), and ``lenmatched/CIDEr-D ratio`` = the run's own-field CIDEr-D over it.
      Both corpora have the same caption lengths, so length moves both; the ratio compares what the captions say.
    """
    from finecap.metrics.suite import evaluate

    out = {f"{HUMAN_PREFIX}{k}": v for k, v in evaluate(predictions, human, metrics=["bleu", "cider"], cfg=cfg).items()
           if k in ("BLEU-4", "CIDEr-D")}  # fmt: skip
    run = evaluate(predictions, own, metrics=["cider"], cfg=cfg)["CIDEr-D"]
    baseline = evaluate(reference_openings(predictions, own), own, metrics=["cider"], cfg=cfg)["CIDEr-D"]
    out[f"{LENGTH_MATCHED}baseline CIDEr-D"] = baseline
    if baseline > 0:  # (empty captions: no ratio)
        out[f"{LENGTH_MATCHED}CIDEr-D ratio"] = run / baseline
    return out


def evaluate_run(grid: StageRunner, paper: Paper, key: str) -> tuple[dict[str, float], list[ItemGroup]]:
    """The paper's metrics of run ``key`` on the test split (beam-5 captions of its best checkpoint), on the other test
    worlds its tables read (:func:`extra_evaluations`) and on the scene families (:func:`family_metrics`, unless
    ``paper.families`` is false); and the
    per-image values of those that are means over the test images, one :func:`item_group` per test world."""
    from finecap.data.datasets import load_records
    from finecap.data.results import read_results
    from finecap.home import world_path
    from finecap.metrics.suite import evaluate_items
    from finecap.models.retriever import load_retriever
    from finecap.stages.outputs import caption_stage, diversity_metrics_items
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
    scores, per_image = evaluate_items(predictions, references, metrics=metrics, retriever=retriever, images=records,
                                       scenes={r.image_id: scenes_by_id[int(r.image_id)] for r in records},
                                       bags=paper_bags(grid, paper) if "bags" in metrics else None,
                                       cfg=cfg)  # fmt: skip
    if paper.diversity and RUNS[key].recipe is not None:
        diversity, diversity_items = diversity_metrics_items(grid, key, references)
        scores.update(diversity)
        for i, values in diversity_items.items():  # the same test images: one group
            per_image.setdefault(i, {}).update(values)
    groups = [item_group(per_image)]
    if RUNS[key].recipe is not None:  # a first-token-shifted SMILE run: where its shift token lands
        scores.update(shift_token_metrics(grid, key))
    if RUNS[key].captions != "original" and RUNS[key].recipe is not None and "cider" in metrics:
        human = {r.image_id: r.captions[1:] for r in records}
        scores.update(boosted_field_metrics(predictions, references, human, cfg))
    others = []  # (scores, items) of the other test worlds
    if "shifted/" in extras:
        others.append(shifted_metrics(grid, paper, key, retriever))
    if paper.families:
        others.append(family_metrics(grid, key, retriever or load_retriever(grid.cfg), required="family/" in extras))
    for extra, group in others:
        scores.update(extra)
        if group is not None:
            groups.append(group)
    return scores, groups


ItemGroup = dict[str, Any]
"""The per-image values of one test world in a run's items file: ``{"ids": [image ids], "values": {metric key:
[value per id, None where the image has none]}}``."""


def item_group(per_image: Mapping[Hashable, Mapping[str, float]], prefix: str = "") -> ItemGroup:
    """The :data:`ItemGroup` of ``{image_id: {metric key: value}}`` (:func:`finecap.metrics.suite.evaluate_items`):
    the keys whose corpus value is the mean of these values (not :data:`~finecap.metrics.suite.NOT_IMAGE_MEANS`),
    prefixed with ``prefix``; ids sorted (as text), keys sorted, values to 4 significant digits, so that the file is
    the same whenever the run's captions are."""
    from finecap.metrics.suite import NOT_IMAGE_MEANS

    ids = sorted(per_image, key=str)
    keys = sorted({k for scores in per_image.values() for k in scores} - set(NOT_IMAGE_MEANS))
    values = {prefix + k: [compact(per_image[i].get(k)) for i in ids] for k in keys}
    return {"ids": ids, "values": values}


def compact(value: float | None) -> float | int | None:
    """``value`` to 4 significant digits, a whole number as an int (R@k hits are 0 or 1: the file stays small)."""
    if value is None:
        return None
    rounded = float(f"{value:.4g}")
    return int(rounded) if rounded.is_integer() else rounded


def paper_bags(grid: StageRunner, paper: Paper) -> dict[int, list[list[Any]]]:
    """The test split's TrueMatch bags for ``paper``, built once into the seed's folder: the demo's (from the human
    captions, ``bags_test.json``), or from the text embeddings of the caption field ``paper.bags_from`` of the
    boosted data set (``bags.text_from``)."""
    from finecap.app.bags import main as build_bags  # the `finecap bags build` command
    from finecap.data.bags_file import read_bags

    cfg, data = grid.cfg, None
    path = grid.run_dir / ("bags_test.json" if paper.bags_from == "original" else f"bags_test_{paper.bags_from}.json")
    if not path.exists():
        if paper.bags_from != "original":
            data = ensure_boosted(grid)
            cfg = dataclasses.replace(cfg, bags=dataclasses.replace(cfg.bags, text_from=paper.bags_from))
        build_bags(cfg, data=data, split="test", sizes=cfg.eval.bag_sizes, out=path)
    return read_bags(path)
