"""The reward server's HTTP face: a Starlette application over a :class:`~finecap.serve.service.RewardService`, run
by uvicorn (``pip install finecap[serve]``).

Endpoints:

- ``POST /reward``: finecap's request (:func:`finecap.serve.protocol.parse_reward`) ->
  ``{"id": ..., "image_ids": [...], "total": [...], "parts": {"cider": [...], ...}}``: the request's ``id`` and
  image ids (or ``images``) echoed, one total and one value per part for each caption, in order.
- ``POST /get_reward``: OpenRLHF's and CapRL's (:func:`finecap.serve.protocol.parse_get_reward`) ->
  ``{"rewards": [...], "extra_logs": {"cider": [...], ...}}``: the totals, and the parts, which OpenRLHF logs.
- ``GET /health``: ``{"status": "ok", "reward": ..., "images": N, "uptime": ..., "scored": ..., "captions": ...,
  "failed": ..., "timed_out": ..., "left": ..., "refused": ..., "queued": ..., "queued_bytes": ..., "busy": ...,
  "blocked_checks": ..., "failures": ..., "score_timeout": ..., "tallies": {...}}``.
  ``uptime``: the seconds since the start (:attr:`Meter.uptime <finecap.serve.service.Meter.uptime>`), which the counts
  below cover. Since the start, each request that passed its checks, or whose check ran out of time, counted once by
  how it ended (:class:`~finecap.serve.service.Meter`): ``scored``, the requests answered their values (200), and
  ``captions``, theirs; ``failed``, those answered 500 (the reward failed on them, or the server's own error once they
  were scored) or ``/get_reward``'s 502 (captions the reward could not score); ``timed_out``, those answered 504
  (``--score-timeout``: their check, or their wait and reward call); ``left``, those whose client went away before
  their answer (queued, never scored, or while their call ran); ``refused``, those answered 503 because the server was
  stuck (at once, or waiting for a check thread once every thread was) or its queue full (``--max-queued-bytes``).
  Now: ``queued``, the requests waiting for the reward, and ``queued_bytes``, their bodies' bytes; ``busy``, the
  seconds its current call has run (0 when idle: a call that hangs shows there, :attr:`RewardService.busy_for`);
  ``blocked_checks``, the check threads held by a request's check past
  ``--score-timeout`` (image paths on a file system that does not answer: :attr:`RewardService.blocked_checks`).
  ``failures``: every failure logged
  (:class:`~finecap.serve.service.RepeatedFailures`, a kind's repeats bounded): the 500s, 502s, 503s and 504s above
  and the server's own errors. ``tallies``: the reward's running counts of its work
  (:meth:`RewardService.tallies`: a judged reward's judge's calls, cache hits, unparsable answers, failed calls and
  HTTP 429 replies, ``{"judge/calls": 40, "judge/failed": 3, ...}``, of a sum's part ``qa_utility/judge/calls``, ...;
  ``{}`` for a reward that counts nothing; ``null`` when the reward's ``tallies()`` raised, which is logged once
  and fails no probe), so that a judge failing call after call shows while the server keeps
  answering (its captions ``null``). Once the current call has run past ``--score-timeout`` the answer is 503 with
  ``"status": "stuck"`` (:meth:`RewardService.stuck`), until the call returns: a supervisor's probe can restart the
  server. While every check thread is blocked (:meth:`RewardService.checks_stuck`: no request can be checked) the
  answer is 503 with ``"status": "checks_stuck"``, until one returns. A request refused 4xx (malformed, unknown
  images, the policy) is in none of these counts.

A caption the reward could not score (:attr:`finecap.rewards.RewardOutput.failed`: a judge that failed) is never a
number a trainer would pay: ``/reward`` answers it ``null`` in ``total`` and in every part, and the reply then says
how many with ``"failed": k`` (absent when none failed); ``/get_reward`` refuses the request with a 502 naming the
failed captions, since OpenRLHF reads every reward as a number (:func:`~finecap.serve.protocol.openrlhf_reply`).

A refused request gets ``{"error": {"field": "captions[3]", "message": "..."}}`` with 400 (malformed: bad JSON,
wrong types, unknown images), 413 (beyond the limits: the body, captions per request, characters per caption), 404
/ 405 (no such endpoint or method, for a request the policy admitted; a 405 names the methods allowed in ``Allow``),
or the policy's answers below; a
fault of the reward gets 500 with a generic message (the detail in the server's log, :mod:`finecap.serve.service`),
and a request not answered ``--score-timeout`` seconds after it queued (a reward call that hangs, its own or one it
waits behind), or whose check has not ended ``--score-timeout`` seconds after it began (image paths on a file system
that does not answer), gets 504 naming the option (:class:`~finecap.serve.service.ScoreTimeout`); one arriving while
the server is stuck (a call past ``--score-timeout``) gets 503 at once, with ``Retry-After`` and a message naming the
stuck call and the option (:class:`~finecap.serve.service.ServerStuck`), as does one that would take the requests
waiting for the reward past ``--max-queued-bytes`` of bodies (:class:`~finecap.serve.service.QueueFull`);
the server goes on serving in every case but one: a reward that raises ``SystemExit`` stops it (exit code 1).
Replies are strict JSON: no ``NaN`` or ``Infinity`` token, ever (a reward's non-finite value is a 500 naming the
reward).

Policy (docs/integrations.md, "The reward server's safety"):

- **Host and origin.** A request whose ``Host`` is not the bound address or a loopback name is refused 400
  (:class:`~finecap.serve.hosts.HostPolicy`: a web page cannot read the answers through DNS rebinding); a request
  carrying an ``Origin`` (a browser's, on a page of any site) or ``Sec-Fetch-Site: cross-site`` / ``same-site`` is
  refused 403; a POST must say ``Content-Type: application/json`` (415 otherwise: a cross-site form or
  ``text/plain`` POST, which browsers send without asking first, is never scored).
- **Token.** With ``--token-file`` every request must carry ``Authorization: Bearer <token>`` (401 otherwise,
  compared in constant time); the token is read from the file, never from the command line, and never written.
  ``GET /health`` too (its answer names the reward and its counts: a supervisor's probe sends the token).
- **Before routing.** The ``Host``, origin and token checks run before a request is routed (:class:`Admission`),
  whatever its path and method: a client they refuse gets the same 400, 401 or 403 everywhere, never a 404, a 405
  (whose ``Allow`` names an endpoint's methods) or a trailing slash's redirect to an endpoint, which told a client
  without the token which endpoints exist. The ``Content-Type`` check (415) is an endpoint's own, after them.
- **Connections.** Request headers must arrive within ``header_timeout`` seconds of the connection (or of the end
  of the previous answer), the body within ``body_timeout`` seconds (408); a reply its client stops reading is cut
  off (the connection aborted, the reply dropped) once it has waited ``write_timeout`` seconds for the client to
  read more. At most ``max_connections`` are open at once, and :data:`HEALTH_CONNECTIONS` more answer ``GET
  /health`` alone (any other request on them: 503, closed), so that a supervisor's probe gets through while a
  trainer holds every connection; beyond both, a new one is closed at once (the cap is kept under the process's
  file-descriptor limit). A failing ``accept`` is logged at most once every 10 s with its count, as are requests
  that are no HTTP/1.1 (400) or ask for an ``Upgrade`` (:class:`ProtocolLog`). What a request's
  bytes decide (decoding, checks, image paths) runs on the service's check threads, never on the event loop; a
  request whose client disconnects is cancelled and, if it has not started, never scored. At most
  :data:`BODIES_AT_ONCE` large bodies (over :data:`SMALL_BODY`, 1 MiB, or chunked) are read and checked at once, so
  that the bodies held in memory are bounded (a 16 MiB body of empty JSON objects costs about 400 MiB while parsed);
  a large body waits for a slot with its connection paused (uvicorn reads 64 KiB of an unread body, then stops), and
  its ``body_timeout`` runs from then. Small bodies take no slot: clients stalling large bodies hold up no
  trainer's request.

Values are sent with Python's ``repr`` of the float32 values, which reads back to the same float32.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import resource
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from finecap.utils.system import MissingExtra, hangup_as_sigterm

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
    from starlette.routing import Route
    from uvicorn.protocols.http.h11_impl import H11Protocol
except ImportError:  # pragma: no cover - the serve extra is in the test extra
    raise MissingExtra("finecap's reward server needs Starlette and uvicorn: pip install 'finecap[serve]'") from None

from finecap.rewards import RewardOutput
from finecap.serve.hosts import HostPolicy
from finecap.serve.protocol import (
    FailedCaptions,
    Limits,
    RequestError,
    RewardRequest,
    decode_json,
    openrlhf_reply,
    parse_get_reward,
    parse_reward,
)
from finecap.serve.service import CHECK_THREADS, Overloaded, RewardFailed, RewardService
from finecap.utils.once import SaidOnce

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take and how many may be connected (module docstring, "Connections").

    Attributes:
        header_timeout: seconds for a request's headers to arrive (``--header-timeout``).
        body_timeout: seconds for its body to arrive (``--body-timeout``).
        max_connections: connections open at once (``--max-connections``), besides :data:`HEALTH_CONNECTIONS`
            kept for ``GET /health``.
        write_timeout: seconds a reply may wait for its client to read more of it (``--write-timeout``).
    """

    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_connections: int = 256
    write_timeout: float = 60.0

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "write_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 3600):
                raise ValueError(f"--{name.replace('_', '-')}: must be a number of seconds above 0 and at most 3600, "
                                 f"got {value:g}")  # fmt: skip
        if not 1 <= self.max_connections <= 65_536:
            raise ValueError(f"--max-connections: must be from 1 to 65536, got {self.max_connections}")

    def connection_cap(self) -> int:
        """:attr:`max_connections`, kept 64 under the process's soft file-descriptor limit (the rest are the
        server's own files and the sockets it closes)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - 64))


SMALL_BODY = 1 << 20
"""Bytes of a request body read without a slot (:data:`BODIES_AT_ONCE`): a trainer's requests are kilobytes."""
BODIES_AT_ONCE = 4 * CHECK_THREADS
"""Large request bodies (over :data:`SMALL_BODY` bytes, or of undeclared length) read and checked at once at most
(module docstring, "Connections")."""


