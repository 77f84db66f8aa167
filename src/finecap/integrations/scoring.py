"""What the adapters of :mod:`finecap.integrations` share: :class:`Scorer`, one finecap reward in process or on a
reward server (``finecap serve-reward``, :mod:`finecap.serve`), called on a list of captions and their images as the
server calls it on one request: ``reward(captions, call_batch(image_ids, references))``, so that a reward's values
are bit-identical whichever front end asks; and the readers of the trainers' arguments (columns of per-sample
values, completions, message contents).

Every adapter is entered the same way, :meth:`Scorer.of`'s: ``name_or_reward`` (a registry name or dotted path with
its ``**options``, :func:`finecap.rewards.reward_of`; or a built reward) or ``url=`` (a running reward server).
Every value is a :class:`finecap.rewards.RewardOutput`, which each adapter converts at its boundary. A scorer
closes what it opened (:meth:`Scorer.close`, or ``with``): the reward it built from a name (a judge-backed reward's
judge: its connections, answer cache or engine), never a reward it was given, and a server client's connections.

In process, a call is checked exactly as the server checks a request, by the same code, and refused with the same
message (a ``ValueError``: :class:`finecap.serve.protocol.RequestError`): its fields
(:func:`~finecap.serve.protocol.parse_reward`: captions are strings, ids strings or integers, references lists of
strings, never a string split into characters), its images (:class:`~finecap.serve.service.CallCheck`: the ids the
reward knows, ``17`` and ``"17"`` one image; a reward that compares a call's images refuses a call of one image,
as TRL's default of one prompt a generation batch would give); and its values (:meth:`CallCheck.answer`, the
server's): a value that is not finite as float32 is a :class:`finecap.rewards.NonFiniteReward` naming the reward, and
a server's reply is checked for its length, types and finiteness (:func:`finecap.serve.client.checked_values`).

Example::

    >>> from finecap.rewards.cider import CiderReward
    >>> scorer = Scorer.of(CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]}))
    >>> [round(v, 3) for v in scorer.score(["a red circle", "a square"], [1, "2"]).total.tolist()]
    [5.26, 1.743]
    >>> Scorer.of("cider", references={1: ["a red circle"], 2: ["a blue square"]}).reward.per_caption
    True
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from finecap.judges.base import tallies_grown
from finecap.rewards import RewardOutput, as_reward, reward_of
from finecap.serve.protocol import Limits, RequestError, in_callers_words, parse_reward, reward_body
from finecap.serve.service import CallCheck, ImageTable
from finecap.utils.closing import Closeable

log = logging.getLogger(__name__)

IN_PROCESS = Limits(max_request_bytes=2**62, max_captions=2**62, max_caption_chars=2**62, max_references=2**62)
"""A call in process has no size limits (the server's protect the server); every other check is the server's."""


class Scorer(Closeable):
    """A finecap reward (``reward``, in this process) or a reward server (``url``), one of them.

    Args:
        reward: ``reward(captions, batch) -> RewardOutput``: a reward (:class:`finecap.rewards.RewardBase`, or a
            plain callable, wrapped once: :func:`finecap.rewards.as_reward`), set up.
        url: the server (``http://127.0.0.1:8000``); its reward, images and limits are the server's.
        timeout: seconds per request to the server.
        token: the server's bearer token (default ``$FINECAP_REWARD_TOKEN``).
        name: what messages call the reward.
    """

    def __init__(self, reward: Any = None, *, url: str | None = None, timeout: float = 180.0,
                 token: str | None = None, name: str = "the reward") -> None:  # fmt: skip
        if (reward is None) == (url is None):
            raise ValueError("give a finecap reward (reward=) or a reward server's URL (url=), one of them")
        if reward is not None and not callable(reward):
            raise TypeError(f"reward= must be a finecap reward (callable), got {type(reward).__name__}")
        self.reward = None if reward is None else as_reward(reward, "reward")
        self.name = name
        self.owns_reward = False  # set by Scorer.of for a reward it built: close() closes it
        self.client = None
        self._check: CallCheck | None = None
        self._lock = threading.Lock()  # one reward call at a time, whoever calls (as the server's, service.py)
        self._tallied: dict[str, float] | None = None  # a server's tallies as last read (counted); None: not yet
        self._tally_lock = threading.Lock()  # one read of a server's tallies at a time, against _tallied
        self._told_tallies = False  # a server's tallies that could not be read: said once
        if url is not None:
            from finecap.serve.client import RewardClient  # httpx: only for a server

            self.client = RewardClient(url, timeout=timeout, token=token)

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (verl's ``remote`` reward manager pickles the adapter): all but the lock, which
        is this process's; the copy makes its own."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_tally_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._tally_lock = threading.Lock(), threading.Lock()

    @classmethod
    def of(cls, name_or_reward: Any = None, *, url: str | None = None, timeout: float = 180.0,
           token: str | None = None, name: str | None = None, **options: Any) -> Scorer:  # fmt: skip
        """The one entry of every adapter: a registry name or dotted path with the reward's ``options``
        (:func:`finecap.rewards.reward_of`: built and set up here), a built reward, or ``url=`` of a reward server
        (``timeout``, ``token``: the client's); ``name``: what messages call it (default: the given name)."""
        if (name_or_reward is None) == (url is None):
            raise ValueError("give a finecap reward (a registry name, a dotted path or a built reward) or a reward "
                             "server's URL (url=), one of them")  # fmt: skip
        if url is not None:
            if options:
                raise TypeError(f"options {sorted(options)} are the reward's: a server (url=) has its own")
            return cls(url=url, timeout=timeout, token=token, name=name or "the reward")
        shown = name or (name_or_reward if isinstance(name_or_reward, str) else "the reward")
        scorer = cls(reward_of(name_or_reward, **options), name=shown)
        scorer.owns_reward = isinstance(name_or_reward, str)  # built here from a name or a dotted path
        return scorer

    def close(self) -> None:
        """Release what this scorer opened: the reward it built from a name (:meth:`finecap.rewards.RewardBase.close`:
        a judge-backed reward closes the judge it built), never one it was given; a server client's connections.
        Safe to call again. A trainer's adapter calls none of this itself (the frameworks have no such hook): call it,
        or ``with`` the scorer, when training is done; otherwise the process's end releases them."""
        if self.client is not None:
            self.client.close()
        if self.owns_reward and self.reward is not None:
            self.reward.close()
            self.owns_reward = False

    def tallies(self) -> dict[str, float]:
        """The reward's running counts of its work since it was built (:meth:`finecap.rewards.RewardBase.tallies`: a
        judged reward's judge's ``judge/calls``, ``judge/failed``, ...; a server's reward's, read from its ``GET
        /health``: :meth:`finecap.serve.client.RewardClient.tallies`), the running totals; what each adapter logs
        through its trainer is their increase over each call (:meth:`counted`)."""
        if self.client is not None:
            return self.client.tallies()
        return dict(self.reward.tallies())

    @property
    def compares_images(self) -> bool:
        """Whether the reward ranks each caption's image among the call's images (a server says so itself, with a 400
        on a request of one image)."""
        return self.reward is not None and self.reward.compares_images

    def check(self) -> CallCheck:
        """The server's checks of a call's images, over the images the reward knows (read at the first call: a
        reward is set up by then)."""
        if self._check is None:
            known = self.reward.known_images()
            table = None if known is None else ImageTable(known)  # its messages are the server's
            self._check = CallCheck(table, self.compares_images, self.name)
        return self._check

    def score(self, captions: Sequence[str], image_ids: Sequence[Hashable],
              references: Sequence[Sequence[str]] | None = None, *,
              fields: Mapping[str, str] | None = None) -> RewardOutput:  # fmt: skip
        """The values (float32 on the CPU) of ``captions`` of the images ``image_ids`` (against ``references``, when
        given). Safe from several threads (verl's reward loop runs ``compute_score`` in a thread pool, OpenRLHF its
        ``reward_func`` in ``asyncio.to_thread``): a reward in this process is called by one thread at a time, as the
        server calls its reward, since a reward need not be thread-safe (an in-process vLLM judge's engine is not);
        a server's requests go out at once. ``fields``: the caller's own names for the call's fields (``captions``,
        ``image_ids``, ``references``), which a refusal names, in process as from a server
        (:func:`finecap.serve.protocol.callers_field`; OpenRLHF's :data:`~finecap.serve.protocol.GET_REWARD_FIELDS`:
        ``labels[1]: unknown image id 99``); default the names of a ``/reward`` request. A server is asked after
        its ``/health`` is read once (:meth:`_read_first`), as every adapter asks it."""
        if self.client is not None:
            self._read_first()
            return self.client.score(captions, image_ids, references=references, fields=fields)
        return self._in_process(captions, image_ids, references, fields)[0]

    async def ascore(self, captions: Sequence[str], image_ids: Sequence[Hashable],
                     references: Sequence[Sequence[str]] | None = None, *,
                     fields: Mapping[str, str] | None = None) -> RewardOutput:  # fmt: skip
        """:meth:`score` (its arguments), awaited: a server's request does not block the trainer's event loop."""
        if self.client is not None:
            await self._aread_first()
            return await self.client.ascore(captions, image_ids, references=references, fields=fields)
        return self.score(captions, image_ids, references, fields=fields)

    def counted(self, captions: Sequence[str], image_ids: Sequence[Hashable],
                references: Sequence[Sequence[str]] | None = None, *,
                fields: Mapping[str, str] | None = None) -> tuple[RewardOutput, dict[str, float]]:  # fmt: skip
        """:meth:`score` (its arguments) and how much each of the reward's :meth:`tallies` grew over the call
        (``{"judge/calls": 6.0, "judge/failed": 1.0, ...}``, every key at every call, 0 where none; ``{}`` for a
        reward that counts nothing): what the adapters log through their trainers (docs/integrations.md, "The judge's
        work in the trainer's log"). In process, the call's own work, read inside the call's lock (a call of another
        thread is never counted in it); through a server, the increase of its ``/health`` tallies since this scorer
        last read them (:meth:`_server_grown`): every client's work in between."""
        if self.client is None:
            return self._in_process(captions, image_ids, references, fields)
        client = self.client
        return self.counted_on_server(lambda: client.score(captions, image_ids, references=references, fields=fields))

    def counted_on_server(self, call: Callable[[], RewardOutput]) -> tuple[RewardOutput, dict[str, float]]:
        """``call()``, a request of this scorer's server client (one :meth:`counted` does not make: OpenRLHF's
        images by path), and the increase of the server's tallies over it, as :meth:`counted` counts it."""
        self._read_first()
        out = call()
        return out, self._server_grown()

    async def acounted(self, captions: Sequence[str], image_ids: Sequence[Hashable],
                       references: Sequence[Sequence[str]] | None = None, *,
                       fields: Mapping[str, str] | None = None) -> tuple[RewardOutput, dict[str, float]]:  # fmt: skip
        """:meth:`counted`, awaited: a server's request and the read of its tallies do not block the event loop."""
        if self.client is None:
            return self.counted(captions, image_ids, references, fields=fields)
        await self._aread_first()
        out = await self.client.ascore(captions, image_ids, references=references, fields=fields)
        return out, await asyncio.to_thread(self._server_grown)

    def _read_first(self) -> None:
        """Before this scorer's first request to its server, the server's ``/health`` read (:meth:`_server_grown`),
        whichever adapter asks (:meth:`score`, :meth:`ascore`, :meth:`counted`, :meth:`acounted`): the tallies before
        the first call (the server's work until then is no call's), and the server known to the client as one that
        answers, so that a first request whose connection is refused or closed unanswered (a server over its
        ``--max-connections``, or restarting) is asked again as a later one is
        (:meth:`finecap.serve.client.RewardClient.retry_wait`); from a server that never answered, it fails at once."""
        if self._tallied is None:
            self._server_grown()

    async def _aread_first(self) -> None:
        """:meth:`_read_first`, awaited: the read does not block the event loop."""
        if self._tallied is None:
            await asyncio.to_thread(self._server_grown)

    def _in_process(self, captions: Sequence[str], image_ids: Sequence[Hashable],
                    references: Sequence[Sequence[str]] | None,
                    fields: Mapping[str, str] | None) -> tuple[RewardOutput, dict[str, float]]:  # fmt: skip
        with self._lock:
            try:
                request = parse_reward(reward_body(captions, image_ids, references=references), IN_PROCESS)
                job = self.check().job(request)
            except RequestError as e:
                raise in_callers_words(e, fields) from None
            before = dict(self.reward.tallies())
            out = self.check().answer(self.reward(job.captions, job.batch()), [len(job.captions)])[0]
            return out, tallies_grown(before, self.reward.tallies())

    def _server_grown(self) -> dict[str, float]:
        """How much the server's tallies grew since this scorer last read them, the counts read now kept for the next
        time; the first read gives ``{}``. A read that fails (the server unreachable a moment, or a server whose
        ``/health`` holds no tallies) is logged once and counts 0 for each key, whose increase the next read holds;
        when the first read fails the scorer counts nothing (``{}`` at every call: a trainer that reads every sample's
        keys from the first one's, verl, finds the same keys in each). A server that restarted (a count below the one
        read before) counts from 0."""
        from finecap.serve.client import RewardServerError

        with self._tally_lock:
            if self._tallied == {}:  # a reward that counts nothing, or a first read that failed
                return {}
            try:
                now = self.client.tallies()
            except RewardServerError as e:
                if not self._told_tallies:
                    self._told_tallies = True
                    log.warning("finecap adapter: the reward server's tallies (its judge's calls, failures, ...) "
                                "could not be read; the trainer's log holds none of them until a read succeeds "
                                "(none at all when the first read failed): %s", e)  # fmt: skip
                if self._tallied is None:
                    self._tallied = {}
                return dict.fromkeys(self._tallied, 0.0)
            before, self._tallied = self._tallied, now
            if before is None:
                return {}
            if any(now.get(k, 0.0) < v for k, v in before.items()):  # the server restarted: its counts began again
                before = {}
            return tallies_grown(before, now)


def per_sample(increase: Mapping[str, float], n: int) -> dict[str, float]:
    """A call's increase of the tallies (:meth:`Scorer.counted`) shared evenly among its ``n`` samples, for a
    trainer that logs a value per sample (verl, OpenRLHF): the samples' sum is the call's increase, their mean the
    count per caption, whichever way the trainer cuts its batch into calls.

    >>> per_sample({"judge/calls": 6.0}, 4)
    {'judge/calls': 1.5}
    """
    return {k: v / n for k, v in increase.items()}


TRAINER_KEYWORDS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"})
"""The keywords TRL's ``GRPOTrainer`` passes a reward function beside the data set's columns (TRL 1.16,
``_calculate_rewards``): never listed as columns in an error."""


def column(values: Mapping[str, Any], name: str, n: int, who: str, option: str) -> list[Any]:
    """The per-sample column ``name`` of a trainer's keyword arguments (``n`` values), or an error listing the
    columns there are and the ``option`` that names another."""
    if name not in values:
        columns = sorted(k for k in values if k not in TRAINER_KEYWORDS)
        raise KeyError(f"{who}: no {name!r} column among the data set's columns {columns}; add the image ids as that "
                       f"column or pass {option}=")  # fmt: skip
    given = values[name]
    if isinstance(given, str | bytes) or not hasattr(given, "__len__"):
        raise ValueError(f"{who}: the {name!r} column must hold one value per completion, got "
                         f"{type(given).__name__}")  # fmt: skip
    out = list(given)
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


def completion_text(completion: Any, index: int = 0) -> str:
    """The text of one completion (``completions[index]``, for errors): a string as is; a conversational completion
    (a list of messages) gives its last assistant message's content (a string, or the concatenated ``text`` blocks
    of a content list; a message without a ``role`` is the assistant's). A completion holding no assistant message
    is refused: its text is the prompt's, not a caption. Anything else (``None``, a number) is refused by name."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and all(isinstance(m, Mapping) for m in completion):
        replies = [m for m in completion if m.get("role", "assistant") == "assistant"]
        if not replies:
            roles = sorted({str(m.get("role")) for m in completion})
            raise ValueError(f"completions[{index}]: no assistant message (roles: {', '.join(roles)}): nothing the "
                             "model wrote to score")  # fmt: skip
        try:
            return content_text(replies[-1].get("content", ""))
        except TypeError as e:
            raise ValueError(f"completions[{index}]: {e}") from None
    kind = "an empty list" if isinstance(completion, Sequence) and not completion else type(completion).__name__
    raise ValueError(f"completions[{index}]: expected a string or a list of messages, got {kind}")


def completion_texts(completions: Any) -> list[str]:
    """:func:`completion_text` of each completion."""
    completions = list(completions) if isinstance(completions, Sequence) and not isinstance(completions, str) else None
    if completions is None:
        raise ValueError("completions: expected a list of completions")
    return [completion_text(c, i) for i, c in enumerate(completions)]
