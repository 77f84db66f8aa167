import re

from finecap.report.table import markdown_table


def test_markdown_table_formats_and_fills_missing():
    rows = {"mle": {"length": 7.25, "words": 40}, "smile": {"length": 11.0, "R@1": 0.5}}
    assert markdown_table(rows).splitlines() == [
        "| stage | length | words | R@1 |",
        "| --- | --- | --- | --- |",
        "| mle | 7.250 | 40 | - |",
        "| smile | 11.000 | - | 0.500 |",
    ]


def test_length_curves_reads_validation_events_and_writes_png(tmp_path):
    import json

    from finecap.report.plots import length_curves, validation_series

    run = tmp_path / "run"
    run.mkdir()
    events = [
        {"step": 10, "split": "train", "values": {"loss": 1.0}},
        {"step": 100, "split": "val", "values": {"length": 9.5}},
        {"step": 200, "split": "val", "values": {"length": 11.0, "r@1": 0.5}},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert validation_series(run, "length") == [(100, 9.5), (200, 11.0)]
    out = length_curves({"smile": run}, tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_pipe_or_line_break_in_a_name_stays_in_its_cell():
    """A stage, metric or row named with ``|`` or a line break ended its cell (or its row) early, shifting every
    column after it under the wrong header (the demo's results.md, finecap eval's table)."""
    table = markdown_table({"mle|x": {"R|1": 0.5, "two\nlines": 1.0}}).splitlines()
    assert table == ["| stage | R\\|1 | two lines |", "| --- | --- | --- |", "| mle\\|x | 0.500 | 1.000 |"]
    # GitHub's table reading: cells split at an unescaped pipe; every row has as many as the header
    assert {len(re.split(r"(?<!\\)\|", row)) for row in table} == {5}
