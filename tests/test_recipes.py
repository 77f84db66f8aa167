"""Every recipe loads, validates, and opens with the command that runs it (DESIGN.md style point 3)."""

from pathlib import Path

import pytest

from finecap.config import load
from finecap.objectives import OBJECTIVES

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").rglob("*.yaml"))


def test_there_are_recipes():
    names = {p.relative_to(p.parents[1]).as_posix() for p in RECIPES}
    assert {"demo/mle.yaml", "demo/smile.yaml", "coco/smile_clipcap.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.relative_to(p.parents[1]).as_posix())
def test_recipe_loads_and_documents_its_command(recipe):
    cfg = load(recipe)
    assert cfg.train.objective in OBJECTIVES, cfg.train.objective
    head = recipe.read_text().splitlines()
    assert head[0].startswith("#"), "a recipe opens with a comment"
    comments = "\n".join(line for line in head if line.startswith("#"))
    assert "finecap " in comments, "the opening comment gives the command that runs the recipe"
    assert "verride" in comments, "the opening comment gives an override example"