def large_body(request: Request) -> bool:
    """Whether ``request``'s body takes a slot (:data:`BODIES_AT_ONCE`): it declares more than :data:`SMALL_BODY`
    bytes, or no length (chunked)."""
    declared = request.headers.get("content-length", "")
    return not declared.isdigit() or int(declared) > SMALL_BODY


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A strict JSON answer: a non-finite float is a ``ValueError``, never a bare ``NaN`` token."""
    return Response(json.dumps(payload, separators=(",", ":"), allow_nan=False), status_code=status,
                    media_type="application/json", headers=headers)  # fmt: skip


async def read_body(request: Request, limits: Limits, timeout: float = 60.0) -> bytes:
    """The request's body, refused (413) beyond ``limits.max_request_bytes`` before it is all read, and (408) when
    it has not all arrived ``timeout`` seconds after this call (after its headers, or after a large body's wait for a
    slot: :data:`BODIES_AT_ONCE`)."""
    limit = limits.max_request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError("body", f"{int(declared):,} bytes exceed the server's limit of {limit:,} "
                           "(--max-request-bytes)", 413)  # fmt: skip
    chunks, size = [], 0
    deadline = time.monotonic() + timeout
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(deadline - time.monotonic(), 0.0))
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise RequestError("body", f"not all sent within {timeout:g} s (--body-timeout)", 408) from None
        size += len(chunk)
        if size > limit:
            raise RequestError("body", f"more than {limit:,} bytes (--max-request-bytes)", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def refusal(error: RequestError) -> Response:
    """The answer to a refused request: its JSON error; a 401 names its scheme; a 408 or 413, answered before the body
    was all read, closes the connection (the rest of that body is never read as a next request)."""
    headers = None
    if error.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    elif error.status in (408, 413):
        headers = {"Connection": "close"}
    return _json(error.body(), error.status, headers)


class Guard:
    """The policy every request passes before its body is read (module docstring, "Host and origin", "Token"):
    :meth:`check` before it is routed, whatever its path and method (:class:`Admission`), :meth:`check_media` on a
    POST to an endpoint."""

    def __init__(self, host: str, token: str | None, allowed_hosts: Iterable[str] = ()) -> None:
        self.hosts = HostPolicy(host, allowed_hosts)
        self.token = token.encode() if token else None

    def check(self, request: Request) -> None:
        """Nothing, or the :class:`RequestError` (400, 401, 403) of a request whose ``Host``, origin or token the
        policy refuses."""
        host = request.headers.get("host")
        if not self.hosts.accepts(host):
            raise RequestError("Host", f"{host!r} is not the address this reward server is bound to (a "
                               "DNS-rebinding request?); use the URL it printed, an IP address of this machine, or "
                               "start the server with --allow-host NAME for a name its clients use")  # fmt: skip
        origin = request.headers.get("origin")
        if origin is not None:
            raise RequestError("Origin", f"requests from web pages ({origin}) are refused: the reward server answers "
                               "programs", 403)  # fmt: skip
        site = request.headers.get("sec-fetch-site", "none")
        if site in ("cross-site", "same-site"):
            raise RequestError("Sec-Fetch-Site", f"{site} requests are refused", 403)
        if self.token is not None:
            given = request.headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(value.strip().encode(), self.token):
                raise RequestError("Authorization", "this reward server needs its token: send 'Authorization: "
                                   "Bearer <token>' (the clients read $FINECAP_REWARD_TOKEN)", 401)  # fmt: skip

    @staticmethod
    def check_media(request: Request) -> None:
        """Nothing, or the 415 :class:`RequestError` of a POST whose body is not said to be JSON."""
        if request.method == "POST":
            media = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                raise RequestError("Content-Type", f"expected application/json, got {media or 'none'}", 415)


class Admission:
    """ASGI middleware: every HTTP request passes :meth:`Guard.check` before it is routed, so that a client the policy
    refuses (no token, a foreign ``Host``, a web page) gets its 400, 401 or 403 for any path and method, and learns
    from a 404, 405 or a trailing slash's redirect which endpoints exist only once admitted (module docstring,
    "Token")."""

    def __init__(self, app: Callable[..., Awaitable[None]], guard: Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: dict, receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[None]]) -> None:  # fmt: skip
        if scope["type"] == "http":
            try:
                self.guard.check(Request(scope))
            except RequestError as e:
                await refusal(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def until_gone(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """``(True, result)`` of ``work``, or ``(False, None)`` once the request's client has disconnected (``work`` is
    then cancelled: a queued request is never scored)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False, None


