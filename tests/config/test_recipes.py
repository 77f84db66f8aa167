"""Every recipe loads, validates, and opens with the command that runs it (DESIGN.md style point 3)."""

import os

import pytest

from finecap.app.cli import main
from finecap.config import ConfigError, load
from finecap.objectives import get_objective
from finecap.objectives.exploration import SequenceLevelExploration
from finecap.objectives.grpo import PolicyOptimization
from finecap.objectives.mle import MLE
from finecap.objectives.reinforce import Reinforce
from finecap.objectives.smile import SmileObjective
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
    load(recipe)
    head = recipe.read_text().splitlines()
    assert head[0].startswith("#"), "a recipe opens with a comment"
    comments = "\n".join(line for line in head if line.startswith("#"))
    assert "finecap " in comments, "the opening comment gives the command that runs the recipe"
    assert "verride" in comments, "the opening comment gives an override example"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_sets_no_option_its_configuration_never_reads(name, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="finecap.config"):
        load(resolve_recipe(name))
    assert not [r.getMessage() for r in caplog.records if "changes nothing" in r.getMessage()]


def promised(name: str) -> dict:
    """What a recipe's name promises (its file name's words): the objective's class, the reward's parts with their
    weights, and the captioner kind. SR + lambda CIDEr (NDLB Sec. 4.6) adds CIDEr to a self-retrieval reward at a
    weight below the retrieval's 1."""
    words = set(name.rsplit("/", 1)[-1].split("_"))
    kind = "blip" if "blip" in words else "vlm" if "vlm" in words else "clipcap"
    if "smile" in words:
        return {"objective": SmileObjective, "kind": kind}
    if "grpo" in words:  # the GRPO family (issue 50): SR + lambda CIDEr-D, CIDEr-D alone, or CapRL's QA utility
        reward = {"retrieval": 1.0} if "sr" in words else {"qa_utility": 1.0} if "qa" in words else {"cider": 1.0}
        return {"objective": PolicyOptimization, "reward": reward, "kind": kind}
    if "sle" in words:
        return {"objective": SequenceLevelExploration, "reward": {"cider": 1.0}, "kind": kind}
    if "scst" in words:
        return {"objective": Reinforce, "reward": {"cider": 1.0}, "kind": kind}
    if "discritune" in words or "sr" in words:
        return {"objective": Reinforce, "reward": {"retrieval": 1.0}, "kind": kind}
    if words & {"mle", "boost", "expert"}:
        return {"objective": MLE, "kind": kind}
    raise AssertionError(f"{name}: its name promises no objective this test knows; add it to promised()")


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_builds_the_objective_its_name_promises(name):
    """Built as training builds it (``get_objective``), not read back from the field the loader just checked."""
    cfg = load(name)
    promise = promised(name)
    objective = get_objective(cfg.train.objective, cfg)
    assert type(objective) is promise["objective"], (name, type(objective).__name__)
    assert cfg.model.kind == promise["kind"]
    if "reward" not in promise:
        assert not hasattr(objective, "reward"), f"{name}: a likelihood objective has no reward"
        return
    weights = {part: weight for part, (weight, _) in objective.reward.rewards.items()}
    main, weight = next(iter(promise["reward"].items()))
    assert weights[main] == weight, (name, weights)
    assert all(w < weight for part, w in weights.items() if part != main), f"{name}: {weights}"
    words = set(name.rsplit("/", 1)[-1].split("_"))
    assert (objective.rl.entropy_coef > 0) == ("me" in words), f"{name}: max-entropy term iff the name says ME"
    assert bool(cfg.data.bag_schedule) == ("bagcurri" in words), f"{name}: a bag curriculum iff the name says so"
    if words & {"l", "v", "lv"}:  # NDLB's SR-L / SR-V / SR-LV: which of the captioner's parts self-retrieval trains
        lm, encoder = bool(words & {"l", "lv"}), bool(words & {"v", "lv"})
        assert (cfg.model.train_lm, cfg.model.train_encoder) == (lm, encoder), name


