"""finecap's caption rewards as verl reward functions (``custom_reward_function``).

verl calls a reward function in one of two forms, both provided here:

- per sample, ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs)`` (verl's
  reward loop, its ``naive`` and ``remote`` managers: verl 0.6 and later score one sample a call), and its
  coroutine ``compute_score_async``, which verl's reward loop awaits (concurrent samples then reach the server
  together, and it merges them into one call of a reward that scores each caption alone: CIDEr-D);
- per batch, ``compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **reward_kwargs)``
  (``reward_manager.name=batch``), one call for the whole generation batch.

Each returns ``{"score": total, <part>: value, ..., <tally>: value}`` per sample (verl trains on ``score`` and keeps
the other keys: its validation logs their means, its rollout dumps hold them); the tallies are a judged reward's work
over the call (``judge/calls``, ``judge/failed``, ...: :meth:`finecap.integrations.scoring.Scorer.counted`), shared
evenly among the call's samples.
The image a response describes is ``extra_info["image_id"]`` (the ``image_key`` option), its references, when the
data set brings its own, ``extra_info["references"]`` (``references_key``; otherwise the reward's own: CIDEr-D
against the training references of the image); ``ground_truth`` is not read (verl requires the field: put the
references there too, or anything). A per-sample call holds one image, so a reward that ranks each caption's image
among the call's images (self-retrieval with in-batch distractors, the listener) is refused there: use the batch
form (verl's ``batch`` reward manager of verl 0.5 and earlier), or serve ``sr.distractors=hard`` (mined distractors).

Two ways to point verl at a reward:

- a server (``finecap serve-reward RECIPE``), from verl's configuration alone, the functions of this module::

      reward.custom_reward_function.path=pkg://finecap.integrations.verl
      reward.custom_reward_function.name=compute_score_async      # or compute_score, compute_score_batch
      +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000

  (verl < 0.6 reads ``custom_reward_function`` at the top level of its configuration.) ``reward_kwargs.timeout``
  (seconds per request, default 180) and ``reward_kwargs.token`` (the server's bearer token; default
  ``$FINECAP_REWARD_TOKEN`` of verl's reward workers, which keeps it off the command line) reach the client too.
- a reward in verl's own process, from a file of yours (:class:`VerlReward` takes the adapters' one entry,
  :meth:`finecap.integrations.scoring.Scorer.of`: a registry name with its options, a built reward, or ``url=``)::

      # finecap_reward.py
      from finecap.integrations.verl import VerlReward
      compute_score = VerlReward("cider", references=train_references)
      compute_score_batch = compute_score.batch

A sample the reward could not score (:attr:`finecap.rewards.RewardOutput.failed`) has NaN values, never 0. A call
the reward (or the server) refuses names verl's fields: ``extra_infos[3].image_id: unknown image id 99``,
``solution_strs[1]``, ``extra_infos[2].references[0]`` (a per-sample call's ``extra_info.image_id``,
``solution_str``), never the ``image_ids[3]`` of finecap's own request (:meth:`VerlReward.fields`).

Example::

    >>> from finecap.rewards.cider import CiderReward
    >>> fn = VerlReward(CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]}))
    >>> round(fn("coco", "a red circle", "", {"image_id": 1})["score"], 3)
    5.26
    >>> [round(r["score"], 3) for r in fn.batch(["coco"] * 2, ["a red circle", "a square"], ["", ""],
    ...                                         [{"image_id": 1}, {"image_id": 2}])]
    [5.26, 1.743]
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from finecap.integrations.scoring import Scorer, per_sample
from finecap.rewards import RewardOutput
from finecap.serve.protocol import one_sample_fields

log = logging.getLogger(__name__)

__all__ = ["VerlReward", "compute_score", "compute_score_async", "compute_score_batch"]


class VerlReward:
    """A finecap reward (or a reward server's) with verl's reward-function signatures (module docstring).

    Args:
        name_or_reward: a registry name or dotted path (with its ``options``) or a built finecap reward
            (:meth:`finecap.integrations.scoring.Scorer.of`), or ``None`` with ``url``.
        url: a reward server instead.
        image_key: the ``extra_info`` key of each sample's image id.
        references_key: the ``extra_info`` key of each sample's references (read when present).
    """

    def __init__(self, name_or_reward: Any = None, *, url: str | None = None, image_key: str = "image_id",
                 references_key: str = "references", **options: Any) -> None:  # fmt: skip
        self.scorer = Scorer.of(name_or_reward, url=url, **options)
        self.image_key, self.references_key = image_key, references_key
        self._told_ground_truth = False

    def close(self) -> None:
        """Release what its scorer opened (:meth:`finecap.integrations.scoring.Scorer.close`)."""
        self.scorer.close()

    def _inputs(self, extra_infos: Sequence[Mapping[str, Any] | None]) -> tuple[list[Hashable], list | None]:
        ids, refs = [], []
        for n, info in enumerate(extra_infos):
            info = {} if info is None else info
            if not isinstance(info, Mapping):
                raise ValueError(f"finecap verl reward: sample {n}'s extra_info must be a dict, got "
                                 f"{type(info).__name__}")  # fmt: skip
            if self.image_key not in info:
                raise KeyError(f"finecap verl reward: sample {n}'s extra_info has no {self.image_key!r} (keys: "
                               f"{sorted(info)}); put each sample's image id there, or pass image_key=")  # fmt: skip
            ids.append(info[self.image_key])
            refs.append(info.get(self.references_key))
        given = [r is not None for r in refs]
        if any(given) and not all(given):
            raise ValueError(f"finecap verl reward: sample {given.index(False)} has no {self.references_key!r} in its "
                             "extra_info where others have: give references for every sample or for none")  # fmt: skip
        return ids, (refs if all(given) else None)  # checked as the server checks them (a string is refused)

    def fields(self, one: bool) -> dict[str, str]:
        """verl's names for the fields of a call (:func:`finecap.serve.protocol.callers_field`), which its refusals
        name: the batch form's ``solution_strs`` and ``extra_infos[i]``'s keys; ``one``: the per-sample form's
        ``solution_str`` and ``extra_info``'s keys."""
        if one:
            return one_sample_fields({"captions": "solution_str", "image_ids": f"extra_info.{self.image_key}",
                                      "references": f"extra_info.{self.references_key}"})  # fmt: skip
        return {"captions": "solution_strs", "image_ids": f"extra_infos[].{self.image_key}",
                "references": f"extra_infos[].{self.references_key}"}  # fmt: skip

    def batch(self, data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
              extra_infos: Sequence[Mapping[str, Any] | None], **reward_kwargs: Any
              ) -> list[dict[str, float]]:  # fmt: skip
        """verl's batch form: one reward call for the batch."""
        return self._scored(solution_strs, ground_truths, extra_infos, one=False)

    def _scored(self, solution_strs: Sequence[str], ground_truths: Sequence[Any],
                extra_infos: Sequence[Mapping[str, Any] | None], one: bool) -> list[dict[str, float]]:  # fmt: skip
        ids, refs = self._inputs(extra_infos)
        self._note_ground_truth(ground_truths, refs)
        out, increase = self.scorer.counted(solution_strs, ids, refs, fields=self.fields(one))
        return _samples(out, increase)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
                 = None, **reward_kwargs: Any) -> dict[str, float]:  # fmt: skip
        """verl's per-sample form (refused for rewards that compare a call's images: module docstring)."""
        self._check_single()
        return self._scored([solution_str], [ground_truth], [extra_info], one=True)[0]

    async def ascore(self, data_source: str, solution_str: str, ground_truth: Any,
                     extra_info: Mapping[str, Any] | None = None, **reward_kwargs: Any
                     ) -> dict[str, float]:  # fmt: skip
        """The per-sample form as a coroutine (a server is asked without blocking verl's event loop)."""
        self._check_single()
        ids, refs = self._inputs([extra_info])
        self._note_ground_truth([ground_truth], refs)
        return _samples(*await self.scorer.acounted([solution_str], ids, refs, fields=self.fields(True)))[0]

    def _note_ground_truth(self, ground_truths: Sequence[Any], refs: list | None) -> None:
        """A warning, once, when ``ground_truth`` holds text and no references came in ``extra_info``: verl's natural
        place for the references is not read (module docstring), so the reward's own references score the call."""
        if refs is not None or self._told_ground_truth:
            return
        if any(isinstance(g, str) and g.strip() or isinstance(g, list | tuple) and g and all(isinstance(t, str)
               for t in g) for g in ground_truths):  # fmt: skip
            self._told_ground_truth = True
            log.warning("finecap verl reward: ground_truth holds text, which it does not read: the reward scores "
                        "against its own references of the image in extra_info[%r]; to score against the data set's, "
                        "put them in extra_info[%r]", self.image_key, self.references_key)  # fmt: skip

    def _check_single(self) -> None:
        if self.scorer.compares_images:
            raise ValueError("finecap verl reward: this reward ranks each caption's image among the call's images, "
                             "and a per-sample call holds one: use compute_score_batch (reward_manager=batch) or "
                             "sr.distractors=hard")  # fmt: skip


