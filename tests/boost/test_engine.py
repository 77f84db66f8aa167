"""boost's engine (:mod:`finecap.boost.engine`) on its own: how an answer is cleaned into a caption."""

import pytest

from finecap.boost.engine import clean_answer


@pytest.mark.parametrize(
    ("answer", "caption"),
    [
        ('"A red circle on grass."', "A red circle on grass."),
        ("'A red circle on grass.'", "A red circle on grass."),
        ("“A red circle on grass.”", "A red circle on grass."),
        ("`A red circle on grass.`", "A red circle on grass."),
        ('Caption: "A dog\'s red ball."', "A dog's red ball."),
        # the label inside the quotes: it was kept ('Caption: A dog's red ball.'), the quotes alone dropped
        ('"Caption: A dog\'s red ball."', "A dog's red ball."),
        ("“Improved caption: A red circle on grass.”", "A red circle on grass."),
        ("'A dog's red ball.'", "A dog's red ball."),  # an apostrophe is no quote
        # two quotations, not one around the whole answer: the quotes stay (they lost their first and last)
        ('"STOP" is painted on a sign reading "SLOW"', '"STOP" is painted on a sign reading "SLOW"'),
        ("'STOP' is painted on a sign reading 'SLOW'", "'STOP' is painted on a sign reading 'SLOW'"),
        ("“STOP” is painted on a sign reading “SLOW”", "“STOP” is painted on a sign reading “SLOW”"),
        # quotes that are no pair: a quotation at one end only, two kinds
        ('A sign reading "SLOW"', 'A sign reading "SLOW"'),
        ("\"A red circle on grass.'", "\"A red circle on grass.'"),
        ('"', '"'),
        ('""', None),
    ],
)
def test_only_quotes_around_the_whole_answer_are_dropped(answer, caption):
    assert clean_answer(answer) == caption


@pytest.mark.parametrize(
    ("answer", "caption"),
    [
        # a label in markdown emphasis, as chat models write it, was kept in the caption ('**Caption:** A dog ...')
        ("**Caption:** A dog runs on grass.", "A dog runs on grass."),
        ("**Improved caption**: A dog runs on grass.", "A dog runs on grass."),
        ("*Caption:* A dog runs on grass.", "A dog runs on grass."),
        ('"**Caption:** A dog runs on grass."', "A dog runs on grass."),
        # strong emphasis around the whole answer, as quotes are: dropped
        ("**A dog runs on grass.**", "A dog runs on grass."),
        ("Caption: __A dog runs on grass.__", "A dog runs on grass."),
        # emphasis inside the answer, or another bold label, is the answer's own: kept
        ("**A dog** runs on **grass**.", "**A dog** runs on **grass**."),
        ("**Note:** A dog runs on grass.", "**Note:** A dog runs on grass."),
        ("****", "****"),
    ],
)
def test_a_markdown_label_and_emphasis_around_the_whole_answer_are_dropped(answer, caption):
    assert clean_answer(answer) == caption