def test_promised_refuses_a_name_it_does_not_know():
    with pytest.raises(AssertionError, match="promises no objective"):
        promised("demo/mystery")
    assert promised("coco/sr_lv_bagcurri_clipcap")["reward"] == {"retrieval": 1.0}


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


@pytest.mark.parametrize(
    "name",
    ["coco/mle_vlm", "coco/smile_vlm", "coco/discritune_vlm", "coco/sr_l_vlm", "coco/sr_lv_bagcurri_vlm",
     "coco/grpo_cider_vlm", "coco/grpo_sr_cider_vlm"],
)  # fmt: skip
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
    assert model.train_lm and model.train_encoder == cfg.model.train_encoder and model.section.train_projector
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if ".lora_A" in n}
    if cfg.lora.lm:  # every VLM recipe (issue 65): LoRA on the language model's attention (NDLB's GPT-2 targets)
        assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= adapted and not adapted & {"gate_proj", "down_proj"}
    if cfg.lora.encoder:  # SR-LV: the vision tower's attention and MLP too
        assert {"fc1", "fc2", "out_proj"} <= adapted
    if not (cfg.lora.lm or cfg.lora.encoder):
        assert not adapted


@pytest.mark.parametrize("name", [n for n in RECIPES if n.startswith("coco/") and "boost" not in n])
def test_coco_training_recipes_set_the_input_pipeline(name):
    # Real images: decoded and preprocessed in DataLoader workers kept across epochs, pinned for the GPU copy
    # (docs/data.md, "The input pipeline"); stated in the recipe, not left to the defaults.
    import yaml

    written = yaml.safe_load(resolve_recipe(name).read_text())["data"]
    assert written["num_workers"] >= 2 and written["persistent_workers"] is True and written["pin_memory"] is True
    cfg = load(resolve_recipe(name))
    assert (cfg.data.num_workers, cfg.data.persistent_workers, cfg.data.pin_memory) == (8, True, True)


@pytest.mark.parametrize("name", [n for n in RECIPES if n.startswith("coco/smile_")])
def test_coco_smile_recipes_evaluate_the_papers_table_1_perplexity_too(name):
    # SMILE's Table 1 reports perplexity "with GPT-2" beside length, diversity, R@1/R@5 and CLIPScore (Sec. 3.1):
    # `finecap eval <recipe>` computes it only when eval.lm names the LM (finecap.app.eval.default_metrics).
    from finecap.app.eval import default_metrics

    cfg = load(resolve_recipe(name))
    assert cfg.eval.lm == "gpt2"
    assert "perplexity" in default_metrics(coco=False, world=False, bags=False, lm=bool(cfg.eval.lm))


def test_the_small_world_recipe_shares_the_quick_demos_world_and_encoder_and_else_is_demo_mle():
    """demo/mle_small (the README's recipe for a slow machine): the quick demo's world and world encoder (one cache:
    the same world key and encoder settings), demo/mle's captioner, fewer steps."""
    from finecap.recipes.settings import DEMO_QUICK
    from finecap.world.key import world_key

    small, quick, full = load("demo/mle_small"), load(None, base=DEMO_QUICK), load("demo/mle")
    assert world_key(small.world) == world_key(quick.world) != world_key(full.world)
    assert (small.retriever.epochs, small.retriever.batch_size) == (quick.retriever.epochs, quick.retriever.batch_size)
    assert small.clipcap == full.clipcap and small.model == full.model and small.train.objective == "mle"
    assert small.run.name == "demo/mle_small" and small.train.max_steps < 100


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_recipe_path_that_is_a_fifo_is_named_as_such_not_as_missing(tmp_path, monkeypatch):
    # `finecap config fifo.yaml` said "fifo.yaml: recipe file not found": the path is there, it is no regular file
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"fifo\.yaml: is no regular file \(a FIFO, a socket or a device\)") as e:
        load(fifo)
    assert "not found" not in str(e.value)
    monkeypatch.chdir(tmp_path)
    os.mkfifo("smile")
    assert resolve_recipe("smile").parts[-2:] == ("demo", "smile.yaml")  # a packaged name still wins
