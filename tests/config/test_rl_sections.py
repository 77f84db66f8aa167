"""The ``rl`` section split into ``rl`` (shared by every RL objective), ``grpo`` and ``sle``: a configuration stored
before the split (a run's or checkpoint's ``config.yaml``), a recipe and overrides with the former ``rl.*`` keys load
into the new sections (MOVED_KEYS); one layer setting a former key and its new one differently is refused naming
both; each section's checks, and the checks across sections, name their key."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import yaml

from finecap.config import (
    MOVED_KEYS,
    Config,
    ConfigError,
    GRPOConfig,
    RLConfig,
    SLEConfig,
    load,
    load_stored,
    migrate_moved_keys,
)

GRPO_OPTIONS = {"advantage": "group", "policy_loss": "clipped", "iterations": 2, "clip_high": 0.28, "kl_coef": 0.04,
                "loss_aggregation": "token", "reward_aggregation": "normalize_then_sum"}  # fmt: skip
SLE_OPTIONS = {"alpha": 0.5, "distance": "overlap34"}


def old_layout(cfg: Config) -> dict:
    """``cfg`` as a configuration stored before the split wrote it: every grpo and sle key in the flat ``rl``."""
    data = cfg.saved_dict()
    data["rl"] = {**data["rl"], **data.pop("grpo"), **data.pop("sle")}
    return data


def test_every_grpo_and_sle_key_moved_from_rl_and_nothing_else():
    moved = {k: v for k, v in MOVED_KEYS.items() if k.startswith("rl.")}
    assert set(moved.values()) == {f"grpo.{f.name}" for f in dataclasses.fields(GRPOConfig)} | {
        f"sle.{f.name}" for f in dataclasses.fields(SLEConfig)
    }
    assert all(k.split(".")[1] == v.split(".")[1] for k, v in moved.items())
    assert not {f.name for f in dataclasses.fields(RLConfig)} & {k.split(".")[1] for k in moved}


def test_a_config_stored_before_the_split_loads_into_the_new_sections(tmp_path):
    want = load(None, ["rl.samples=8", *(f"grpo.{k}={v}" for k, v in GRPO_OPTIONS.items()),
                       *(f"sle.{k}={v}" for k, v in SLE_OPTIONS.items()), f"run.dir={tmp_path / 'run'}"])  # fmt: skip
    stored = tmp_path / "config.yaml"
    stored.write_text(yaml.safe_dump(old_layout(want), sort_keys=False))
    assert "grpo" not in yaml.safe_load(stored.read_text()) and "advantage" in yaml.safe_load(stored.read_text())["rl"]
    assert load_stored(stored) == want
    assert load(str(stored)) == want  # the stage runner reads a stored config.yaml as a recipe
    assert migrate_moved_keys(old_layout(want))["grpo"]["advantage"] == "group"


def test_a_recipe_and_overrides_with_the_former_keys_load_and_later_layers_win(tmp_path, caplog):
    recipe = tmp_path / "old.yaml"
    recipe.write_text("train:\n  objective: reinforce\nrl:\n  samples: 4\n  advantage: group\n  scale_rewards: none\n"
                      "  alpha: 0.5\n")  # fmt: skip
    cfg = load(str(recipe), ["rl.scale_rewards=batch", "rl.distance=overlap34"])
    assert (cfg.grpo.advantage, cfg.grpo.scale_rewards, cfg.rl.samples) == ("group", "batch", 4)
    assert (cfg.sle.alpha, cfg.sle.distance) == (0.5, "overlap34")
    assert "rl.advantage -> grpo.advantage" in caplog.text and "rl.alpha -> sle.alpha" in caplog.text
    new = tmp_path / "new.yaml"
    new.write_text("rl:\n  samples: 4\ngrpo:\n  advantage: group\n  scale_rewards: none\n")
    assert load(str(new), ["rl.scale_rewards=batch"]).grpo.scale_rewards == "batch"  # the override is above


def test_a_former_key_and_its_new_one_set_apart_in_one_file_are_refused(tmp_path):
    recipe = tmp_path / "both.yaml"
    recipe.write_text("rl:\n  samples: 4\n  advantage: group\ngrpo:\n  advantage: baseline\n")
    with pytest.raises(ConfigError, match=r"rl.advantage='group' and grpo.advantage='baseline' are both set") as e:
        load(str(recipe))
    assert e.value.key == "grpo.advantage" and str(e.value).startswith(str(recipe))


def test_a_stored_configuration_setting_a_former_key_and_its_new_one_apart_names_the_file(tmp_path):
    """A run's config.yaml edited by hand (rl.kl_coef added beside grpo.kl_coef) is refused as a recipe is: naming
    the file, wherever finecap reads it (caption, eval and resume through load_stored; a resume's list of changes)."""
    from finecap.train.state import config_changes

    data = load(None).saved_dict()
    data["rl"]["kl_coef"] = 0.04  # grpo.kl_coef: 0.0
    stored = tmp_path / "config.yaml"
    stored.write_text(yaml.safe_dump(data, sort_keys=False))
    for read in (lambda: load_stored(stored), lambda: config_changes(stored, load(None).saved_dict())):
        with pytest.raises(ConfigError, match=r"rl.kl_coef=0.04 and grpo.kl_coef=0.0 are both set") as e:
            read()
        assert str(e.value).startswith(f"{stored}: ") and e.value.key == "grpo.kl_coef", str(e.value)


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        (["grpo.scale_rewards=batch"], "grpo.scale_rewards", "set grpo.advantage=group as well"),
        (["grpo.iterations=2"], "grpo.iterations", "needs grpo.policy_loss=clipped"),
        (["grpo.kl_coef=0.1"], "grpo.kl_coef", "needs grpo.policy_loss=clipped"),
        # read only by the clipped loss: with the default reinforce loss they trained exactly as without them
        (["grpo.loss_aggregation=token"], "grpo.loss_aggregation", "needs grpo.policy_loss=clipped"),
        (["grpo.clip_low=0.1"], "grpo.clip_low", "needs grpo.policy_loss=clipped"),
        (["grpo.clip_high=0.28"], "grpo.clip_high", "needs grpo.policy_loss=clipped"),
        (["grpo.importance=sequence"], "grpo.importance", "needs grpo.policy_loss=clipped"),
        (["grpo.kl_bias_correction=false"], "grpo.kl_bias_correction", "needs grpo.policy_loss=clipped"),
        # the group's mean is the baseline of group advantages
        (
            ["grpo.advantage=group", "rl.samples=4", "rl.baseline=mean"],
            "rl.baseline",
            "is not used with grpo.advantage=group",
        ),
        (["grpo.advantage=group", "rl.samples=4", "rl.mean_momentum=0.9"], "rl.mean_momentum", "is not used with"),
        (["grpo.advantage=group", "rl.samples=1"], "rl.samples", "must be >= 2 with grpo.advantage=group"),
        (["rl.alarms={kl: 0.5}"], "rl.alarms.kl", "needs grpo.kl_coef > 0"),
        (["rl.alarms={failed: 2}"], "rl.alarms.failed", "must be in [0, 1)"),
        (["rl.strategy=greedy", "rl.baseline=mean"], "rl.samples", "must be 1 with rl.strategy=greedy"),
        (["sle.alpha=2"], "sle.alpha", "must be"),
        (["sle.distance=bleu"], "sle.distance", "invalid value"),
    ],
)
def test_each_sections_checks_name_their_key(overrides, key, message):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert e.value.key == key and message in str(e.value), str(e.value)
    assert str(e.value).startswith("override "), str(e.value)  # where it was set


