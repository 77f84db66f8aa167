"""A client of finecap's reward server (``POST /reward``), synchronous and asynchronous, over httpx: what the
adapters of :mod:`finecap.integrations` (verl, ms-swift, OpenRLHF's reward function) send when they are given the
server's URL instead of a reward.

Every reply is checked before a trainer sees it (:func:`checked_values`): one finite number per caption in
``total`` and in each part, or a :class:`RewardServerError` naming what is wrong: a NaN, a string, a missing value or
a reply of another length never reaches a policy's advantages. A 503 (a server stuck behind a reward call past its
``--score-timeout``, its queue full, or all of its connections open) is asked again with backoff
(:meth:`RewardClient.retry_wait`: the server's ``Retry-After`` at least), :data:`RETRIES` times at most, before it is
a :class:`RewardServerError`; so is a request that got no answer from a server that has answered this client before
(a server restarting: refused, closed or reset connections), where one that never has fails at once (a wrong URL or
port). A
``null`` is read only as a caption the reward could not score, when the reply counts it (``"failed": k``): a
:class:`finecap.rewards.RewardOutput` with that caption in ``failed`` (its values NaN), which each adapter answers in
its trainer's way. A server's bearer token (``finecap
serve-reward --token-file``) is read from ``$FINECAP_REWARD_TOKEN`` (or given as ``token=``); every message masks the
credentials of the URL (``user:password@``, ``?token=``), so that no log line or traceback shows them, and a
``user:password@`` is never requested: it is sent as basic authentication
(:func:`finecap.config.secrets.split_credentials`), as httpx logs the URL of every request.

Example (a server from ``finecap serve-reward demo/sr_bagcurri --port 8000``)::

    client = RewardClient("http://127.0.0.1:8000")
    client.score(["a red circle on sand", "two blue squares"], image_ids=[17, 4]).total   # tensor([-0.41, -1.9])
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import torch

from finecap.config.fields import url_problem
from finecap.config.secrets import masked_reply, masked_url_secrets, split_credentials
from finecap.rewards import RewardOutput
from finecap.serve.protocol import RequestError, callers_field, in_callers_words, reward_body

log = logging.getLogger(__name__)

TOKEN_ENV = "FINECAP_REWARD_TOKEN"
"""The environment variable holding the reward server's bearer token (``finecap serve-reward --token-file``)."""


class RewardServerError(RuntimeError):
    """The server refused a request (its status, the field it named and its message) or could not be reached."""

    def __init__(self, status: int | None, field: str | None, message: str) -> None:
        where = f" ({field})" if field else ""
        text = f"reward server{where}: {message}" + (f" [HTTP {status}]" if status else "")
        # a URL's user:password@ or ?token=, or the request's Authorization header echoed by the server, never
        # reaches a message
        super().__init__(masked_reply(text))
        self.status, self.field = status, field


def reward_url(url: str) -> str:
    """The ``/reward`` endpoint of a server given by its base URL (or by the endpoint itself)."""
    url = url.rstrip("/")
    for endpoint in ("/reward", "/get_reward", "/health"):
        if url.endswith(endpoint):
            url = url[: -len(endpoint)]
    return f"{url}/reward"


MAX_IN_FLIGHT = 64
"""Requests a :class:`RewardClient` keeps in flight at most: from all threads (:meth:`RewardClient.score`) and from
each event loop (:meth:`RewardClient.ascore`); more wait their turn. A server closes the connections over its
``--max-connections`` (256 by default) at once, so a trainer awaiting hundreds of samples together would see most of
them fail."""


KEEPALIVE_EXPIRY = 4.0
"""Seconds a client keeps an idle connection for its next request: less than the 5 s after which finecap's server
(uvicorn's keep-alive) closes one, so that a request is never sent on a connection the server is closing at that
moment, which would fail it (``RemoteProtocolError``) where a new connection would have served it."""


RETRIES = 5
"""Times a request answered 503, or that got no answer from a server that answered before, is asked again at most
(:meth:`RewardClient.retry_wait`)."""
MAX_RETRY_WAIT = 30.0
"""Seconds a client waits at most before asking a request again, whichever answer it retries
(:meth:`RewardClient.retry_wait`: a 503, whose larger ``Retry-After`` is cut to it, or a connection refused, closed
unanswered or reset by a server that answered before)."""


NO_ANSWER = (httpx.NetworkError, httpx.RemoteProtocolError)
"""httpx's errors of a request whose connection failed before an answer came: refused (``ConnectError``: nothing
listens there, or not yet again), closed unanswered (``RemoteProtocolError``, or a reply that is no HTTP) or reset
(``ReadError``, ``WriteError``). A time-out is none of them (:meth:`RewardClient.retry_wait`)."""


