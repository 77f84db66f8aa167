"""The reward service behind the HTTP server: a set-up reward, the images it knows, and the batching of concurrent
requests.

- **Images.** A request names images by id or by path; :class:`ImageTable` maps them to the reward's own ids (those
  of the served data set's training split, whose references, embeddings and scenes the reward was set up with):
  ``17`` and ``"17"`` are the same image, a path is matched as the data set names it or resolved. An image the
  reward does not know is refused (400, naming ``image_ids[i]``) before any reward is called.
- **One call per request.** A request is one reward call, ``reward(captions, call_batch(image_ids))``, exactly as
  the adapters call it in process, so the values are bit-identical through every front end. A reward whose
  candidates are the call's images (self-retrieval with in-batch distractors, the listener:
  :func:`finecap.rewards.compares_images`) ranks each caption's image among the request's images: a request with
  one distinct image is refused (its values would say nothing).
- **Batching.** Requests wait in a queue that one worker thread serves (a reward holds a model and tables, and is
  called by one caller at a time, as in training). Each round takes what queued while the previous round ran
  (after waiting ``batch_wait`` seconds for more), up to ``batch_size`` captions. When every component scores each
  caption on its own (:func:`finecap.rewards.per_caption`: CIDEr-D) the round's requests are merged into one call
  (the values are those of separate calls, tested bit for bit); otherwise each is called alone, in turn.
- **Throughput logs.** Every ``log_every`` seconds one line: requests, captions, captions per second, the mean
  round, the share of the time the reward was busy, and the p50 / p99 latency of the requests since the previous
  line (and one at the end).

Example::

    >>> import asyncio
    >>> from finecap.rewards.cider import CiderReward
    >>> reward = CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]})
    >>> service = RewardService(reward, ImageTable([1, 2]))
    >>> async def ask():
    ...     async with service.running():
    ...         return await service.score(service.job(RewardRequest(["a red circle", "a square"], ["1", 2])))
    >>> [round(v, 3) for v in asyncio.run(ask()).total]  # as the reward's own example: "1" is the image 1
    [5.26, 1.743]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from finecap.rewards import Reward, call_batch, compares_images, per_caption
from finecap.serve.protocol import Limits, RequestError, RewardRequest

log = logging.getLogger(__name__)

_MISSING = object()


class ImageTable:
    """The images a served reward knows: request ids (``str(id)``: ``17`` and ``"17"`` are one image) and image
    paths (as the data set names them, or resolved) -> the reward's image ids.

    Args:
        image_ids: the reward's image ids (the served data set's training images).
        paths: ``{path: image id}`` of the images' files (optional: requests by path are refused without).
        source: what the images are, for errors (``"the 900 training images of world 3f2a"``).
    """

    def __init__(self, image_ids: Iterable[Hashable], paths: Mapping[str, Hashable] | None = None,
                 source: str = "") -> None:  # fmt: skip
        self.by_text: dict[str, Hashable] = {}
        for image_id in image_ids:
            seen = self.by_text.setdefault(str(image_id), image_id)
            if seen != image_id:
                raise ValueError(f"image ids {seen!r} and {image_id!r} read the same in a request")
        self.by_path = dict(paths or {})
        self.source = source or f"the {len(self.by_text)} images the reward was set up with"

    @classmethod
    def of_records(cls, records: Sequence[Any], source: str = "") -> ImageTable:
        """The table of data-set records (:class:`finecap.data.formats.Record`: ``image_id``, ``path``)."""
        paths: dict[str, Hashable] = {}
        for r in records:
            if not getattr(r, "embedded", False):
                paths[str(r.path)] = r.image_id
                paths.setdefault(str(Path(r.path).resolve()), r.image_id)
        return cls([r.image_id for r in records], paths, source)

    def __len__(self) -> int:
        return len(self.by_text)

    def resolve(self, given: Sequence[Any], by_path: bool, field: str) -> list[Hashable]:
        """The reward's ids of the request's images (``field``: the request's name for them, in errors)."""
        out = []
        for i, value in enumerate(given):
            if by_path:
                hit = self.by_path.get(value, _MISSING)
                if hit is _MISSING:
                    hit = self.by_path.get(str(Path(value).resolve()), _MISSING)
            else:
                hit = self.by_text.get(str(value), _MISSING)
            if hit is _MISSING:
                what = "image file" if by_path else "image id"
                raise RequestError(f"{field}[{i}]", f"unknown {what} {value!r}: the server scores {self.source}")
            out.append(hit)
        return out


@dataclass
class Job:
    """A checked request: its captions, the reward's ids of their images, its references (or ``None``)."""

    request: RewardRequest
    image_ids: list[Hashable]

    @property
    def captions(self) -> list[str]:
        return self.request.captions

    def batch(self) -> dict[str, Any]:
        """The reward's batch of this request alone (:func:`finecap.rewards.call_batch`)."""
        return call_batch(self.image_ids, self.request.references)


@dataclass
class Scored:
    """One request's values: ``total[n]`` and each part's ``parts[name][n]``, as Python floats (float32 values)."""

    total: list[float]
    parts: dict[str, list[float]] = field(default_factory=dict)


class RewardService:
    """A set-up reward served to concurrent requests (module docstring).

    Args:
        reward: ``reward(captions, batch) -> RewardOutput``, set up (``finecap serve-reward``: the training
            loop's).
        images: the images the reward knows.
        limits: what one request may hold.
        batch_size: captions per round at most (a larger request is a round of its own).
        batch_wait: seconds a round waits for more requests once one is queued (0: only those already queued).
        log_every: seconds between throughput lines (0: none).
        name: what the logs and ``/health`` call the reward.
    """

    def __init__(self, reward: Reward, images: ImageTable, *, limits: Limits | None = None, batch_size: int = 1024,
                 batch_wait: float = 0.0, log_every: float = 60.0, name: str = "reward") -> None:  # fmt: skip
        if batch_size < 1:
            raise ValueError(f"--batch-size: must be at least 1, got {batch_size}")
        if batch_wait < 0:
            raise ValueError(f"--batch-wait-ms: must be at least 0, got {batch_wait * 1000:g}")
        self.reward, self.images, self.name = reward, images, name
        self.limits = limits or Limits()
        self.batch_size, self.batch_wait = batch_size, batch_wait
        self.merges = per_caption(reward)
        self.compares = compares_images(reward)
        self.meter = Meter(log_every)
        self._lock = threading.Lock()  # one reward call at a time, whoever calls
        self._pending: deque[tuple[Job, asyncio.Future, float]] = deque()
        self._wakeup: asyncio.Event | None = None
        self._executor: ThreadPoolExecutor | None = None

    # ---------------------------------------------------------------------------------------------------------------
    def job(self, request: RewardRequest) -> Job:
        """Check ``request`` against the images and the reward (:class:`RequestError` naming the field)."""
        field_name = "images" if request.by_path else "image_ids"
        ids = self.images.resolve(request.image_ids, request.by_path, field_name)
        if self.compares and len(set(ids)) < 2:
            raise RequestError(field_name, f"names one distinct image; {self.name} ranks each caption's image among "
                               "the request's images (sr.distractors=batch, or the listener): send a generation batch "
                               "of several images per request, or serve sr.distractors=hard")  # fmt: skip
        return Job(request, ids)

    def score_now(self, jobs: Sequence[Job]) -> list[Scored | Exception]:
        """Score ``jobs`` here and now (the worker thread's round): one merged call when the reward scores each
        caption on its own and no job brings references, else one call per job; a failed merged call is retried
        job by job, so that one bad request fails alone."""
        with self._lock:
            if self.merges and len(jobs) > 1 and all(j.request.references is None for j in jobs):
                try:
                    captions = [c for j in jobs for c in j.captions]
                    out = self.reward(captions, call_batch([i for j in jobs for i in j.image_ids]))
                    return split_output(out, [len(j.captions) for j in jobs])
                except Exception:  # noqa: BLE001 - retried one by one below, where the culprit fails alone
                    pass
            return [self._one(j) for j in jobs]

    def _one(self, job: Job) -> Scored | Exception:
        try:
            return split_output(self.reward(job.captions, job.batch()), [len(job.captions)])[0]
        except (ValueError, KeyError) as e:  # the reward refused these captions or images: the client's to fix
            return RequestError("captions", str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
        except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback, answered 500, the server goes on
            log.exception("reward server: %s failed on a request of %d captions", self.name, len(job.captions))
            return e

    # ---------------------------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RewardService]:
        """The worker serving the queue, for the life of the block (the server's lifespan)."""
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="finecap-reward")
        worker = asyncio.create_task(self._serve_queue())
        try:
            yield self
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            while self._pending:
                _, future, _ = self._pending.popleft()
                if not future.done():
                    future.set_exception(RuntimeError("the reward server stopped before scoring this request"))
            self._executor.shutdown(wait=True)
            self._executor = self._wakeup = None

    async def score(self, job: Job) -> Scored:
        """``job``'s values, scored in a round of the worker (:meth:`running` must be active)."""
        if self._wakeup is None:
            raise RuntimeError("RewardService.score: the service is not running (use `async with service.running()`)")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        start = time.perf_counter()
        self._pending.append((job, future, start))
        self._wakeup.set()
        result = await future
        self.meter.latency(time.perf_counter() - start)
        return result

    async def _serve_queue(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self.batch_wait > 0 and sum(len(j.captions) for j, _, _ in self._pending) < self.batch_size:
                await asyncio.sleep(self.batch_wait)
            round_, size = [], 0
            while self._pending and (not round_ or size + len(self._pending[0][0].captions) <= self.batch_size):
                item = self._pending.popleft()
                round_.append(item)
                size += len(item[0].captions)
            start = time.perf_counter()
            results = await loop.run_in_executor(self._executor, self.score_now, [j for j, _, _ in round_])
            self.meter.round(len(round_), size, time.perf_counter() - start)
            for (_, future, _), result in zip(round_, results, strict=True):
                if future.done():  # the client went away
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            self.meter.maybe_log(self.name)


def split_output(out: Any, sizes: Sequence[int]) -> list[Scored]:
    """A reward call's output (:class:`~finecap.rewards.RewardOutput`) as Python floats, cut into the requests it
    merged (``sizes`` captions each)."""
    total = out.total.detach().float().cpu().tolist()
    parts = {name: p.detach().float().cpu().tolist() for name, p in out.parts.items()}
    scored, at = [], 0
    for n in sizes:
        scored.append(Scored(total[at : at + n], {name: values[at : at + n] for name, values in parts.items()}))
        at += n
    return scored


class Meter:
    """Throughput and latency since the last logged line (``log_every`` seconds apart; 0: never logged)."""

    def __init__(self, log_every: float) -> None:
        self.log_every = log_every
        self.started = self.since = time.perf_counter()
        self.requests = self.captions = self.rounds = 0
        self.busy = 0.0
        self.latencies: list[float] = []
        self.total_requests = self.total_captions = 0

    def round(self, requests: int, captions: int, seconds: float) -> None:
        self.requests += requests
        self.captions += captions
        self.rounds += 1
        self.busy += seconds
        self.total_requests += requests
        self.total_captions += captions

    def latency(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def line(self, name: str) -> str:
        """The throughput line of the window (and starts a new one)."""
        now = time.perf_counter()
        span = max(now - self.since, 1e-9)
        lat = np.array(self.latencies or [float("nan")]) * 1000
        text = (f"reward server ({name}): {self.requests} requests, {self.captions} captions in {span:.1f} s: "
                f"{self.captions / span:,.0f} captions/s, {self.captions / max(self.rounds, 1):.0f} captions a "
                f"round, the reward busy {100 * self.busy / span:.0f}% of the time; latency p50 "
                f"{np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms")  # fmt: skip
        self.since, self.requests, self.captions, self.rounds, self.busy, self.latencies = now, 0, 0, 0, 0.0, []
        return text

    def maybe_log(self, name: str) -> None:
        if self.log_every > 0 and time.perf_counter() - self.since >= self.log_every:
            log.info("%s", self.line(name))
