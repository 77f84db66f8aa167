"""The ``openai`` backend: any OpenAI-compatible chat-completions server (vLLM, llama.cpp server, Ollama, TGI,
``transformers serve``, OpenAI itself) over HTTP with ``httpx``, retried with ``tenacity``.

``POST {base_url}/chat/completions`` with ``{"model", "messages", "max_tokens", "temperature"}`` and, when sampling
(``temperature > 0``), a ``seed`` of the request's own (:func:`request_seed`: from ``run.seed`` and the task), which
OpenAI's API and vLLM's server read, so that a server's samples repeat as the in-process backends' do (as far as the
server makes them repeatable: OpenAI's are "mostly" so); the answer is ``choices[0].message.content``. For the
``visual`` step the image is sent inline as a base64 data URL in the last user message (``{"type": "image_url",
"image_url": {"url": "data:image/png;base64,..."}}``), which every server above accepts for vision models, before
the text part, as the in-process backends place it
(:func:`finecap.boost.chat.conversation`) and as the paper's VLM, InstructBLIP, reads its instruction after the image.
What is sent is never the file's bytes: the image is decoded (:func:`finecap.data.images.decode_image`: a real image
within the decompression-bomb limit and the task's image budget, ``data.max_image_pixels`` / ``data.max_aspect_ratio``,
EXIF orientation applied) and its RGB pixels re-encoded, as JPEG (quality 95) when
the file was a JPEG and PNG otherwise, with the matching MIME type (:func:`finecap.data.images.encode_image`). A file
that does not decode is a :class:`~finecap.boost.engine.BadImage`: that image fails, nothing is sent. At most
``boost.concurrency`` requests are in flight (a thread pool of that size sharing one connection pool).

What happens to each request:

- **retried** up to ``boost.retries`` times: no connection, a time-out or HTTP 408, 409, 429 and every 5xx but 501,
  505, 506, 508, 510 and 511 (:func:`retried_status`: a 520-524 of a proxy such as Cloudflare, an overloaded 529 and a
  507 too, as OpenAI's own client retries every 5xx; those six say the request cannot be served as it is sent, so they
  fail the image as a 400 does), and an HTTP 200 whose JSON body is an error (``{"error": ...}`` without ``choices``,
  as vLLM and some proxies report a failure: retried as a 500 is). The wait before a retry is the server's when it
  names one (OpenAI's ``retry-after-ms``, in milliseconds, else ``Retry-After``: seconds or an HTTP date;
  :func:`server_wait`) plus a random jitter of up to ``backoff`` seconds; otherwise exponential with jitter
  (``backoff * 2**(n-1)`` plus up to ``backoff``); never more than ``boost.retry_max_wait``. A server asking for longer
  than ``boost.retry_max_wait`` fails the request instead of retrying early. A server's ``x-should-retry`` header
  (OpenAI's, not a standard one) overrides the status: ``false`` fails the request at once, as when its retries are
  spent, ``true`` retries any other failing status (not those below that stop the run). When the retries are spent, an
  unreachable server (no connection, time-outs, 502/503/504, 520-524, 529: :data:`UNAVAILABLE_STATUS`) is
  :class:`~finecap.boost.engine.ServerUnavailable` (the engine stops after ``boost.max_consecutive_failures`` of them
  in a row), a server that answered each attempt with a failure (408, 409, 429, 500, another retried 5xx, an error
  body) a :class:`~finecap.boost.engine.ServerFailing` (a :class:`~finecap.boost.engine.BackendError`: boost fails the
  image; a judge counts it towards ``judge.max_consecutive_failures``). Every other HTTP 429 (not a spent quota's) is
  counted (:attr:`OpenAIBackend.rate_limited`), and the first of each server is logged as a warning naming the wait it
  asked (the header read and the seconds waited, :func:`asked_wait`), ``<section>.retries``, ``retry_max_wait`` and
  ``concurrency``, so that a rate-limited run does not only slow down;
- **stops the run at once**: HTTP 401 or 403 (the key is refused), 404 (wrong URL or model name) and an HTTP 429
  whose error is ``insufficient_quota`` (its ``code`` or ``type``: the account is out of credit, :func:`quota_spent`):
  every further request would fail the same way (:class:`~finecap.boost.engine.FatalBackendError`); and a reply
  naming another ``model`` than the first reply did (a proxy's fallback: :mod:`finecap.boost.served_model`), or than
  the cached answers of an earlier run that the engine uses record (:func:`~finecap.boost.engine.check_cached_models`),
  its answer neither used nor cached; no new request starts after it, and a request not sent or not retried because of
  it is :class:`~finecap.boost.engine.Cancelled` (its image not done, not failed), whatever order the answers of the
  requests in flight arrive in;
- **fails the image**: any other HTTP error (e.g. 400, a prompt too long for the model; a 501 or another of
  :data:`NOT_RETRIED_5XX`);
- **fails the image, as cut off** (:class:`~finecap.boost.engine.CutOff`, unless made with ``refuse_cut_off=False``,
  as the judges are: they parse an answer rather than keep it): an answer whose ``finish_reason`` is ``"length"``,
  stopped at ``max_tokens`` (``boost.max_new_tokens``) before the model ended it;
- **fails the image, not asked again**: a refusal (``choices[0].message.refusal``, as OpenAI's API reports one,
  with or without content) and an answer stopped by the server's content filter (``finish_reason:
  "content_filter"``): the same request would get the same, and what came is no caption;
- **asked again by the engine**: a reply that is not chat-completions JSON
  (:class:`~finecap.boost.engine.MalformedReply`, reported as "not JSON" or "no choices[0].message.content"), and
  a body that does not decode (a broken ``Content-Encoding: gzip``). A content given as a list of parts is read as
  its ``text`` parts joined (others, a reasoning model's ``thinking``, are not the answer).
  A ``finish_reason`` of ``"length"`` is a cut-off answer (above) whatever its content, none included (a reasoning
  model that spent ``max_tokens`` thinking answers ``content: null``).

The time-out (``boost.timeout``, ``judge.timeout``) bounds each step of a request: a server silent for that long
while connecting, sending or between any two reads is a time-out (httpx's time-outs are per step), and so is a reply
body still arriving when the time-out has passed since the request began (checked as each piece arrives: a body
dripped a byte at a time cannot hold a request for ever). Headers sent slowly are not cut off that way, so a request
may take a few times the time-out. A reply over :data:`MAX_REPLY_BYTES` is a malformed reply, read no further. The
body is parsed as JSON from its bytes (UTF-8, -16 or -32, whatever charset the headers claim, as httpx's
``Response.json`` reads it); bytes that are not text are a malformed reply. The API key (of ``MASKED_KEY_LENGTH``
characters or more: a shorter one, such as vLLM's customary ``EMPTY``, is no secret worth changing an answer's words
for) and URL credentials are masked in the answer too: a server that echoes the ``Authorization`` header into its
answer cannot put the key into a caption, a judge's cached answer or a log.

The base URL is checked when the backend is made, before any request: an ``http(s)`` URL with a host. The API key is
read from the environment variable ``boost.<role>_api_key_env`` (``OPENAI_API_KEY`` by default; a variable named
explicitly must be set); it is sent as ``Authorization: Bearer`` and replaced by ``***`` in every error message.
Credentials in the base URL (``https://user:password@host/v1``) are taken out of it and sent as HTTP basic
authentication (:func:`finecap.config.secrets.split_credentials`), so that the URL httpx logs at INFO for every
request carries none, and are masked in every message too (:func:`finecap.config.secrets.masked_url_secrets`).

Why ``httpx`` + ``tenacity`` rather than the ``openai`` package: the request is one POST that httpx makes with a
time-out and a connection pool; ``tenacity`` gives the retry policy (stop, jittered exponential wait, the retry
predicate, an injectable ``sleep``), to which this module adds what the policy must know about HTTP: which statuses
are retried, ``Retry-After``, and which failures end the run. The ``openai`` client also retries and reads
``Retry-After``, but it hides the attempts, its waits cannot be injected in tests, and it would stop neither at the
first 401 across concurrent requests nor after N connection failures in a row.
"""

