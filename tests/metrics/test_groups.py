"""The metric groups' records (finecap.metrics.groups) are the one source of the suite's tables, the registry's names
and the report's column rules."""

from __future__ import annotations

import logging

import pytest

from finecap import registry
from finecap.metrics.group import INPUTS, Column, MetricGroup, metric_group
from finecap.metrics.suite import CAPTION_METRICS, IMAGE_METRICS, METRICS, NOT_IMAGE_MEANS, parse_metrics
from finecap.report.columns import OTHER_COLUMNS, column_rules, direction, is_count, rules_for


def test_every_registered_group_is_a_record_named_as_its_row():
    assert list(METRICS) == list(registry.METRIC_GROUPS)
    for name, group in METRICS.items():
        assert isinstance(group, MetricGroup) and group.name == name
        assert group.reads <= set(INPUTS) and group.columns, name
    assert set(CAPTION_METRICS) <= set(METRICS)


def test_the_suites_tables_come_from_the_records():
    # the values these tables held when they were written by hand
    assert IMAGE_METRICS == ("retrieval", "bags", "clipscore")
    assert NOT_IMAGE_MEANS == ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "CHAIRi")
    assert {n for n, g in METRICS.items() if "world" in g.reads} == {"faithfulness", "listener"}
    assert METRICS["meteor"].unavailable is not None and METRICS["spice"].unavailable is not None


def test_column_rules_are_the_groups_columns_exceptions_first():
    rules = column_rules()
    builtin = {c for g in METRICS.values() for c in g.columns} | set(OTHER_COLUMNS)
    assert set(rules.columns) == builtin
    first_higher = next(k for k, c in enumerate(rules.columns) if c.better == "higher")
    assert all(c.better == "higher" for c in rules.columns[first_higher:])
    # the diversity group's self-BLEU is lower-is-better although the bleu group, registered first, says *BLEU-*
    assert direction("sample/mBLEU-4") == "lower" and direction("BLEU-4") == "higher"
    assert direction("perplexity/tokens") is None and is_count("perplexity/tokens")  # before *perplexity*, its group's
    assert direction("CHAIRs") == direction("CHAIRi") == "lower" and direction("chair/recall") == "higher"
    assert direction("chair/objects") is None
    assert direction("perplexity") == "lower"


def test_a_users_group_columns_come_first():
    mine = MetricGroup("mine", lambda ctx: {}, columns=(Column("my/CIDEr-D error", "lower"),))
    rules = column_rules([mine])
    assert direction("my/CIDEr-D error") == "higher"  # the built-in *CIDEr* rule, without the user's group
    assert direction("my/CIDEr-D error", rules) == "lower" and direction("CIDEr-D", rules) == "higher"


def test_a_path_that_does_not_import_leaves_its_columns_without_direction(caplog):
    with caplog.at_level(logging.WARNING, logger="finecap.report.columns"):
        rules = rules_for(["bleu", "no_such_module_x:GROUP"])
    assert "cannot import module 'no_such_module_x'" in caplog.text
    assert direction("BLEU-4", rules) == "higher"


def test_records_are_checked():
    with pytest.raises(ValueError, match="better must be 'higher', 'lower' or None"):
        Column("x", "up")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="columns must be Column records"):
        MetricGroup("x", lambda ctx: {}, columns=(("x", "higher"),))  # type: ignore[arg-type]
    assert MetricGroup("x", lambda ctx: {}, reads={"images"}).reads == frozenset({"images"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"eval.metrics: 'finecap.metrics.group:Column' is a type, not a MetricGroup"):
        metric_group("finecap.metrics.group:Column")
    with pytest.raises(ValueError, match=r"--metrics: unknown metric\(s\) 'blue' \(did you mean 'bleu'\?\)"):
        parse_metrics("blue", option="--metrics")