def test_the_checks_across_sections_run_on_a_config_built_by_hand():
    with pytest.raises(ConfigError) as e:
        Config(rl=RLConfig(samples=1, strategy="greedy", baseline="mean"), grpo=GRPOConfig(advantage="group"))
    assert e.value.key == "rl.samples"
    assert Config(rl=RLConfig(samples=2), grpo=GRPOConfig(advantage="group")).grpo.advantage == "group"


def test_a_resume_compares_a_run_stored_before_the_split_under_the_new_keys(tmp_path):
    from finecap.train.state import config_changes

    before = load(None, ["grpo.advantage=group", "grpo.policy_loss=clipped", "grpo.kl_coef=0.04"])
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(old_layout(before), sort_keys=False))
    now = load(None, ["grpo.advantage=group", "grpo.policy_loss=clipped", "grpo.kl_coef=0.1"]).saved_dict()
    assert config_changes(saved, now) == ["grpo.kl_coef: 0.04 -> 0.1"]


@pytest.mark.parametrize(
    ("sections", "unread"),
    [
        ({"grpo": {"policy_loss": "reinforce", "loss_aggregation": "token", "clip_high": 0.28}},
         ["grpo.clip_high", "grpo.loss_aggregation"]),
        ({"rl": {"samples": 4, "baseline": "mean", "mean_momentum": 0.9}, "grpo": {"advantage": "group"}},
         ["rl.baseline", "rl.mean_momentum"]),
        ({"rl": {"samples": 4, "advantage": "group", "baseline": "mean"}}, ["rl.baseline"]),  # before the split
    ],
)  # fmt: skip
def test_a_stored_run_with_options_it_never_read_loads_without_them(tmp_path, caplog, sections, unread):
    """Options refused now because they change nothing: a run stored before was trained exactly as without them, so
    its configuration loads (captioning, export, reports of it) with their defaults, and says which it dropped; a new
    configuration with them is refused."""
    caplog.set_level(logging.INFO, logger="finecap")
    stored = tmp_path / "config.yaml"
    stored.write_text(yaml.safe_dump({"train": {"objective": "reinforce"}, **sections}))
    with pytest.raises(ConfigError, match="needs grpo.policy_loss=clipped|is not used with grpo.advantage=group"):
        load(str(stored))
    cfg = load_stored(stored)
    for option in unread:
        section, key = option.split(".")
        assert getattr(getattr(cfg, section), key) == getattr(getattr(Config(), section), key), option
    assert f"read without {', '.join(unread)}, which the run set but never read" in caplog.text