def failed_count(out: RewardOutput) -> dict[str, int]:
    """``{"failed": k}`` when ``k > 0`` captions failed, else nothing (module docstring)."""
    mask = out.failed_mask()
    return {} if mask is None else {"failed": int(mask.sum())}


def finecap_reply(request: RewardRequest, out: RewardOutput) -> dict[str, Any]:
    """The answer of ``POST /reward`` (failed captions: ``null``, and their count)."""
    images = "images" if request.by_path else "image_ids"
    total, parts = out.values(failed=None)
    return {"id": request.request_id, images: request.image_ids, "total": total, "parts": parts,
            **failed_count(out)}  # fmt: skip


def create_app(service: RewardService, *, host: str = "127.0.0.1", token: str | None = None,
               connections: ConnectionLimits | None = None,
               allowed_hosts: Iterable[str] = ()) -> Starlette:  # fmt: skip
    """The Starlette application serving ``service`` (its worker runs for the application's lifespan) under the
    policy of a server bound to ``host`` with the bearer ``token`` (or none), answering the ``Host`` names
    ``allowed_hosts`` too (module docstring)."""
    guard = Guard(host, token, allowed_hosts)
    body_timeout = (connections or ConnectionLimits()).body_timeout
    slots = asyncio.Semaphore(BODIES_AT_ONCE)  # large bodies read and checked at once (module docstring)
    tallies_failed = SaidOnce()  # the errors of the reward's tallies() said (/health)

    def endpoint(parse: Callable[[Any, Limits], RewardRequest], reply: Callable[[RewardRequest, RewardOutput], dict]):
        def checked(raw: bytes) -> tuple[RewardRequest, Any]:
            parsed = parse(decode_json(raw), service.limits)
            return parsed, service.job(parsed, len(raw))  # its size: --max-queued-bytes

        async def handle(request: Request) -> Response:
            try:
                guard.check_media(request)  # admitted already (Admission)
                async with slots if large_body(request) else contextlib.nullcontext():  # --body-timeout runs from here
                    raw = await read_body(request, service.limits, body_timeout)
                    parsed, job = await service.off_loop(checked, raw)
                    del raw  # the bytes are not kept while the request waits for the reward

                def answer(out: RewardOutput) -> Response:  # made in score(), which counts the request by it
                    return _json(reply(parsed, out))

                answered, response = await until_gone(request, service.score(job, answer))
                if not answered:
                    return Response(status_code=499)  # nobody reads it: the client is gone
                return response
            except ClientDisconnect:  # the client left while sending its body: nothing to answer, nothing to log
                return Response(status_code=499)
            except RequestError as e:
                return refusal(e)
            except Overloaded as e:  # stuck, or the queue full: answered at once, the client told when to ask again
                return _json(
                    {"error": {"field": None, "message": str(e)}}, e.status, {"Retry-After": str(e.retry_after)}
                )
            except RewardFailed as e:  # the reward's fault, in finecap's own words (the detail is in the log): a 500,
                return _json({"error": {"field": None, "message": str(e)}}, e.status)  # or --score-timeout's 504
            except FailedCaptions as e:  # /get_reward: a judge failed on some of its captions (openrlhf_reply)
                message = f"the reward {service.name} {e}; ask again, or ask /reward, which answers them null"
                service.failures.log(e, f"reward server: {request.method} {request.url.path}: {message}",
                                     level=logging.WARNING, trace=False)  # fmt: skip
                return _json({"error": {"field": None, "message": message}}, 502)
            except Exception as e:  # noqa: BLE001 - a bug of the server's: logged, answered without its text
                service.failures.log(e, f"reward server: {request.method} {request.url.path} failed")
                return _json({"error": {"field": None, "message": "internal error; the server's log has it"}}, 500)

        return handle

    async def health(request: Request) -> Response:  # admitted already (Admission): its answer names the reward
        meter = service.meter
        try:
            tallies: dict[str, int | float] | None = service.tallies()
        except Exception as e:  # noqa: BLE001 - a reward's own tallies() failing must not fail the probe
            tallies = None  # a supervisor would restart a server that scores well; said once per kind of error
            if tallies_failed.first((type(e), str(e))):
                log.warning("reward server: the reward %s's tallies() failed (/health answers them null): %s: %s",
                            service.name, type(e).__name__, e)  # fmt: skip
        status = "stuck" if service.stuck() else "checks_stuck" if service.checks_stuck() else "ok"
        return _json({"status": status, "reward": service.name, "images": len(service.images),
                      "uptime": round(meter.uptime, 3), "scored": meter.total_scored,
                      "captions": meter.total_captions, "failed": meter.failed,
                      "timed_out": meter.timed_out, "left": meter.left, "refused": meter.refused,
                      "queued": service.queued, "queued_bytes": service.queued_bytes,
                      "busy": round(service.busy_for, 3),
                      "blocked_checks": service.blocked_checks, "failures": service.failures.total,
                      "score_timeout": service.score_timeout, "tallies": tallies},
                     200 if status == "ok" else 503)  # fmt: skip

    async def http_error(request: Request, exc: HTTPException) -> Response:
        """404 / 405 as a JSON error, with Starlette's headers (a 405's ``Allow``: the methods the path takes)."""
        return _json({"error": {"field": None, "message": f"{request.method} {request.url.path}: {exc.detail}"}},
                     exc.status_code, dict(exc.headers or {}))  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_exception_handler(QuietAcceptErrors())
        async with service.running():
            yield
        service.failures.flush()  # the repeats counted since their last line, before the server's last line
        log.info("%s", service.meter.line(service.name))

    routes = [
        Route("/reward", endpoint(parse_reward, finecap_reply), methods=["POST"]),
        Route("/get_reward", endpoint(parse_get_reward, openrlhf_reply), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Admission, guard=guard)],
                     exception_handlers={HTTPException: http_error}, lifespan=lifespan)  # fmt: skip


