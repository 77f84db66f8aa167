"""finecap's caption rewards as TRL reward functions (``GRPOTrainer``, ``RLOOTrainer``, any online trainer of TRL).

:func:`reward_function` takes the adapters' one entry (:meth:`finecap.integrations.scoring.Scorer.of`): a registry
name or dotted path with the reward's options, a built reward, or ``url=`` of a running ``finecap serve-reward``. It
returns a callable with TRL's signature ``fn(prompts, completions, **kwargs) -> list[float | None]``: one value per
completion (plain or conversational), the image of each read from the data-set column ``image_id_column`` that TRL
passes through ``kwargs``; its ``__name__`` is the reward's name (TRL logs ``rewards/<name>/mean``; the reward's
parts, such as a sum's terms or retrieval's accuracy, go to TRL's ``log_metric`` as ``rewards/<name>/<part>/mean``,
and a judged reward's work in the call, the increase of its tallies, as ``rewards/<name>/judge/calls``, ...). A
completion the reward could not score (:attr:`finecap.rewards.RewardOutput.failed`) is ``None``, which TRL (1.16) reads
as NaN: a completion that every reward function answers ``None`` is left out of its group's mean and standard deviation
(advantage 0), but one that another reward function scored is paid 0 for finecap's reward, inside those statistics
(TRL sums its reward functions with ``nansum``); beside other reward functions pass ``failed="raise"``, which raises
:class:`~finecap.serve.protocol.FailedCaptions` naming the completions instead, as ms-swift's adapter does.
A call the reward (or the server) refuses names TRL's fields, ``image_id[3]: unknown image id 99`` (the
``image_id_column``) or ``completions[1]``, never the ``image_ids[3]`` of finecap's own request. docs/integrations.md
lists each reward's options.

Example (plain-text completions)::

    >>> fn = reward_function("cider", references={1: ["a red circle", "a small red circle"], 2: ["a blue square"]})
    >>> [round(r, 3) for r in fn(prompts=["", ""], completions=["a red circle", "a square"], image_id=[1, 2])]
    [5.26, 1.743]
    >>> fn.__name__
    'cider'
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from finecap.integrations.scoring import Scorer, column, completion_text, completion_texts
from finecap.registry import REWARDS, is_dotted_path
from finecap.rewards.base import scored_mean
from finecap.serve.protocol import refuse_failed

__all__ = ["REWARDS", "TrlReward", "completion_text", "reward_function"]

FAILED = ("none", "raise")
"""What :class:`TrlReward` does with a completion the reward could not score: answer ``None``, or raise."""


def checked_failed(name: str, failed: str) -> str:
    """``failed``, one of :data:`FAILED`, or a ``ValueError`` naming the valid ones."""
    if failed not in FAILED:
        raise ValueError(f"reward_function({name!r}): failed={failed!r}; valid: {', '.join(FAILED)}")
    return failed


class TrlReward:
    """A finecap reward (or a reward server's) with TRL's reward-function signature (module docstring).

    Args:
        name: the reward's name; TRL logs it as ``rewards/<name>/mean``.
        reward: the finecap reward, set up, or a :class:`~finecap.integrations.scoring.Scorer`.
        image_id_column: the data-set column of each completion's image id.
        failed: ``"none"``: a completion the reward could not score is ``None`` (right when finecap's is TRL's only
            reward function); ``"raise"``: the call raises :class:`~finecap.serve.protocol.FailedCaptions` naming it
            (beside other reward functions, whose values would make TRL pay it 0: module docstring).
    """

    def __init__(self, name: str, reward: Any, image_id_column: str = "image_id", failed: str = "none") -> None:
        self.__name__ = name
        self.failed = checked_failed(name, failed)
        self.scorer = reward if isinstance(reward, Scorer) else Scorer(reward, name=name)
        self.reward = self.scorer.reward
        self.image_id_column = image_id_column

    def image_ids(self, n: int, kwargs: Mapping[str, Any]) -> list[Hashable]:
        return column(kwargs, self.image_id_column, n, f"reward_function({self.__name__!r})", "image_id_column")

    def fields(self) -> dict[str, str]:
        """TRL's names for the fields of a call (:func:`finecap.serve.protocol.callers_field`), which its refusals
        name: the completions and the data set's image-id column."""
        return {"captions": "completions", "image_ids": self.image_id_column}

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        """One value per completion (``None``: the reward could not score it); a call the reward server would refuse
        is refused alike (a ``ValueError`` with the server's message: :class:`finecap.integrations.scoring.Scorer`),
        a conversational completion without an assistant message too."""
        texts = completion_texts(completions)  # stripped as every adapter's (finecap.serve.protocol.parse_reward)
        out, increase = self.scorer.counted(texts, self.image_ids(len(texts), kwargs), fields=self.fields())
        log_metric = kwargs.get("log_metric")  # TRL >= 1.16: averaged over the logging step beside its own metrics
        if callable(log_metric):  # the judge's work of this call, logged even when the call raises below
            for key, value in increase.items():
                log_metric(f"rewards/{self.__name__}/{key}", value)
        if self.failed == "raise":
            refuse_failed(out, "completions", "TRL would pay a None as 0 beside other reward functions (nansum)",
                          f"reward_function({self.__name__!r})")  # fmt: skip
        if callable(log_metric):  # each part's mean where it has a value, as the training log's (scored_mean): a
            # judged reward's judge_failed part is 1 at the failed completions, its share failed (a reward's parts
            # are NaN where they mean nothing: a judged reward's others at its failed completions)
            for part, values in out.parts.items():
                mean = scored_mean(values)
                if part != self.__name__ and math.isfinite(mean):  # a part named like the reward: TRL's own name
                    log_metric(f"rewards/{self.__name__}/{part}/mean", mean)
        return out.values(failed=None)[0]

    def close(self) -> None:
        """Release what its scorer opened (:meth:`finecap.integrations.scoring.Scorer.close`): call it after
        ``trainer.train()``."""
        self.scorer.close()


def reward_function(name_or_reward: Any = None, *, url: str | None = None, image_id_column: str = "image_id",
                    name: str | None = None, failed: str = "none", **options: Any) -> TrlReward:  # fmt: skip
    """A TRL reward function over the finecap reward ``name_or_reward`` (a :data:`REWARDS` name or
    ``"pkg.module:factory"`` with its ``options``, or a built reward) or over the reward server at ``url``
    (:meth:`finecap.integrations.scoring.Scorer.of`). ``name``: TRL's name for it (default: the given name, else
    ``"finecap"``); ``failed``: :class:`TrlReward`'s (``"raise"`` beside other reward functions). A call of TRL holds
    its generation batch only: the retrieval reward's distractors can be no other images (``sr.distractors=batch``)."""
    if isinstance(name_or_reward, str) and name_or_reward not in REWARDS and not is_dotted_path(name_or_reward):
        raise ValueError(f"reward_function: unknown reward {name_or_reward!r}; valid: {', '.join(REWARDS)} (or a "
                         "dotted path 'pkg.module:factory')")  # fmt: skip
    shown = name or (name_or_reward if isinstance(name_or_reward, str) else "finecap")
    checked_failed(shown, failed)  # before a reward is built
    sr = options.get("sr")
    if sr is not None and sr.distractors != "batch":
        raise ValueError(f"reward_function({shown!r}): sr.distractors={sr.distractors}; TRL gives batch only")
    try:
        scorer = Scorer.of(name_or_reward, url=url, name=shown, **options)
    except TypeError as e:
        raise TypeError(f"reward_function({shown!r}): {e}") from None
    return TrlReward(shown, scorer, image_id_column, failed)