def _samples(out: RewardOutput, increase: Mapping[str, float]) -> list[dict[str, float]]:
    """Each sample's ``{"score": total, <part>: value, ..., <tally>: share}``: the reward's parts, and its tallies'
    increase over the call shared evenly among the call's samples (:func:`~finecap.integrations.scoring.per_sample`),
    the same keys for every sample (verl reads each sample's keys from the first one's)."""
    total, parts = out.values()
    shares = per_sample(increase, len(total)) if total else {}
    return [{"score": t, **{k: v[n] for k, v in parts.items()}, **shares} for n, t in enumerate(total)]


_SERVED: dict[tuple[str, str, str, str | None, float], VerlReward] = {}
"""The server adapters of the module's functions, one per ``(url, image_key, references_key, token, timeout)``."""


def _served(url: str | None, image_key: str, references_key: str, token: str | None, timeout: float) -> VerlReward:
    if not url:
        raise ValueError("finecap.integrations.verl.compute_score: give the reward server's URL in verl's "
                         "custom_reward_function.reward_kwargs.url (or build a VerlReward over a reward in a file of "
                         "yours; docs/integrations.md)")  # fmt: skip
    key = (url, image_key, references_key, token, timeout)
    if key not in _SERVED:
        _SERVED[key] = VerlReward(url=url, image_key=image_key, references_key=references_key, token=token,
                                  timeout=timeout)  # fmt: skip
    return _SERVED[key]


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                  *, url: str | None = None, image_key: str = "image_id", references_key: str = "references",
                  token: str | None = None, timeout: float = 180.0, **reward_kwargs: Any
                  ) -> dict[str, float]:  # fmt: skip
    """verl's per-sample reward function on the reward server at ``url`` (``url``, ``image_key``,
    ``references_key``, ``token``: the server's bearer token, default ``$FINECAP_REWARD_TOKEN``, and ``timeout``:
    seconds per request, are ``reward_kwargs`` of verl's config; the other keywords, which verl's reward loop adds
    for reward models of its own, are not read)."""
    scorer = _served(url, image_key, references_key, token, timeout)
    return scorer(data_source, solution_str, ground_truth, extra_info)


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any,
                              extra_info: Mapping[str, Any] | None = None, *, url: str | None = None,
                              image_key: str = "image_id", references_key: str = "references",
                              token: str | None = None, timeout: float = 180.0,
                              **reward_kwargs: Any) -> dict[str, float]:  # fmt: skip
    """:func:`compute_score` as a coroutine, which verl's reward loop awaits."""
    scorer = _served(url, image_key, references_key, token, timeout)
    return await scorer.ascore(data_source, solution_str, ground_truth, extra_info)


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
                        extra_infos: Sequence[Mapping[str, Any] | None], *, url: str | None = None,
                        image_key: str = "image_id", references_key: str = "references", token: str | None = None,
                        timeout: float = 180.0, **reward_kwargs: Any) -> list[dict[str, float]]:  # fmt: skip
    """verl's batch reward function on the reward server at ``url`` (keywords: :func:`compute_score`'s)."""
    scorer = _served(url, image_key, references_key, token, timeout)
    return scorer.batch(data_sources, solution_strs, ground_truths, extra_infos)