def _unreachable(url: str, e: httpx.HTTPError, answered: bool) -> RewardServerError:
    """The error of a request that got no reply (``e``: httpx's), saying what happened even when ``e`` says nothing;
    ``answered``: whether the server has answered this client before (else a wrong URL or port is likelier)."""
    text = str(e) or type(e).__name__
    if isinstance(e, httpx.RemoteProtocolError):
        text += " (the server closed the connection: restarting, or more open than its --max-connections?)"
    if isinstance(e, NO_ANSWER) and not answered:
        text += "; it has never answered this client: not asked again (a wrong URL or port, or no HTTP server?)"
    return RewardServerError(None, None, f"{url}: {text}")


def _failure(e: httpx.HTTPError) -> str:
    """What a request's failed connection (:data:`NO_ANSWER`) says of the server, in a retry's log line."""
    if isinstance(e, httpx.ConnectError):
        return "could not be connected to (restarting?)"
    if isinstance(e, httpx.RemoteProtocolError):
        return "closed the connection without answering"
    return "broke the connection without answering"


@dataclass
class _LoopPool:
    """What :meth:`RewardClient.ascore` keeps for one event loop: its turns, its connection pool (an
    ``httpx.AsyncClient`` is bound to the loop it first ran in), and the async generator whose ``finally`` closes the
    pool when the loop ends (``asyncio.run`` closes every live async generator of its loop before closing it)."""

    gate: asyncio.Semaphore
    http: httpx.AsyncClient
    keeper: Any = None


