"""docs/architecture.md's "How to add a metric", followed: a metric group of one's own (tests/helpers/toy_metric.py)
given by dotted path is checked when the configuration is loaded, computed by `finecap eval` (corpus and per-image
values, from --metrics or eval.metrics), and its column is coloured in the report by the direction its record
gives."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from finecap.app.cli import main
from finecap.app.report import main as write_report
from finecap.config import ConfigError, load
from finecap.metrics.suite import evaluate
from finecap.report.columns import direction, rules_for

TOY = "helpers.toy_metric:GROUP"


@pytest.fixture()
def eval_files(tmp_path):
    refs = tmp_path / "refs.jsonl"
    refs.write_text(
        json.dumps({"id": 1, "image": "1.png", "captions": ["a red circle", "a big red circle"]}) + "\n"
        + json.dumps({"id": 2, "image": "2.png", "captions": ["a blue square"]}) + "\n"
    )  # fmt: skip
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "A red circle on grass."},
                                   {"image_id": 2, "caption": "a blue square"}]))  # fmt: skip
    return ["eval", "--predictions", str(results), "--references", str(refs)]


def test_finecap_eval_computes_a_metric_given_by_dotted_path(eval_files, tmp_path, capsys):
    items = tmp_path / "items.json"
    assert main([*eval_files, "--metrics", f"bleu,{TOY}", "--format", "json", "--per-image", str(items)]) == 0
    scores = json.loads(capsys.readouterr().out)
    # image 1: {a, red, circle, on, grass} less its references' {a, red, circle, big}: 2 words; image 2: none
    assert list(scores) == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "toy/unmatched"]
    assert scores["toy/unmatched"] == 1.0  # (2 + 0) / 2
    assert [(row["image_id"], row["toy/unmatched"]) for row in json.loads(items.read_text())] == [(1, 2.0), (2, 0.0)]
    # from the configuration (eval.metrics), in the table that `finecap eval` prints
    assert main([*eval_files, f"eval.metrics=[{TOY}]"]) == 0
    assert "| toy/unmatched | 1.000 |" in capsys.readouterr().out.splitlines()
    # and through the library
    assert evaluate({1: "a red circle on grass"}, {1: ["a red circle"]}, metrics=[TOY]) == {"toy/unmatched": 2.0}


def test_a_metric_path_is_checked_before_any_work(eval_files, capsys):
    assert load(None, [f"eval.metrics=[bleu, {TOY}]"]).eval.metrics == ["bleu", TOY]
    with pytest.raises(ConfigError, match=r"eval.metrics: unknown metric group 'tyo'.*dotted path"):
        load(None, ["eval.metrics=[tyo]"])
    assert main([*eval_files, "--metrics", "bleu,no_such_module_x:GROUP"]) == 2
    err = capsys.readouterr().err  # one line, naming the option
    assert err.startswith("finecap: error: --metrics: cannot import module 'no_such_module_x'")
    assert err.count("\n") == 1
    assert main([*eval_files, "--metrics", "helpers.toy_metric:unmatched_words"]) == 2
    err = capsys.readouterr().err
    assert "--metrics: 'helpers.toy_metric:unmatched_words' is a function, not a MetricGroup" in err
    assert main([*eval_files, "eval.metrics=[helpers.toy_metric:NOPE]"]) == 2
    assert "eval.metrics: module 'helpers.toy_metric' has no attribute 'NOPE'" in capsys.readouterr().err


def _column_cells(html: str, column: str) -> dict[str, str]:
    """``{stage: the class of its cell}`` in the column ``column`` of the report's results table that holds it."""
    table = next(t for t in re.findall(r"<table class=\"sortable\".*?</table>", html, re.S) if f"<th>{column}" in t)
    headers = re.findall(r"<th>(.*?)</th>", table)
    j = next(k for k, h in enumerate(headers) if h.startswith(column)) - 1  # the first header is the stage's
    rows = re.findall(r"<tr><td>([^<]*)</td>(.*?)</tr>", table, re.S)
    return {stage: re.findall(r'<td class="([^"]*)"', cells)[j] for stage, cells in rows}


@pytest.mark.slow  # the report draws its plots and gallery: about 3 s
def test_the_report_colours_a_users_metric_by_its_direction(fabricated_run, tmp_path, monkeypatch):
    from finecap.config import ConfigError
    from finecap.registry import LEGACY_TRUST_ENV, TRUST_ENV

    run = shutil.copytree(fabricated_run, tmp_path / "run")
    for stage in ("mle", "smile", "smile_random"):
        shutil.rmtree(run / stage)  # their training logs: no curves to draw here
    results = json.loads((run / "results.json").read_text())
    for stage, value in {"mle": 2.0, "smile": 1.0, "blip_x": 3.0}.items():
        results[stage]["toy/unmatched"] = value
    (run / "results.json").write_text(json.dumps(results))
    assert direction("toy/unmatched") is None and direction("toy/unmatched", rules_for([TOY])) == "lower"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["eval"]["metrics"] = [TOY]
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    monkeypatch.delenv(LEGACY_TRUST_ENV, raising=False)
    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(ConfigError, match=rf"eval.metrics names '{TOY}', code of one's own"):
        write_report(run, retrieval=False)  # the run folder's config alone never makes the report import code
    monkeypatch.setenv(TRUST_ENV, TOY)  # named by the user: its direction colours the column
    html = write_report(run, retrieval=False).read_text()
    assert '<th>toy/unmatched<span class="dir" title="lower is better">' in html
    assert _column_cells(html, "toy/unmatched") == {"mle": "", "smile": "best", "blip_x": "worst"}  # 1 < 2 < 3
    ranks = {w for cell in _column_cells(html, "Length").values() for w in cell.split()}
    assert "best" not in ranks and "worst" not in ranks  # a column without a direction is never coloured
