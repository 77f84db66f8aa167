"""finecap's caption rewards as ms-swift reward functions (GRPO's ``--reward_funcs``): an ``ORM`` (a reward in the
trainer's process, or a reward server) and an ``AsyncORM`` (a reward server, asked without blocking the trainer).

ms-swift calls a reward function ``fn(completions, **kwargs) -> list[float]`` with the generation batch's
completions (strings: each one's last message content) and every column of the data set as a keyword argument, one
value per completion; the image a completion describes is the ``image_id`` column (``image_id_column``), its
references, when the data set has its own, the ``references`` column (``references_column``; read when present).
Reward functions are registered by name in ``orms`` (``swift.rewards`` in ms-swift 4, ``swift.plugin`` in 3) from a
plugin file that ``--external_plugins`` imports; ms-swift instantiates the class itself, so :func:`orm` and
:func:`async_orm` return *classes* bound to their reward::

    # finecap_plugin.py
    from swift.rewards import orms               # ms-swift 3: from swift.plugin import orms
    from finecap.integrations.swift import async_orm
    orms["finecap"] = async_orm(url="http://127.0.0.1:8000")   # finecap serve-reward RECIPE --port 8000

    swift rlhf --rlhf_type grpo --external_plugins finecap_plugin.py --reward_funcs finecap ...

Both take the adapters' one entry (:meth:`finecap.integrations.scoring.Scorer.of`): a registry name with its
options, a built reward, or ``url=``. The classes derive from ms-swift's ``ORM`` / ``AsyncORM`` when ms-swift is
installed (and from ``object`` otherwise: the call signature is all ms-swift reads). A call is one reward call over
the whole batch, so a reward that ranks each caption's image among the batch's images (self-retrieval) sees the
batch's images.

A call holding a completion the reward could not score (:attr:`finecap.rewards.RewardOutput.failed`: a judge that
failed on it) raises :class:`~finecap.serve.protocol.FailedCaptions` naming it (``completions[i]``), as OpenRLHF's
adapter does, never a NaN or a ``None``: ms-swift reads ``None`` as NaN and sums its reward functions with
``nansum`` (``swift.rl_core.advantage.compute_advantages``, ms-swift 4.6), which pays a NaN as 0 and counts it in the
group's mean and standard deviation. A call the reward (or the server) refuses names ms-swift's fields:
``image_id[3]: unknown image id 99`` (the ``image_id_column``), ``completions[1]``, ``references[2][0]`` (the
``references_column``), never the ``image_ids[3]`` of finecap's own request.

Example::

    >>> from finecap.rewards.cider import CiderReward
    >>> CiderORM = orm(CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]}))
    >>> [round(r, 3) for r in CiderORM()(["a red circle", "a square"], image_id=[1, 2], trainer_state=None)]
    [5.26, 1.743]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from finecap.integrations.scoring import Scorer, column, completion_texts
from finecap.rewards import RewardOutput
from finecap.serve.protocol import refuse_failed

__all__ = ["async_orm", "orm"]


def _swift_bases() -> tuple[type, type]:
    """ms-swift's ``ORM`` and ``AsyncORM`` (4.x: ``swift.rewards``; 3.x: ``swift.plugin``), else ``object``."""
    for module in ("swift.rewards", "swift.plugin"):
        try:
            imported = __import__(module, fromlist=["ORM", "AsyncORM"])
            return imported.ORM, imported.AsyncORM
        except (ImportError, AttributeError):
            continue
    return object, object


class _Inputs:
    """What both classes read from ms-swift's call."""

    scorer: Scorer
    image_id_column: str
    references_column: str

    def _inputs(self, completions: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[str], list, list | None]:
        texts = completion_texts(completions)
        who = f"finecap ms-swift reward {type(self).__name__}"
        ids = column(kwargs, self.image_id_column, len(texts), who, "image_id_column")
        refs = kwargs.get(self.references_column)
        if refs is not None:
            refs = column(kwargs, self.references_column, len(texts), who, "references_column")
        return texts, ids, refs

    def fields(self) -> dict[str, str]:
        """ms-swift's names for the fields of a call (:func:`finecap.serve.protocol.callers_field`), which its
        refusals name: the completions and the data set's columns."""
        return {"captions": "completions", "image_ids": self.image_id_column, "references": self.references_column}

    def _paid(self, out: RewardOutput) -> list[float]:
        """The totals, or :class:`FailedCaptions` naming the completions the reward could not score."""
        refuse_failed(out, "completions", "ms-swift would pay a NaN as 0 (it sums its reward functions with nansum)",
                      f"finecap ms-swift reward {type(self).__name__}")  # fmt: skip
        return out.values()[0]


def _orm_class(base: type, call: Any, scorer: Scorer, image_id_column: str, references_column: str,
               name: str) -> type:  # fmt: skip
    def __init__(self: Any, args: Any = None, **kwargs: Any) -> None:  # ms-swift 4 passes its arguments, 3 none
        self.args = args

    return type(name, (_Inputs, base), {"__init__": __init__, "__call__": call, "scorer": scorer,
                                        "image_id_column": image_id_column, "references_column": references_column,
                                        "__module__": __name__})  # fmt: skip


def orm(name_or_reward: Any = None, *, url: str | None = None, image_id_column: str = "image_id",
        references_column: str = "references", name: str = "FinecapReward", **options: Any) -> type:  # fmt: skip
    """An ms-swift ``ORM`` class over a finecap reward (``name_or_reward`` with its ``options``, or a built one) or
    the reward server at ``url`` (:meth:`finecap.integrations.scoring.Scorer.of`); ``name``: the class's name."""

    def __call__(self: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts, ids, refs = self._inputs(completions, kwargs)
        return self._paid(self.scorer.score(texts, ids, refs, fields=self.fields()))

    scorer = Scorer.of(name_or_reward, url=url, **options)
    return _orm_class(_swift_bases()[0], __call__, scorer, image_id_column, references_column, name)


def async_orm(name_or_reward: Any = None, *, url: str | None = None, image_id_column: str = "image_id",
              references_column: str = "references", name: str = "FinecapAsyncReward",
              **options: Any) -> type:  # fmt: skip
    """An ms-swift ``AsyncORM`` class (ms-swift awaits it alongside its other asynchronous reward functions): over
    the reward server at ``url`` (asked without blocking the trainer), or over a reward in process as :func:`orm`."""

    async def __call__(self: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts, ids, refs = self._inputs(completions, kwargs)
        return self._paid(await self.scorer.ascore(texts, ids, refs, fields=self.fields()))

    scorer = Scorer.of(name_or_reward, url=url, **options)
    return _orm_class(_swift_bases()[1], __call__, scorer, image_id_column, references_column, name)
