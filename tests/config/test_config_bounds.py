"""Bounded inputs (issue 32): hostile recipes, overrides, stored configurations and trainer states end in one short
named error, never in a huge message, a hang or a silently wrong run.

- YAML: anchors and aliases are refused (a 450-byte alias bomb stands for billions of values, which an error message
  used to expand), and so are duplicate keys at any depth (YAML keeps the last of two silently), in recipes, in
  command-line overrides and in stored ``config.yaml`` files, naming the file and the line(s) or the override.
- Error messages shorten the values they quote (:func:`finecap.utils.text.short_repr`).
- Options that size memory or work have upper bounds, named in the error.
- ``--resume`` checks ``trainer_state.json`` (and the states it restores) before using it.

The command-line cases use ``helpers.cli.run_cli`` and tests/conftest.py's fixtures ``tiny`` and ``secret_run`` (a
tiny world, CLIP and 2-step run), as tests/app/test_bad_inputs.py does.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from finecap.config import ConfigError, from_dict, load, load_stored
from finecap.train.state import CheckpointError, check_info, check_resume
from finecap.utils.reading import YAMLRefused, load_yaml, read_yaml_mapping
from finecap.utils.text import short_repr
from helpers.cli import run_cli

MAX_LINE = 1000  # characters of a "one-line" error here: every message below is well under it


def alias_bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML mapping (one line per level, each level 9 aliases of the one before: 9**9 strings)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, name = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines)


def bomb_recipe() -> str:
    """A recipe whose ``train.lr`` is the alias bomb (450 bytes)."""
    return "train:\n  lr:\n" + "".join(f"    {line}\n" for line in alias_bomb().splitlines())


def bomb_flow() -> str:
    """The alias bomb on one line, as an override value (``train.lr={a: &a [...], b: &b [*a, ...], ...}``)."""
    return "{" + ", ".join(alias_bomb().splitlines()) + "}"


def one_line_error(argv: list[str]) -> str:
    """Run ``finecap ARGV``: it must exit 2 with one short ``finecap: error:`` line and no traceback; returns it."""
    code, out, err = run_cli(argv)
    assert "Traceback" not in err
    assert code == 2, err[:2000]
    lines = [line for line in err.splitlines() if line.startswith("finecap: ")]
    assert len(lines) == 1 and lines[0].startswith("finecap: error: "), err[:2000]
    assert len(err) < MAX_LINE, f"{len(err)} characters: {err[:300]}..."
    return lines[0]


# --------------------------------------------------------------------------------------------------------------------
# The YAML loader: no anchors, no aliases, no duplicate keys
# --------------------------------------------------------------------------------------------------------------------


def test_the_alias_bomb_is_small_and_would_expand():
    assert len(bomb_recipe()) <= 450
    with pytest.raises(YAMLRefused, match=r"^line 3: YAML anchors and aliases are not allowed \(found '&a'\)"):
        load_yaml(bomb_recipe())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &x 1\n", "line 1: YAML anchors and aliases are not allowed (found '&x')"),  # an anchor alone too
        ("a: [1, 2]\nb: *x\n", "line 2: YAML anchors and aliases are not allowed (found '*x')"),  # before 'undefined'
        ("base: &b {lr: 1}\ntrain:\n  <<: *b\n", "line 1: YAML anchors and aliases are not allowed (found '&b')"),
    ],
)
def test_anchors_and_aliases_are_refused(text, message):
    with pytest.raises(YAMLRefused) as e:
        load_yaml(text)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    ("text", "key", "where"),
    [
        ("train:\n  lr: 1\nworld:\n  n_train: 5\ntrain:\n  epochs: 2\n", "'train'", "at lines 1 and 5"),
        ("train:\n  lr: 1\n  epochs: 2\n  lr: 3\n", "'train.lr'", "at lines 2 and 4"),
        ("train:\n  loss_weights:\n    mle: 1\n    mle: 2\n", "'train.loss_weights.mle'", "at lines 3 and 4"),
        ("a:\n  - {b: 1}\n  - {c: 1, c: 2}\n", "'a[1].c'", "twice on line 3"),  # inside a list, on one line
        ("x:\n  1: a\n  0x1: b\n", "'x.0x1'", "at lines 2 and 3"),  # equal as YAML compares keys: both are 1
    ],
)
def test_duplicate_keys_at_any_depth_name_the_key_and_both_lines(text, key, where):
    with pytest.raises(YAMLRefused) as e:
        load_yaml(text)
    assert f"duplicate key {key} {where}" in str(e.value)


@pytest.mark.parametrize(
    "text",
    ["train:\n  lr: 1\n  <<: {lr: 2, epochs: 3}\n", "train:\n  <<: [{lr: 2}, {epochs: 3}]\n", "<<: {train: {}}\n"],
)
def test_merge_keys_are_refused_naming_the_line(text, tmp_path):
    # a merge key needs no alias (`<<: {lr: 2}`), and the key written beside it won silently (lr 1 over the merged 2):
    # a duplicate the duplicate-key check skipped
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "<<" in row)
    with pytest.raises(YAMLRefused, match=rf"^line {line}: YAML merge keys are not allowed \(found '<<' in "):
        load_yaml(text)
    recipe = tmp_path / "merge.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(recipe))}: line {line}: YAML merge keys are not allowed"):
        load(recipe)
    assert load_yaml('a:\n  "<<": 1\n') == {"a": {"<<": 1}}  # a quoted '<<' is a key like any other


def test_plain_yaml_still_loads():
    text = "train:\n  lr: 1.0e-4\n  validators: [captions]\n  loss_weights: {mle: 1, smile: 0.5}\n"
    text += "eval:\n  bag_sizes: [3, 5]\n"
    assert load_yaml(text) == yaml_safe_load(text)


def yaml_safe_load(text: str):
    import yaml

    return yaml.safe_load(text)


def test_a_recipe_with_a_section_twice_names_the_file_and_both_lines(tmp_path):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("train:\n  lr: 0.5\nworld:\n  n_train: 10\ntrain:\n  epochs: 3\n")
    with pytest.raises(ConfigError) as e:
        load(recipe)
    assert str(e.value) == (
        f"{recipe}: line 5: duplicate key 'train' at lines 1 and 5 (YAML would keep only the last silently): merge "
        "them into one"
    )
    line = one_line_error(["config", str(recipe)])
    assert f"{recipe}: line 5: duplicate key 'train' at lines 1 and 5" in line


def test_nested_duplicate_keys_in_a_recipe(tmp_path):
    recipe = tmp_path / "nested.yaml"
    recipe.write_text("# my recipe\ntrain:\n  lr: 0.5\n  epochs: 3\n  lr: 0.1\n")
    line = one_line_error(["config", str(recipe)])
    assert f"{recipe}: line 5: duplicate key 'train.lr' at lines 3 and 5" in line


# --------------------------------------------------------------------------------------------------------------------
# The alias bomb through every YAML reader, on the command line
# --------------------------------------------------------------------------------------------------------------------


def test_alias_bomb_in_a_recipe(tmp_path):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(bomb_recipe())
    line = one_line_error(["config", str(recipe)])
    assert line == (
        f"finecap: error: {recipe}: line 3: YAML anchors and aliases are not allowed (found '&a'): write the value "
        "out in full"
    )
    # the demo and boost prompt files read YAML through the same reader
    with pytest.raises(ValueError, match=f"^{recipe}: line 3: YAML anchors"):
        read_yaml_mapping(recipe, "a mapping")


@pytest.mark.parametrize("key", ["train.lr", "train.loss_weights", "eval.bag_sizes", "run.name"])
def test_alias_bomb_in_an_override(key):
    line = one_line_error(["config", f"{key}={bomb_flow()}"])
    assert line.startswith(f"finecap: error: override '{key}={{a: &a [")
    assert line.endswith(": YAML anchors and aliases are not allowed (found '&a'): write the value out in full")


def test_alias_bomb_in_a_stored_config(tmp_path):
    # a checkpoint folder's config.yaml (read by `finecap caption`, `finecap report`, --resume) is read the same way
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.yaml").write_text(bomb_recipe())
    with pytest.raises(ConfigError, match=f"^{ckpt / 'config.yaml'}: line 3: YAML anchors"):
        load_stored(ckpt / "config.yaml")
    line = one_line_error(["caption", "--checkpoint", str(ckpt), "--out", str(tmp_path / "captions.json")])
    assert f"{ckpt / 'config.yaml'}: line 3: YAML anchors and aliases are not allowed" in line
    assert not (tmp_path / "captions.json").exists()
    run = tmp_path / "run"  # a run folder's config.yaml, read by `finecap report`
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"mle": {"CIDEr": 0.5}}))
    (run / "config.yaml").write_text(bomb_recipe())
    line = one_line_error(["report", str(run)])
    assert f"{run / 'config.yaml'}: line 3: YAML anchors and aliases are not allowed" in line


def test_a_resumed_runs_stored_config_is_read_the_same_way(tmp_path):
    from finecap.train.state import config_changes, is_run_config

    saved = tmp_path / "config.yaml"
    saved.write_text(bomb_recipe())
    with pytest.raises(ValueError, match=f"^{saved}: line 3: YAML anchors and aliases are not allowed"):
        config_changes(saved, {"train": {"lr": 1.0}})  # --resume compares the run's config.yaml with its own
    assert not is_run_config(saved)
    saved.write_text("run:\n  name: x\ntrain:\n  lr: 0.5\n  lr: 0.1\n")
    with pytest.raises(ValueError, match="duplicate key 'train.lr' at lines 4 and 5"):
        config_changes(saved, {"train": {"lr": 1.0}})
    saved.write_text("run:\n  name: x\ntrain:\n  lr: " + repr("w" * 10_000) + "\n")
    (change,) = config_changes(saved, {"train": {"lr": 1.0}})  # a log line: the long value shortened
    assert change.startswith("train.lr: 'www") and "..." in change and change.endswith(" -> 1.0")
    assert len(change) < 300


def test_an_override_that_only_looks_like_an_alias_stays_text():
    # an alias before any anchor was never YAML (PyYAML: "found undefined alias"): the text itself, as before
    assert load(None, ["run.name=*best"]).run.name == "*best"
    assert load(None, ["vlm.prompt=*Describe* the image"]).vlm.prompt == "*Describe* the image"
    with pytest.raises(ConfigError, match=r"^override 'run.name=&x best': YAML anchors and aliases are not allowed"):
        load(None, ["run.name=&x best"])  # PyYAML would have dropped "&x " silently
    with pytest.raises(ConfigError, match=r"^override 'boost.llm_api_key=\*\*\*': YAML anchors"):
        load(None, ["boost.llm_api_key=&k sk-secret"])  # a secret is never repeated


def test_an_override_starting_with_a_hash_is_its_text():
    # YAML reads "# hi" as a comment alone, so vlm.prompt=# hi was None ("expected a string, got None"), while
    # "a #1 photo" was its text: a value is the text it shows, whatever its first character
    assert load(None, ["vlm.prompt=# Describe the image"]).vlm.prompt == "# Describe the image"
    assert load(None, ["run.name=#2"]).run.name == "#2"
    assert load(None, ["vlm.prompt=a #1 photo"]).vlm.prompt == "a #1 photo"
    with pytest.raises(ConfigError, match=r"train.lr: expected a number, got '#1'"):
        load(None, ["train.lr=#1"])


def test_a_duplicate_key_in_an_override_value():
    line = one_line_error(["config", "train.loss_weights={mle: 1, mle: 2}"])
    assert "override 'train.loss_weights={mle: 1, mle: 2}': duplicate key 'mle' twice on line 1" in line


# --------------------------------------------------------------------------------------------------------------------
# Error messages shorten the values they quote
# --------------------------------------------------------------------------------------------------------------------


def shared_bomb(levels: int = 9) -> list:
    """The alias bomb as YAML would build it: 9**levels strings through shared lists (tiny in memory)."""
    value: list = ["lol"] * 9
    for _ in range(levels - 1):
        value = [value] * 9
    return value


@pytest.mark.parametrize(
    ("section", "key"),
    [("train", "lr"), ("train", "objective"), ("train", "schedule"), ("train", "log_with"), ("train", "loss_weights"),
     ("train", "cpu"), ("train", "max_steps"), ("smile", "shift_token_id"), ("eval", "bag_sizes")],
)  # fmt: skip
def test_a_huge_value_is_shortened_in_the_error(section, key):
    # a value that reached the configuration some other way than YAML (a dict from Python, a JSON file)
    with pytest.raises(ConfigError) as e:
        from_dict({section: {key: {"a": shared_bomb()}}}, "x.yaml: ")
    assert len(str(e.value)) < MAX_LINE and str(e.value).startswith(f"x.yaml: {section}.{key}")
    with pytest.raises(ConfigError) as e:
        from_dict({section: {key: "x" * 1_000_000}}, "x.yaml: ")
    assert len(str(e.value)) < MAX_LINE


def test_unknown_names_and_sections_are_shortened():
    for data in ({"x" * 100_000: {}}, {"train": {"y" * 100_000: 1}}, {"train": shared_bomb()}):
        with pytest.raises(ConfigError) as e:
            from_dict(data, "x.yaml: ")
        assert len(str(e.value)) < MAX_LINE
    long = "z" * 100_000
    line = one_line_error(["config", f"train.lr={long}"])
    assert "train.lr: expected a number, got 'zzz" in line


def test_short_repr():
    assert short_repr("ten") == "'ten'" and short_repr(3) == "3"
    assert len(short_repr("x" * 10**6)) <= 60 and len(short_repr(shared_bomb())) <= 60
    assert short_repr(10**5000) == "<int too long to show>"
    assert len(short_repr("y" * 1000, limit=200)) <= 200


# --------------------------------------------------------------------------------------------------------------------
# Upper bounds of the options that size memory or work
# --------------------------------------------------------------------------------------------------------------------

BOUNDS = {
    "world.n_train": 1_000_000,
    "world.n_val": 1_000_000,
    "world.n_test": 1_000_000,
    "data.max_tokens": 4096,
    "data.num_workers": 256,
    "data.bag_neighbours": 10_000,
    "retriever.epochs": 10_000,
    "retriever.batch_size": 65_536,
    "retriever.batch_size_eval": 65_536,
    "clipcap.prefix_length": 1024,
    "clipcap.mapper_layers": 64,
    "clipcap.mapper_heads": 256,
    "clipcap.tiny_layers": 48,
    "clipcap.tiny_hidden": 2048,
    "blip.tiny_layers": 48,
    "blip.tiny_hidden": 2048,
    "vlm.tiny_layers": 48,
    "vlm.tiny_hidden": 2048,
    "train.epochs": 100_000,
    "train.max_steps": 100_000_000,
    "train.batch_size": 65_536,
    "train.grad_accum_steps": 4096,
    "train.log_captions": 1024,
    "decode.max_length": 4096,
    "decode.beam_size": 100,
    "decode.batch_size": 65_536,
    "decode.num_return_sequences": 4096,
    "eval.draws": 1000,
    "eval.batch_size": 65_536,
    "smile.random_k": 262_144,
    "rl.samples": 256,
    "sr.hard_k": 1024,
    "lora.rank": 4096,
    "boost.concurrency": 1024,
    "boost.retries": 100,
    "boost.batch_size": 4096,
    "boost.max_new_tokens": 32_768,
    "demo.jobs": 256,
    "demo.stage_threads": 256,
}


# What a bound's option needs beside it to be legal at all (cross-field rules that are not the bound under test).
COMPANIONS: dict[str, list[str]] = {"decode.num_return_sequences": ["decode.strategy=sample"]}


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_an_option_that_sizes_memory_has_an_upper_bound(key):
    limit = BOUNDS[key]
    section, name = key.split(".")
    others = COMPANIONS.get(key, [])
    assert getattr(getattr(load(None, [*others, f"{key}={limit}"]), section), name) == limit  # the bound is allowed
    with pytest.raises(ConfigError) as e:
        load(None, [*others, f"{key}={limit + 1}"])
    assert e.value.key == key
    message = str(e.value)
    # shown as given: no bound option is named like a secret (a count of a text's tokens, data.max_tokens, is none)
    shown = f"{key}={limit + 1}"
    got = float(limit + 1) if key == "train.epochs" else limit + 1  # a float option
    assert message.startswith(f"override '{shown}': {key}: must be <= {limit}, got {got} ("), message


@pytest.mark.parametrize(
    ("override", "key"),
    [("data.bag_schedule={1: 0, 2: 1025}", "data.bag_schedule"), ("eval.bag_sizes=[3, 1025]", "eval.bag_sizes")],
)
def test_bag_sizes_have_an_upper_bound(override, key):
    with pytest.raises(ConfigError, match=rf"^override '.*': {key}: must be <= 1024, got 1025 \(images per bag"):
        load(None, [override])
    assert load(None, [override.replace("1025", "1024")])


def test_a_stored_config_with_a_huge_beam_is_refused_naming_the_file(tmp_path):
    stored = tmp_path / "config.yaml"
    stored.write_text("decode:\n  strategy: beam\n  beam_size: 100000\n")
    with pytest.raises(ConfigError, match=rf"^{stored}: line 3: decode.beam_size: must be <= 100, got 100000"):
        load_stored(stored)


def test_the_decoding_batch_as_a_whole_is_bounded():
    # decode.batch_size counts sequences (images x beams), so the batch is decode.batch_size x decode.max_length
    # token positions: 20,000 x 4,096 = 81,920,000 > 2**26 = 67,108,864; 16,384 x 4,096 = 2**26 exactly is allowed.
    too_many = ["decode.strategy=beam", "decode.beam_size=100", "decode.max_length=4096", "decode.batch_size=20000"]
    with pytest.raises(ConfigError) as e:
        load(None, too_many)
    assert e.value.key == "decode.batch_size"
    assert "decode.batch_size x decode.max_length = 81,920,000 token positions" in str(e.value)
    assert load(None, [*too_many[:3], "decode.batch_size=16384"]).decode.batch_size == 16384
    # beams no longer multiply it: 1,000 sequences (10 images of 100 beams) x 4,096 = 4M positions
    assert load(None, [*too_many[:3], "decode.batch_size=1000"]).decode.batch_size == 1000


def test_lower_bounds_that_were_missing():
    cases = [
        ("data.max_tokens=0", "data.max_tokens: must be >= 1"),
        ("data.num_workers=-1", "data.num_workers: must be >= 0"),
        ("decode.batch_size=0", "decode.batch_size: must be >= 1"),
        ("retriever.batch_size_eval=0", "retriever.batch_size_eval: must be >= 1"),
    ]
    for override, message in cases:
        with pytest.raises(ConfigError, match=message):
            load(None, [override])


def test_a_seed_torch_cannot_take_is_refused_when_the_configuration_loads():
    # run.seed=2**64 passed the configuration and stopped training at its first step ("Overflow when unpacking long
    # long", no option named); 2**64 - 1 and negative seeds are torch's
    with pytest.raises(ConfigError, match=r"run.seed: must be <= 18446744073709551615, got 18446744073709551616 "
                                          r"\(torch.manual_seed's range\)"):  # fmt: skip
        load(None, [f"run.seed={2**64}"])
    assert load(None, [f"run.seed={2**64 - 1}"]).run.seed == 2**64 - 1
    assert load(None, ["run.seed=-1"]).run.seed == -1


def test_every_shipped_recipe_is_within_the_bounds():
    from pathlib import Path

    import finecap.recipes
    from finecap.recipes import list_recipes

    names = list_recipes()
    files = sorted(Path(finecap.recipes.__file__).parent.glob("*/*.yaml"))  # what the package ships, listed or not
    assert names == sorted(f"{f.parent.name}/{f.stem}" for f in files) and len(names) >= 40
    for name in names:
        load(name)  # raises if a bound refuses a paper's setting


# --------------------------------------------------------------------------------------------------------------------
# --resume checks its state
# --------------------------------------------------------------------------------------------------------------------

GOOD = {"step": 4, "epoch": 1, "position": 1, "best_value": 0.5, "best_step": 2, "total_steps": 10,
        "num_processes": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": 1e18}, "field 'step' must be an integer, got 1e+18"),
        ({"step": 10**18}, "field 'step' must be in [0, 10], got 1000000000000000000"),
        ({"step": -3}, "field 'step' must be in [0, 10], got -3"),
        ({"step": "4"}, "field 'step' must be an integer, got '4'"),
        ({"step": True}, "field 'step' must be an integer, got True"),
        ({"step": None}, "field 'step' must be an integer, got None"),
        ({"step": 4.0}, "field 'step' must be an integer, got 4.0"),
        ({"epoch": -1}, "field 'epoch' must be in [0, 4], got -1"),
        ({"epoch": 5}, "field 'epoch' must be in [0, 4], got 5"),  # every epoch takes a step
        ({"position": 9}, "field 'position' must be in [0, 4], got 9"),
        ({"num_processes": 0}, "field 'num_processes' must be in [1, 65536], got 0"),
        ({"total_steps": "x"}, "field 'total_steps' must be an integer, got 'x'"),
        ({"best_value": "high"}, "field 'best_value' must be a finite number or null, got 'high'"),
        ({"best_value": float("nan")}, "field 'best_value' must be a finite number or null, got nan"),
        ({"best_step": 7}, "field 'best_step' must be in [0, 4], got 7"),
        ({"best_step": None}, "fields 'best_value' and 'best_step' must be set together"),
        ({"stpe": 3}, "unknown field 'stpe'"),
        ({"device": 3}, "field 'device' must be a string, got 3"),
    ],
)
def test_a_tampered_trainer_state_is_refused_naming_the_field(change, message):
    path = Path("run/checkpoints/last/trainer_state.json")
    info = {**GOOD, **change}
    with pytest.raises(CheckpointError) as e:
        check_info(info, path)
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)


def test_a_trainer_state_must_be_an_object_with_a_step():
    path = Path("trainer_state.json")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        check_info([1, 2], path)
    with pytest.raises(CheckpointError, match="field 'step' is missing"):
        check_info({"epoch": 0}, path)
    assert check_info({"step": 3}, path) == {"step": 3}  # an older file: the other fields take their defaults
    assert check_info(GOOD, path) == GOOD


def test_the_trainer_state_is_checked_against_the_resuming_run():
    folder = Path("run/checkpoints/last")
    check_resume(GOOD, folder, total=4, num_batches=lambda epoch: 3)
    with pytest.raises(CheckpointError, match=r"field 'step' is 4, past the 3 steps of this run"):
        check_resume(GOOD, folder, total=3, num_batches=lambda epoch: 3)
    with pytest.raises(CheckpointError, match=r"field 'position' is 1, but epoch 1 of this run has 1 global batches"):
        check_resume(GOOD, folder, total=10, num_batches=lambda epoch: 1)  # the loop would spin without training


def test_restored_objective_and_logger_states_are_checked():
    from finecap.objectives.baselines import MeanBaseline
    from finecap.train.logging import Logger

    baseline = MeanBaseline()
    baseline.load_state_dict({"mean": 0.25, "count": 3})
    assert (baseline.mean, baseline.count) == (0.25, 3)
    for state in ({"mean": "x", "count": 3}, {"mean": float("inf"), "count": 3}, {"mean": 0.1, "count": -1},
                  {"mean": 0.1, "count": 2.5}, {"mean": True, "count": 1}):  # fmt: skip
        with pytest.raises(ValueError, match="baseline"):
            baseline.load_state_dict(state)
    logger = Logger(accelerator=None)
    logger.load_state_dict({"sums": {"loss": 2.0}, "counts": {"loss": 2}})
    for state in ({"sums": {"loss": 2.0}, "counts": {"loss": 0}}, {"sums": {"loss": "x"}, "counts": {"loss": 1}},
                  {"sums": {"loss": 2.0}, "counts": {}}):  # fmt: skip
        with pytest.raises(ValueError, match="pending log values"):
            logger.load_state_dict(state)


def _tampered_run(secret_run, tmp_path: Path) -> Path:
    run = tmp_path / "r"
    shutil.copytree(secret_run["run"], run)
    return run


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"step": 1e18}, "field 'step' must be an integer, got 1e+18"),
        ({"step": -3}, "field 'step' must be in [0, 2], got -3"),
        ({"step": "2"}, "field 'step' must be an integer, got '2'"),
        ({"step": True}, "field 'step' must be an integer, got True"),
        ({"step": 10**18, "total_steps": 10**18}, "field 'step' is 1000000000000000000, past the 3 steps of this run"),
        # not the truth: in a checkpoint of before the "trained" digest (removed: ...), and one with it
        ({"step": 1, "position": 1, "best_step": 1, "trained": ...}, "the learning-rate scheduler is at step 2, but"),
        ({"position": 1}, "but this run's first 1 batches of that epoch hold other examples"),
    ],
)
def test_resume_refuses_a_tampered_trainer_state(tiny, secret_run, tmp_path, change, fragment):
    run = _tampered_run(secret_run, tmp_path)
    info_file = run / "checkpoints" / "last" / "trainer_state.json"
    info = json.loads(info_file.read_text())
    assert info["step"] == 2 and info["total_steps"] == 2
    info_file.write_text(json.dumps({k: v for k, v in {**info, **change}.items() if v is not ...}))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    line = one_line_error(["train", *tiny["base"], "--out", str(run), "--resume", "train.max_steps=3"])
    assert fragment in line
    where = run / "checkpoints" / "last" / ("state/main.json" if "scheduler" in fragment else "trainer_state.json")
    assert line.startswith(f"finecap: error: {where}: "), line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing trained, nothing written


def test_resume_refuses_a_tampered_logger_state(tiny, secret_run, tmp_path):
    run = _tampered_run(secret_run, tmp_path)
    state = run / "checkpoints" / "last" / "state" / "process_0.json"
    tree = json.loads(state.read_text())
    tree["logger"] = {"sums": {"loss": 1.0}, "counts": {"loss": 0}}  # the next log line would divide by zero
    state.write_text(json.dumps(tree))
    line = one_line_error(["train", *tiny["base"], "--out", str(run), "--resume", "train.max_steps=3"])
    assert line.startswith(f"finecap: error: {state}: the random, logger and objective state cannot be restored")