class QuietAcceptErrors:
    """The event loop's exception handler: a failing ``accept`` (``EMFILE`` at the file-descriptor limit: asyncio
    retries every second and reports each failure with its traceback) is one line at most every ``every`` seconds,
    with the count since the last; anything else goes to asyncio's default handler."""

    def __init__(self, every: float = 10.0) -> None:
        self.every, self.count, self.last = every, 0, -math.inf

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if "accept" not in message:
            loop.default_exception_handler(context)
            return
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.every:
            error = context.get("exception")
            log.warning("reward server: %d connection(s) could not be accepted in the last %.0f s (%s); lower "
                        "--max-connections or raise the file-descriptor limit (ulimit -n)", self.count,
                        min(now - self.last, self.every), error or message)  # fmt: skip
            self.count, self.last = 0, now


HEALTH_CONNECTIONS = 2
"""Connections beyond ``--max-connections`` that answer ``GET /health`` alone (module docstring, "Connections")."""


def health_only(app: Callable[..., Awaitable[None]], cap: int) -> Callable[..., Awaitable[None]]:
    """``app`` (ASGI) on a connection beyond the cap (:data:`HEALTH_CONNECTIONS`): ``GET /health`` is answered as
    ever; any other request gets 503 naming ``--max-connections``, and the connection is closed."""
    message = (f"all {cap} connections of this reward server are open (--max-connections); this one answers GET "
               "/health alone: retry later")  # fmt: skip
    refused = json.dumps({"error": {"field": None, "message": message}})
    headers = [(b"content-type", b"application/json"), (b"connection", b"close"), (b"retry-after", b"1")]

    async def guarded(scope: dict, receive: Callable[..., Awaitable[Any]],
                      send: Callable[..., Awaitable[None]]) -> None:  # fmt: skip
        if scope["type"] != "http" or scope["path"] == "/health":
            await app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": refused.encode()})

    return guarded


