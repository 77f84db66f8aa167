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