from __future__ import annotations

import base64
import email.utils
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential_jitter,
)

from finecap.boost.engine import (
    BackendError,
    BadImage,
    Cancelled,
    FatalBackendError,
    MalformedReply,
    ServerFailing,
    ServerUnavailable,
    Task,
    cut_off,
    option_name,
    request_seed,
)
from finecap.boost.served_model import ServedModel
from finecap.config.fields import url_problem
from finecap.config.secrets import masked_reply, masked_url_secrets, split_credentials
from finecap.data.images import DEFAULT_LIMITS, ImageLimits, decode_image, encode_image
from finecap.data.records import DataError

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
RETRIED_4XX = frozenset({408, 409, 429})
"""The HTTP 4xx statuses asked again: a request time-out, a conflict (a lock's), a rate limit (openai-python's)."""
NOT_RETRIED_5XX = {
    501: "Not Implemented",
    505: "HTTP Version Not Supported",
    506: "Variant Also Negotiates",
    508: "Loop Detected",
    510: "Not Extended",
    511: "Network Authentication Required",
}
"""The HTTP 5xx statuses never asked again (:func:`retried_status`): they say that the request cannot be served as it
is sent, however often: what it asks is not implemented (vLLM answers 501 to a request using what it lacks), or the
protocol, a server's or proxy's set-up or a network's login stands in the way. The image fails, as on a 400."""
UNAVAILABLE_STATUS = frozenset({502, 503, 504, 520, 521, 522, 523, 524, 529})
"""The retried statuses that say the server could not be reached or take the request: a gateway's or proxy's 502,
503, 504, Cloudflare's 520-524 (its origin server answered nothing it could read, is down, could not be reached or
timed out) and 529 (overloaded, as Anthropic's API answers); after the retries a
:class:`~finecap.boost.engine.ServerUnavailable`, and any other retried status a
:class:`~finecap.boost.engine.ServerFailing`."""
FATAL_STATUS = {
    401: "the server refused the API key",
    403: "the API key may not use this model or server",
    404: "no such endpoint or model (check the base URL, which usually ends in /v1, and the model name)",
}
"""HTTP statuses that stop the run at once: every further request would get the same."""
QUOTA_SPENT = "the account's quota is spent (insufficient_quota: check its plan and billing; retrying cannot help)"
"""Why an HTTP 429 that says ``insufficient_quota`` stops the run at once (:func:`quota_spent`)."""


