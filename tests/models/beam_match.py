"""Checks shared by the tests that compare finecap's ``finished_beams="set_aside"`` beam search with transformers'
``generate`` (tests/models/test_blip.py, tests/models/test_vlm.py)."""

import torch


def trimmed(gen) -> list[list[int]]:
    """Each decoded row up to its length (stop token included)."""
    return [s[:n] for s, n in zip(gen.sequences.tolist(), gen.lengths.tolist(), strict=True)]


def assert_same_hypotheses(ours, sequences: list[list[int]], scores: torch.Tensor, fill: tuple[int, ...],
                           setting: object) -> None:  # fmt: skip
    """finecap's hypotheses ``ours`` (a Generation) equal ``generate``'s new tokens ``sequences`` row by row up to
    each one's length, ``generate`` filling the rest with a token of ``fill`` (its pad id, or the first stop id when
    the pad id is 0), and the scores equal ``scores`` (``sequences_scores``)."""
    for row, seq in enumerate(sequences):
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n], setting
        assert all(t in fill for t in seq[n:]), setting
    assert torch.allclose(ours.scores, scores, atol=1e-5), setting
