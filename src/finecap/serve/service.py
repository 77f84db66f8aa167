"""The reward service behind the HTTP server: a set-up reward, the images it knows, and the batching of concurrent
requests.

- **Images.** A request names images by id or by path; :class:`ImageTable` maps them to the reward's own ids (those
  of the served data set's training split, whose references, embeddings and scenes the reward was set up with):
  ``17`` and ``"17"`` are the same image, a path is matched as the data set names it or, naming an existing file,
  as the kernel resolves it (:func:`real_path`: no file is opened for reading, one call a path). An image the
  reward does not know is refused (400, naming ``image_ids[i]``, or the field the request's caller sent it in:
  ``labels[i]`` of ``/get_reward``'s, :meth:`CallCheck.job`) before any reward is called.
- **One call per request.** A request is one reward call, ``reward(captions, call_batch(image_ids))``, exactly as
  the adapters call it in process, so the values are bit-identical through every front end. A reward whose
  candidates are the call's images (self-retrieval with in-batch distractors, the listener: ``compares_images``,
  :class:`finecap.rewards.RewardBase`) ranks each caption's image among the request's images: a request with one
  distinct image is refused (its values would say nothing).
- **Batching.** Requests wait in a queue that one worker thread serves (a reward holds a model and tables, and is
  called by one caller at a time, as in training). Each round takes what queued while the previous round ran
  (after waiting ``batch_wait`` seconds for more), up to ``batch_size`` captions. When every component scores each
  caption on its own (``per_caption``: CIDEr-D) the round's requests are merged into one call (the values are
  those of separate calls, tested bit for bit); otherwise a round is one request, called alone.
- **Faults by origin.** What the client sent is checked before the reward is called (the request's fields by
  :mod:`finecap.serve.protocol`, its images by :class:`CallCheck`) and refused 4xx naming the field; whatever the
  reward raises or returns after that is the server's fault: a 500 with a generic message (:class:`RewardFailed`;
  the exception and its traceback go to the server's log, never to the client, since a reward's message may hold a
  path or a token), a non-finite value included (its message is finecap's own: the reward, the part and the
  caption). A reward that raises ``SystemExit`` or another non-``Exception`` stops the server, which exits
  non-zero (:attr:`RewardService.fatal`); it never leaves a server that accepts but no longer answers.
- **Deadline.** A request not answered ``score_timeout`` seconds after it queued (``--score-timeout``, default
  :data:`SCORE_TIMEOUT`: its wait in the queue and its reward call together) is answered 504 naming the option
  (:class:`ScoreTimeout`), whether its own call hangs or it waits behind one; it leaves the queue then, never
  scored, and the requests behind a hung call meet their own deadline, or are scored once the call returns. A
  Python thread cannot be stopped: the hung call keeps the one reward thread (no thread is started for a request,
  none for a call that overran), and ``/health`` says the server is stuck while that call has run past the deadline
  (:meth:`RewardService.stuck`) until the call returns; only a restart frees a call that never does. A request
  that arrives while the server is stuck is not queued: it is answered at once 503 with ``Retry-After``
  (:attr:`RewardService.retry_after` seconds) and an error naming the stuck call and ``--score-timeout``
  (:class:`ServerStuck`), so that a trainer or a load balancer moves on (finecap's client retries it with backoff:
  :class:`finecap.serve.client.RewardClient`) instead of waiting out a deadline of its own. A request's check (its
  decoding, the resolution of its image paths, which asks the file system: a hung network file system never answers)
  is bounded by the same option, on its own clock: past it the request is answered 504 naming the option
  (:class:`CheckTimeout`); the check thread it held stays blocked until the file system answers (a thread cannot be
  stopped), and the check of a request still waiting for a check thread is never run. While every check thread is
  so blocked (:meth:`RewardService.checks_stuck`: each has run one check past ``--score-timeout``) no request can
  be checked: a request arriving then is answered 503 at once, as while the reward's call is stuck, one already
  waiting for a thread gets that 503 as soon as every thread is so blocked (never checked: the checks it waits
  behind began before it, so they pass the deadline before its own), and ``/health`` answers 503
  ``"checks_stuck"`` until one returns.
- **Queue bound.** The requests waiting in the queue (checked, not yet taken into a round), all clients' together (no
  bound is per client, and the queue is served in arrival order: docs/integrations.md, "One client's share"), hold at
  most ``max_queued_bytes`` bytes (``--max-queued-bytes``, default :data:`MAX_QUEUED_BYTES`), counted as the bytes of
  their bodies as the server read them (:attr:`Job.size`: what the code can measure exactly; the parsed request held
  costs more, from 1.3 to 6.7 times its body in the requests measured on CPython 3.11, 8192 captions of 60 words and
  8192 of one word: benchmarks/queued_request_memory.py); the requests of the round in a call are no longer queued, and
  were within the bound as they left it. A request that would take the queue past it is not queued: it is answered at
  once 503 with ``Retry-After`` (:attr:`RewardService.retry_after`) and an error naming the option
  (:class:`QueueFull`), counted as ``refused``, so that finecap's client asks again with backoff once the reward has
  worked the queue down, where a slow or hung reward call let ``--max-connections`` clients each leave a request of up
  to ``--max-request-bytes`` waiting (4 GiB of bodies at the defaults).
- **Failed captions.** Captions the reward could not score (:attr:`finecap.rewards.RewardOutput.failed`) are never
  answered as a number: ``/reward`` answers them JSON ``null`` with their count (``failed``), ``/get_reward``
  refuses the request with a 502 naming them (:mod:`finecap.serve.app`).
- **Abandoned work.** A request whose client went away before its round began is never scored
  (:meth:`RewardService.score` cancelled: the HTTP layer cancels it when the client disconnects), and leaves the
  queue at once: the queue holds the requests of connected clients only, however long the reward's call takes. A
  reward call still running when the service stops is waited for :attr:`RewardService.stop_wait` seconds at most
  (none after :meth:`RewardService.abandon`), then abandoned to its daemon thread (:class:`DaemonThreads`), so
  that a hung call never keeps the server from stopping.
- **Repeated failures.** A reward that fails on every request (a judge's endpoint gone for days) logs the traceback
  of each kind of failure (its exception type and the code it passed through) once, then one line at most every
  :data:`REPEAT_LINE_EVERY` seconds with the count since, and the traceback again every
  :data:`FULL_TRACEBACK_EVERY` seconds (:class:`RepeatedFailures`); a non-finite value, the ``/get_reward`` 502s
  and the server's own errors alike; the server's stop says the repeats counted since each kind's last line
  (:meth:`RepeatedFailures.flush`), as does the forgetting of the oldest kind beyond the kinds it remembers.
  Every failed request is still answered 500 (or 502, or 504) and counted in ``/health``'s ``failures``.
- **Counts.** Each request handed to :meth:`RewardService.score` ends in one of five ways, counted apart
  (:class:`Meter`, ``/health``): *scored* (its values handed back), *failed* (the reward's fault: a 500, or
  ``/get_reward``'s 502 for captions the reward could not score; a fault of the server's own after the call too),
  *timed out* (a 504: ``--score-timeout``, its check's included), *left* (its client went away before its answer,
  queued or in a call) and *refused* (a 503: the server was stuck, or its queue full).
- **Throughput logs.** Every ``log_every`` seconds one line: the requests of each outcome since the previous line
  (and one at the end), the captions the reward scored, captions per second, the mean round, the share of the time
  the reward was busy, and the p50 / p99 latency of the scored requests (a timed-out request's latency is the
  deadline: it is counted, not in the percentiles).

Example::

    >>> import asyncio
    >>> from finecap.rewards.cider import CiderReward
    >>> reward = CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]})
    >>> service = RewardService(reward, ImageTable([1, 2]))
    >>> async def ask():
    ...     async with service.running():
    ...         return await service.score(service.job(RewardRequest(["a red circle", "a square"], ["1", 2])))
    >>> [round(v, 3) for v in asyncio.run(ask()).total.tolist()]  # as the reward's own example: "1" is the image 1
    [5.26, 1.743]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import queue
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from finecap.data.records import id_text, refuse_repeated_ids
from finecap.rewards import NonFiniteReward, Reward, RewardOutput, as_reward, call_batch, check_finite
from finecap.serve.protocol import Limits, RequestError, RewardRequest, in_callers_words

log = logging.getLogger(__name__)

_MISSING = object()

MAX_BATCH_SIZE = 1_000_000
"""``--batch-size`` at most (captions of one merged reward call)."""
MAX_BATCH_WAIT = 60.0
"""``--batch-wait-ms`` at most, in seconds: a round waits at most a minute for more requests."""
CHECK_THREADS = 2
"""Threads that decode and check requests off the event loop (:meth:`RewardService.off_loop`)."""
SCORE_TIMEOUT = 120.0
"""``--score-timeout``'s default, in seconds: under the 180 s per request of finecap's client and adapters
(:class:`finecap.serve.client.RewardClient`), so that they read the server's 504 naming the option rather than time
out on their own."""
MAX_SCORE_TIMEOUT = 86_400.0
"""``--score-timeout`` at most, in seconds (a day)."""
CHECKS_STUCK_MARGIN = 0.01
"""Seconds past the moment every check thread would be blocked (:meth:`RewardService.checks_stuck`, which counts a
check that has run *more* than ``--score-timeout``) at which a request waiting for a thread looks again."""
STUCK_RETRY_AFTER = 5
"""Seconds a request refused while the server is stuck, or while its queue is full, is told to wait before it asks
again (``Retry-After``, :attr:`RewardService.retry_after`)."""
MAX_QUEUED_BYTES = 256 * 2**20
"""``--max-queued-bytes``' default: the bodies' bytes of the requests waiting for the reward at most (module docstring,
"Queue bound"). 256 MiB holds all the requests finecap's client keeps in flight
(:data:`finecap.serve.client.MAX_IN_FLIGHT`, 64) at 4 MiB each, where a trainer's requests are kilobytes to a few
MiB (8192 captions of 60 words are 2.6 MB of JSON: benchmarks/queued_request_memory.py), so that a trainer does not
meet it in normal use; 16 requests of the largest body the server takes by default (``--max-request-bytes``,
16 MiB) fit in it. Without it, requests waiting behind a slow or hung reward call were bounded by
``--max-connections`` x ``--max-request-bytes`` alone: 4 GiB of bodies at the defaults."""
MAX_MAX_QUEUED_BYTES = 2**40
"""``--max-queued-bytes`` at most (1 TiB)."""
CLOSE_WAIT = 10.0
"""Seconds ``finecap serve-reward`` waits for its reward's ``close()`` as it stops before abandoning it
(:func:`close_within`)."""
STOP_WAIT = 2.0
"""Seconds a stopping service waits for a reward call (or a request's check) still running before abandoning it
(:attr:`RewardService.stop_wait`): the HTTP server has already given the requests in flight its grace."""


class DaemonThreads(Executor):
    """A pool of ``n`` daemon threads (``concurrent.futures``' executor interface): unlike ``ThreadPoolExecutor``,
    whose threads the interpreter joins at exit, a call that never returns (a hung reward) cannot keep the process
    alive once the service has abandoned it (:meth:`RewardService.running`)."""

    def __init__(self, n: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict] | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(n)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if self._closed:
            raise RuntimeError("DaemonThreads: cannot take work after shutdown")
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, as ThreadPoolExecutor does
                future.set_exception(e)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more work; queued work cancelled (``cancel_futures``); each thread ends after its current call
        (``wait``: joined, without limit)."""
        self._closed = True
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while True:
                    item = self._queue.get_nowait()
                    if item is not None:
                        item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def busy(self) -> bool:
        """Whether a thread is still running (a call it had begun, after :meth:`shutdown`)."""
        return any(thread.is_alive() for thread in self._threads)


def close_within(reward: Reward, name: str, wait: float = CLOSE_WAIT) -> bool:
    """Close ``reward`` (its judge's connections, its in-process engine), waiting ``wait`` seconds at most: ``True``
    once closed (an exception of its ``close`` is raised here), ``False`` when ``close`` had not returned by then; it
    is then abandoned to a daemon thread (:class:`DaemonThreads`: the process can end under it) and logged, naming
    ``name``. One thread, at the server's end: a close that hangs (a judge's endpoint that never answers its goodbye)
    never keeps ``finecap serve-reward`` from exiting."""
    pool = DaemonThreads(1, "finecap-close")
    future = pool.submit(reward.close)
    pool.shutdown(wait=False)
    try:
        future.result(timeout=wait)
    except FutureTimeout:
        log.error("reward server: the reward %s did not close within %g s: abandoned (the process ends without its "
                  "close; what it holds is released by the process's end)", name, wait)  # fmt: skip
        return False
    return True


KERNEL_RESOLVES = hasattr(os, "O_PATH") and os.path.isdir("/proc/self/fd")
"""Whether :func:`real_path` asks the kernel (Linux): one ``open(O_PATH)`` a path, whatever it holds."""


def real_path(path: str) -> str:
    """The canonical path of the existing file ``path`` names (its links followed, ``.`` and ``..`` taken), as
    :meth:`ImageTable.resolve` matches a request's image path not known as written; an ``OSError`` (or a
    ``ValueError``: a NUL character) when it names no file.

    On Linux the kernel resolves it in one call, ``open(path, O_PATH)`` then the link ``/proc/self/fd/N``: the file
    is not opened for reading (a FIFO does not block, a device is not touched), and the cost is bounded whatever the
    path holds (the kernel takes at most ``PATH_MAX``, 4096 bytes, and 40 links). Python's own resolution
    (``Path.resolve``, elsewhere) asks the file system about each component in turn, and each link's target's: a
    16 MiB request of paths like ``/tmp/../tmp/...`` naming a known image held a check thread 18 s (measured on a
    loaded 2-core machine), a few such requests every check thread."""
    if not KERNEL_RESOLVES:
        return str(Path(path).resolve(strict=True))
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


class ImageTable:
    """The images a served reward knows: request ids (:func:`~finecap.data.records.id_text`: ``17`` and ``"17"`` are
    one image) and image paths (as the data set names them, or an existing file's other name: :func:`real_path`) ->
    the reward's image ids.

    Args:
        image_ids: the reward's image ids (the served data set's training images), each image once: two ids that
            read the same in a request (``1`` and ``"1"``, or one id twice) are a ``ValueError``
            (:func:`~finecap.data.records.refuse_repeated_ids`, naming ``source``).
        paths: ``{path: image id}`` of the images' files (optional: requests by path are refused without).
        source: what the images are, for errors (``"the 900 training images of world 3f2a"``).
    """

    def __init__(self, image_ids: Iterable[Hashable], paths: Mapping[str, Hashable] | None = None,
                 source: str = "") -> None:  # fmt: skip
        image_ids = list(image_ids)
        refuse_repeated_ids(image_ids, source or "the reward's images")
        self.by_text: dict[str, Hashable] = {id_text(image_id): image_id for image_id in image_ids}
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
                with contextlib.suppress(ValueError, OSError):  # as the kernel names it (real_path), if it exists
                    paths.setdefault(real_path(str(r.path)), r.image_id)
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
                    # no such file, a NUL character, a path too long, a link loop (RuntimeError before Python 3.13)
                    with contextlib.suppress(ValueError, OSError, RuntimeError):
                        hit = self.by_path.get(real_path(value), _MISSING)
            else:
                hit = self.by_text.get(id_text(value), _MISSING)
            if hit is _MISSING:
                what = "image file" if by_path else "image id"
                raise RequestError(f"{field}[{i}]", f"unknown {what} {value!r}: the server scores {self.source}")
            out.append(hit)
        return out


class CallCheck:
    """What every front end checks of a call's images before the reward sees them, and of its values after: the
    reward server on each request, the adapters in process (:class:`finecap.integrations.scoring.Scorer`), so that
    both refuse the same input with the same message (:class:`~finecap.serve.protocol.RequestError`, a
    ``ValueError``) and the same values (:meth:`answer`).

    Args:
        images: the images the reward knows (``None``: a reward that does not say; any id is passed on as given).
        compares: the reward ranks each caption's image among the call's (``compares_images``):
            a call of one distinct image is refused (its values would say nothing), ``7`` and ``"7"`` being one
            image as :func:`~finecap.rewards.call_batch` reads them, with or without ``images``.
        name: what messages call the reward.
    """

    def __init__(self, images: ImageTable | None, compares: bool, name: str) -> None:
        self.images, self.compares, self.name = images, compares, name

    def job(self, request: RewardRequest) -> Job:
        """``request`` checked against the images and the reward: a :class:`RequestError` naming the field as the
        request's caller named it (:attr:`RewardRequest.fields`, :func:`~finecap.serve.protocol.in_callers_words`:
        ``labels[1]`` of a ``/get_reward`` request, ``image_ids[1]`` or ``images[1]`` of a ``/reward`` one)."""
        try:
            return Job(request, self._image_ids(request))
        except RequestError as e:
            raise in_callers_words(e, request.fields) from None

    def _image_ids(self, request: RewardRequest) -> list[Hashable]:
        """The reward's ids of ``request``'s images, refused naming the ``/reward`` request's fields."""
        field = "images" if request.by_path else "image_ids"
        if self.images is not None:
            ids = self.images.resolve(request.image_ids, request.by_path, field)
        else:
            ids = list(request.image_ids)
        if self.compares and len({id_text(i) for i in ids}) < 2:  # 3 and "3": one image (call_batch's rule)
            raise RequestError(field, f"names one distinct image; {self.name} ranks each caption's image among the "
                               "request's images (sr.distractors=batch, or the listener): send a generation batch of "
                               "several images per request, or serve sr.distractors=hard")  # fmt: skip
        return ids

    def answer(self, out: RewardOutput, sizes: Sequence[int]) -> list[RewardOutput]:
        """``out`` as every front end answers it: float32 on the CPU, cut into consecutive calls of ``sizes``
        captions (:meth:`finecap.rewards.RewardOutput.split`), every value finite *as float32*: a
        :class:`~finecap.rewards.NonFiniteReward` naming the reward, the part and the caption otherwise
        (:func:`~finecap.rewards.check_finite`), a float64 value beyond float32's range (about 3.4e38, answered as
        inf) included."""
        whole = out.split([sum(sizes)])[0]
        try:
            check_finite(whole, self.name)
        except NonFiniteReward as e:
            check_finite(out, self.name)  # the reward's own non-finite value, named as such
            raise NonFiniteReward(f"{e} (a value beyond float32's range, about 3.4e38, in which every front end "
                                  "answers)") from None  # fmt: skip
        return whole.split(sizes)


FULL_TRACEBACK_EVERY = 600.0
"""Seconds between two full tracebacks of the same failure of a reward (:class:`RepeatedFailures`)."""
REPEAT_LINE_EVERY = 10.0
"""Seconds between two lines of the same failure between its tracebacks (:class:`RepeatedFailures`)."""


@dataclass
class _FailureKind:
    """What :class:`RepeatedFailures` keeps of one kind of failure."""

    reported: float  # time of its last full report
    level: int  # the level its last failure was logged at
    words: str  # its last failure's line (what a line about it says)
    repeats: int = 0  # failures since that report
    said_at: float = 0.0  # time of its last line (the full report, or a count)
    said: int = 0  # of the repeats, those a line has said


class RepeatedFailures:
    """The log of the failed requests, bounded (module docstring, "Repeated failures"): a failure of a kind not seen
    for ``every`` seconds (its exception type and the lines of code its traceback passed through; not its message,
    which may name the request) is logged in full (with its traceback, unless ``trace=False``); the others in between
    are one line at most every ``line_every`` seconds for each kind, with the first line of their message and the
    count since that full report, which counts every failure. At most ``kinds`` kinds are remembered (the oldest
    forgotten first, with one line of its repeats no line has said yet), so that failures of ever-new kinds cannot
    grow it. One home for every failed request of the server: the reward's exceptions and non-finite values
    (:class:`RewardService`), the ``/get_reward`` 502s and the server's own errors (:mod:`finecap.serve.app`);
    :attr:`total` counts them all (``/health``'s ``failures``).

    Args:
        every: seconds between two full reports of one kind.
        kinds: kinds of failure remembered at most.
        clock: the time in seconds (``time.monotonic``; a test's own clock).
        line_every: seconds between two lines of one kind between its full reports (0: a line each).
    """

    def __init__(self, every: float = FULL_TRACEBACK_EVERY, kinds: int = 256,
                 clock: Callable[[], float] = time.monotonic,
                 line_every: float = REPEAT_LINE_EVERY) -> None:  # fmt: skip
        self.every, self.kinds, self.clock, self.line_every = every, kinds, clock, line_every
        self.total = 0
        """Failures logged here since the start, said or not."""
        self._seen: OrderedDict[tuple, _FailureKind] = OrderedDict()
        self._lock = threading.Lock()  # the worker thread and the event loop both log here

    def log(self, error: BaseException, what: str, *, level: int = logging.ERROR, trace: bool = True) -> None:
        """Log ``error`` (``what``: the failed request in words) at ``level``: with its traceback (``trace``), or,
        ``trace=False``, as ``what`` alone (which then says the error in finecap's words)."""
        frames = tuple((f.filename, f.lineno) for f in traceback.extract_tb(error.__traceback__))
        kind = (type(error).__qualname__, frames, trace)
        with self._lock:
            self.total += 1
            now = self.clock()
            seen = self._seen.get(kind)
            word = "traceback" if trace else "full report"
            if seen is None or now - seen.reported >= self.every:
                repeats = seen.repeats if seen is not None else 0
                since = f" (the same failure {repeats} more time(s) since its last {word})" if repeats else ""
                shown = (type(error), error, error.__traceback__) if trace else None
                log.log(level, "%s%s", what, since, exc_info=shown)
                self._seen[kind] = _FailureKind(reported=now, level=level, words=what, said_at=now)
                self._seen.move_to_end(kind)
                while len(self._seen) > self.kinds:  # the oldest kind is forgotten, what it counted said first
                    self._say_unsaid(
                        self._seen.popitem(last=False)[1],
                        now,
                        f"forgotten for a newer kind (at most {self.kinds} kinds are remembered)",
                    )
                return
            seen.repeats += 1
            if trace:
                message = (str(error).splitlines() or [""])[0][:300]
                what = f"{what}: {type(error).__name__}: {message}"
            seen.level, seen.words = level, what
            if now - seen.said_at < self.line_every:
                return  # counted: the next line, the next full report or the server's stop (flush) says it
            seen.said_at, seen.said = now, seen.repeats
            ago = now - seen.reported
            log.log(level, "%s (the same failure %d time(s) since its %s %.0f s ago; the next %s in %.0f s at most)",
                    what, seen.repeats, word, ago, word, self.every - ago)  # fmt: skip

    def flush(self) -> None:
        """Say the repeats counted but not yet said (those since each kind's last line): one line per kind that has
        any, at its last failure's level, with its last failure's words and their count. The server's stop calls it
        (:mod:`finecap.serve.app`), so that a log read after a shutdown misses no failure; a second call says
        nothing more."""
        with self._lock:
            now = self.clock()
            for seen in self._seen.values():
                self._say_unsaid(seen, now, "the server stopped")

    @staticmethod
    def _say_unsaid(seen: _FailureKind, now: float, until: str) -> None:
        """One line with the repeats of ``seen`` no line has said yet, if any (``until``: why now)."""
        unsaid = seen.repeats - seen.said
        if unsaid > 0:
            seen.said = seen.repeats
            log.log(seen.level, "%s (the same failure %d more time(s) since its last line %.0f s ago, unsaid until "
                    "%s)", seen.words, unsaid, now - seen.said_at, until)  # fmt: skip


class RewardFailed(RuntimeError):
    """The reward failed on a request after the request was checked: the server's fault, answered :attr:`status`
    (500) with this message (generic, or finecap's own words for a non-finite value; never the reward's exception
    text)."""

    status = 500


class ScoreTimeout(RewardFailed):
    """The request was not answered within ``--score-timeout`` seconds of its queueing (a reward call that hangs, its
    own or one it waited behind): answered 504 (module docstring, "Deadline")."""

    status = 504


class CheckTimeout(ScoreTimeout):
    """The request's check (decoding it, resolving its image paths) did not end within ``--score-timeout`` seconds
    (a network file system that does not answer): answered 504 (module docstring, "Deadline")."""


class Overloaded(RewardFailed):
    """The server cannot take the request now: answered 503 at once, not queued, with ``Retry-After``
    :attr:`retry_after` seconds (finecap's client asks again with backoff), counted as ``refused``."""

    status = 503

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ServerStuck(Overloaded):
    """The request arrived while the reward's current call had run past ``--score-timeout``
    (:meth:`RewardService.stuck`), or while every check thread was so held (:meth:`RewardService.checks_stuck`)
    (module docstring, "Deadline")."""


class QueueFull(Overloaded):
    """The request would have taken the queue past ``--max-queued-bytes`` (module docstring, "Queue bound")."""


@dataclass
class Job:
    """A checked request: its captions, the reward's ids of their images, its references (or ``None``), and
    :attr:`size`, the bytes of its body as the server read it, which ``--max-queued-bytes`` bounds (module
    docstring, "Queue bound"): 0 for a request made in process, which has no body."""

    request: RewardRequest
    image_ids: list[Hashable]
    size: int = 0

    @property
    def captions(self) -> list[str]:
        return self.request.captions

    def batch(self) -> dict[str, Any]:
        """The reward's batch of this request alone (:func:`finecap.rewards.call_batch`)."""
        return call_batch(self.image_ids, self.request.references)


Waiting = tuple[Job, asyncio.Future, float]
"""A request in the queue: its job, the future its values are handed to, the ``time.perf_counter()`` it queued."""


class WaitingRequests:
    """The reward's queue (module docstring, "Batching"): the requests waiting for a round, in order, and
    :attr:`bytes`, their bodies' bytes together (:attr:`Job.size`), kept as requests come and go so that admitting
    one (``--max-queued-bytes``, module docstring "Queue bound") costs no walk over the queue."""

    def __init__(self) -> None:
        self._items: deque[Waiting] = deque()
        self.bytes = 0
        """The bytes of the waiting requests' bodies, together."""

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Waiting]:
        return iter(self._items)

    def first(self) -> Waiting:
        """The request that has waited longest (it stays queued)."""
        return self._items[0]

    def append(self, item: Waiting) -> None:
        self._items.append(item)
        self.bytes += item[0].size

    def popleft(self) -> Waiting:
        item = self._items.popleft()
        self.bytes -= item[0].size
        return item

    def remove(self, item: Waiting) -> bool:
        """Take ``item`` out of the queue: whether it was there."""
        for i, queued in enumerate(self._items):
            if queued is item:
                del self._items[i]
                self.bytes -= item[0].size
                return True
        return False


class RewardService:
    """A set-up reward served to concurrent requests (module docstring).

    Args:
        reward: ``reward(captions, batch) -> RewardOutput``, set up (``finecap serve-reward``: the training
            loop's); a plain callable is wrapped (:func:`finecap.rewards.as_reward`).
        images: the images the reward knows.
        limits: what one request may hold.
        batch_size: captions per round at most (a larger request is a round of its own).
        batch_wait: seconds a round waits for more requests once one is queued (0: only those already queued).
        log_every: seconds between throughput lines (0: none).
        name: what the logs and ``/health`` call the reward.
        score_timeout: seconds a request waits for its values, queued and scored, before a 504 (above
            ``batch_wait``, at most :data:`MAX_SCORE_TIMEOUT`; module docstring, "Deadline").
        max_queued_bytes: bytes of the bodies of the requests waiting in the queue at most; a request beyond is a
            503 (at least ``limits.max_request_bytes``, at most :data:`MAX_MAX_QUEUED_BYTES`; default
            :data:`MAX_QUEUED_BYTES`, which says why; module docstring, "Queue bound").
    """

    def __init__(self, reward: Reward, images: ImageTable, *, limits: Limits | None = None, batch_size: int = 1024,
                 batch_wait: float = 0.0, log_every: float = 60.0, name: str = "reward",
                 score_timeout: float = SCORE_TIMEOUT, max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:  # fmt: skip
        self.limits = limits or Limits()
        self.check_options(batch_size, batch_wait, log_every, score_timeout, max_queued_bytes, self.limits)
        self.reward, self.images, self.name = as_reward(reward, "reward"), images, name
        self.batch_size, self.batch_wait, self.score_timeout = batch_size, batch_wait, score_timeout
        self.max_queued_bytes = max_queued_bytes
        self.merges = self.reward.per_caption
        self.compares = self.reward.compares_images
        self.check = CallCheck(images, self.compares, name)
        self.meter = Meter(log_every)
        self.failures = RepeatedFailures()
        """The log of the failed requests (a full report of each kind every :data:`FULL_TRACEBACK_EVERY` s)."""
        self.fatal: BaseException | None = None
        """What stopped the server: a non-``Exception`` the reward raised (``SystemExit``), or the worker's crash."""
        self.on_fatal: Callable[[], None] = lambda: None
        """Called (on the event loop) once :attr:`fatal` is set: the server stops (:mod:`finecap.serve.app`)."""
        self._requests_seen = 0
        self._lock = threading.Lock()  # one reward call at a time, whoever calls
        self._pending = WaitingRequests()
        self._call_started: float | None = None  # time.monotonic() of the reward call running (busy_for)
        self._wakeup: asyncio.Event | None = None
        self._executor: DaemonThreads | None = None
        self._checks: DaemonThreads | None = None
        self._check_starts: dict[object, float] = {}  # time.monotonic() of each check running (blocked_checks)
        self._check_starts_lock = threading.Lock()
        self.stop_wait = STOP_WAIT
        """Seconds :meth:`running`'s end waits for a reward call or a check still running before abandoning it."""
        self.retry_after = STUCK_RETRY_AFTER
        """Seconds a request refused while the server is stuck or its queue full is told to wait (``Retry-After``:
        :class:`Overloaded`)."""
        self.abandoned = False
        """A reward call was still running when the service stopped, and was left to its daemon thread: the reward
        must not be closed under it (``finecap serve-reward`` leaves it to the process's end)."""
        self._abandon_now = False

    @staticmethod
    def check_options(batch_size: int, batch_wait: float, log_every: float, score_timeout: float,
                      max_queued_bytes: int = MAX_QUEUED_BYTES, limits: Limits | None = None) -> None:  # fmt: skip
        """Nothing, or the ``ValueError`` naming the command's option of a value out of its range (``finecap
        serve-reward`` checks them before it loads the reward, which may take minutes); ``max_queued_bytes`` below
        ``limits.max_request_bytes`` would refuse every request of the largest size allowed, even into an empty
        queue."""
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"--batch-size: must be from 1 to {MAX_BATCH_SIZE:,}, got {batch_size}")
        if not (math.isfinite(batch_wait) and 0 <= batch_wait <= MAX_BATCH_WAIT):
            raise ValueError(f"--batch-wait-ms: must be a number from 0 to {MAX_BATCH_WAIT * 1000:g}, got "
                             f"{batch_wait * 1000:g}")  # fmt: skip
        if not (math.isfinite(log_every) and log_every >= 0):
            raise ValueError(f"--log-every: must be a finite number of seconds, at least 0, got {log_every:g}")
        if not (math.isfinite(score_timeout) and 0 < score_timeout <= MAX_SCORE_TIMEOUT):
            raise ValueError(f"--score-timeout: must be a number of seconds above 0 and at most "
                             f"{MAX_SCORE_TIMEOUT:g}, got {score_timeout:g}")  # fmt: skip
        if score_timeout <= batch_wait:  # every request would wait out its deadline in the round's wait
            raise ValueError(f"--score-timeout: must exceed --batch-wait-ms ({batch_wait * 1000:g} ms), got "
                             f"{score_timeout:g} s")  # fmt: skip
        if not 1 <= max_queued_bytes <= MAX_MAX_QUEUED_BYTES:
            raise ValueError(f"--max-queued-bytes: must be from 1 to {MAX_MAX_QUEUED_BYTES:,}, got "
                             f"{max_queued_bytes:,}")  # fmt: skip
        request_bytes = (limits or Limits()).max_request_bytes
        if max_queued_bytes < request_bytes:  # a request of the largest size allowed could never queue
            raise ValueError(f"--max-queued-bytes: must be at least --max-request-bytes ({request_bytes:,}), got "
                             f"{max_queued_bytes:,}")  # fmt: skip

    # ---------------------------------------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        """Requests waiting for a round (their clients still connected: module docstring, "Abandoned work")."""
        return len(self._pending)

    @property
    def queued_bytes(self) -> int:
        """The bytes of the bodies of the requests waiting for a round (:attr:`Job.size`), at most
        :attr:`max_queued_bytes` (module docstring, "Queue bound")."""
        return self._pending.bytes

    @property
    def busy_for(self) -> float:
        """Seconds the reward's current call has run (0.0 when none runs): a call that never returns (a hung judge)
        shows here, in ``/health``, while the requests behind it wait (:attr:`queued`)."""
        started = self._call_started
        return 0.0 if started is None else time.monotonic() - started

    def stuck(self) -> bool:
        """Whether the reward's current call has run past :attr:`score_timeout` (``/health``: "stuck"): every request
        it holds has been answered 504, and those behind it wait for it to return."""
        return self.busy_for > self.score_timeout

    @property
    def blocked_checks(self) -> int:
        """Check threads (:data:`CHECK_THREADS`) running a request's check that has run past :attr:`score_timeout`:
        its request was answered 504 (:class:`CheckTimeout`), and the thread stays held until the check returns
        (image paths on a network file system that does not answer)."""
        now = time.monotonic()
        with self._check_starts_lock:
            return sum(now - started > self.score_timeout for started in self._check_starts.values())

    def tallies(self) -> dict[str, int | float]:
        """The reward's running counts of its work since it was built (:meth:`finecap.rewards.RewardBase.tallies`:
        a judged reward's judge's calls, cache hits, unparsable answers, failed calls and HTTP 429 replies, as
        ``judge/calls``, ... or, of a weighted sum's part, ``qa_utility/judge/failed``, ...), whole counts as ints:
        ``/health``'s ``tallies``, which say a judge failing while the server keeps answering. Names and numbers
        alone: nothing of the judge's URLs or key. Read while a call may run: each count is read as it stands."""
        return {k: int(v) if float(v).is_integer() else float(v) for k, v in self.reward.tallies().items()}

    def checks_stuck(self) -> bool:
        """Whether every check thread is blocked (:attr:`blocked_checks`; ``/health``: "checks_stuck"): no request
        can be checked until one returns, and each waits out its deadline for a thread (a 504)."""
        return self.blocked_checks >= CHECK_THREADS

    def job(self, request: RewardRequest, size: int = 0) -> Job:
        """Check ``request`` against the images and the reward (:class:`CallCheck`); ``size``: the bytes of its body
        as the server read it (:attr:`Job.size`; 0: made in process)."""
        job = self.check.job(request)
        job.size = size
        return job

    def score_now(self, jobs: Sequence[Job]) -> list[RewardOutput | Exception]:
        """Score ``jobs`` here and now (the worker thread's round): one merged call when the reward scores each
        caption on its own and no job brings references, else one call per job; a failed merged call is retried
        job by job, so that one bad request fails alone. A failure is a :class:`RewardFailed` (logged here)."""
        with self._lock:
            if self.merges and len(jobs) > 1 and all(j.request.references is None for j in jobs):
                try:
                    captions = [c for j in jobs for c in j.captions]
                    out = self.reward(captions, call_batch([i for j in jobs for i in j.image_ids]))
                    return self.check.answer(out, [len(j.captions) for j in jobs])
                except BaseException:  # noqa: BLE001 - retried one by one below, where the culprit fails alone
                    pass  # (and where a SystemExit is recorded: _one)
            return [self._one(j) for j in jobs]

    def _one(self, job: Job) -> RewardOutput | Exception:
        self._requests_seen += 1
        number = self._requests_seen
        try:
            return self.check.answer(self.reward(job.captions, job.batch()), [len(job.captions)])[0]
        except NonFiniteReward as e:  # finecap's own words: the reward, its part and the caption
            self.failures.log(e, f"reward server: request #{number}: {e}", trace=False)
            return RewardFailed(f"{e} (request #{number}); the server's log has the details")
        except Exception as e:  # noqa: BLE001 - the reward's fault, whatever its type: logged, answered 500, the server goes on
            self.failures.log(e, f"reward server: {self.name} failed on request #{number} ({len(job.captions)} "
                              "captions)")  # fmt: skip
            return RewardFailed(f"internal error: the reward {self.name} failed on this request (#{number}); the "
                                "server's log has the error")  # fmt: skip
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt raised by the reward: stop the server
            log.critical("reward server: %s raised %s on request #%d: the server stops", self.name,
                         type(e).__name__, number)  # fmt: skip
            self.fatal = e
            return RewardFailed(f"internal error: the reward {self.name} stopped the server (request #{number})")

    # ---------------------------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RewardService]:
        """The worker serving the queue, for the life of the block (the server's lifespan). Its end waits for a
        reward call or a check still running at most :attr:`stop_wait` seconds (none after :meth:`abandon`), then
        abandons it to its daemon thread (:class:`DaemonThreads`: the process can end under it) and logs it; an
        abandoned reward call sets :attr:`abandoned`."""
        self._wakeup = asyncio.Event()
        self._executor = DaemonThreads(1, "finecap-reward")
        self._checks = DaemonThreads(CHECK_THREADS, "finecap-checks")
        self._check_starts = {}  # a check abandoned by a previous run holds none of this run's threads
        self.abandoned = self._abandon_now = False
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
            pools = (self._executor, self._checks)
            for pool in pools:
                pool.shutdown(wait=False, cancel_futures=True)
            deadline = time.monotonic() + self.stop_wait
            while any(p.busy() for p in pools) and time.monotonic() < deadline and not self._abandon_now:
                await asyncio.sleep(0.02)  # the event loop goes on (a second Ctrl-C: abandon)
            if self._executor.busy():
                self.abandoned = True
                log.warning("reward server: a call of the reward %s was still running when the server stopped: "
                            "abandoned (the process ends without it; the reward is not closed)",
                            self.name)  # fmt: skip
            if self._checks.busy():
                log.warning("reward server: a request's check was still running when the server stopped: abandoned")
            self._executor = self._checks = self._wakeup = None

    def abandon(self) -> None:
        """Stop waiting for a reward call still running (:meth:`running`'s end): a second Ctrl-C."""
        self._abandon_now = True

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on one of the service's :data:`CHECK_THREADS` threads (:meth:`running` must be active): the
        work a request's bytes decide (decoding, checking, resolving its image paths) never runs on the event loop,
        which keeps answering ``/health`` and the other clients meanwhile. Not done within :attr:`score_timeout`
        seconds (its wait for a thread included): :class:`CheckTimeout` (module docstring, "Deadline"); a call not
        yet begun is then never run, one running keeps its thread until it returns. While every check thread is so
        held (:meth:`checks_stuck`), :class:`ServerStuck` at once: a 503, the request not queued; a request that
        found every thread busy and waits for one gets that 503 as soon as they all are so held (the checks it waits
        behind began before it, so they pass the deadline before its own), its call then never run."""
        if self._checks is None:
            raise RuntimeError("RewardService.off_loop: the service is not running")
        if self.checks_stuck():  # no thread is free, nor will be soon: not queued behind them (module docstring)
            raise self._checks_refused("this request was not queued")
        starts, lock = self._check_starts, self._check_starts_lock
        began = threading.Event()

        def timed() -> Any:  # on the check thread: its start kept while it runs (blocked_checks)
            began.set()
            key = object()
            with lock:
                starts[key] = time.monotonic()
            try:
                return fn(*args)
            finally:
                with lock:
                    del starts[key]

        deadline = time.monotonic() + self.score_timeout
        work = asyncio.get_running_loop().run_in_executor(self._checks, timed)
        stuck_at = self._checks_stuck_at()
        try:
            if stuck_at is not None and stuck_at < deadline:  # every thread busy: stuck then, unless one returns
                await asyncio.wait({work}, timeout=stuck_at - time.monotonic())
                if not work.done() and not began.is_set() and self.checks_stuck():
                    work.cancel()  # not begun: never run (one that began in between runs, unanswered)
                    waited = self.score_timeout - (deadline - time.monotonic())
                    raise self._checks_refused(f"this request waited {waited:.1f} s for a check thread and was not "
                                               "checked")  # fmt: skip
            return await asyncio.wait_for(work, max(deadline - time.monotonic(), 0.0))
        except asyncio.CancelledError:  # its client left: a call not begun is never run
            work.cancel()
            raise
        except TimeoutError:
            self.meter.timed_out += 1
            message = (f"not checked within {self.score_timeout:g} s (--score-timeout): reading the request (its "
                       "JSON, its image paths, which are resolved on the server's file system: a network file system "
                       "that does not answer?) has not ended. Ask again later, name the images by id, or fix the file "
                       "system the paths are on")  # fmt: skip
            error = CheckTimeout(message)
            self.failures.log(error, f"reward server: {self.name}: a request {message}", level=logging.WARNING,
                              trace=False)  # fmt: skip
            raise error from None

    def _checks_stuck_at(self) -> float | None:
        """The ``time.monotonic()`` past which every check thread is blocked (:meth:`checks_stuck`) if none of the
        checks running now returns first, or ``None`` while a thread is free (a check begun later passes its deadline
        after the deadline of a request waiting now: it cannot make that request's wait hopeless)."""
        with self._check_starts_lock:
            if len(self._check_starts) < CHECK_THREADS:
                return None
            return max(self._check_starts.values()) + self.score_timeout + CHECKS_STUCK_MARGIN

    def _checks_refused(self, what: str) -> Overloaded:
        """The :class:`ServerStuck` of a request that no check thread can check (:meth:`checks_stuck`); ``what``: what
        became of it."""
        return self._refused(
            f"the reward server cannot check requests: each of its {CHECK_THREADS} check threads has run a "
            f"request's check past --score-timeout ({self.score_timeout:g} s) and has not returned (image paths "
            f"on a file system that does not answer?); {what}. Retry after "
            f'{self.retry_after} s or ask another server; GET /health answers 503 "checks_stuck" until one '
            "returns (restart the server if none does)",
            "a request",
        )

    async def score(self, job: Job, answer: Callable[[RewardOutput], Any] | None = None) -> Any:
        """``job``'s values (float32 on the CPU), scored in a round of the worker (:meth:`running` must be active), or
        ``answer(values)``, the reply a front end makes of them (:mod:`finecap.serve.app`); :class:`ScoreTimeout` when
        they are not there :attr:`score_timeout` seconds from now (module docstring, "Deadline"). The request counts
        as scored once its reply is made: an ``answer`` that raises (``/get_reward``'s 502 for captions the reward
        could not score, a fault of the server's) counts it failed, its exception raised here."""
        if self._wakeup is None:
            raise RuntimeError("RewardService.score: the service is not running (use `async with service.running()`)")
        if self.fatal is not None:
            raise RewardFailed("the reward server is stopping: its reward failed")
        if self.stuck():  # not queued: it would wait out its whole deadline behind the call (module docstring)
            raise self._stuck(len(job.captions))
        if self._pending.bytes + job.size > self.max_queued_bytes:  # module docstring, "Queue bound"
            raise self._full(job)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        start = time.perf_counter()
        item = (job, future, start)
        self._pending.append(item)
        self._wakeup.set()
        try:  # the deadline and a departed client both cancel the future: its answer, if it comes, is dropped
            result = await asyncio.wait_for(future, self.score_timeout)
        except asyncio.CancelledError:  # its client left, queued or while its call ran
            self._forget(item)
            self.meter.left += 1
            raise
        except TimeoutError:
            queued = self._forget(item)
            self.meter.timed_out += 1
            raise self._timed_out(len(job.captions), queued) from None
        except Exception:
            self.meter.failed += 1
            raise
        try:
            reply = result if answer is None else answer(result)
        except Exception:
            self.meter.failed += 1
            raise
        self.meter.scored(len(job.captions), time.perf_counter() - start)
        return reply

    def _stuck(self, captions: int) -> Overloaded:
        """The :class:`ServerStuck` of a request of ``captions`` captions that arrived while the server is stuck
        (:meth:`_refused`)."""
        message = (f"the reward server is stuck: a call of the reward {self.name} has run {self.busy_for:.1f} s, past "
                   f"--score-timeout ({self.score_timeout:g} s), and has not returned; this request was not queued. "
                   f"Retry after {self.retry_after} s or ask another server; GET /health answers 503 \"stuck\" until "
                   "the call returns (restart the server if it never does)")  # fmt: skip
        return self._refused(message, f"a request of {captions} captions")

    def _full(self, job: Job) -> Overloaded:
        """The :class:`QueueFull` of ``job``, which would take the queue past :attr:`max_queued_bytes`
        (:meth:`_refused`)."""
        message = (f"the reward server's queue is full: {len(self._pending)} requests of {self._pending.bytes:,} "
                   f"bytes wait for the reward {self.name} (its current call has run {self.busy_for:.1f} s), and "
                   f"this request's {job.size:,} bytes would take them past --max-queued-bytes "
                   f"({self.max_queued_bytes:,}); it was not queued. Retry after {self.retry_after} s or ask another "
                   "server")  # fmt: skip
        return self._refused(message, f"a request of {len(job.captions)} captions", QueueFull)

    def _refused(self, message: str, what: str, kind: type[Overloaded] = ServerStuck) -> Overloaded:
        """The ``kind`` of :class:`Overloaded` (503, ``Retry-After``) saying ``message``, counted (``refused``) and
        logged naming ``what`` (:class:`RepeatedFailures`: a trainer retrying while the server is stuck, or its queue
        full, costs a line every 10 s)."""
        self.meter.refused += 1
        error = kind(message, self.retry_after)
        self.failures.log(error, f"reward server: {what} refused (503): {message}", level=logging.WARNING,
                          trace=False)  # fmt: skip
        return error

    def _timed_out(self, captions: int, queued: bool) -> ScoreTimeout:
        """The :class:`ScoreTimeout` of a request of ``captions`` captions (``queued``: it never reached a round),
        logged (:class:`RepeatedFailures`: a reward hung for days costs a line every 10 s)."""
        where = "waited behind a reward call that has run" if queued else "was in a reward call that has run"
        message = (f"not scored within {self.score_timeout:g} s (--score-timeout): the request {where} "
                   f"{self.busy_for:.0f} s so far; GET /health says whether the reward is stuck. Ask again later, "
                   "or restart the server with a larger --score-timeout if the reward is slow rather than "
                   "hung")  # fmt: skip
        error = ScoreTimeout(message)
        self.failures.log(error, f"reward server: {self.name}: a request of {captions} captions {message}",
                          level=logging.WARNING, trace=False)  # fmt: skip
        return error

    def _forget(self, item: Waiting) -> bool:
        """Take a request whose client left, or whose deadline passed, out of the queue now (whether it was there), so
        that its captions are not held until the reward's current call returns (a slow or hung call, clients that
        time out and ask again: the queue grew by one request a retry); one already taken into a round is left to it
        (its answer is dropped: :func:`settle`)."""
        return self._pending.remove(item)

    async def _serve_queue(self) -> None:
        try:
            await self._serve_rounds()  # returns once the reward has stopped the server (self.fatal)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - a worker that died would leave a server answering nothing
            log.critical("reward server: the worker serving %s stopped (%s: %s); the server stops", self.name,
                         type(e).__name__, e)  # fmt: skip
            self.fatal = e
        if self.fatal is not None:
            while self._pending:
                _, future, _ = self._pending.popleft()
                if not future.done():
                    future.set_exception(RewardFailed("internal error: the reward server is stopping"))
            self.on_fatal()

    def _next_round(self) -> list[Waiting]:
        """The requests of the next round, taken from the queue: up to ``batch_size`` captions when the reward's calls
        are merged, else one request (one call each, so that a request whose client leaves while an earlier one is
        scored is never called); a request whose client already left is dropped (never scored)."""
        round_, size = [], 0
        while self._pending and (not round_ or (self.merges and size + len(self._pending.first()[0].captions)
                                                <= self.batch_size)):  # fmt: skip
            item = self._pending.popleft()
            if item[1].done():  # its client went away while it queued (counted as left by its score())
                continue
            round_.append(item)
            size += len(item[0].captions)
        return round_

    async def _serve_rounds(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self.batch_wait > 0 and sum(len(j.captions) for j, _, _ in self._pending) < self.batch_size:
                await asyncio.sleep(self.batch_wait)
            round_ = self._next_round()
            if not round_:
                continue
            start = time.perf_counter()
            self._call_started = time.monotonic()
            try:
                results = await loop.run_in_executor(self._executor, self.score_now, [j for j, _, _ in round_])
            finally:
                self._call_started = None
            settle(round_, results)
            self.meter.round(len(round_), sum(len(j.captions) for j, _, _ in round_), time.perf_counter() - start)
            self.meter.maybe_log(self.name)
            if self.fatal is not None:
                return


def settle(items: Sequence[Waiting], results: Sequence[RewardOutput | Exception]) -> None:
    """Hand each item's result (or exception) to its future, unless its client went away."""
    for (_, future, _), result in zip(items, results, strict=True):
        if future.done():
            continue
        if isinstance(result, Exception):
            future.set_exception(result)
        else:
            future.set_result(result)


LATENCIES_KEPT = 100_000
"""Latencies a :class:`Meter` keeps: its percentiles are over the window's last this many requests, so that a server
whose lines are never logged (``--log-every 0``) does not grow by one float a request for ever."""


class Meter:
    """The server's counts (module docstring, "Counts") and its throughput since the last logged line (``log_every``
    seconds apart; 0: only when the server stops); latency of the scored requests over the window's last
    :data:`LATENCIES_KEPT`.

    Each request handed to :meth:`RewardService.score` is counted once, by how it ended (totals since the start):
    :attr:`total_scored` (its values handed back; their captions in :attr:`total_captions`), :attr:`failed`,
    :attr:`timed_out` (its check's 504 included: :class:`CheckTimeout`), :attr:`left`, :attr:`refused`. The
    reward's own work is counted apart, per window: its rounds, the captions it scored (a request whose client left
    during its call among them) and the seconds it was busy."""

    OUTCOMES = ("failed", "timed_out", "left", "refused")

    def __init__(self, log_every: float) -> None:
        self.log_every = log_every
        self.started = self.since = time.perf_counter()
        self.captions = self.rounds = 0  # the reward's work in the window
        self.busy = 0.0
        self.latencies: deque[float] = deque(maxlen=LATENCIES_KEPT)
        self.total_scored = self.total_captions = 0
        self.failed = 0  # requests answered 500 or /get_reward's 502: the reward failed on them (or on some captions)
        self.timed_out = 0  # requests answered 504 (--score-timeout)
        self.left = 0  # requests whose client went away before their answer: queued (never scored) or in a call
        self.refused = 0  # answered 503: the server stuck (at once, or after waiting for a check thread), queue full
        self._said = dict.fromkeys(("total_scored", *self.OUTCOMES), 0)  # the totals at the window's start

    @property
    def uptime(self) -> float:
        """Seconds since the counts began (the service was made: ``finecap serve-reward``'s start), ``/health``'s
        ``uptime``: a supervisor sees a restart (it falls) and the rates of the counts since the start."""
        return time.perf_counter() - self.started

    def round(self, requests: int, captions: int, seconds: float) -> None:
        """A round of the reward: ``requests`` requests, ``captions`` captions scored in ``seconds``."""
        self.captions += captions
        self.rounds += 1
        self.busy += seconds

    def scored(self, captions: int, seconds: float) -> None:
        """A request of ``captions`` captions whose values were handed back ``seconds`` after it queued."""
        self.total_scored += 1
        self.total_captions += captions
        self.latencies.append(seconds)

    def line(self, name: str) -> str:
        """The throughput line of the window (and starts a new one)."""
        now = time.perf_counter()
        span = max(now - self.since, 1e-9)
        since = {k: getattr(self, k) - self._said[k] for k in self._said}
        lat = np.array(self.latencies) * 1000
        latency = (f"latency p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms of the scored "
                   "requests" if len(lat) else "no request scored")  # fmt: skip
        text = (f"reward server ({name}): in {span:.1f} s {since['total_scored']} requests scored, "
                f"{since['failed']} failed (500, 502), {since['timed_out']} timed out (504, --score-timeout), "
                f"{since['left']} left by their client, {since['refused']} refused (503: stuck, or the queue "
                f"full); the reward scored {self.captions} captions: {self.captions / span:,.0f} captions/s, "
                f"{self.captions / max(self.rounds, 1):.0f} captions a round, busy {100 * self.busy / span:.0f}% of "
                f"the time; {latency}")  # fmt: skip
        self.since, self.captions, self.rounds, self.busy = now, 0, 0, 0.0
        self._said = {k: getattr(self, k) for k in self._said}
        self.latencies.clear()
        return text

    def maybe_log(self, name: str) -> None:
        if self.log_every > 0 and time.perf_counter() - self.since >= self.log_every:
            log.info("%s", self.line(name))