MAX_REPLY_BYTES = 8 * 2**20
"""The largest reply read (8 MiB; a chat answer of 32,768 tokens is about 150 kB): a larger one is a malformed reply,
asked again, never held whole in memory."""
MASKED_KEY_LENGTH = 8
"""An API key this long or longer is masked in answers as in messages (module docstring)."""


def image_data_url(path: str | Path, limits: ImageLimits = DEFAULT_LIMITS) -> str:
    """``data:<mime>;base64,<bytes>`` of the image file at ``path`` decoded within the image budget ``limits`` and
    re-encoded (module docstring), never of its bytes; :class:`~finecap.boost.engine.BadImage` naming the file when it
    is not an image finecap reads."""
    try:
        image, fmt = decode_image(path, limits)
    except DataError as e:
        raise BadImage(str(e)) from None
    data, mime = encode_image(image, fmt)
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def with_image(
    messages: list[dict[str, Any]], image: str | Path, limits: ImageLimits = DEFAULT_LIMITS
) -> list[dict[str, Any]]:
    """``messages`` with the image (read within the image budget ``limits``) attached to the last user message
    (OpenAI content-parts format), before its text (module docstring)."""
    out = [dict(m) for m in messages]
    last = out[-1]
    last["content"] = [{"type": "image_url", "image_url": {"url": image_data_url(image, limits)}},
                       {"type": "text", "text": last["content"]}]  # fmt: skip
    return out


def retried_status(status: int) -> bool:
    """Whether a reply of HTTP ``status`` is asked again (module docstring): 408, 409, 429 (:data:`RETRIED_4XX`) and
    every 5xx, as openai-python's client retries them (a proxy's 520-524, an overloaded 529, a 507 are as passing as a
    500), but the :data:`NOT_RETRIED_5XX`, which a retry cannot change. A server's ``x-should-retry`` overrides it
    (:func:`should_retry`).

    Example::

        >>> [s for s in (400, 408, 429, 500, 501, 503, 505, 507, 511, 520, 524, 529, 599) if retried_status(s)]
        [408, 429, 500, 503, 507, 520, 524, 529, 599]
    """
    return status in RETRIED_4XX or (500 <= status <= 599 and status not in NOT_RETRIED_5XX)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay seconds or an HTTP date; RFC 9110 10.2.3) at time
    ``now`` (Unix seconds); ``None`` when absent or unreadable.

    Example::

        >>> parse_retry_after("7", now=0.0)
        7.0
        >>> parse_retry_after("Thu, 01 Jan 1970 00:00:30 GMT", now=12.0)
        18.0
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def server_wait(headers: httpx.Headers, now: float) -> float | None:
    """Seconds a reply's ``headers`` ask to wait before a retry at time ``now`` (Unix seconds): OpenAI's
    ``retry-after-ms`` (milliseconds) when it is a number, as OpenAI's own client prefers it, else ``Retry-After``
    (:func:`parse_retry_after`); ``None`` when neither says.

    Example::

        >>> server_wait(httpx.Headers({"retry-after-ms": "1500", "Retry-After": "2"}), now=0.0)
        1.5
        >>> server_wait(httpx.Headers({"retry-after-ms": "soon", "Retry-After": "2"}), now=0.0)
        2.0
    """
    named = asked_wait(headers, now)
    return None if named is None else named[1]


