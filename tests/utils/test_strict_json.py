"""Every JSON file finecap writes is strict JSON (``finecap.utils.files.strict_json``): a float that is no number is
``null``, never Python's ``NaN`` / ``Infinity`` tokens, which ``jq``, JavaScript's ``JSON.parse`` and strict parsers
refuse."""

import json

from finecap.utils.files import append_jsonl, write_json
from finecap.utils.reading import parse_json

NESTED = {"human": {"CIDEr-D": 0.5, "SPICE": float("nan")}, "rows": [1.5, float("inf")], "pair": (float("-inf"), 2)}


def test_write_json_writes_a_value_that_is_no_number_as_null(tmp_path):
    # write_json (the demo's results.json, a world encoder's encoder.json, a boosted Karpathy or COCO file, ...)
    # wrote bare NaN / Infinity tokens
    write_json(tmp_path / "results.json", NESTED)
    got = parse_json((tmp_path / "results.json").read_text(), "results.json", constants=False)  # tokens refused
    assert got == {"human": {"CIDEr-D": 0.5, "SPICE": None}, "rows": [1.5, None], "pair": [None, 2]}


def test_append_jsonl_writes_each_line_as_strict_json(tmp_path):
    append_jsonl(tmp_path / "log.jsonl", {"step": 1, "values": {"loss": float("nan")}})
    append_jsonl(tmp_path / "log.jsonl", {"step": 2, "values": {"loss": 0.25}})
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [parse_json(line, "log.jsonl", one_line=True, constants=False) for line in lines] == [
        {"step": 1, "values": {"loss": None}},
        {"step": 2, "values": {"loss": 0.25}},
    ]


def test_finite_values_and_other_types_are_written_as_json_dumps_writes_them(tmp_path):
    data = {"a": [1, 2.5, "x", None, True], "b": {"c": -0.0}}
    write_json(tmp_path / "plain.json", data, indent=None)
    assert (tmp_path / "plain.json").read_text() == json.dumps(data) + "\n"