class ToFinecapLog(logging.Handler):
    """The handler of uvicorn's own loggers (``uvicorn.error``: "Invalid HTTP request received.", "Exception in ASGI
    application"): their records go through finecap's logger (this module's), so that they get the handlers, the level
    and the format of the server's other lines (``finecap serve-reward``: its UTC time first), never uvicorn's own
    ``WARNING:  ...`` lines on stderr (:data:`UVICORN_LOGGING`)."""

    def emit(self, record: logging.LogRecord) -> None:
        if log.isEnabledFor(record.levelno):
            log.handle(record)


UVICORN_LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"finecap": {"()": ToFinecapLog}},
    "loggers": {"uvicorn": {"handlers": ["finecap"], "level": "WARNING", "propagate": False}},
}
"""uvicorn's ``log_config`` (:func:`make_server`): its loggers to finecap's (:class:`ToFinecapLog`), warnings and
above (uvicorn's ``log_level`` "warning"); no access log."""


SHUTDOWN_GRACE = 30
"""Seconds a stopping server gives the requests in flight (uvicorn's graceful-shutdown timeout)."""


class SaidEvery:
    """Events of one kind (connections refused or cut off) counted and said in one log line at most every ``every``
    seconds, with how many there were since the last line: a flood of them costs a line per window, not one each.
    ``message`` is a %-format whose first field is that count.

    >>> said = SaidEvery(logging.INFO, "%d connection(s) closed")
    >>> said.add(); said.add(); said.count  # the first was said at once, the second waits for the window's end
    1
    >>> said.flush(); said.count  # a stopping server says what it counted since its last line
    0
    """

    def __init__(self, level: int, message: str, every: float = 10.0) -> None:
        self.level, self.message, self.every = level, message, every
        self.count = 0
        self._said = -math.inf
        self._args: tuple[Any, ...] = ()

    def add(self, *args: Any) -> None:
        self.count, self._args = self.count + 1, args
        if time.monotonic() - self._said >= self.every:
            self.flush()

    def flush(self) -> None:
        """Say the events counted since the last line, if any (with the last one's values): the server calls it as it
        stops, so that none counted is left unsaid (as :meth:`RepeatedFailures.flush`)."""
        if self.count:
            log.log(self.level, self.message, self.count, *self._args)
            self.count, self._said = 0, time.monotonic()


