"""The scene-family test world in the demo's report and the papers' grids: the fine-grained measures that are not at
their ceiling.

Every trained stage (and the human captions: each image's first reference) captions the 1,000 images of the family
test world (:func:`finecap.metrics.families.family_test_world`: 100 families of 10 scenes, each one detail from its
base, from the training world's seed; made once per world in the finecap home) with its best checkpoint, decoded as
its test captions (beam 5), and the training world's retriever scores them (:func:`family_scores`):

- ``family/R@1``: the image among the 10 members of its family (the ImageCoDe analogue);
- ``hardRD{N}/R@1``, ``R@5``: the image among ``N`` = ``eval.n_distractors`` distractors, its 9 family members and
  ``N - 9`` random images of other families (``eval.draws`` draws; :func:`finecap.metrics.families.hard_rd_retrieval`);
- ``bag{s}/R@1``: TrueMatch bags built on the family world as NDLB builds them (Algorithms 1-2 over the multimodal
  embeddings of its images and references), the most similar share ``bags.keep_hardest`` of them kept (the demo's:
  all; a third, as a stand-in for NDLB's manual filter, sat near chance for every row), with their mean
  intra-bag similarity ``bag{s}/alpha`` and count ``bag{s}/bags``; the bags of the training world's test split
  (1,000 images without near-duplicates) were easier than 99 random distractors. The family world holds the world's
  near-duplicates, so its bags are as hard as the world's scenes allow, and they are scored on the same captions.
- with ``listener``: the fact-based listener in the same bags (``listener/bag{s}/R@1``,
  :mod:`finecap.metrics.listener`).

The bags are built once per run directory (``<run_dir>/families10/bags_test.json``: a folder of its own, since
``finecap report`` checks the run directory's own ``bags*.json`` against the training world), and again when
what built them changes (:func:`finecap.app.bags.reuse_bags`); the captions once per
stage (``<stage>/captions_families10_test.json``, :func:`finecap.stages.outputs.caption_world`): in the demo by the
training stage itself after its test captions (:func:`caption_families`), so in parallel with the other side
stages; the report captions what is missing (stages trained before this existed). Cost measured on the default demo
(two shared cores): 51 s for the MLE ClipCap's beam-5 captions of the 1,000 family images; scoring a row on the
family world takes 3-5 s.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finecap.app.bags import reuse_bags
from finecap.config import Config, WorldConfig
from finecap.data.bags_file import read_bags
from finecap.data.references import load_references
from finecap.data.truematch import bag_statistics
from finecap.home import cache_dir
from finecap.metrics import families
from finecap.metrics.families import family_self_retrieval_items, family_test_world
from finecap.metrics.suite import evaluate_items
from finecap.stages import StageRunner
from finecap.stages.outputs import caption_world
from finecap.train.prepare import prepare
from finecap.utils.reading import DATA_FILE, read_json

log = logging.getLogger(__name__)


@dataclass
class FamilyWorld:
    """The family test world of a runner's configuration: its settings, folder, test records with their families
    and scene graphs, and its TrueMatch bags (``{size: [[image_id, ...], ...]}``) with their statistics."""

    world: WorldConfig
    path: Path
    references: Any  # finecap.data.references.LoadedReferences
    bags: dict[int, list[list[Any]]]
    bag_stats: dict[str, float]


def has_families(cfg: Config) -> bool:
    """Whether the test split of ``cfg.world`` is large enough for one family (``world.n_test`` >= the family size):
    a tiny test world (the tests') has no family world, and the demo leaves its columns out."""
    return cfg.world.n_test >= families.FAMILY_SIZE


def make_family_world(cfg: Config, make: bool = True) -> tuple[WorldConfig, Path]:
    """The family test world of ``cfg.world`` (its settings and folder), made when missing (the demo's ``world``
    stage makes it, so the training stages, which caption it side by side, never race to); with ``make=False`` a
    missing one raises ``FileNotFoundError`` (the report reads the world, never makes it)."""
    world = family_test_world(cfg.world, families.FAMILY_SIZE)
    return world, prepare(dataclasses.replace(cfg, world=world), {"world"}, make=make).world


def caption_families(runner: StageRunner, stage: str) -> None:
    """A training stage's captions of the family world (``then`` of the demo's training stages, after its test
    captions): they are made where the stage runs, side by side with the other stages, not in the report. The family
    world is made here when missing (the demo's ``world`` stage, or the first stage to finish, makes it before the
    side stages start)."""
    caption_world(runner, stage, make_family_world(runner.cfg)[0], families.family_tag())


def family_world(runner: StageRunner) -> FamilyWorld:
    """Make (or find) the family test world of ``runner.cfg.world`` and its bags (module docstring)."""
    cfg = runner.cfg
    world, path = make_family_world(cfg)
    references = load_references(cfg, path, split="test", check_images=True)
    bags_path = reuse_bags(
        cfg, data=path, out=runner.run_dir / families.family_tag() / "bags_test.json", force=runner.force
    )
    return FamilyWorld(world, path, references, read_bags(bags_path), bag_statistics(read_json(bags_path, DATA_FILE)))


def family_captions(runner: StageRunner, stage: str | None, family: FamilyWorld) -> dict[Any, str]:
    """The family world's test captions by ``stage``'s best checkpoint, or the first reference of each image for
    ``stage=None`` (the human row)."""
    if stage is None:
        return {r.image_id: r.captions[0] for r in family.references.records}
    return caption_world(
        runner, stage, family.world, families.family_tag(), force=False
    )  # made again with the stage (force)


def family_scores(
    runner: StageRunner, family: FamilyWorld, predictions: dict[Any, str], retriever: Any, listener: bool = False
) -> dict[str, float]:
    """``family/*``, ``hardRD{N}/*``, ``bag{s}/*`` (and ``listener/bag{s}/*`` with ``listener``) of family-world
    captions, scored by the training world's ``retriever`` (module docstring)."""
    return family_scores_items(runner, family, predictions, retriever, listener)[0]


def family_scores_items(
    runner: StageRunner, family: FamilyWorld, predictions: dict[Any, str], retriever: Any, listener: bool = False
) -> tuple[dict[str, float], dict[Any, dict[str, float]]]:
    """:func:`family_scores` and the per-image values of its means by image id (the family R@k and hard RD's:
    :func:`finecap.metrics.families.family_self_retrieval_items`; the bags':
    :func:`~finecap.metrics.suite.evaluate_items`)."""
    cfg = runner.cfg
    e, refs, size = cfg.eval, family.references, families.FAMILY_SIZE
    hard = e.n_distractors if size - 1 <= e.n_distractors <= len(refs.records) - 1 else None
    if hard is None:
        log.warning("no hard RD%d on the family world: it needs at least the %d family members and at most the %d "
                    "other images as distractors", e.n_distractors, size - 1, len(refs.records) - 1)  # fmt: skip
    out, items = family_self_retrieval_items(predictions, retriever, refs.records, refs.families, size,
                                             cache_dir(cfg.run), n_distractors=hard, draws=e.draws,
                                             seed=e.seed)  # fmt: skip
    groups = ["bags", "listener"] if listener else ["bags"]
    scores, bag_items = evaluate_items(predictions, None, metrics=groups, retriever=retriever, images=refs.records,
                                       scenes=refs.scenes, bags=family.bags, cfg=cfg)  # fmt: skip
    bag_keys = ("bag", "listener/bag")
    out.update({k: v for k, v in scores.items() if k.startswith(bag_keys)})
    out.update(family.bag_stats)
    for i, values in bag_items.items():
        items.setdefault(i, {}).update({k: v for k, v in values.items() if k.startswith(bag_keys)})
    return out, items
