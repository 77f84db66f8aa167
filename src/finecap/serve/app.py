"""The reward server's HTTP face: a Starlette application over a :class:`~finecap.serve.service.RewardService`, run
by uvicorn (``pip install finecap[serve]``).

Endpoints:

- ``POST /reward``: finecap's request (:func:`finecap.serve.protocol.parse_reward`) ->
  ``{"id": ..., "image_ids": [...], "total": [...], "parts": {"cider": [...], ...}}``: the request's ``id`` and
  image ids (or ``images``) echoed, one total and one value per part for each caption, in order.
- ``POST /get_reward``: OpenRLHF's and CapRL's (:func:`finecap.serve.protocol.parse_get_reward`) ->
  ``{"rewards": [...], "extra_logs": {"cider": [...], ...}}``: the totals, and the parts, which OpenRLHF logs.
- ``GET /health``: ``{"status": "ok", "reward": ..., "images": N, "requests": ..., "captions": ...}``.

A refused request gets ``{"error": {"field": "captions[3]", "message": "..."}}`` with 400 (malformed: bad JSON,
wrong types, unknown images), 413 (beyond the limits: the body, captions per request, characters per caption) or 404
/ 405 (no such endpoint or method); an internal error gets 500 with the same shape; the server goes on serving in
every case. A body is read up to ``max_request_bytes`` and no further (a larger ``Content-Length`` is refused before
reading). Values are sent with Python's ``repr`` of the float32 values, which reads back to the same float32.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from finecap.utils import MissingExtra

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
except ImportError:  # pragma: no cover - the serve extra is in the test extra
    raise MissingExtra("finecap's reward server needs Starlette and uvicorn: pip install 'finecap[serve]'") from None

from finecap.serve.protocol import Limits, RequestError, RewardRequest, decode_json, parse_get_reward, parse_reward
from finecap.serve.service import RewardService, Scored

log = logging.getLogger(__name__)


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload, separators=(",", ":")), status_code=status, media_type="application/json")


async def read_body(request: Request, limits: Limits) -> bytes:
    """The request's body, refused (413) beyond ``limits.max_request_bytes`` before it is all read."""
    limit = limits.max_request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError("body", f"{int(declared):,} bytes exceed the server's limit of {limit:,} "
                           "(--max-request-bytes)", 413)  # fmt: skip
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError("body", f"more than {limit:,} bytes (--max-request-bytes)", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def finecap_reply(request: RewardRequest, scored: Scored) -> dict[str, Any]:
    """The answer of ``POST /reward``."""
    images = "images" if request.by_path else "image_ids"
    return {"id": request.request_id, images: request.image_ids, "total": scored.total, "parts": scored.parts}


def openrlhf_reply(request: RewardRequest, scored: Scored) -> dict[str, Any]:
    """The answer of ``POST /get_reward`` (OpenRLHF reads ``rewards``, and logs ``extra_logs``)."""
    return {"rewards": scored.total, "extra_logs": scored.parts}


def create_app(service: RewardService) -> Starlette:
    """The Starlette application serving ``service`` (its worker runs for the application's lifespan)."""

    def endpoint(parse: Callable[[Any, Limits], RewardRequest], reply: Callable[[RewardRequest, Scored], dict]):
        async def handle(request: Request) -> Response:
            try:
                parsed = parse(decode_json(await read_body(request, service.limits)), service.limits)
                scored = await service.score(service.job(parsed))
            except RequestError as e:
                return _json(e.body(), e.status)
            except Exception as e:  # noqa: BLE001 - the reward's bug: answered 500, logged in the service
                return _json({"error": {"field": None, "message": f"internal error: {type(e).__name__}: {e}"}}, 500)
            return _json(reply(parsed, scored))

        return handle

    async def health(request: Request) -> Response:
        meter = service.meter
        return _json({"status": "ok", "reward": service.name, "images": len(service.images),
                      "requests": meter.total_requests, "captions": meter.total_captions})  # fmt: skip

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _json({"error": {"field": None, "message": f"{request.method} {request.url.path}: {exc.detail}"}},
                     exc.status_code)  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service.running():
            yield
        log.info("%s", service.meter.line(service.name))

    routes = [
        Route("/reward", endpoint(parse_reward, finecap_reply), methods=["POST"]),
        Route("/get_reward", endpoint(parse_get_reward, openrlhf_reply), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)


class Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM is a clean stop: uvicorn re-raises the signal it caught once it has shut down
    gracefully (so that the process dies by it, exit code 143); a reward server its supervisor stops exits 0. SIGINT
    keeps uvicorn's behaviour (a second one forces the exit)."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM:
            self.should_exit = True
            return
        super().handle_exit(sig, frame)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: a free one). Made with ``proto=IPPROTO_TCP``: asyncio sets
    ``TCP_NODELAY`` only on connections accepted by such a socket, and one made with ``proto`` 0 (as uvicorn's own
    ``bind_socket`` makes it) leaves Nagle's algorithm on, so that every small answer waits for the client's delayed
    ACK: 40 ms a request on Linux, measured."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def make_server(service: RewardService, host: str = "127.0.0.1", port: int = 0,
                sock: socket.socket | None = None) -> tuple[Server, socket.socket]:  # fmt: skip
    """The uvicorn server of ``service`` and its socket: ``sock``, or one bound now (:func:`bind`; ``port`` 0: a free
    port, read it from ``sock.getsockname()``); run it with ``server.run(sockets=[sock])``. Stopped by SIGINT, SIGTERM
    (both a graceful shutdown: the requests in flight are answered) or ``server.should_exit = True``."""
    config = uvicorn.Config(create_app(service), host=host, port=port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=30)  # fmt: skip
    return Server(config), sock if sock is not None else bind(host, port)