INVALID_REQUEST = "Invalid HTTP request received."
"""uvicorn's warning for bytes that are no HTTP/1.1 request (a TLS handshake, a port scanner), answered 400."""
UPGRADE_REQUEST = "Unsupported upgrade request."
"""uvicorn's warning for a request with an ``Upgrade`` header (``h2c``, ``websocket``), answered over HTTP/1.1."""
NO_WEBSOCKETS = "No supported WebSocket library detected."
"""The start of uvicorn's advice after :data:`UPGRADE_REQUEST` to install a WebSocket library: a reward server serves
none (``ws="none"``)."""


class ProtocolLog:
    """The logger of one server's connections, in place of uvicorn's (``uvicorn.error``): the warnings a client's bytes
    cause, one a request in uvicorn (:data:`INVALID_REQUEST`, :data:`UPGRADE_REQUEST` and its :data:`NO_WEBSOCKETS`
    advice), are counted in ``invalid`` and ``upgrades`` and said one line at most every 10 s with their count
    (:class:`SaidEvery`): a client sending such requests for days costs a line per window, not two lines a request.
    Everything else goes to uvicorn's logger as ever (:class:`ToFinecapLog`)."""

    def __init__(self, logger: logging.Logger, invalid: SaidEvery, upgrades: SaidEvery) -> None:
        self.logger, self.invalid, self.upgrades = logger, invalid, upgrades

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg == INVALID_REQUEST:
            self.invalid.add()
        elif msg == UPGRADE_REQUEST:
            self.upgrades.add()
        elif not str(msg).startswith(NO_WEBSOCKETS):
            self.logger.warning(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for request headers, one for a reply its client does not read, a
    cap on open connections beyond which :data:`HEALTH_CONNECTIONS` answer ``GET /health`` alone (module docstring,
    "Connections"), and its clients' faults logged in bounded lines (:class:`ProtocolLog`); :func:`make_server` makes
    a subclass holding the limits."""

    header_timeout = 10.0
    write_timeout = 60.0
    cap = 256
    refused: SaidEvery  # each server's own (make_server's subclass)
    late: SaidEvery
    unread: SaidEvery
    invalid: SaidEvery
    upgrades: SaidEvery

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = ProtocolLog(self.logger, self.invalid, self.upgrades)  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.cap + HEALTH_CONNECTIONS:
            self.refused.add(len(self.connections) - 1, HEALTH_CONNECTIONS)
            transport.close()
            return
        if len(self.connections) > self.cap:  # a supervisor's probe gets through while a trainer holds the cap
            self.app = health_only(self.app, self.cap)
        self._arm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:  # the client reads no more of the reply: it has write_timeout seconds
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_late)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_late(self) -> None:
        self._write_timer = None
        if self.transport.is_closing():
            return
        self.unread.add(self.write_timeout)
        self.transport.abort()  # close() would wait for the unread bytes to be sent

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a request's headers arrived
            self._disarm()
        elif self._between_requests():  # headers under way
            self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # uvicorn's keep-alive timeout watches the idle connection

    def _headers_late(self) -> None:
        self._header_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.late.add(self.header_timeout)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)


class Server(uvicorn.Server):
    """uvicorn's server, but SIGTERM and Ctrl-C (SIGINT) are a clean stop: uvicorn re-raises the signal it caught
    once it has shut down gracefully (so that the process dies by it: exit code 143, or 130 through Python's
    KeyboardInterrupt); a reward server stopped by its supervisor or its user exits 0 (docs/integrations.md). A
    hang-up (SIGHUP: the SSH session of a server started without ``nohup`` or ``tmux`` dropped), which uvicorn does
    not catch, is the same stop as SIGTERM (:func:`finecap.utils.system.hangup_as_sigterm`): it killed the process at
    once, a request in flight unanswered and the reward unclosed (a vLLM judge's engine orphaned). A second
    Ctrl-C during the graceful stop forces the exit: uvicorn stops waiting for the requests in flight, and the
    service (``service``, set by :func:`make_server`) for a reward call still running
    (:meth:`RewardService.abandon`)."""

    service: RewardService | None = None
    said: tuple[SaidEvery, ...] = ()
    """The connections' flood-bounded counts (:func:`make_server`), said as the server stops."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:  # a forced stop skips the lifespan's end, which says them first
            if self.service is not None:
                self.service.failures.flush()
            for said in self.said:
                said.flush()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals(), hangup_as_sigterm():  # uvicorn's SIGTERM handler is handle_exit by then
            yield

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == signal.SIGINT and self.should_exit:
            self.force_exit = True  # the second Ctrl-C: stop waiting for the requests in flight
            if self.service is not None:
                self.service.abandon()  # and for the reward call they wait for
            return
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.should_exit = True
            return
        super().handle_exit(sig, frame)


BACKLOG = 2048
"""Connections the listening socket holds before they are accepted (uvicorn's default ``backlog``)."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: a free one) and listening: the address is taken now, so that
    a second server on the port fails here, before it loads its reward (SO_REUSEADDR lets a socket bind a port whose
    other sockets do not listen), and a client that connects meanwhile waits in the backlog until serving starts.
    Made with ``proto=IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` only on connections accepted by such a socket, and
    one made with ``proto`` 0 (as uvicorn's own ``bind_socket`` makes it) leaves Nagle's algorithm on, so that every
    small answer waits for the client's delayed ACK: 40 ms a request on Linux, measured."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(BACKLOG)  # uvicorn's create_server listens again, with the same backlog
    except OSError as e:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def make_server(service: RewardService, host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None,
                *, token: str | None = None, connections: ConnectionLimits | None = None,
                allowed_hosts: Iterable[str] = ()) -> tuple[Server, socket.socket]:  # fmt: skip
    """The uvicorn server of ``service`` and its socket: ``sock``, or one bound now (:func:`bind`; ``port`` 0: a free
    port, read it from ``sock.getsockname()``); run it with ``server.run(sockets=[sock])``. Stopped by SIGINT, SIGTERM
    (both a graceful shutdown: the requests in flight are answered, within :data:`SHUTDOWN_GRACE` seconds; one still
    being read or scored then is cut off, and uvicorn answers it with a plain-text 500; a reward call still running
    :attr:`RewardService.stop_wait` seconds later is abandoned, so that the run returns even when a call hangs; a
    second SIGINT ends the stop at once), ``server.should_exit = True``, or a reward that raises ``SystemExit``
    (:attr:`RewardService.fatal`); every stop, a forced one too, first logs the failures' repeats not yet said
    (:meth:`RepeatedFailures.flush <finecap.serve.service.RepeatedFailures.flush>`). ``token``, ``connections`` and
    ``allowed_hosts``: module docstring."""
    connections = connections or ConnectionLimits()
    protocol = type("RewardServerProtocol", (GuardedH11Protocol,), {
        "header_timeout": connections.header_timeout, "write_timeout": connections.write_timeout,
        "cap": connections.connection_cap(),
        "refused": SaidEvery(logging.WARNING, "reward server: %d connection(s) closed at once: %d are open "
                             "(--max-connections, and %d kept for GET /health)"),
        "late": SaidEvery(logging.INFO, "reward server: %d connection(s) sent no complete request headers within "
                          "%g s (--header-timeout): closed"),
        "unread": SaidEvery(logging.WARNING, "reward server: %d connection(s) read no more of their reply for %g s "
                            "(--write-timeout): aborted, the reply dropped"),
        "invalid": SaidEvery(logging.WARNING, f"reward server: %d request(s) were no valid HTTP/1.1 (uvicorn: "
                             f"{INVALID_REQUEST}): answered 400, their connection closed"),
        "upgrades": SaidEvery(logging.INFO, "reward server: %d request(s) asked to upgrade their connection (an "
                              "Upgrade header), which this server does not: answered over HTTP/1.1")})  # fmt: skip
    app = create_app(service, host=host, token=token, connections=connections, allowed_hosts=allowed_hosts)
    config = uvicorn.Config(app, host=host, port=port, log_config=UVICORN_LOGGING, log_level="warning",
                            access_log=False, lifespan="on", timeout_graceful_shutdown=SHUTDOWN_GRACE,
                            backlog=BACKLOG, http=protocol, ws="none")  # fmt: skip
    server = Server(config)
    server.service = service
    server.said = (protocol.refused, protocol.late, protocol.unread, protocol.invalid, protocol.upgrades)

    def stop() -> None:
        server.should_exit = True

    service.on_fatal = stop
    return server, sock if sock is not None else bind(host, port)
