"""What METEOR scores: the checked inputs, and the segment the jar reads from pycocoevalcap's ``SCORE`` line."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from finecap.data.records import id_keys, refuse_repeated_ids
from finecap.metrics.meteor.normalize import java_trim

__all__ = ["MAX_WORDS", "check_inputs", "check_lengths", "pycocoevalcap_line", "segment_fields"]

MAX_WORDS = 1000
"""Words of a caption or reference METEOR scores at most (``eval.meteor_max_words``; :func:`check_lengths`)."""


def check_inputs(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]]
) -> tuple[list[Hashable], list[str], list[list[str]]]:
    """``(ids, hypotheses, references)`` in the order of ``predictions``; ``ValueError`` naming the record at fault.
    Ids are matched as :func:`finecap.metrics.ngram.counting.align` matches them (an int and its string are one
    image; two naming one image on either side are refused).

    >>> check_inputs({1: "a dog"}, {"1": ["a dog", "the dog"], 2: ["unused"]})
    ([1], ['a dog'], [['a dog', 'the dog']])
    """
    ids = list(predictions)
    if not ids:
        raise ValueError("predictions: empty, nothing to evaluate")
    refuse_repeated_ids(ids, "predictions")
    refuse_repeated_ids(references, "references")
    found, _ = id_keys(ids, references)
    refs = []
    for i in ids:
        if i not in found:
            raise ValueError(f"references: no entry for prediction id {i!r}")
        r = references[found[i]]
        if isinstance(r, str) or len(r) == 0:
            raise ValueError(f"references[{i!r}]: expected a non-empty list of caption strings")
        refs.append(list(r))
    return ids, [predictions[i] for i in ids], refs


def pycocoevalcap_line(hypothesis: str, references: Sequence[str]) -> str:
    """The ``SCORE`` line pycocoevalcap's ``Meteor`` writes for one image (without the newline): it removes ``|||``
    from the hypothesis and halves runs of two spaces, then joins ``SCORE``, the references and the hypothesis with
    `` ||| ``.

    >>> pycocoevalcap_line("a   dog ||| x", ["one", "two"])  # three spaces: one pass leaves two
    'SCORE ||| one ||| two ||| a  dog x'
    """
    hypothesis = hypothesis.replace("|||", "").replace("  ", " ")
    return " ||| ".join(("SCORE", " ||| ".join(references), hypothesis))


def segment_fields(hypothesis: str, references: Sequence[str]) -> tuple[str, list[str]]:
    """The hypothesis and references the jar reads from :func:`pycocoevalcap_line`: it splits the line on ``|||``
    (a reference that holds ``|||`` becomes two; Java's ``split`` drops trailing empty fields) and trims each field
    with Java's ``trim``.

    >>> segment_fields("a dog ||| x", ["one ||| two", " three\\t"])
    ('a dog x', ['one', 'two', 'three'])
    """
    fields = pycocoevalcap_line(hypothesis, references).split("|||")
    while fields and fields[-1] == "":
        fields.pop()
    return java_trim(fields[-1]), [java_trim(f) for f in fields[1:-1]]


def check_lengths(ids: Sequence[Hashable], predictions: Sequence[str], references: Sequence[Sequence[str]],
                  max_words: int = MAX_WORDS) -> None:  # fmt: skip
    """Refuse a prediction or reference of more than ``max_words`` words (separated by spaces: the tokens of a caption
    as ``finecap eval`` tokenises it), naming the image, its length and the limit.

    METEOR's alignment (:mod:`~finecap.metrics.meteor.align`, the jar's beam search) keeps up to 40 paths and tries
    every match at every reference position, so its time grows faster than the square of the length: on the 2-core
    development machine a 1,000-word caption against a 1,000-word reference of varied words takes 3 s, but one in
    which every word is the same takes 160 s, and 20,000 words ran for more than 6 minutes. 1,000 words is far above
    captions (COCO's 10, detailed descriptions' 100-300).

    >>> check_lengths([7], ["a b c"], [["a b"]], max_words=2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: predictions[7]: 3 words, more than METEOR's limit of 2 (eval.meteor_max_words: raise it ...)
    """
    short = 2 * max_words  # n words take at least 2n - 1 characters: a text this short has at most max_words
    for i, hyp, refs in zip(ids, predictions, references, strict=True):
        if len(hyp) <= short and all(len(r) <= short for r in refs):
            continue
        texts = [(f"predictions[{i!r}]", hyp)] + [(f"references[{i!r}][{k}]", r) for k, r in enumerate(refs)]
        for where, text in texts:
            n = len(text.split())
            if n > max_words:
                raise ValueError(
                    f"{where}: {n:,} words, more than METEOR's limit of {max_words:,} (eval.meteor_max_words: raise "
                    "it to score longer captions; METEOR's time grows faster than the square of the length)"
                )
