"""The fields' own rules (bounds and allowed values, :mod:`finecap.config.fields`) are checked by one loop whenever a
section is built: read from a recipe or built by hand (``SmileConfig(first_token=...)``, as components' direct users
do), with the same message naming the key."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from finecap.config import SECTIONS, ConfigError, RLConfig, SmileConfig, describe, load
from finecap.config.fields import choices_of, field_problem
from helpers.recipe_values import refused_both_ways


def _outside(kind: str, bound: float, integer: bool) -> float:
    """A value just outside one bound (``gt``/``lt`` exclude the bound itself)."""
    step = 1 if integer else 0.5
    return {"ge": bound - step, "gt": bound, "le": bound + step, "lt": bound}[kind]


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_every_bound_and_choice_is_checked_when_a_section_is_built_by_hand(name):
    cls = SECTIONS[name]
    hints = typing.get_type_hints(cls)
    checked = 0
    for f in dataclasses.fields(cls):
        key = f"{name}.{f.name}"
        bad_values = [_outside(kind, bound, hints[f.name] is int) for kind, bound in f.metadata["bounds"].items()]
        if choices_of(hints[f.name]) is not None:
            bad_values.append("no-such-choice")
        for bad in bad_values:
            with pytest.raises(ConfigError) as e:
                cls(**{f.name: bad})
            assert e.value.key == key, (key, bad, str(e.value))
            assert str(e.value).startswith(f"{key}: "), str(e.value)
            checked += 1
    assert checked or name in ("run", "bags"), f"[{name}] has no field rules: is the section's loop reached?"


def test_a_bound_is_the_same_rule_by_hand_and_from_a_recipe(tmp_path):
    with pytest.raises(ConfigError) as by_hand:
        RLConfig(samples=300)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rl:\n  samples: 300\n")
    with pytest.raises(ConfigError) as loaded:
        load(recipe)
    assert str(loaded.value) == f"{recipe}: line 2: {by_hand.value}"
    assert (
        str(by_hand.value)
        == "rl.samples: must be <= 256, got 300 (captions decoded per image; SCST: 5, GRPO-style: 8 to 64)"
    )


def test_choices_are_checked_by_hand_and_cross_field_rules_follow():
    with pytest.raises(
        ConfigError, match=r"^smile.first_token: invalid value 'first'; valid choices: mle, shift, none"
    ):
        SmileConfig(first_token="first")
    with pytest.raises(ConfigError, match=r"^smile.shift_token_id: must be set when smile.first_token=shift"):
        SmileConfig(first_token="shift")
    assert SmileConfig(first_token="shift", shift_token_id=2).shift_token_id == 2


def test_messages_of_one_sided_two_sided_and_reasoned_bounds():
    fields = {f.name: f for f in dataclasses.fields(SECTIONS["decode"])}
    assert field_problem(fields["top_p"], 0.0) == "must be in (0, 1], got 0.0"
    assert field_problem(fields["temperature"], 0.0) == "must be > 0, got 0.0"
    assert field_problem(fields["beam_size"], 0) == "must be >= 1, got 0"  # the reason belongs to the upper bound
    assert field_problem(fields["beam_size"], 101).endswith("(captioning papers search 3 to 10 beams)")
    assert field_problem(fields["beam_size"], 5) is None


def test_the_reference_rows_show_the_bounds():
    rows = {key: text for key, _, _, text in describe(SECTIONS["clipcap"])}
    assert rows["prefix_length"].endswith(
        "fed to the language model. Must be >= 1, <= 1024 (GPT-2's whole context; ClipCap: 10 or 40)."
    )  # the upper bound's reason (doc(..., why=...)) after the bounds
    assert rows["tiny_dropout"].endswith(" Must be in [0, 1).")
    assert "Must be" not in rows["lm"]


def _string_fields() -> list[tuple[str, str, tuple]]:
    """Every option whose type is a string or a choice of strings (``Literal``), possibly optional: (section, key, the
    choices, empty for a free string)."""
    out = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            hints = typing.get_type_hints(cls)
            tp = hints[f.name]
            arms = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
                typing.Union, __import__("types").UnionType) else [tp]  # fmt: skip
            for arm in arms:
                choices = choices_of(arm)
                if choices is not None and all(isinstance(c, str) for c in choices):
                    out.append((section, f.name, choices))
                elif arm is str:
                    out.append((section, f.name, ()))
    return out


STRING_FIELDS = _string_fields()


def test_string_options_are_found():
    keys = {f"{s}.{k}" for s, k, _ in STRING_FIELDS}
    assert {"train.mixed_precision", "model.kind", "run.name"} <= keys and len(keys) > 40


@pytest.mark.parametrize(("section", "key", "choices"), STRING_FIELDS, ids=[f"{s}.{k}" for s, k, _ in STRING_FIELDS])
def test_every_string_option_takes_each_choice_and_the_yaml_1_1_words_from_the_command_line(section, key, choices):
    """``no``, ``off``, ``yes``, ``on`` were YAML 1.1 booleans, so ``train.mixed_precision=no`` arrived as False and
    was refused: every choice of every string option, plain and quoted, now arrives as the string it is; a free string
    option keeps those words as strings (another rule of the option may still refuse them, never its type)."""
    words = choices or ("no", "off", "yes", "on", "No")
    for word in words:
        for spelled in (word, f'"{word}"', f"'{word}'"):
            try:
                cfg = load(None, [f"{section}.{key}={spelled}"])
            except ConfigError as e:  # another rule may refuse it (a cross-field one), never its type or choices
                for words_of_type in ("invalid value", "expected a string", "got False", "got True", "expected"):
                    assert words_of_type not in str(e), f"{section}.{key}={spelled}: {e}"
                continue
            assert getattr(getattr(cfg, section), key) == word, (section, key, spelled)


BOOL_CASES = [("yes", True), ("on", True), ("true", True), ("TRUE", True), ("no", False), ("off", False),
              ("false", False), ("Off", False)]  # fmt: skip


@pytest.mark.parametrize(("word", "value"), BOOL_CASES)
def test_boolean_options_read_the_yaml_1_1_words(word, value):
    assert load(None, [f"data.pin_memory={word}"]).data.pin_memory is value
    with pytest.raises(ConfigError, match="expected true/false"):
        load(None, ["data.pin_memory=maybe"])


SET_ASIDE = ["decode.strategy=beam", "decode.finished_beams=set_aside"]


@pytest.mark.parametrize(("word", "value"), [*BOOL_CASES, ('"true"', True), ("never", "never")])
def test_an_option_whose_choices_hold_booleans_reads_them_as_a_boolean_option_does(word, value):
    # decode.early_stopping (false, true or never) refused yes/on/no/off, which a boolean option reads
    assert load(None, [*SET_ASIDE, f"decode.early_stopping={word}"]).decode.early_stopping == value


@pytest.mark.parametrize("number", ["1", "0", "1.0", "0.0"])
def test_an_option_whose_choices_hold_booleans_refuses_a_number(number):
    # Python has 1 == True: decode.early_stopping=1 was read as true, where a boolean option refuses 1
    with pytest.raises(ConfigError, match=r"early_stopping: invalid value .*; valid choices: false, true, never"):
        load(None, [*SET_ASIDE, f"decode.early_stopping={number}"])
    from finecap.config import DecodeConfig

    with pytest.raises(ConfigError, match=r"decode.early_stopping: invalid value"):  # a section built by hand too
        DecodeConfig(strategy="beam", finished_beams="set_aside", early_stopping=float(number))


@pytest.mark.parametrize("spelled", ["null", "Null", "~", "none", "None", "NONE", '""', "''"])
def test_an_empty_path_option_takes_null_and_none(spelled):
    assert load(None, [f"train.init_from={spelled}"]).train.init_from == ""
    assert load(None, [f"boost.prompts={spelled}"]).boost.prompts == ""


def test_none_is_a_name_for_options_that_are_not_paths():
    assert load(None, ["run.name=none"]).run.name == "none"  # a run may be called that
    with pytest.raises(ConfigError, match="expected a string"):
        load(None, ["run.name=null"])


@pytest.mark.parametrize(
    "written",
    ["0123", "1:30", "12:30", "1_000", "0x1F", "0o17", "2024.10", "1e3", "-0", "+5",
     "2024-01-01", "2024-01-01T10:00:00", "2001-12-14 21:59:43.10 -5"],
)  # fmt: skip
def test_a_string_option_keeps_a_number_or_a_date_as_written(written, tmp_path):
    # YAML 1.1 read 0123 as octal 83, 1:30 as 90, 0x1F as 31, 2024.10 as 2024.1: a run name or a data path given so
    # was silently another (from the command line and from a recipe alike); and 2024-01-01 as a date, which no option
    # takes: a run or a data folder named by its date was refused ("run.name: expected a string, got
    # datetime.date(2024, 1, 1)")
    assert load(None, [f"run.name={written}"]).run.name == written
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"run:\n  name: {written}\ndata:\n  path: {written}\n")
    cfg = load(recipe)
    assert (cfg.run.name, cfg.data.path.rsplit("/", 1)[-1]) == (written, written)


def test_a_number_option_refuses_a_date_kept_as_text():
    with pytest.raises(ConfigError, match=r"train.lr: expected a number, got '2024-01-01'"):
        load(None, ["train.lr=2024-01-01"])


def test_numeric_options_read_the_yaml_numbers_as_plain_numbers():
    cfg = load(None, ["train.max_steps=1_000", "train.lr=2.50e-4", "rl.rewards={cider: 0.50}"])
    assert (cfg.train.max_steps, cfg.train.lr, cfg.rl.rewards) == (1000, 2.5e-4, {"cider": 0.5})
    assert type(cfg.train.max_steps) is int and type(cfg.train.lr) is float and type(cfg.rl.rewards["cider"]) is float
    assert "max_steps: 1000" in cfg.to_yaml()


@pytest.mark.parametrize(
    ("key", "written", "read"),
    [
        ("run.seed", "010", 8),
        ("world.n_train", "0755", 493),
        ("world.n_train", "12:30", 750),
        ("train.lr", "1:30.5", 90.5),
        ("eval.bag_sizes", "[3, 010]", 8),
        ("rl.rewards", "{cider: 010}", 8),
    ],
)
def test_a_numeric_option_refuses_a_number_yaml_1_1_reads_otherwise(key, written, read, tmp_path):
    # YAML 1.1 reads a leading 0 as octal and a colon as base 60: run.seed: 010 trained with seed 8, silently
    refused_both_ways(key, written, tmp_path, rf"{re.escape(key)}.*reads as {read}\b.*YAML 1.1",
                      rf"recipe.yaml: line 2: {re.escape(key)}.*reads as {read}\b")  # fmt: skip


def test_a_numeric_option_reads_what_yaml_1_1_reads_as_written():
    cfg = load(None, ["run.seed=07", "world.n_train=0x10", "train.max_steps=1_000", "train.weight_decay=00"])
    assert (cfg.run.seed, cfg.world.n_train, cfg.train.max_steps, cfg.train.weight_decay) == (7, 16, 1000, 0.0)


def test_a_stored_config_with_an_empty_section_loads(tmp_path):
    from finecap.config import load_stored

    stored = tmp_path / "config.yaml"
    stored.write_text("run:\n  name: x\njudge:\n")  # a section left empty by hand: a bare TypeError before
    assert load_stored(stored).run.name == "x"


def test_fp16_with_float16_trained_weights_is_refused_before_the_run():
    # torch's GradScaler refuses float16 gradients: the run died at its first optimizer step on a GPU
    for items in (["model.trainable_dtype=float16"], ["model.trainable_dtype=same", "model.dtype=float16"]):
        with pytest.raises(ConfigError, match="train.mixed_precision: fp16 scales the gradients"):
            load(None, ["train.mixed_precision=fp16", *items])
    assert load(None, ["train.mixed_precision=fp16", "model.dtype=float16"]).model.trainable_dtype == "float32"
    assert load(None, ["train.mixed_precision=bf16", "model.trainable_dtype=float16"])
