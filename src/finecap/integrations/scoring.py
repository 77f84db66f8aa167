"""What the adapters of :mod:`finecap.integrations` share: :class:`Scorer`, one finecap reward in process or on a
reward server (``finecap serve-reward``, :mod:`finecap.serve`), called on a list of captions and their images as the
server calls it on one request: ``reward(captions, call_batch(image_ids, references))``, so that a reward's values
are bit-identical whichever front end asks; and the readers of the trainers' arguments (columns of per-sample
values, message contents).

Example::

    >>> from finecap.rewards.cider import CiderReward
    >>> scorer = Scorer(CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]}))
    >>> [round(v, 3) for v in scorer.score(["a red circle", "a square"], [1, 2]).total]
    [5.26, 1.743]
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from finecap.rewards import Reward, call_batch, compares_images
from finecap.serve.service import Scored, split_output


class Scorer:
    """A finecap reward (``reward``, in this process) or a reward server (``url``), one of them.

    Args:
        reward: ``reward(captions, batch) -> RewardOutput``: a reward of the table (:func:`finecap.rewards.get_reward`)
            or a mixture (:class:`finecap.rewards.WeightedSum`), set up.
        url: the server (``http://127.0.0.1:8000``); its reward, images and limits are the server's.
        timeout: seconds per request to the server.
    """

    def __init__(self, reward: Reward | None = None, *, url: str | None = None, timeout: float = 180.0) -> None:
        if (reward is None) == (url is None):
            raise ValueError("give a finecap reward (reward=) or a reward server's URL (url=), one of them")
        self.reward = reward
        self.client = None
        if url is not None:
            from finecap.serve.client import RewardClient  # httpx: only for a server

            self.client = RewardClient(url, timeout=timeout)

    @property
    def compares_images(self) -> bool:
        """Whether the reward ranks each caption's image among the call's images (a server says so itself, with a 400
        on a request of one image)."""
        return self.reward is not None and compares_images(self.reward)

    def score(self, captions: Sequence[str], image_ids: Sequence[Hashable],
              references: Sequence[Sequence[str]] | None = None) -> Scored:  # fmt: skip
        """The values of ``captions`` of the images ``image_ids`` (against ``references``, when given)."""
        if self.client is not None:
            return self.client.score(captions, image_ids, references=references)
        return split_output(self.reward(list(captions), call_batch(image_ids, references)), [len(captions)])[0]

    async def ascore(self, captions: Sequence[str], image_ids: Sequence[Hashable],
                     references: Sequence[Sequence[str]] | None = None) -> Scored:  # fmt: skip
        """:meth:`score`, awaited (a server's request does not block the trainer's event loop)."""
        if self.client is not None:
            return await self.client.ascore(captions, image_ids, references=references)
        return self.score(captions, image_ids, references)


def column(values: Mapping[str, Any], name: str, n: int, who: str, option: str) -> list[Any]:
    """The per-sample column ``name`` of a trainer's keyword arguments (``n`` values), or an error listing the
    columns there are and the ``option`` that names another."""
    if name not in values:
        columns = sorted(k for k in values if k not in ("trainer_state", "log_extra", "log_metric"))
        raise KeyError(f"{who}: no {name!r} column among the data set's columns {columns}; add the image ids as that "
                       f"column or pass {option}=")  # fmt: skip
    out = list(values[name])
    if len(out) != n:
        raise ValueError(f"{who}: {len(out)} values of {name!r} for {n} completions")
    return out


def content_text(content: Any) -> str:
    """The text of a message's content: a string as is, a list of blocks as its concatenated ``text`` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and all(isinstance(b, Mapping) for b in content):
        return "".join(block.get("text", "") for block in content if block.get("type") == "text")
    raise TypeError(f"a message's content must be a string or a list of blocks, got {type(content).__name__}")