def asked_wait(headers: httpx.Headers, now: float) -> tuple[str, float | None] | None:
    """The header a reply's ``headers`` ask a wait in, as :func:`server_wait` reads them, and its seconds at time
    ``now`` (``None``: unreadable, so the backoff's wait): ``retry-after-ms`` when it is a number, else
    ``Retry-After``; ``None`` when neither is there.

    Example::

        >>> asked_wait(httpx.Headers({"retry-after-ms": "1500", "Retry-After": "2"}), now=0.0)
        ('retry-after-ms', 1.5)
        >>> asked_wait(httpx.Headers({"Retry-After": "soon"}), now=0.0), asked_wait(httpx.Headers(), now=0.0)
        (('Retry-After', None), None)
    """
    try:
        return "retry-after-ms", max(0.0, float(headers.get("retry-after-ms", "").strip())) / 1000
    except ValueError:
        if "Retry-After" not in headers:
            return None
        return "Retry-After", parse_retry_after(headers.get("Retry-After"), now)


def should_retry(headers: httpx.Headers) -> bool | None:
    """What a reply's ``x-should-retry`` header says (``true`` or ``false``, as OpenAI's API sends it): whether the
    server says a retry may succeed; ``None`` without one."""
    return {"true": True, "false": False}.get(headers.get("x-should-retry", "").strip().lower())


def quota_spent(raw: bytes) -> bool:
    """Whether an HTTP 429's body ``raw`` says the account is out of credit (OpenAI's ``{"error": {"code":
    "insufficient_quota", "type": "insufficient_quota", ...}}``, either field): no retry can succeed.

    Example::

        >>> quota_spent(b'{"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}')
        True
        >>> quota_spent(b'{"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}')
        False
    """
    try:
        body = json.loads(raw)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and "insufficient_quota" in (error.get("code"), error.get("type"))


