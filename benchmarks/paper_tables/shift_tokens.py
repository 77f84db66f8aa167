"""Where SMILE's first-token shift token lands in a shifted run's generated captions (SMILE Sec. 3.3, Table 4).

The world's shift token is ``<mask>`` (id 2, :data:`.runs.MASK_ID`), a special token: the decoder can emit it, and
turning token ids into text (:func:`finecap.decode.texts_of`, ``skip_special_tokens=True``) drops it, so the caption
files never show it. :func:`shift_token_metrics` decodes the run's test captions again (beam 5, the run's
``decode.*``, as :func:`finecap.stages.outputs.caption_stage`) through :class:`TokenRecorder`, which keeps the raw
token ids of every generated row, and counts the shift token in them (:func:`token_positions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from finecap.stages import StageRunner

PREFIX = "shift_token/"


class TokenRecorder:
    """A captioner whose ``generate`` keeps the token ids of every generated row, each up to its length (the stop
    token included), before decoding turns them into text; every other attribute is the captioner's."""

    def __init__(self, model: Any):
        self._model = model
        self.rows: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        gen = self._model.generate(*args, **kwargs)
        self.rows.extend(s[:n] for s, n in zip(gen.sequences.tolist(), gen.lengths.tolist()))
        return gen


def token_positions(rows: Sequence[Sequence[int]], token_id: int) -> dict[str, float]:
    """How often ``token_id`` occurs in generated token rows: ``captions`` = fraction of rows holding it,
    ``first`` = fraction whose first token it is, ``later`` = fraction holding it after the first position,
    ``per_caption`` = mean occurrences per row, ``rows`` = number of rows (keys prefixed ``shift_token/``).

    >>> token_positions([[2, 7, 4], [7, 2, 2, 4], [7, 4], [2, 4]], 2)["shift_token/first"]
    0.5
    """
    if not rows:
        raise ValueError("token_positions needs at least one generated row")
    n = len(rows)
    return {
        f"{PREFIX}captions": sum(token_id in r for r in rows) / n,
        f"{PREFIX}first": sum(bool(r) and r[0] == token_id for r in rows) / n,
        f"{PREFIX}later": sum(token_id in r[1:] for r in rows) / n,
        f"{PREFIX}per_caption": sum(list(r).count(token_id) for r in rows) / n,
        f"{PREFIX}rows": float(n),
    }


def shift_token_metrics(grid: StageRunner, key: str) -> dict[str, float]:
    """:func:`token_positions` of the shift token in run ``key``'s test captions when it trained with
    ``smile.first_token=shift``; ``{}`` for every other run."""
    from finecap.caption import generate_captions
    from finecap.stages.outputs import best_model

    cfg = grid.stage_config(key)
    if cfg.train.objective != "smile" or cfg.smile.first_token != "shift":
        return {}
    recorder = TokenRecorder(best_model(grid, key))
    generate_captions(recorder, cfg, "test", progress=False)
    return token_positions(recorder.rows, cfg.smile.shift_token_id)
