"""One run's ``metrics.jsonl`` written both ways: as finecap's tracker writes it now (strict JSON, a value that is no
finite number ``null`` and named in ``"nonfinite"``) and as it wrote it before (Python's bare ``NaN`` / ``Infinity``
tokens), typed out by hand so that neither depends on the code under test."""

from __future__ import annotations

import json

OLD_FORM = (
    '{"step": 1, "epoch": 0.1, "split": "train", "values": {"loss": Infinity, "reward": NaN, "lr": 0.1}}\n'
    '{"step": 2, "epoch": 0.2, "split": "val", "values": {"cider_d": NaN, "loss": -Infinity}, '
    '"text": {"captions": "0: a cat"}}\n'
    '{"step": 3, "epoch": 0.3, "split": "train", "values": {"loss": 2.5, "reward": 0.25, "lr": 0.1}}\n'
)
NEW_FORM = (
    '{"step": 1, "epoch": 0.1, "split": "train", "values": {"loss": null, "reward": null, "lr": 0.1}, '
    '"nonfinite": {"loss": "Infinity", "reward": "NaN"}}\n'
    '{"step": 2, "epoch": 0.2, "split": "val", "values": {"cider_d": null, "loss": null}, '
    '"text": {"captions": "0: a cat"}, "nonfinite": {"cider_d": "NaN", "loss": "-Infinity"}}\n'
    '{"step": 3, "epoch": 0.3, "split": "train", "values": {"loss": 2.5, "reward": 0.25, "lr": 0.1}}\n'
)
"""The same three events: a training one with an infinite loss and a NaN reward, a validation one with a NaN CIDEr-D
and a -inf loss, a finite training one."""


def strict_rows(text: str) -> list:
    """The rows of a JSONL text read as strict JSON: a ``NaN`` / ``Infinity`` token is an ``AssertionError``."""

    def refuse(token: str):
        raise AssertionError(f"not JSON: the bare token {token}")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines() if line.strip()]


def same(a, b) -> bool:
    """Whether two events (or lists of them) are equal, a NaN equal to a NaN (and neither equal to an infinity)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