class _Retry(Exception):
    """A failed attempt worth retrying; ``unavailable`` when the server could not be reached."""

    def __init__(self, message: str, *, unavailable: bool, retry_after: float | None = None,
                 status: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.unavailable, self.retry_after, self.status = unavailable, retry_after, status


def check_base_url(url: str, key: str) -> None:
    """``ValueError`` naming ``key`` unless ``url`` is an http(s) URL with a host, no white space (the rule of every
    URL option, :func:`~finecap.config.fields.url_problem`: ``OPENAI_BASE_URL`` is read here, past the options'
    checks) and no ``?query`` or ``#fragment``: ``/chat/completions`` is appended to it, which would land inside them
    (and a key given as ``?api_key=`` would reach the URL httpx logs at INFO; keys go in ``*_api_key_env``)."""
    problem = url_problem(url)
    if problem:
        raise ValueError(masked_url_secrets(f"{key}: {problem}"))
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as e:
        raise ValueError(f"{key}={masked_url_secrets(url)!r}: malformed URL ({masked_url_secrets(str(e))})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"{key}={masked_url_secrets(url)!r}: not an http(s) URL with a host; e.g. http://localhost:8000/v1"
        )
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        raise ValueError(
            f"{key}={masked_url_secrets(url)!r}: a base URL takes no ?query or #fragment (finecap appends "
            "/chat/completions to it); give the API key by its *_api_key_env variable, e.g. http://localhost:8000/v1"
        )


def check_api_key(api_key: str, option: str) -> None:
    """``ValueError`` naming ``option`` (never the key) unless ``api_key`` can be sent as ``Authorization: Bearer``:
    visible ASCII only. A key with a line break (a ``.env`` file saved with CRLF ends its values with ``\\r``), a
    space, a control or a non-ASCII character would fail every request, and httpx's error would print the header with
    its escapes (``\\r`` written as two characters), which the key's masking does not recognise.

    Example::

        >>> check_api_key("sk-0123456789", "boost.llm_api_key_env")  # fine: nothing said
        >>> try:
        ...     check_api_key("sk-0123456789\\r", "boost.llm_api_key_env")
        ... except ValueError as e:
        ...     print(str(e).split(" (")[0], "|", str(e).split(") ")[1].split(";")[0])
        boost.llm_api_key_env: the API key holds a character an HTTP header cannot carry | at position 14 of 14
    """
    bad = next((i for i, c in enumerate(api_key) if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(
            f"{option}: the API key holds a character an HTTP header cannot carry (a line break, space, control or "
            f"non-ASCII character) at position {bad + 1} of {len(api_key)}; correct the variable or file it comes "
            "from (the key is not shown)"
        )


def api_key_from_env(variable: str, key: str, explicit: bool) -> str:
    """The API key in environment ``variable``; ``""`` when unset, unless the variable was named explicitly (then a
    ``ValueError`` naming ``key``)."""
    value = os.environ.get(variable, "")
    if not value and explicit:
        raise ValueError(f"{key}={variable}: the environment variable {variable} is not set (export it first)")
    return value


def _text_of(content: Any) -> Any:
    """A message's content as text: a string as it is; a list of content parts (``[{"type": "text", "text": ...},
    ...]``, which some OpenAI-compatible servers send) as its text parts joined, when it has one (a part of another
    type, a reasoning model's ``thinking``, is not the answer); anything else as it is (a malformed reply)."""
    if isinstance(content, list) and content and all(isinstance(p, dict) for p in content):
        texts = [p["text"] for p in content if p.get("type") == "text" and isinstance(p.get("text"), str)]
        return "".join(texts) if texts else content
    return content


class Stop:
    """The stop of the requests of one backend, or of several sharing it (a judge's servers): once :meth:`set`, no
    request is sent (:class:`~finecap.boost.engine.Cancelled`), none is retried, and a wait between attempts (the
    default ``sleep``'s) ends at once. ``reason``: the first reason given (a refusal's message), for whoever stops on
    another request's error (:class:`~finecap.judges.openai.OpenAIJudge` names it as that request did)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.reason = ""

    def set(self, reason: str) -> None:
        """Stop; the first ``reason`` given is kept."""
        with self._lock:
            self.reason = self.reason or reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds``, or until the stop is set; whether it is."""
        return self._event.wait(seconds)

    def clear(self) -> None:
        """Go on again (:meth:`OpenAIBackend.run` ends so: boost's next step), the reason forgotten."""
        with self._lock:
            self.reason = ""
            self._event.clear()


class OpenAIBackend:
    """Chat completions on an OpenAI-compatible server (module docstring).

    ``sleep``, ``clock`` and ``transport`` are injectable so that tests of waits and time-outs need no real time:
    ``sleep`` waits between attempts (default: a wait the run's stop interrupts), ``clock`` gives the time
    ``Retry-After`` dates are read against (default ``time.time``), ``transport`` answers the HTTP requests (default:
    httpx's network transport; an ``httpx.MockTransport`` can play a slow server on a fake clock, raising
    ``httpx.ReadTimeout`` when the request's ``timeout`` extension is shorter than the server's delay).
    ``refuse_cut_off``: an answer cut off at ``max_tokens`` is a :class:`~finecap.boost.engine.CutOff` (module
    docstring); ``False`` returns it as it came. ``served``: the check of the model each reply names (its
    ``"model"``, when a non-empty string; masked as the answer is), made before its answer is returned
    (:class:`~finecap.boost.served_model.ServedModel`: a reply naming another model than the first stops the run);
    by default one of this backend's own, naming ``<key>_model``; the judge shares one among its servers. ``stop``:
    the :class:`Stop` of its requests (by default its own), which a refusal sets; the judge shares one among its
    servers, and sets it when it stops, so that its calls in flight end at their next attempt or wait (it asks through
    :meth:`complete` alone: :meth:`run` clears the stop when it ends). Boost's
    engine reads it (:class:`~finecap.boost.engine.ServedCheck`): the model its cache lines and ``boost.json`` record,
    and the one a resumed run's cached answers record, told to it before any request.

    Messages name the options the user set: ``key`` is boost's role (``boost.llm``: ``boost.llm_model``,
    ``boost.llm_api_key_env``, ...) or a section (``judge``: ``judge.model``, ``judge.api_key_env``, ...), and
    ``url_option`` the option ``base_url`` came from (``<key>_base_url`` by default; the judge's is ``judge.urls``).
    """

    def __init__(
        self,
        model: str,
        base_url: str = "",
        api_key: str = "",
        *,
        concurrency: int = 8,
        timeout: float = 120.0,
        retries: int = 3,
        max_tokens: int = 120,
        temperature: float = 0.0,
        seed: int = 0,
        backoff: float = 1.0,
        max_wait: float = 60.0,
        key: str = "boost.llm",
        url_option: str = "",
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
        refuse_cut_off: bool = True,
        served: ServedModel | None = None,
        stop: Stop | None = None,
    ) -> None:
        if not model:
            raise ValueError(f"{option_name(key, 'model')}: the openai backend needs the served model name")
        self.model = model
        url_option = url_option or option_name(key, "base_url")
        url_key = url_option if base_url else f"OPENAI_BASE_URL (environment, {url_option} empty)"
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        check_base_url(base_url, url_key)
        # in messages: the URL as given, its credentials masked (http://***@host/v1/chat/completions)
        self.shown_url = masked_url_secrets(f"{base_url.rstrip('/')}/chat/completions")
        base_url, credentials = split_credentials(base_url)  # sent as basic auth: httpx logs the URL it requests
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self._api_key = api_key or os.environ.get("OPENAI_API_KEY", "")
        check_api_key(self._api_key, option_name(key, "api_key_env"))
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self.concurrency, self.retries, self.backoff, self.max_wait = concurrency, retries, backoff, max_wait
        self.timeout = timeout
        self.section = key.split(".")[0]  # boost or judge: the section whose options are named in messages
        self.max_tokens, self.temperature, self.refuse_cut_off = max_tokens, temperature, refuse_cut_off
        self.seed = seed
        self.served = served or ServedModel(
            model, option_name(key, "model"), who=key,
            advice=f"two models behind {url_option} (a proxy's fallback) would cache one model's answers as "
            "another's; serve one model and re-run: the answers this run cached so far are the first's",
        )  # fmt: skip
        self.key = key
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.Client(headers=headers, auth=credentials, timeout=timeout, limits=limits,
                                   transport=transport)  # fmt: skip
        self._stop = stop if stop is not None else Stop()
        self._sleep = sleep or (lambda seconds: self._stop.wait(seconds))
        self._clock = clock
        self._exponential = wait_exponential_jitter(initial=backoff, max=max_wait, jitter=backoff)
        self._lock = threading.Lock()
        self.requests_sent = 0
        self.rate_limited = 0  # replies of HTTP 429, a spent quota's not (module docstring: the first is logged)

    def identity(self) -> dict[str, Any]:
        """Model and generation settings, not the URL: a resumed run may reach the same model at another address;
        when it samples (``temperature > 0``) also ``seed`` (``run.seed``), which decides the requests' seeds."""
        return {"backend": "openai", "model": self.model, "max_tokens": self.max_tokens,
                "temperature": self.temperature,
                **({"seed": self.seed} if self.temperature > 0 else {})}  # fmt: skip

    def payload(self, task: Task) -> dict[str, Any]:
        """The request's JSON body (module docstring): a ``seed`` of its own (:func:`request_seed`) when sampling."""
        messages = with_image(task.messages, task.image, task.limits) if task.image is not None else task.messages
        return {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature,
                **({"seed": request_seed(self.seed, task)} if self.temperature > 0 else {})}  # fmt: skip

    def redact(self, text: str) -> str:
        """``text`` with the API key replaced by ``***`` (servers may echo it in errors), the credentials of the
        URLs in it masked (:func:`~finecap.config.secrets.masked_url_secrets`: the server's own URL may hold some)
        and those of an echoed ``Authorization`` header (:func:`~finecap.config.secrets.masked_authorization`: the
        basic authentication of the URL's ``user:password@``, in base64)."""
        return masked_reply(text.replace(self._api_key, "***") if self._api_key else text)

    def masked_answer(self, text: str) -> str:
        """An answer as it is used: the API key masked when it has ``MASKED_KEY_LENGTH`` characters or more, URL
        credentials masked (module docstring)."""
        return self.redact(text) if len(self._api_key) >= MASKED_KEY_LENGTH else masked_url_secrets(text)

    def wait(self, state: RetryCallState) -> float:
        """Seconds before the next attempt: the server's wait (:func:`server_wait`) plus jitter, else jittered
        exponential backoff; never more than ``retry_max_wait``."""
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _Retry) and error.retry_after is not None:
            return min(error.retry_after + random.uniform(0, self.backoff), self.max_wait)
        return self._exponential(state)

    def attempt(self, payload: dict[str, Any]) -> str:
        """One POST; the answer text, or an exception saying whether and how to go on."""
        if self._stop.is_set():
            raise Cancelled("not sent: the run is stopping")
        with self._lock:
            self.requests_sent += 1
        deadline = time.monotonic() + self.timeout
        try:
            with self.client.stream("POST", self.url, json=payload) as response:
                raw = self._read_before(response, deadline)
        except httpx.TransportError as e:  # no connection, time-outs, a connection cut mid-reply
            raise _Retry(f"{type(e).__name__}: {self.redact(str(e))}", unavailable=True) from None
        except httpx.DecodingError as e:  # a compressed reply that does not decode (a broken gzip body)
            raise MalformedReply(f"the reply's body does not decode ({self.redact(str(e))[:200]})") from None
        status = response.status_code
        # for messages: masked before it is cut, so that a key (or URL) the cut falls inside leaks no prefix of itself;
        # the first 300 characters lie within the first 1200 bytes, a key starting among them within its length more
        head = raw[: 1200 + len(self._api_key)].decode(response.encoding or "utf-8", errors="replace")
        shown = self.redact(head)[:300]
        fatal = FATAL_STATUS.get(status) or (QUOTA_SPENT if status == 429 and quota_spent(raw) else None)
        if fatal:
            refused = FatalBackendError(
                f"{self.shown_url}: HTTP {status}: {fatal} ({option_name(self.key, '*')}); the server said: {shown}"
            )
            self._stop.set(str(refused))  # no new request starts
            raise refused
        if status == 429:
            self._note_rate_limit(response)
        if retried_status(status) or (status >= 400 and should_retry(response.headers)):
            raise self._retry(response, f"HTTP {status}: {shown[:200]}", unavailable=status in UNAVAILABLE_STATUS)
        if status >= 400:
            raise BackendError(f"{self.shown_url}: HTTP {status}: {shown}")
        try:
            body = json.loads(raw)  # JSON's own encoding detection, as httpx's Response.json; not the charset header
        except ValueError:  # UnicodeDecodeError too
            raise MalformedReply(f"HTTP {status} but the reply is not JSON: {shown[:200]!r}") from None
        if isinstance(body, dict) and body.get("error") is not None and not body.get("choices"):
            # a failure reported with HTTP 200 (vLLM, some proxies): retried as a 500 is, after the same waits
            raise self._retry(response, f"HTTP {status} with an error body: {shown[:200]}", unavailable=False)
        try:
            choice = body["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            choice = message = None
        content = _text_of(message.get("content")) if isinstance(message, dict) else None
        refusal = message.get("refusal") if isinstance(message, dict) else None
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        if isinstance(refusal, str) and refusal.strip():  # asked again, the same request would be refused again
            raise BackendError(f"{self.shown_url}: the model refused to answer: {self.masked_answer(refusal)[:200]!r}")
        if finish == "content_filter":  # what came is not the model's whole answer
            raise BackendError(f"{self.shown_url}: the server's content filter stopped the answer (finish_reason "
                               f"'content_filter'): {self.masked_answer(str(content or ''))[:200]!r}")  # fmt: skip
        if self.refuse_cut_off and finish == "length":  # also with no text: a reasoning model's budget spent
            text = content if isinstance(content, str) else ""
            raise cut_off(self.masked_answer(text), self.max_tokens, "finish_reason 'length'")
        if not isinstance(content, str):
            raise MalformedReply(f"the reply has no choices[0].message.content text: {self.redact(str(body))[:200]}")
        served = body.get("model") if isinstance(body, dict) else None
        if isinstance(served, str) and served:
            try:  # masked as the answer: a server echoing the key puts it nowhere
                self.served.check(self.masked_answer(served))
            except FatalBackendError as e:
                self._stop.set(str(e))  # another model answers: no new request starts, as after a 401
                raise
        return self.masked_answer(content)

    def _retry(self, response: httpx.Response, message: str, *, unavailable: bool) -> _Retry:
        """The retry of an attempt the server answered with a failure (``message``), waiting as the server asks
        (:func:`server_wait`, :meth:`wait`); raised at once (module docstring) when the server asks for longer than
        ``retry_max_wait`` or says ``x-should-retry: false``: a :class:`~finecap.boost.engine.ServerUnavailable` for
        :data:`UNAVAILABLE_STATUS`, else a :class:`~finecap.boost.engine.ServerFailing`."""
        retry_after = server_wait(response.headers, self._clock())
        why = ""
        if should_retry(response.headers) is False:
            why = f"{self.shown_url}: {message}; the server says not to retry (x-should-retry: false)"
        elif retry_after is not None and retry_after > self.max_wait:
            why = (f"{self.shown_url}: {message}; the server asks to retry after {retry_after:g} s, more than "
                   f"{self.section}.retry_max_wait={self.max_wait:g}")  # fmt: skip
        if why:
            raise ServerUnavailable(why) if unavailable else ServerFailing(why, status=response.status_code)
        return _Retry(message, unavailable=unavailable, retry_after=retry_after, status=response.status_code)

    def _note_rate_limit(self, response: httpx.Response) -> None:
        """Count a reply of HTTP 429 (:attr:`rate_limited`); the first of this server is logged as a warning naming
        the options that decide what comes of it (module docstring)."""
        with self._lock:
            self.rate_limited += 1
            first = self.rate_limited == 1
        if first:
            log.warning(
                "%s: HTTP 429, the server rate-limits %s's requests (%s); each is retried up to %s.retries=%d times, "
                "waiting at most %s.retry_max_wait=%g s, then fails; lower %s.concurrency=%d if it goes on (logged "
                "once per server)", self.shown_url, self.section, self._asked_wait(response), self.section,
                self.retries, self.section, self.max_wait, self.section, self.concurrency,
            )  # fmt: skip

    def _asked_wait(self, response: httpx.Response) -> str:
        """The wait ``response`` asks, for a message: the header it is read from (:func:`asked_wait`), as sent, and
        the seconds the retry waits for it (``retry-after-ms: 1500, a wait of 1.5 s``)."""
        named = asked_wait(response.headers, self._clock())
        if named is None:
            return "no Retry-After or retry-after-ms: the backoff's wait"
        header, seconds = named
        said = f"{header}: {self.redact(response.headers[header])[:40]}"
        if seconds is None:
            return f"{said}, unreadable: the backoff's wait"
        if seconds > self.max_wait:
            return f"{said}, a wait of {seconds:g} s, more than {self.section}.retry_max_wait: not retried"
        return f"{said}, a wait of {seconds:g} s"

    def _read_before(self, response: httpx.Response, deadline: float) -> bytes:
        """The reply's bytes, an ``httpx.ReadTimeout`` when they are still arriving at ``deadline`` (module
        docstring: the time-out bounds the whole request)."""
        pieces, size = [], 0
        for piece in response.iter_bytes():
            pieces.append(piece)
            size += len(piece)
            if size > MAX_REPLY_BYTES:
                raise MalformedReply(f"the reply is over {MAX_REPLY_BYTES // 2**20} MiB (not a chat answer); read no "
                                     "further")  # fmt: skip
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout(
                    f"the reply was still arriving after {self.timeout:g} s ({self.section}.timeout)",
                    request=response.request,
                )
        return b"".join(pieces)

    def complete(self, task: Task) -> str:
        """One request with its retries (module docstring)."""
        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1) | stop_when_event_set(self._stop),
            wait=self.wait,
            retry=retry_if_exception_type(_Retry),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            return retrying(self.attempt, self.payload(task))
        except Cancelled:
            if retrying.statistics.get("attempt_number", 1) == 1:
                raise
            raise Cancelled("not retried: the run is stopping", sent=True) from None  # an earlier attempt went out
        except _Retry as e:
            if self._stop.is_set():  # retries cut short by the stop: not this request's failure
                raise Cancelled(f"not retried: the run is stopping (last error {e})", sent=True) from None
            n = retrying.statistics.get("attempt_number", self.retries + 1)
            why = f"{self.shown_url}: gave up after {n} attempt(s); last error {e}"
            raise ServerUnavailable(why) if e.unavailable else ServerFailing(why, status=e.status) from None

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        """``(position, answer or exception)`` as the requests complete, ``concurrency`` at a time. A Ctrl-C while
        waiting for answers sends nothing more but hands over the answers of the requests in flight (the engine
        caches them; a second Ctrl-C drops them), then raises ``KeyboardInterrupt``."""
        pool = ThreadPoolExecutor(max_workers=self.concurrency)
        done = False
        try:
            futures = {pool.submit(self.complete, t): i for i, t in enumerate(tasks)}
            handed: set[Future] = set()
            try:
                yield from _outcomes(futures, handed)
            except KeyboardInterrupt:
                self._stop.set("interrupted")  # the requests not yet sent end as Cancelled at once
                in_flight = sum(f.running() for f in futures)
                log.warning("interrupted: waiting for the %d request(s) in flight to keep their answers (Ctrl-C "
                            "again to drop them)", in_flight)  # fmt: skip
                yield from _outcomes(futures, handed)
                raise
            done = True
        finally:
            if not done:  # the engine stopped early (or a kill): send nothing more, wake retries from their wait
                self._stop.set("the run is stopping")
            pool.shutdown(wait=True, cancel_futures=True)
            self._stop.clear()

    def close(self) -> None:
        self.client.close()


def _outcomes(futures: dict[Future, int], handed: set[Future]) -> Iterator[tuple[int, str | BaseException]]:
    """``(position, answer or exception)`` of each future of ``futures`` not in ``handed`` as it completes; each is
    added to ``handed`` (so that a second call after an interrupt hands over only the others)."""
    for future in as_completed([f for f in futures if f not in handed]):
        handed.add(future)
        try:
            outcome: str | BaseException = future.result()
        except Exception as e:  # noqa: BLE001 - every failure goes to the engine, which logs or stops
            outcome = e
        yield futures[future], outcome