def test_a_former_key_among_the_python_apis_keywords_is_read_as_its_new_key_saying_so(tmp_path, caplog):
    # finecap.train(..., rl__kl_coef=0.1) read grpo.kl_coef without a word, where the same key in a recipe or an
    # override logs one line naming its new name; a stored configuration read with the keywords says it once too
    over, source = {"rl": {"kl_coef": 0.1, "policy_loss": "clipped"}}, "finecap.train keywords: "
    with caplog.at_level(logging.WARNING, logger="finecap"):
        cfg = load(None, over=over, over_source=source)
    assert (cfg.grpo.kl_coef, cfg.grpo.policy_loss) == (0.1, "clipped")
    said = [r.getMessage() for r in caplog.records if "new names" in r.getMessage()]
    assert said == [f"{source}read under their new names: rl.kl_coef -> grpo.kl_coef, rl.policy_loss -> "
                    "grpo.policy_loss"]  # fmt: skip
    stored = tmp_path / "config.yaml"
    load(None).save(stored)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finecap"):
        assert load_stored(stored, over=over, over_source=source).grpo.kl_coef == 0.1
    assert [r.getMessage() for r in caplog.records if "new names" in r.getMessage()] == said
    with pytest.raises(ConfigError, match=rf"^{source}rl.kl_coef=0.1 and grpo.kl_coef=0.2 are both set"):
        load(None, over={"rl": {"kl_coef": 0.1}, "grpo": {"kl_coef": 0.2}}, over_source=source)
