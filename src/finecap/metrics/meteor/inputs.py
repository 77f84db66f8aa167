"""What METEOR scores: the checked inputs, and the segment the jar reads from pycocoevalcap's ``SCORE`` line."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from finecap.metrics.meteor.normalize import java_trim

__all__ = ["check_inputs", "pycocoevalcap_line", "segment_fields"]


def check_inputs(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]]
) -> tuple[list[Hashable], list[str], list[list[str]]]:
    """``(ids, hypotheses, references)`` in the order of ``predictions``; ``ValueError`` naming the record at fault.

    >>> check_inputs({1: "a dog"}, {1: ["a dog", "the dog"], 2: ["unused"]})
    ([1], ['a dog'], [['a dog', 'the dog']])
    """
    ids = list(predictions)
    if not ids:
        raise ValueError("predictions: empty, nothing to evaluate")
    refs = []
    for i in ids:
        if i not in references:
            raise ValueError(f"references: no entry for prediction id {i!r}")
        r = references[i]
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
