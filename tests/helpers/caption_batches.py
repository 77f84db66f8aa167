"""``finecap caption`` stopped part way in this process, for the tests of its resumption: a run is stopped after N
batches by making :func:`finecap.caption.batch_captions` raise ``KeyboardInterrupt`` (Ctrl-C) on its call N + 1."""

from __future__ import annotations

import pytest

import finecap.caption


class Batches:
    """:func:`finecap.caption.batch_captions` counting its calls; ``stop_after``: Ctrl-C on the call after those."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stop_after: int | None = None) -> None:
        self.calls, self.stop_after, self.real = 0, stop_after, finecap.caption.batch_captions
        monkeypatch.setattr(finecap.caption, "batch_captions", self)

    def __call__(self, *args, **kwargs):
        if self.stop_after is not None and self.calls == self.stop_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.real(*args, **kwargs)
