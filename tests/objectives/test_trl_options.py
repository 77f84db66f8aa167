"""docs/methods/grpo.md's table "TRL 1.16 options and finecap" against the installed TRL and finecap: every option it
names is a field of TRL's ``GRPOConfig`` (a renamed or removed option fails here, not silently on the page), every
value it gives (``loss_type="cispo"``) is one that field's help lists, every finecap option it names is one of
finecap's configuration keys, and every test it names exists under ``tests/``."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from finecap.config import ConfigError, load
from finecap.config.sections import Config, ScaleRewards
from helpers.markdown_tables import markdown_rows

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "methods" / "grpo.md"
HEADING = "### TRL 1.16 options and finecap"


def rows() -> list[dict[str, str]]:
    return markdown_rows(PAGE.read_text(encoding="utf-8"), HEADING)


def trl_options(cell: str) -> list[tuple[str, str | None]]:
    """``(option, value or None)`` of each backticked name of a table's first cell: `` `beta` ``,
    `` `loss_type="dapo"` ``."""
    out = []
    for name in re.findall(r"`([^`]+)`", cell):
        option, _, value = name.partition("=")
        out.append((option, value.strip('"') or None))
    return out


def test_the_table_names_each_option_once_and_every_kind_of_row():
    table = rows()
    named = [o for row in table for o in trl_options(row["TRL option"])]
    assert len(named) == len(set(named)), "an option or value is named twice"
    assert any(row["finecap"].startswith("not available") for row in table)
    assert all(row["tested equal to TRL"] == "—" or "test_" in row["tested equal to TRL"] for row in table)


def test_every_option_the_table_names_is_one_of_the_installed_trls_grpo_config():
    trl = pytest.importorskip("trl")
    assert trl.__version__.startswith("1.16"), f"the table is of TRL 1.16; installed: {trl.__version__}"
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    for row in rows():
        options = trl_options(row["TRL option"])
        assert options, row
        for option, value in options:
            assert option in fields, f"docs/methods/grpo.md names {option!r}, which TRL's GRPOConfig has not"
            if value is not None:
                helped = fields[option].metadata.get("help", "")
                assert f"'{value}'" in helped, f"{option}={value!r} is not one of the values TRL's help lists"


def finecap_keys() -> set[str]:
    """Every ``section.option`` of finecap's configuration."""
    config = Config()
    sections = {s.name: getattr(config, s.name) for s in dataclasses.fields(config)}
    return {f"{name}.{o.name}" for name, section in sections.items() for o in dataclasses.fields(section)}


def test_every_finecap_option_and_test_the_table_names_exists():
    keys = finecap_keys()
    sections = {key.split(".")[0] for key in keys}
    defined = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("test_*.py"))
    for row in rows():
        for name in re.findall(r"`([a-z_]+[.][a-z_]+)", row["finecap"]):  # grpo.kl_coef, rl.rewards, decode.max_length
            if name.split(".")[0] in sections:
                assert name in keys, f"docs/methods/grpo.md names {name!r}, which is no finecap option"
        for test in re.findall(r"`(test_\w+)`", row["finecap"] + row["tested equal to TRL"]):
            assert re.search(rf"^def {test}\(", defined, re.M), f"docs/methods/grpo.md names {test}, which no test is"


def test_scale_rewards_takes_trls_values_as_words_and_refuses_its_booleans(tmp_path):
    """The table's ``scale_rewards`` row, read from the installed TRL: its ``GRPOConfig`` turns ``True`` into
    ``"group"`` and ``False`` into ``"none"``, and the values it then holds are finecap's three choices, whose
    advantages are TRL's (``test_advantages_equal_trls_own_at_the_edges``). finecap takes the words only: a boolean
    (a TRL config's ``scale_rewards: false`` copied into a recipe or an override) is refused, naming the option and
    the three words, never read as one of them."""
    trl = pytest.importorskip("trl")

    def trls(value):
        args = trl.GRPOConfig(output_dir=str(tmp_path), scale_rewards=value, use_cpu=True, report_to="none",
                              bf16=False)  # fmt: skip
        return args.scale_rewards

    theirs = {value: trls(value) for value in (True, "group", "batch", False, "none")}
    assert theirs == {True: "group", "group": "group", "batch": "batch", False: "none", "none": "none"}
    assert set(theirs.values()) == set(typing.get_args(ScaleRewards))
    for word in ("group", "batch", "none"):
        assert load(None, ["grpo.advantage=group", f"grpo.scale_rewards={word}"]).grpo.scale_rewards == word
    refused = r"grpo\.scale_rewards: invalid value .*; valid choices: group, batch, none"
    for value in ("true", "false", "True", "no"):
        with pytest.raises(ConfigError, match=refused):
            load(None, ["grpo.advantage=group", f"grpo.scale_rewards={value}"])
