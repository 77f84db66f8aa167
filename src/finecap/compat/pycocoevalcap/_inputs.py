"""The inputs every scorer of the drop-in takes, checked as pycocoevalcap asserts them (errors name the id)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence


def scorer_inputs(
    gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]], scorer: str
) -> tuple[list[Hashable], list[str], list[list[str]]]:
    """``(ids, candidates, references)`` in the order of ``gts`` (pycocoevalcap's order of scores).

    ``gts[id]``: a non-empty list of reference strings; ``res[id]``: a list of exactly one caption; the same ids in
    both. ``ValueError`` naming ``scorer`` and the id otherwise (pycocoevalcap asserts).

    >>> scorer_inputs({1: ["a dog", "the dog"]}, {1: ["a dog"]}, "Bleu")
    ([1], ['a dog'], [['a dog', 'the dog']])
    """
    if gts.keys() != res.keys():
        only_g, only_r = [i for i in gts if i not in res], [i for i in res if i not in gts]
        raise ValueError(
            f"{scorer}.compute_score: gts and res must have the same ids; only in gts: {only_g[:5]}, "
            f"only in res: {only_r[:5]}"
        )
    ids = list(gts)
    cands, refs = [], []
    for i in ids:
        hypo, ref = res[i], gts[i]
        if isinstance(hypo, str) or len(hypo) != 1 or not isinstance(hypo[0], str):
            raise ValueError(f"{scorer}.compute_score: res[{i!r}] must be a list of one caption string, got {hypo!r}")
        if isinstance(ref, str) or len(ref) == 0 or not all(isinstance(r, str) for r in ref):
            raise ValueError(f"{scorer}.compute_score: gts[{i!r}] must be a non-empty list of reference strings")
        cands.append(hypo[0])
        refs.append(list(ref))
    return ids, cands, refs
