"""pycocoevalcap's own code as the tests' reference (tests/metrics/test_cocoeval.py, tests/app/test_evaluate.py)."""

from __future__ import annotations


class NoSpice:
    """Stands in for pycocoevalcap's ``Spice`` when its Stanford CoreNLP jars are missing (pycocoevalcap would
    download them; no network here): the reference flow runs unchanged otherwise, and SPICE is left out of the
    comparison, as finecap leaves it out of its own numbers then."""

    def compute_score(self, gts, res):
        return 0.0, [0.0] * len(res)

    def method(self):
        return "SPICE"
