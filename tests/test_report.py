from finecap.report.table import markdown_table


def test_markdown_table_formats_and_fills_missing():
    rows = {"mle": {"length": 7.25, "words": 40}, "smile": {"length": 11.0, "R@1": 0.5}}
    assert markdown_table(rows).splitlines() == [
        "| stage | length | words | R@1 |",
        "| --- | --- | --- | --- |",
        "| mle | 7.250 | 40 | - |",
        "| smile | 11.000 | - | 0.500 |",
    ]
