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
