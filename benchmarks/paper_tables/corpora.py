"""SMILE's Fig. 4b corpora on the world: each image's captions rewritten with no detail (``simplest``) or one detail
of the main object (``simpler``), in the world's words."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from finecap.stages import StageRunner

SIMPLE_CORPORA = ("simplest", "simpler")


def simple_caption(scene: Any, level: str, rng: Any) -> str:
    """A caption of ``scene`` with no detail (``simplest``: the main object's noun, 'a circle') or one detail of the
    main object (``simpler``: a colour, size or pattern word, or the background, drawn with ``rng``), in the world's
    words (:mod:`finecap.world.captions`), for SMILE's Fig. 4b corpora."""
    from finecap.world.captions import BACKGROUND_PHRASES, COLOR_WORDS, PATTERN_WORDS, SHAPE_WORDS, SIZE_WORDS

    main = scene.main
    noun = SHAPE_WORDS[main.shape][0]
    if level == "simplest":
        return f"a {noun}"
    if level != "simpler":
        raise ValueError(f"unknown corpus {level!r}; valid: {', '.join(SIMPLE_CORPORA)}")
    adjectives = [COLOR_WORDS[main.color][0], SIZE_WORDS[main.size][0]]
    if main.pattern:
        adjectives.append(PATTERN_WORDS[main.pattern][0])
    choice = rng.randrange(len(adjectives) + 1)
    if choice == len(adjectives):
        return f"a {noun} {BACKGROUND_PHRASES[scene.background][0]}"
    word = adjectives[choice]
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word} {noun}"


def simple_corpus(grid: StageRunner, level: str) -> Path:
    """The world's data set with each image's five captions rewritten by :func:`simple_caption` (Karpathy format,
    the world's images), written once to ``<seed folder>/corpus_<level>/dataset.json``; returns its path."""
    import random

    from finecap.home import world_path
    from finecap.utils.files import write_json
    from finecap.utils.reading import read_json
    from finecap.world.make import load_scenes

    out = grid.run_dir / f"corpus_{level}" / "dataset.json"
    if out.exists():
        return out
    world = world_path(grid.cfg.world)
    data, scenes = read_json(world / "dataset.json"), load_scenes(world)
    for image in data["images"]:
        rng = random.Random(f"{grid.cfg.world.seed}-{level}-{image['imgid']}")
        captions = [simple_caption(scenes[int(image["imgid"])], level, rng) for _ in image["sentences"]]
        image["sentences"] = [{**s, "raw": c, "tokens": c.split()} for s, c in zip(image["sentences"], captions)]
    write_json(out, data)
    return out
