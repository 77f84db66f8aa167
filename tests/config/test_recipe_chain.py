"""Recipe chains connect (issue 64): every packaged recipe names its run, a recipe's ``train.init_from`` is where the
recipe making it writes (``<run.root or home/runs>/<run.name>``, :func:`finecap.home.start_path`), and a start that
is missing is one line naming the key and the command that makes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from finecap.config import RunConfig, load
from finecap.home import home, run_path, start_path
from finecap.recipes import list_recipes, resolve_recipe
from finecap.train.setup import maker_of
from helpers.cli import refused, run_cli

RECIPES = list_recipes()


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_names_its_run(name):
    written = yaml.safe_load(resolve_recipe(name).read_text()).get("run") or {}
    assert written.get("name") == name, "a packaged recipe's run.name is its own name (its run directory)"


def test_no_two_recipes_share_a_run_directory():
    folders = [run_path(load(resolve_recipe(name)).run) for name in RECIPES]
    assert len(set(folders)) == len(folders) and all(f.parent.parent == home() / "runs" for f in folders)


@pytest.mark.parametrize("name", [n for n in RECIPES if load(resolve_recipe(n)).train.init_from])
def test_a_recipes_start_is_where_another_recipe_writes(name):
    cfg = load(resolve_recipe(name))
    maker = maker_of(start_path(cfg.train.init_from, cfg.run))
    assert maker is not None and maker != f"finecap train {name}", cfg.train.init_from
    made_by = maker.split()[-1]
    assert run_path(load(resolve_recipe(made_by)).run) / "checkpoints" / "best" == start_path(cfg.train.init_from,
                                                                                               cfg.run)  # fmt: skip


def test_a_relative_start_is_read_from_the_working_directory_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = RunConfig(root=str(tmp_path / "root"))
    assert start_path("mine/best", run) == tmp_path / "root" / "mine" / "best"  # not here: the runs root
    (tmp_path / "mine" / "best").mkdir(parents=True)
    assert start_path("mine/best", run) == Path("mine/best")  # here: as the shell means it


def test_a_missing_start_names_the_key_and_the_command_that_makes_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refused(["train", "demo/grpo_sr_cider"], "train.init_from=demo/mle/checkpoints/best: checkpoint not found",
                   str(home() / "runs"), "make it with `finecap train demo/mle`")  # fmt: skip
    assert "Traceback" not in line and not list(tmp_path.iterdir())  # nothing written, not even the run directory
    refused(["train", "demo/blip_smile", f"run.root={tmp_path / 'r'}"],
            f"make it with `finecap train demo/blip_mle run.root={tmp_path / 'r'}`")  # fmt: skip
    refused(
        ["train", "demo/mle", "train.init_from=nowhere/best"],
        "train.init_from=nowhere/best: checkpoint not found",
        "train.init_from=null for a fresh model",
    )
    refused(["train", "demo/mle", "train.init_from=nowhere/best", "--dry-run"], "train.init_from=nowhere/best")


WORLD = ["world.n_train=24", "world.n_val=8", "world.n_test=4", "world.image_size=32", "retriever.epochs=1",
         "retriever.batch_size=8", "retriever.batch_size_eval=16"]  # fmt: skip
SIZES = ["clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
         "train.max_steps=2", "train.batch_size=4", "train.eval_samples=4", "train.log_every=1", "decode.max_length=6",
         "train.epochs=1"]  # fmt: skip


@pytest.mark.slow
def test_mle_then_grpo_from_a_fresh_home_with_only_size_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, _, err = run_cli(["train", "demo/mle", *WORLD, *SIZES])
    assert code == 0, err
    assert "loss=" in err  # the progress bar's headline of MLE
    mle = tmp_path / "home" / "runs" / "demo" / "mle"
    assert (mle / "checkpoints" / "best" / "model").is_dir()
    code, _, err = run_cli(["train", "demo/grpo_sr_cider", *WORLD, *SIZES])
    assert code == 0, err
    bar = [line for line in err.replace("\r", "\n").splitlines() if "epoch=" in line][-1]
    assert "reward=" in bar and "kl=" in bar and "loss=" not in bar, bar  # GRPO's headline, not its 0 surrogate
    grpo = tmp_path / "home" / "runs" / "demo" / "grpo_sr_cider"
    stored = yaml.safe_load((grpo / "config.yaml").read_text())
    assert stored["train"]["init_from"] == str(mle / "checkpoints" / "best")  # absolute: the start it was found at
    events = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    assert any("reward" in e["values"] for e in events if e["split"] == "train")
    assert not list(work.iterdir())  # runs go to the home's runs/, never the working directory