class RewardClient:
    """Scores captions on a reward server.

    Args:
        url: the server (``http://127.0.0.1:8000``, or its ``/reward`` endpoint): http(s), no ``?query`` or
            ``#fragment``, no white space (:func:`~finecap.config.fields.url_problem`); a ``ValueError`` otherwise.
        timeout: seconds per request (:meth:`score`'s wait for a free connection too).
        token: the server's bearer token (default: ``$FINECAP_REWARD_TOKEN``, if set).
        max_in_flight: requests in flight at most (:data:`MAX_IN_FLIGHT`).
        retries: times a request answered 503, or that got no answer from a server that answered before, is asked
            again (:meth:`retry_wait`; 0: never).
    """

    def __init__(self, url: str, timeout: float = 180.0, token: str | None = None,
                 max_in_flight: int = MAX_IN_FLIGHT, retries: int = RETRIES) -> None:  # fmt: skip
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"RewardClient: the server's URL must start with http:// or https://, got "
                             f"{masked_url_secrets(str(url))!r}")  # fmt: skip
        if "?" in url or "#" in url:  # /reward is appended to the base URL: it would land inside them
            raise ValueError(f"RewardClient: the server's URL takes no ?query or #fragment (the bearer token goes in "
                             f"${TOKEN_ENV} or token=), got {masked_url_secrets(url)!r}")  # fmt: skip
        problem = url_problem(url)  # the rule of every URL option: "http://h:8000 http://g:8000" is no one server
        if problem:
            raise ValueError(masked_url_secrets(f"RewardClient: the server's URL {problem}"))
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"RewardClient: timeout must be a positive number of seconds, got {timeout!r}")
        self.shown_url = masked_url_secrets(reward_url(url))  # in messages: as given, its credentials masked
        url, self._auth = split_credentials(url)  # basic auth, never in the URL httpx logs
        self.url = reward_url(url)
        self.timeout = timeout
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        if not (isinstance(max_in_flight, int) and max_in_flight >= 1):
            raise ValueError(f"RewardClient: max_in_flight must be a positive integer, got {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        if not (isinstance(retries, int) and retries >= 0):
            raise ValueError(f"RewardClient: retries must be an integer, at least 0, got {retries!r}")
        self.retries = retries
        self._answered = False  # whether the server has answered a request of this client (retry_wait)
        self._http: httpx.Client | None = None  # one pool for every thread (httpx's Client can be shared)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPool] = (
            weakref.WeakKeyDictionary()
        )  # each event loop's turns and pool (a trainer may run each step in a loop of its own: _loop_pool)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RewardClient({self.shown_url!r})"

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process needs (verl's ``remote`` reward manager ships its ``compute_score`` to Ray
        workers): the URL, timeout, token and limit; its pools, event loops' turns and lock are this process's, and
        the copy opens its own. Whether the server answered is this process's too (another node may not reach a
        ``127.0.0.1`` URL at all): the copy has not been answered yet (:meth:`retry_wait`)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_http", "_loops", "_lock", "_answered")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._answered = False
        self._http = None
        self._loops = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @staticmethod
    def payload(captions: Sequence[str], image_ids: Sequence[Hashable] | None = None, *,
                images: Sequence[str] | None = None, references: Sequence[Sequence[str]] | None = None,
                request_id: Any = None, fields: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
        """The JSON of a ``/reward`` request (:func:`finecap.serve.protocol.reward_body`); a value it refuses is a
        :class:`~finecap.serve.protocol.RequestError` naming the field in the caller's words (``fields``:
        :func:`~finecap.serve.protocol.in_callers_words`)."""
        try:
            return reward_body(captions, image_ids, images=images, references=references, request_id=request_id)
        except RequestError as e:
            raise in_callers_words(e, fields) from None
        except ValueError as e:
            raise ValueError(f"RewardClient: {e}") from None

    @staticmethod
    def reply(response: httpx.Response, n: int | None = None,
              fields: Mapping[str, str] | None = None) -> RewardOutput:  # fmt: skip
        """The values of a reply to a request of ``n`` captions (checked: :func:`checked_values`), or
        :class:`RewardServerError` naming the field the server named, in the caller's words (``fields``:
        :func:`~finecap.serve.protocol.callers_field`)."""
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code != 200 or not isinstance(data, dict) or "total" not in data:
            error = (data or {}).get("error") if isinstance(data, dict) else None
            if isinstance(error, dict):
                field = callers_field(error.get("field"), fields)
                raise RewardServerError(response.status_code, field, str(error.get("message")))
            raise RewardServerError(response.status_code, None, response.text[:300])
        return checked_values(data, n, str(response.url))

    def _pool_options(self) -> dict[str, Any]:
        """The options of each of its connection pools (httpx's ``Client`` and ``AsyncClient`` take the same)."""
        limits = httpx.Limits(
            max_connections=self.max_in_flight,
            max_keepalive_connections=self.max_in_flight,
            keepalive_expiry=KEEPALIVE_EXPIRY,
        )
        return {"timeout": self.timeout, "headers": self._headers, "auth": self._auth, "limits": limits}

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None or self._http.is_closed:
                self._http = httpx.Client(**self._pool_options())
            return self._http

    async def _loop_pool(self) -> _LoopPool:
        """The running event loop's turns (:attr:`max_in_flight` requests at once) and connection pool, made at its
        first request and closed when the loop ends (``asyncio.run``, :meth:`close`): the requests of one loop share
        its pool's connections, where a connection of each request's own left a socket in TIME_WAIT and cost a new
        client (about 20 ms of CPU, its TLS context) a request (docs/integrations.md#from-python). The pools of loops
        closed otherwise (``loop.close()`` without ``shutdown_asyncgens``) are let go at the next loop's first
        request, their sockets closed as Python frees them."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._loops.get(loop)
            if pool is not None and not pool.http.is_closed:
                return pool
            for ended in [other for other in self._loops if other.is_closed()]:  # each held its loop: never freed
                del self._loops[ended]
            pool = self._loops[loop] = _LoopPool(asyncio.Semaphore(self.max_in_flight),
                                                 httpx.AsyncClient(**self._pool_options()))  # fmt: skip
        pool.keeper = self._keeper(loop, pool)
        await pool.keeper.__anext__()  # started in this loop: the loop closes it at its end
        return pool

    async def _keeper(self, loop: asyncio.AbstractEventLoop, pool: _LoopPool) -> AsyncIterator[None]:
        """Closes ``pool`` (its connections) when closed itself: by ``asyncio.run``'s ``shutdown_asyncgens`` at the
        end of ``loop``, or by :meth:`close`."""
        try:
            yield
        finally:
            with self._lock:
                if self._loops.get(loop) is pool:
                    del self._loops[loop]
            await pool.http.aclose()

    def close(self) -> None:
        """Close the connection pools: the threads' now, each open event loop's in that loop, as soon as it runs (a
        later call opens a new one)."""
        with self._lock:
            http, self._http = self._http, None
            pools, self._loops = list(self._loops.items()), weakref.WeakKeyDictionary()
        if http is not None:
            http.close()
        for loop, pool in pools:
            if pool.keeper is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: its pool goes with it
                    loop.call_soon_threadsafe(loop.create_task, pool.keeper.aclose())

    def retry_wait(self, answer: httpx.Response | httpx.HTTPError, attempt: int) -> float | None:
        """Seconds to wait before asking again after ``answer`` (the server's response, or httpx's error of a request
        that got none) to the ``attempt``-th try (0: the first), or ``None``: it is the answer, or the error.

        Asked again, :attr:`retries` times at most, after ``2 ** attempt`` seconds, or the server's ``Retry-After``
        when longer, :data:`MAX_RETRY_WAIT` at most, each retry logged with the server's message or httpx's error:
        a 503 (a stuck server, one whose queue is full, or one whose connections are all open), and a request whose
        connection failed before an answer came (:data:`NO_ANSWER`: refused, closed unanswered, reset) when the
        server has answered this client before (any response: a request's, :meth:`tallies`'): a server restarting
        (refusing connections until it listens again), one whose connections are all open, the two kept for
        ``/health`` too, closing a new one at once, or one closing an idle connection as the request is sent on it,
        which a later try may find served. From a server that never answered this client such an error is said at
        once (a wrong URL or port, a port that speaks no HTTP: no backoff before the error), as is a time-out: a
        request that ran past :attr:`timeout` is not sent again to the server still scoring it. Each response
        ``answer`` marks the server answered (docs/integrations.md#requests)."""
        if isinstance(answer, httpx.Response):
            self._answered = True
        if attempt >= self.retries:
            return None
        if isinstance(answer, NO_ANSWER) and self._answered:
            asked, said = 0.0, f"{_failure(answer)} ({type(answer).__name__}: {str(answer) or 'no message'})"
        elif isinstance(answer, httpx.Response) and answer.status_code == 503:
            try:
                asked = float(answer.headers.get("retry-after", "0"))
            except ValueError:  # an HTTP date: the backoff alone
                asked = 0.0
            try:
                said = f"answered 503 ({answer.json()['error']['message']})"
            except (ValueError, KeyError, TypeError):
                said = f"answered 503 ({answer.text[:300]})"
        else:
            return None
        wait = min(max(asked if math.isfinite(asked) else 0.0, 2.0**attempt), MAX_RETRY_WAIT)
        said = masked_reply(said)  # the server's words: an echoed header masked
        log.warning("%s", f"reward server {self.shown_url} {said}; asking again in {wait:g} s "
                          f"(retry {attempt + 1} of {self.retries})")  # fmt: skip
        return wait

    def _answer(self, answer: httpx.Response | httpx.HTTPError, n: int,
                fields: Mapping[str, str] | None) -> RewardOutput:  # fmt: skip
        """The values of the last ``answer`` to a request of ``n`` captions (:meth:`reply`), or the error of one that
        got no reply."""
        if isinstance(answer, httpx.HTTPError):
            raise _unreachable(self.shown_url, answer, self._answered) from None
        return self.reply(answer, n, fields)

    def tallies(self) -> dict[str, float]:
        """The served reward's running counts of its work, ``tallies`` of the server's ``GET /health``
        (:meth:`finecap.serve.service.RewardService.tallies`: a judged reward's judge's calls, failed calls, ...),
        read whatever its status (a stuck server's 503 holds them too); a :class:`RewardServerError` when the server
        cannot be reached or its answer holds none (a finecap server older than them)."""
        url = self.url.removesuffix("/reward") + "/health"
        try:
            response = self._client().get(url)
        except httpx.HTTPError as e:
            raise _unreachable(self.shown_url, e, self._answered) from None
        self._answered = True  # the server is there: a request's failed connection is asked again (retry_wait)
        try:
            tallies = response.json()["tallies"]
        except (ValueError, KeyError, TypeError):
            tallies = None
        if not isinstance(tallies, dict) or not all(isinstance(v, int | float) for v in tallies.values()):
            raise RewardServerError(response.status_code, None, f"{self.shown_url.removesuffix('/reward')}/health: "
                                    f"no tallies in its answer: {response.text[:300]}")  # fmt: skip
        return {str(k): float(v) for k, v in tallies.items()}

    def score(self, captions: Sequence[str], image_ids: Sequence[Hashable] | None = None, *,
              fields: Mapping[str, str] | None = None, **kwargs: Any) -> RewardOutput:  # fmt: skip
        """The values of ``captions`` (keyword arguments: :meth:`payload`'s); a 503, or no answer from a server that
        answered before, is asked again (:meth:`retry_wait`). ``fields``: the caller's own names for the request's
        fields, which a refusal names (OpenRLHF's, :data:`~finecap.serve.protocol.GET_REWARD_FIELDS`: ``labels[1]``
        and ``query[1]``, where the server named the ``image_ids[1]`` and ``captions[1]`` of its request:
        :func:`~finecap.serve.protocol.callers_field`)."""
        body = self.payload(captions, image_ids, fields=fields, **kwargs)
        for attempt in itertools.count():
            answer: httpx.Response | httpx.HTTPError
            try:
                answer = self._client().post(self.url, json=body)
            except httpx.HTTPError as e:
                answer = e
            wait = self.retry_wait(answer, attempt)
            if wait is None:
                return self._answer(answer, len(body["captions"]), fields)
            time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    async def ascore(self, captions: Sequence[str], image_ids: Sequence[Hashable] | None = None, *,
                     fields: Mapping[str, str] | None = None, **kwargs: Any) -> RewardOutput:  # fmt: skip
        """:meth:`score`, awaited, at most :attr:`max_in_flight` of one event loop at once, over that loop's
        connections (:meth:`_loop_pool`: trainers may run each step in a new event loop, and an httpx async client is
        bound to its loop); a 503, or no answer from a server that answered before, is asked again
        (:meth:`retry_wait`), its turn given up while it waits."""
        body = self.payload(captions, image_ids, fields=fields, **kwargs)
        for attempt in itertools.count():
            pool = await self._loop_pool()
            answer: httpx.Response | httpx.HTTPError
            try:
                async with pool.gate:
                    answer = await pool.http.post(self.url, json=body)
            except httpx.HTTPError as e:
                answer = e
            wait = self.retry_wait(answer, attempt)
            if wait is None:
                return self._answer(answer, len(body["captions"]), fields)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


def _number_list(value: Any, n: int | None, where: str, url: str, failed: set[int]) -> list[float]:
    """The numbers of ``value`` (NaN at the ``failed`` captions, which must be ``null``), checked."""
    if not isinstance(value, list):
        raise RewardServerError(200, where, f"{url} answered {type(value).__name__} where a list of numbers belongs")
    if n is not None and len(value) != n:
        raise RewardServerError(200, where, f"{url} answered {len(value):,} values for {n:,} captions")
    out = []
    for i, v in enumerate(value):
        if v is None and i in failed:
            out.append(math.nan)
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise RewardServerError(200, f"{where}[{i}]", f"{url} answered {type(v).__name__} where a number belongs")
        if not math.isfinite(v):
            raise RewardServerError(200, f"{where}[{i}]", f"{url} answered a non-finite value ({v})")
        out.append(float(v))
    return out


def checked_values(data: dict[str, Any], n: int | None, url: str = "the reward server") -> RewardOutput:
    """The :class:`~finecap.rewards.RewardOutput` (float32) of a ``/reward`` reply ``data`` to a request of ``n``
    captions: ``total`` and each part of ``parts`` a list of ``n`` finite numbers, ``null`` only at the captions
    that failed (as many as the reply's ``failed`` count says: those are ``failed``, their values NaN), else
    :class:`RewardServerError` naming the field (``total[3]``, ``parts.cider``): a NaN, a string, an uncounted null
    or a reply of another length is never passed on to a trainer.

    >>> checked_values({"total": [1.0, 2], "parts": {"cider": [1.0, 2.0]}}, 2).total.tolist()
    [1.0, 2.0]
    >>> checked_values({"total": [1.0, None], "failed": 1}, 2).failed.tolist()
    [False, True]
    >>> checked_values({"total": [1.0, float("nan")]}, 2)
    Traceback (most recent call last):
    ...
    finecap.serve.client.RewardServerError: reward server (total[1]): the reward server answered a non-finite value \
(nan) [HTTP 200]
    """
    url = masked_url_secrets(url)
    count = data.get("failed", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise RewardServerError(200, "failed", f"{url} answered {count!r} where a count of failed captions belongs")
    total = data.get("total")
    nulls = {i for i, v in enumerate(total) if v is None} if isinstance(total, list) else set()
    if count and len(nulls) != count and not nulls:
        raise RewardServerError(200, "failed", f"{url} answered a failed count of {count} and no null value")
    failed = nulls if len(nulls) == count else set()  # an uncounted null is refused where it stands
    values = _number_list(total, n, "total", url, failed)
    parts = data.get("parts", {})
    if not isinstance(parts, dict):
        raise RewardServerError(200, "parts", f"{url} answered {type(parts).__name__} where an object belongs")
    mask = None
    if failed:
        mask = torch.zeros(len(values), dtype=torch.bool)
        mask[sorted(failed)] = True
    return RewardOutput(
        torch.tensor(values, dtype=torch.float32),
        {str(k): torch.tensor(_number_list(v, len(values), f"parts.{k}", url, failed), dtype=torch.float32)
         for k, v in parts.items()},
        mask,
    )  # fmt: skip
