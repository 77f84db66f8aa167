"""Every recipe loads, validates, and opens with the command that runs it (DESIGN.md style point 3)."""

import pytest

from finecap.app.cli import main
from finecap.config import ConfigError, load
from finecap.objectives import OBJECTIVES
from finecap.recipes import describe_recipe, list_recipes, resolve_recipe

RECIPES = list_recipes()


def test_there_are_recipes():
    assert {"demo/mle", "demo/smile", "coco/smile_clipcap"} <= set(RECIPES)


def test_recipes_resolve_by_name_or_path(tmp_path, capsys):
    path = resolve_recipe("demo/smile")
    assert path.is_file() and path.parts[-3:] == ("recipes", "demo", "smile.yaml")
    assert resolve_recipe("smile") == resolve_recipe("demo/smile.yaml") == path  # unambiguous short name
    mine = tmp_path / "smile"
    mine.write_text("train:\n  lr: 0.5\n")
    assert resolve_recipe(mine) == mine  # an existing file wins over a packaged name
    assert load(mine).train.lr == 0.5 and load("smile").train.objective == "smile"
    with pytest.raises(ConfigError, match="no_such_recipe: recipe file not found, and no packaged recipe.*demo/mle"):
        load("no_such_recipe")
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(RECIPES) and out[0].split()[0] == RECIPES[0]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_loads_and_documents_its_command(name):
    recipe = resolve_recipe(name)
    cfg = load(recipe)
    assert cfg.train.objective in OBJECTIVES, cfg.train.objective
    head = recipe.read_text().splitlines()
    assert head[0].startswith("#"), "a recipe opens with a comment"
    comments = "\n".join(line for line in head if line.startswith("#"))
    assert "finecap " in comments, "the opening comment gives the command that runs the recipe"
    assert "verride" in comments, "the opening comment gives an override example"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_description_is_one_whole_line(name):
    # `finecap recipes` prints each recipe's first comment line: one sentence, whole, within the line length
    first = resolve_recipe(name).read_text().splitlines()[0]
    description = describe_recipe(name)
    assert first == f"# {description}" and len(first) <= 119
    assert description.endswith(".") and description[0].isupper(), description


def test_recipes_lists_whole_descriptions(capsys):
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, line in zip(RECIPES, lines, strict=True):
        assert line.split()[0] == name and line.endswith(describe_recipe(name))


@pytest.mark.parametrize("name", ["coco/mle_vlm", "coco/smile_vlm", "coco/discritune_vlm"])
def test_vlm_recipes_build_a_vlm_captioner(name, tmp_path):
    """The decoder-only VLM recipes name SmolVLM-256M-Instruct (model.kind=vlm); with vlm.name pointing at a tiny
    saved Idefics3 (SmolVLM's family) instead of the Hub, the recipe builds and configures a VLM captioner."""
    from finecap.models.backbones import build_model
    from finecap.models.lora import configure_training
    from finecap.models.presets import save_tiny_vlm
    from finecap.models.vlm import Vlm

    cfg = load(name)
    assert cfg.model.kind == "vlm" and cfg.vlm.name == "HuggingFaceTB/SmolVLM-256M-Instruct"
    tiny = save_tiny_vlm(tmp_path / "vlm", "idefics3")
    cfg = load(name, [f"vlm.name={tiny}"])
    model = configure_training(build_model(cfg), cfg)
    assert isinstance(model, Vlm) and model.section.prompt == cfg.vlm.prompt
    assert model.train_lm and not model.train_encoder and model.section.train_projector


@pytest.mark.parametrize("name", [n for n in RECIPES if n.startswith("coco/") and "boost" not in n])
def test_coco_training_recipes_set_the_input_pipeline(name):
    # Real images: decoded and preprocessed in DataLoader workers kept across epochs, pinned for the GPU copy
    # (docs/data.md, "The input pipeline"); stated in the recipe, not left to the defaults.
    import yaml

    written = yaml.safe_load(resolve_recipe(name).read_text())["data"]
    assert written["num_workers"] >= 2 and written["persistent_workers"] is True and written["pin_memory"] is True
    cfg = load(resolve_recipe(name))
    assert (cfg.data.num_workers, cfg.data.persistent_workers, cfg.data.pin_memory) == (8, True, True)
