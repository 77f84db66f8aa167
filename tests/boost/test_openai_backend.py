"""The openai backend against a real local HTTP server speaking chat completions: request format, images as base64
data URLs, the concurrency limit, retries on HTTP 500 and time-outs, malformed answers (engine retries, then the
failure log with the human captions kept)."""

import base64
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from finecap.boost.chat import conversation
from finecap.boost.engine import (
    AnswerCache,
    Cancelled,
    FailureBudget,
    FatalBackendError,
    ServerUnavailable,
    Task,
    boost_records,
    run_step,
)
from finecap.boost.openai_backend import OpenAIBackend
from finecap.boost.prompts import Prompts
from finecap.data.records import Record
from helpers.chat_server import ChatServer, completion, echo_first_caption


def _records(tmp_path: Path, n: int) -> list[Record]:
    out = []
    for i in range(n):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (8, 8), (i * 20 % 256, 0, 0)).save(path)
        out.append(Record(i, path, "test", [f"caption {i} a", f"caption {i} b"]))
    return out


def _tasks(records: list[Record], step: str = "blend") -> list[Task]:
    prompts = Prompts.load()
    return [
        Task(i, r, step, prompts.messages(step, few_shot=False, captions=r.captions), {"captions": r.captions})
        for i, r in enumerate(records)
    ]


def blended(answer, records: list[Record], tmp_path: Path, **options) -> tuple[Any, ChatServer]:
    """The blend step of ``records`` (2 retries) against a :class:`ChatServer` answering ``answer``, through an
    :class:`OpenAIBackend` of ``options``, with its answer cache in ``tmp_path``: the result and the server."""
    with ChatServer(answer) as server:
        backend = OpenAIBackend("m", server.url, backoff=0.01, **options)
        cache = AnswerCache(tmp_path / "cache.jsonl")
        result = boost_records(records, "blend", backend, None, cache, Prompts.load(), few_shot=False, retries=2,
                               progress=False)  # fmt: skip
        cache.close()
    return result, server


def test_request_format_and_image_data_url(tmp_path):
    records = _records(tmp_path, 2)
    with ChatServer() as server:
        backend = OpenAIBackend("my-llm", server.url, "sk-test", max_tokens=50, temperature=0.0)
        answers = dict(backend.run(_tasks(records[:1]) + [_tasks(records, "visual")[1]]))
    assert answers == {0: "boosted caption 0 a", 1: "described"}
    by_step = {("image_url" in str(r["payload"])): r for r in server.requests}
    text_req, image_req = by_step[False], by_step[True]
    assert text_req["path"] == "/v1/chat/completions"
    assert text_req["headers"]["Authorization"] == "Bearer sk-test"
    payload = text_req["payload"]
    assert payload["model"] == "my-llm" and payload["max_tokens"] == 50 and payload["temperature"] == 0.0
    assert [m["role"] for m in payload["messages"]] == ["system", "user"]
    assert "- caption 0 a\n- caption 0 b" in payload["messages"][-1]["content"]
    parts = image_req["payload"]["messages"][-1]["content"]
    # the image before the text, as the in-process backends (chat.conversation) and InstructBLIP place it: it came
    # after the text, so a VLM whose template keeps the parts' order was prompted otherwise through a server
    assert [p["type"] for p in parts] == ["image_url", "text"]
    assert [p["type"] for p in conversation(_tasks(records, "visual")[1], None)[-1]["content"]] == ["image", "text"]
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == (tmp_path / "1.png").read_bytes()


def test_api_key_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    with ChatServer() as server:
        backend = OpenAIBackend("m", server.url)
        list(backend.run(_tasks(_records(tmp_path, 1))))
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-env"


def test_concurrency_is_bounded(tmp_path):
    records = _records(tmp_path, 12)
    # The first three requests wait for each other (a barrier, not a race against the clock): the limit is used
    # however slowly the threads start. The 0.15 s each request then takes gives a fourth concurrent one, were the
    # client to send it, time to show in max_in_flight.
    first_three, arrived, lock = threading.Barrier(3, timeout=60), [], threading.Lock()

    def answer(payload, n):
        with lock:
            arrived.append(1)
            held = len(arrived) <= 3
        if held:
            first_three.wait()
        return echo_first_caption(payload, n)

    with ChatServer(answer, delay=0.15) as server:
        backend = OpenAIBackend("m", server.url, concurrency=3)
        start = time.perf_counter()
        answers = dict(backend.run(_tasks(records)))
        elapsed = time.perf_counter() - start
    assert len(answers) == 12
    assert server.max_in_flight == 3  # never more than boost.concurrency, and the limit is used
    assert elapsed >= 4 * 0.15  # 12 requests, 3 at a time, 0.15 s each: at least 4 rounds


def test_retries_on_500(tmp_path):
    records = _records(tmp_path, 4)

    def flaky(payload, n):
        if "caption 0 a" in payload["messages"][-1]["content"] and n < 2:
            return 500, {"error": "overloaded"}  # two 500s, then success
        return echo_first_caption(payload, n)

    waits = []
    with ChatServer(flaky) as server:
        backend = OpenAIBackend("m", server.url, retries=3, backoff=0.01, concurrency=4, sleep=waits.append)
        answers = dict(backend.run(_tasks(records)))
    assert answers == {i: f"boosted caption {i} a" for i in range(4)}
    assert backend.requests_sent == len(server.requests) == 4 + 2  # one per task, two retries after the 500s
    assert len(waits) == 2


class SlowServer:
    """A chat server played by an ``httpx.MockTransport`` on a fake clock: ``delay(payload, n)`` is how many (fake)
    seconds the ``n``-th request with that payload takes. When that is longer than the request's read time-out (the
    ``timeout`` extension httpx gives every request from the client's ``timeout``), the clock advances by the
    time-out and ``httpx.ReadTimeout`` is raised, as the network transport would; otherwise it advances by the delay
    and the server answers. ``sleep`` advances the clock too, so nothing here waits in real time."""

    def __init__(self, delay):
        self.delay, self.now, self.seen, self.timeouts = delay, 0.0, Counter(), 0
        self.transport = httpx.MockTransport(self.handle)

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def handle(self, request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.content)
        key = json.dumps(payload, sort_keys=True)
        n, self.seen[key] = self.seen[key], self.seen[key] + 1
        delay, limit = self.delay(payload, n), request.extensions["timeout"]["read"]
        if delay > limit:
            self.now += limit
            self.timeouts += 1
            raise httpx.ReadTimeout("timed out", request=request)
        self.now += delay
        status, body = echo_first_caption(payload, n)
        return httpx.Response(status, json=body)


def test_retries_after_a_time_out_on_a_fake_clock(tmp_path):
    records = _records(tmp_path, 4)

    def delay(payload, n):
        if "caption 1 a" in payload["messages"][-1]["content"] and n == 0:
            return 1.0  # longer than the client's time-out, once
        return 0.3  # slow, but within it: not retried

    server = SlowServer(delay)
    backend = OpenAIBackend("m", "http://llm.test/v1", timeout=0.4, retries=3, backoff=0.01, concurrency=1,
                            sleep=server.sleep, transport=server.transport)  # fmt: skip
    answers = dict(backend.run(_tasks(records)))
    assert answers == {i: f"boosted caption {i} a" for i in range(4)}
    assert backend.requests_sent == 4 + 1 and server.timeouts == 1  # one per task, one retry after the time-out
    # four answers of 0.3 s, one time-out of 0.4 s, one jittered wait of at most backoff * 2 before the retry
    assert 4 * 0.3 + 0.4 + 0.01 <= server.now <= 4 * 0.3 + 0.4 + 0.02 + 1e-9


def test_a_time_out_on_every_attempt_gives_up_as_server_unavailable(tmp_path):
    server = SlowServer(lambda payload, n: 5.0)
    backend = OpenAIBackend("m", "http://llm.test/v1", timeout=0.4, retries=2, backoff=0.0, sleep=server.sleep,
                            transport=server.transport)  # fmt: skip
    ((_, answer),) = list(backend.run(_tasks(_records(tmp_path, 1))))
    assert isinstance(answer, ServerUnavailable) and "gave up after 3 attempt(s)" in str(answer), answer
    assert "ReadTimeout" in str(answer) and server.timeouts == 3 and server.now == 3 * 0.4


def test_gives_up_after_retries(tmp_path):
    with ChatServer(lambda p, n: (503, {"error": "down"})) as server:
        backend = OpenAIBackend("m", server.url, retries=2, backoff=0.01)
        ((_, answer),) = list(backend.run(_tasks(_records(tmp_path, 1))))
    assert isinstance(answer, RuntimeError) and "HTTP 503" in str(answer)
    assert len(server.requests) == 3


def test_malformed_answers_retried_then_logged_with_human_captions_kept(tmp_path):
    records = _records(tmp_path, 3)

    def answer(payload, n):
        text = payload["messages"][-1]["content"]
        if "caption 0 a" in text and n == 0:
            return 200, completion("   ")  # empty once, then fine
        if "caption 1 a" in text and n == 0:
            return 200, "this is not json"  # not chat-completions JSON once, then fine
        if "caption 2 a" in text:
            return 200, {"choices": []}  # always malformed
        return echo_first_caption(payload, n)

    result, server = blended(answer, records, tmp_path)
    assert [f["blend"] for f in result.fields] == [
        ["boosted caption 0 a"],
        ["boosted caption 1 a"],
        records[2].captions,
    ]
    (failure,) = result.failures
    assert (failure.image_id, failure.step, failure.attempts) == (2, "blend", 3)
    assert failure.error.startswith("malformed reply: the reply has no choices[0].message.content text")
    # Round 1: all three malformed; round 2: 0 and 1 answer, 2 malformed again; round 3 (last retry): 2 malformed.
    assert len(server.requests) == 3 + 3 + 1
    assert result.requested == {"blend": 3 + 3 + 1}
    # Accepted answers are cached; a second run asks only for the failed image.
    with ChatServer(echo_first_caption) as server:
        cache = AnswerCache(tmp_path / "cache.jsonl")
        step = run_step("blend", _tasks(records), OpenAIBackend("m", server.url), cache, 0, progress=False)
        cache.close()
    assert step.sent == 1 and step.cached == 2 and not step.failures and step.answers[2] == "boosted caption 2 a"


def test_retry_after_seconds_is_honoured_with_jitter(tmp_path):
    waits: list[float] = []

    def busy_once(payload, n):
        return (429, {"error": "rate limited"}, {"Retry-After": "7"}) if n == 0 else echo_first_caption(payload, n)

    with ChatServer(busy_once) as server:
        backend = OpenAIBackend("m", server.url, backoff=0.5, sleep=waits.append)  # injected: no real sleep
        answers = dict(backend.run(_tasks(_records(tmp_path, 1))))
    assert answers == {0: "boosted caption 0 a"} and len(server.requests) == 2
    (wait,) = waits
    assert 7.0 <= wait <= 7.5  # the server's 7 s plus a jitter of at most backoff


def test_retry_after_http_date_uses_the_clock(tmp_path):
    from email.utils import formatdate

    waits: list[float] = []
    now = 1_800_000_000.0
    header = {"Retry-After": formatdate(now + 12, usegmt=True)}  # an HTTP date 12 s after "now"

    def busy_once(payload, n):
        return (503, {"error": "overloaded"}, header) if n == 0 else echo_first_caption(payload, n)

    with ChatServer(busy_once) as server:
        backend = OpenAIBackend("m", server.url, backoff=0.0, sleep=waits.append, clock=lambda: now)
        list(backend.run(_tasks(_records(tmp_path, 1))))
    assert waits == [12.0]


def test_exponential_backoff_with_jitter_without_retry_after(tmp_path):
    waits: list[float] = []
    with ChatServer(lambda p, n: (500, {"error": "x"}) if n < 3 else echo_first_caption(p, n)) as server:
        backend = OpenAIBackend("m", server.url, retries=3, backoff=1.0, max_wait=60, sleep=waits.append)
        answers = dict(backend.run(_tasks(_records(tmp_path, 1))))
    assert answers == {0: "boosted caption 0 a"} and len(waits) == 3
    # Attempt n waits backoff * 2**(n-1) plus a jitter in [0, backoff]: [1, 2], [2, 3], [4, 5].
    for wait, low in zip(waits, (1.0, 2.0, 4.0), strict=True):
        assert low <= wait <= low + 1.0


ERROR_BODY = {"error": {"message": "engine overloaded", "type": "InternalServerError", "code": 500}}
"""What vLLM (and some proxies) answer, with HTTP 200, for a request that failed."""


def test_an_error_body_with_http_200_waits_the_backoff_as_a_500(tmp_path):
    waits: list[float] = []
    with ChatServer(lambda p, n: (200, ERROR_BODY) if n < 2 else echo_first_caption(p, n)) as server:
        backend = OpenAIBackend("m", server.url, retries=3, backoff=1.0, max_wait=60, sleep=waits.append)
        answers = dict(backend.run(_tasks(_records(tmp_path, 1))))
    assert answers == {0: "boosted caption 0 a"} and len(server.requests) == 3
    # the waits of a 500 (test_exponential_backoff_with_jitter_without_retry_after): [1, 2], then [2, 3]
    assert len(waits) == 2 and 1.0 <= waits[0] <= 2.0 and 2.0 <= waits[1] <= 3.0, waits


def test_an_error_body_with_http_200_honours_retry_after_and_gives_up_as_a_500(tmp_path):
    waits: list[float] = []
    with ChatServer(lambda p, n: (200, ERROR_BODY, {"Retry-After": "7"})) as server:
        backend = OpenAIBackend("m", server.url, retries=2, backoff=0.5, sleep=waits.append)
        ((_, error),) = list(backend.run(_tasks(_records(tmp_path, 1))))
    assert len(server.requests) == 3 and len(waits) == 2 and all(7.0 <= w <= 7.5 for w in waits), waits
    # not a malformed reply (the engine asks no more): a server failing, which a judge counts as no answer
    assert type(error).__name__ == "ServerFailing" and error.status == 200, repr(error)
    assert "gave up after 3 attempt(s)" in str(error) and "engine overloaded" in str(error), str(error)


def test_an_error_body_through_the_engine_is_sent_retries_plus_one_times(tmp_path):
    """The engine does not ask again what the backend gave up on: 3 requests (2 retries), waits between them, the
    image failed with the server's words."""
    waits: list[float] = []
    result, server = blended(lambda p, n: (200, ERROR_BODY), _records(tmp_path, 1), tmp_path, retries=2,
                             sleep=waits.append)  # fmt: skip
    (failure,) = result.failures
    assert len(server.requests) == 3 and len(waits) == 2 and "engine overloaded" in failure.error, failure


def test_retry_after_longer_than_max_wait_fails_without_retrying(tmp_path):
    waits: list[float] = []
    with ChatServer(lambda p, n: (429, {"error": "quota"}, {"Retry-After": "3600"})) as server:
        backend = OpenAIBackend("m", server.url, max_wait=60, sleep=waits.append)
        ((_, error),) = list(backend.run(_tasks(_records(tmp_path, 1))))
    assert isinstance(error, RuntimeError) and "retry after 3600 s, more than boost.retry_max_wait=60" in str(error)
    assert waits == [] and len(server.requests) == 1


def test_a_retry_after_with_its_jitter_never_waits_longer_than_retry_max_wait(tmp_path):
    # before, the jitter (up to backoff) came on top of a Retry-After at retry_max_wait: 5 s asked, 5-6 s waited
    waits: list[float] = []

    def busy_twice(payload, n):
        return (429, {"error": "slow down"}, {"Retry-After": "5"}) if n < 2 else echo_first_caption(payload, n)

    with ChatServer(busy_twice) as server:
        backend = OpenAIBackend("m", server.url, retries=3, backoff=1.0, max_wait=5, sleep=waits.append)
        answers = dict(backend.run(_tasks(_records(tmp_path, 1))))
    assert answers == {0: "boosted caption 0 a"} and len(server.requests) == 3
    assert waits == [5.0, 5.0]  # the server's 5 s, the jitter cut at boost.retry_max_wait=5


def test_retry_after_ms_is_read_before_retry_after_and_bounded_by_retry_max_wait(tmp_path):
    # OpenAI's client reads retry-after-ms (milliseconds) first; before, finecap read only Retry-After (30 s here)
    waits: list[float] = []

    def busy_once(payload, n):
        if n == 0:
            return 429, {"error": "slow down"}, {"retry-after-ms": "1500", "Retry-After": "30"}
        return echo_first_caption(payload, n)

    with ChatServer(busy_once) as server:
        backend = OpenAIBackend("m", server.url, backoff=0.0, sleep=waits.append)
        answers = dict(backend.run(_tasks(_records(tmp_path, 1))))
    assert answers == {0: "boosted caption 0 a"} and waits == [1.5]
    waits.clear()
    with ChatServer(lambda p, n: (503, {"error": "busy"}, {"retry-after-ms": "90000"})) as server:
        backend = OpenAIBackend("m", server.url, max_wait=60, sleep=waits.append)
        ((_, error),) = list(backend.run(_tasks(_records(tmp_path, 1))))
    assert isinstance(error, ServerUnavailable), repr(error)
    assert "retry after 90 s, more than boost.retry_max_wait=60" in str(error), str(error)
    assert waits == [] and len(server.requests) == 1


def test_x_should_retry_false_fails_at_once_and_true_retries_another_failing_status(tmp_path):
    # the server's x-should-retry (OpenAI's) overrides the status, as in OpenAI's client; before, a 500 or 503 saying
    # false was retried anyway and a 400 saying true was failed at once
    def answer(payload, n):
        image = int(payload["messages"][-1]["content"].split("- caption ")[1].split()[0])
        if image == 0:
            return 500, {"error": "bad request in disguise"}, {"x-should-retry": "false"}
        if image == 1:
            return 503, {"error": "draining"}, {"x-should-retry": "False"}
        if image == 2 and n < 2:
            return 400, {"error": "replica warming up"}, {"x-should-retry": "true"}
        return echo_first_caption(payload, n)

    waits: list[float] = []
    with ChatServer(answer) as server:
        backend = OpenAIBackend("m", server.url, retries=3, backoff=0.01, concurrency=1, sleep=waits.append)
        outcomes = dict(backend.run(_tasks(_records(tmp_path, 4))))
    sent = Counter(int(r["payload"]["messages"][-1]["content"].split("- caption ")[1].split()[0])
                   for r in server.requests)  # fmt: skip
    assert sent == {0: 1, 1: 1, 2: 3, 3: 1}, sent
    assert type(outcomes[0]).__name__ == "ServerFailing" and outcomes[0].status == 500, repr(outcomes[0])
    assert isinstance(outcomes[1], ServerUnavailable), repr(outcomes[1])
    for error in (outcomes[0], outcomes[1]):
        assert "the server says not to retry (x-should-retry: false)" in str(error), str(error)
    assert outcomes[2] == "boosted caption 2 a" and outcomes[3] == "boosted caption 3 a"
    assert len(waits) == 2  # the 400s' retries alone


@pytest.mark.parametrize(
    ("status", "gave_up_as"),
    [(520, "ServerUnavailable"), (521, "ServerUnavailable"), (522, "ServerUnavailable"), (523, "ServerUnavailable"),
     (524, "ServerUnavailable"), (529, "ServerUnavailable"), (507, "ServerFailing"), (599, "ServerFailing")],
)  # fmt: skip
def test_every_passing_5xx_is_retried_and_a_proxys_unreachable_origin_is_unavailable(tmp_path, status, gave_up_as):
    # before, only 500/502/503/504 were retried (openai-python retries every 5xx): a Cloudflare 520-524 (its origin
    # server down, unreachable or timed out), an overloaded 529 or a 507 failed the image at its first reply
    waits: list[float] = []
    with ChatServer(lambda p, n: (status, {"error": "origin"}) if n < 2 else echo_first_caption(p, n)) as server:
        backend = OpenAIBackend("m", server.url, retries=2, backoff=0.01, sleep=waits.append)
        assert dict(backend.run(_tasks(_records(tmp_path, 1)))) == {0: "boosted caption 0 a"}  # the third attempt
    assert len(server.requests) == 3 and len(waits) == 2
    with ChatServer(lambda p, n: (status, {"error": "origin"})) as server:
        backend = OpenAIBackend("m", server.url, retries=2, backoff=0.01, sleep=waits.append)
        ((_, error),) = list(backend.run(_tasks(_records(tmp_path, 1))))
    # unreachable (502-like) statuses count towards boost.max_consecutive_failures, a failing server's do not
    assert type(error).__name__ == gave_up_as and "gave up after 3 attempt(s)" in str(error), repr(error)
    assert f"HTTP {status}" in str(error) and len(server.requests) == 3


@pytest.mark.parametrize("status", [501, 505, 506, 508, 510, 511])
def test_a_5xx_saying_the_request_cannot_be_served_fails_the_image_at_once(tmp_path, status):
    # Not Implemented (vLLM's answer to a request using what it lacks), HTTP Version Not Supported, ...: asked again,
    # the same request gets the same; the image fails as on a 400, and the run goes on (not a fatal 401/404)
    waits: list[float] = []
    with ChatServer(lambda p, n: (status, {"error": "not implemented"})) as server:
        backend = OpenAIBackend("m", server.url, retries=3, backoff=0.01, concurrency=1, sleep=waits.append)
        outcomes = dict(backend.run(_tasks(_records(tmp_path, 2))))
    assert [type(o).__name__ for o in outcomes.values()] == ["BackendError", "BackendError"], outcomes
    assert all(f"HTTP {status}: " in str(o) for o in outcomes.values()), outcomes
    assert len(server.requests) == 2 and waits == []


@pytest.mark.parametrize(
    ("headers", "said", "waited"),
    [({"retry-after-ms": "1500", "Retry-After": "30"}, "(retry-after-ms: 1500, a wait of 1.5 s)", [1.5]),
     ({"Retry-After": "7"}, "(Retry-After: 7, a wait of 7 s)", [7.0]),
     ({"Retry-After": "Thu, 01 Jan 1970 00:00:42 GMT"},
      "(Retry-After: Thu, 01 Jan 1970 00:00:42 GMT, a wait of 30 s)", [30.0]),  # 42 s, read at 12 s
     ({"Retry-After": "3600"}, "(Retry-After: 3600, a wait of 3600 s, more than boost.retry_max_wait: not retried)",
      []),
     ({"Retry-After": "soon"}, "(Retry-After: soon, unreadable: the backoff's wait)", [1.0]),
     ({}, "(no Retry-After or retry-after-ms: the backoff's wait)", [1.0])],
)  # fmt: skip
def test_the_first_429s_warning_shows_the_wait_the_retry_takes(tmp_path, caplog, headers, said, waited):
    # before, it showed the Retry-After header alone: "Retry-After: 30" where retry-after-ms asked (and got) 1.5 s
    waits: list[float] = []
    with ChatServer(lambda p, n: (429, {"error": "slow down"}, headers) if n == 0 else echo_first_caption(p, n)) as s:
        backend = OpenAIBackend("m", s.url, backoff=1.0, max_wait=60, sleep=waits.append, clock=lambda: 12.0)
        list(backend.run(_tasks(_records(tmp_path, 1))))
    (warning,) = [r.getMessage() for r in caplog.records if "HTTP 429" in r.getMessage()]
    assert f"the server rate-limits boost's requests {said}; each is retried" in warning, warning
    # the wait taken: the server's plus a jitter of at most backoff (1 s), or the backoff's first, 1-2 s
    assert len(waits) == len(waited) and all(w <= t <= w + 1.0 for w, t in zip(waited, waits, strict=True)), waits


QUOTA_BODY = {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                        "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}  # fmt: skip
"""What OpenAI's API answers, with HTTP 429, to an account out of credit."""


@pytest.mark.parametrize("error", [QUOTA_BODY["error"], {"message": "out of credit", "type": "insufficient_quota"},
                                   {"message": "out of credit", "code": "insufficient_quota"}])  # fmt: skip
def test_a_429_out_of_quota_stops_the_run_at_once_naming_the_quota(tmp_path, error):
    # before, it was retried as a rate limit: up to boost.retries waits of up to boost.retry_max_wait per request, for
    # every image, the run's time spent on an account that cannot answer
    waits: list[float] = []
    with ChatServer(lambda p, n: (429, {"error": error}, {"Retry-After": "20"})) as server:
        backend = OpenAIBackend("m", server.url, retries=3, concurrency=1, sleep=waits.append)
        outcomes = [outcome for _, outcome in backend.run(_tasks(_records(tmp_path, 3)))]
    fatal, *others = sorted(outcomes, key=lambda o: not isinstance(o, FatalBackendError))
    assert isinstance(fatal, FatalBackendError), outcomes
    assert "HTTP 429: the account's quota is spent (insufficient_quota" in str(fatal), str(fatal)
    assert all(isinstance(o, Cancelled) and not o.sent for o in others), others  # no new request after it
    assert len(server.requests) == 1 and waits == [] and backend.rate_limited == 0


def test_connection_refused_is_server_unavailable(tmp_path):
    import socket

    from finecap.boost.engine import ServerUnavailable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    waits: list[float] = []
    backend = OpenAIBackend("m", f"http://127.0.0.1:{port}/v1", retries=2, backoff=0.1, sleep=waits.append)
    ((_, error),) = list(backend.run(_tasks(_records(tmp_path, 1))))
    assert isinstance(error, ServerUnavailable) and "gave up after 3 attempt(s)" in str(error)
    assert "ConnectError" in str(error) and len(waits) == 2 and backend.requests_sent == 3


def test_the_reply_is_read_as_json_reads_bytes_and_bounded_in_size():
    """The body is JSON's bytes, whatever charset the headers claim (UTF-8 under a latin-1 header read 'hÃ©llo'; a
    UTF-16 body was malformed; bytes that are no text were taken with replacement characters into a caption); a reply
    over MAX_REPLY_BYTES is malformed, read no further."""
    from finecap.boost.engine import MalformedReply
    from finecap.boost.openai_backend import MAX_REPLY_BYTES

    def backend(body: bytes, content_type: str = "application/json") -> OpenAIBackend:
        headers = {"Content-Type": content_type}
        reply = httpx.MockTransport(lambda request: httpx.Response(200, content=body, headers=headers))
        return OpenAIBackend("m", "http://llm.test/v1", transport=reply)

    answer = json.dumps({"choices": [{"message": {"content": "h\u00e9llo"}}]}, ensure_ascii=False)
    payload = {"model": "m", "messages": []}
    assert backend(answer.encode(), "application/json; charset=iso-8859-1").attempt(payload) == "h\u00e9llo"
    assert backend(answer.encode("utf-16")).attempt(payload) == "h\u00e9llo"
    with pytest.raises(MalformedReply, match="not JSON"):
        backend(answer.encode().replace("\u00e9".encode(), b"\xff")).attempt(payload)
    huge = b'{"choices": [{"message": {"content": "' + b"a" * (MAX_REPLY_BYTES + 1) + b'"}}]}'
    with pytest.raises(MalformedReply, match="the reply is over 8 MiB"):
        backend(huge).attempt(payload)


def test_a_refused_key_stops_the_run_with_its_own_reason_and_fails_no_cancelled_image(tmp_path):
    # 60 images, 16 requests at a time (the 1 % budget of 60 images allows no failed image). Every fourth image gets
    # HTTP 500 (retried after a wait the stop interrupts), the others HTTP 401. After the first 401 the other requests
    # are not sent, or not retried: cancelled. The pool hands answers over in whatever order they complete; the
    # wrapper below gives the engine every cancelled one before any 401, the worst order the pool may give.
    records = _records(tmp_path, 60)

    def answer(payload, n):
        image = int(payload["messages"][-1]["content"].split("- caption ")[1].split()[0])
        return (500, {"error": "busy"}) if image % 4 == 0 else (401, {"error": {"message": "Incorrect API key"}})

    class RefusalsLast:
        def __init__(self, backend):
            self.backend = backend

        def identity(self):
            return self.backend.identity()

        def run(self, tasks):
            yield from sorted(self.backend.run(tasks), key=lambda done: isinstance(done[1], FatalBackendError))

    with ChatServer(answer) as server:
        backend = OpenAIBackend("m", server.url, concurrency=16, retries=3)
        cache = AnswerCache(tmp_path / "cache.jsonl")
        budget = FailureBudget(60, max_rate=0.01, max_consecutive=10)
        result = run_step("blend", _tasks(records), RefusalsLast(backend), cache, 3, progress=False, budget=budget)
    assert result.stopped.startswith(f"{server.url}/chat/completions: HTTP 401: the server refused the API key")
    assert [f.error.split(":")[0] for f in result.failures] == ["FatalBackendError"]  # the first 401 alone
    assert budget.failed_images == {result.failures[0].image_id}  # image i is at position i
    assert result.sent == len(server.seen)  # requests that went out; the cancelled unsent ones are not counted
    assert result.answers == {}


def answering_as(first: int, then: str):
    """A server answering ``"a caption by <model>"`` as model ``m`` to its first ``first`` requests, then as
    ``then``."""
    count = iter(range(10**6))

    def answer(payload, n):
        model = "m" if next(count) < first else then
        body = completion(f"a caption by {model}")
        body["model"] = model
        return 200, body

    return answer


def test_a_reply_from_another_model_than_the_first_stops_the_run_and_is_neither_used_nor_cached(tmp_path):
    # A proxy falling back to a cheaper model after 5 answers, 4 requests at a time: the fallback's answers were
    # used and cached as boost.llm_model's. Whatever order the replies arrive in, none of the fallback's is kept.
    records = _records(tmp_path, 16)
    result, server = blended(answering_as(5, "cheap-fallback"), records, tmp_path, concurrency=4)
    assert result.stopped.startswith("a server answered as model 'cheap-fallback' after answering as 'm' "
                                     "(boost.llm_model='m'): two models behind boost.llm_base_url")  # fmt: skip
    assert [f.error.split(":")[0] for f in result.failures] == ["FatalBackendError"]  # the first such reply alone
    cached = [json.loads(line)["answer"] for line in (tmp_path / "cache.jsonl").read_text().splitlines()]
    assert 1 <= len(cached) <= 5 and set(cached) == {"a caption by m"}
    assert len(result.boosted) == len(cached) and len(server.requests) < 16  # stopped: the rest never sent


def test_a_server_naming_another_model_throughout_is_used_and_warned_once(tmp_path, caplog):
    records = _records(tmp_path, 3)
    for served, warned in (("m-2024-08-06", False), ("other-model", True)):  # a dated version of m: no warning
        caplog.clear()
        result, _ = blended(answering_as(0, served), records, tmp_path / served, concurrency=1)
        assert result.stopped is None and len(result.boosted) == 3
        said = [r.getMessage() for r in caplog.records if "answers as model" in r.getMessage()]
        assert said == ([f"boost.llm: the server answers as model {served!r}, not boost.llm_model='m'; its answers "
                         "are cached and reported under boost.llm_model"] if warned else [])  # fmt: skip


def _cached(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_resumed_run_whose_server_answers_as_another_model_stops_at_its_first_reply_and_caches_nothing(tmp_path):
    # cache.jsonl did not record the model that answered: a run resumed against a server now serving another model
    # (a proxy's fallback since) went on, its answers and the earlier run's mixed under boost.llm_model's name.
    records = _records(tmp_path, 16)
    first, _ = blended(answering_as(10**6, "unused"), records[:3], tmp_path)  # the earlier run: 3 answers of m
    assert first.stopped is None and first.served_model == {"llm": "m"}
    assert [row["served_model"] for row in _cached(tmp_path / "cache.jsonl")] == ["m"] * 3
    kept = (tmp_path / "cache.jsonl").read_bytes()
    result, server = blended(answering_as(0, "cheap-fallback"), records, tmp_path, concurrency=4)
    cache = tmp_path / "cache.jsonl"
    assert result.stopped == (
        f"a server answered as model 'cheap-fallback', but the 3 answer(s) of step 'blend' kept in {cache} came from "
        "model 'm' (boost.llm_model='m'): resumed, the run would mix two models' answers under boost.llm_model; serve "
        f"'m' again to continue, or boost into another folder (or move {cache} away) to start afresh"
    )
    assert (tmp_path / "cache.jsonl").read_bytes() == kept  # none of the other model's answers kept
    assert result.boosted == [0, 1, 2] and 1 <= len(server.requests) <= 4  # the rest never sent
    assert [f.error.split(":")[0] for f in result.failures] == ["FatalBackendError"]  # the first such reply alone
    assert result.served_model == {"llm": "m"}  # the model of every answer the run used


def test_a_resumed_run_whose_cache_holds_two_models_answers_says_serving_either_stops(tmp_path):
    # Two runs into one folder, of different images, answered as two models (a proxy's fallback in between): the
    # step's cached answers record both. The error said "serve 'cheap' again to continue", but the check runs before
    # any request, so a run serving cheap (or m) stops the same: the advice now says the cache holds both.
    records = _records(tmp_path, 6)
    assert blended(answering_as(10**6, "unused"), records[:3], tmp_path)[0].stopped is None  # 3 answers of m
    assert blended(answering_as(0, "cheap"), records[3:], tmp_path)[0].stopped is None  # 3 of cheap, none of m used
    cache = tmp_path / "cache.jsonl"
    assert [row["served_model"] for row in _cached(cache)] == ["m"] * 3 + ["cheap"] * 3
    for model in ("cheap", "m"):
        result, server = blended(answering_as(0, model), records, tmp_path)
        assert result.stopped == (
            f"the 3 answer(s) of step 'blend' kept in {cache} came from model 'cheap', but the 3 answer(s) of step "
            f"'blend' kept in {cache} came from model 'm' (boost.llm_model='m'): resumed, the run would mix two "
            "models' answers under boost.llm_model; the cache now holds answers of 'm' and 'cheap': serving one "
            f"stops at another's, so boost into another folder (or move {cache} away) to start afresh"
        )
        assert not server.requests


def test_a_resumed_run_continues_with_the_model_its_cache_records_by_the_rule_within_a_run(tmp_path, caplog):
    # A dated version of boost.llm_model recorded: that model (no warning); the same name again continues and is
    # recorded, another name (the undated one too, as within a run) stops the run.
    records = _records(tmp_path, 6)
    blended(answering_as(0, "m-2024-08-06"), records[:2], tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "cache.jsonl").write_bytes((tmp_path / "a" / "cache.jsonl").read_bytes())
    caplog.clear()
    result, server = blended(answering_as(0, "m-2024-08-06"), records[:4], tmp_path / "a")
    assert result.stopped is None and result.boosted == [0, 1, 2, 3] and len(server.requests) == 2
    assert [row["served_model"] for row in _cached(tmp_path / "a" / "cache.jsonl")] == ["m-2024-08-06"] * 4
    assert result.served_model == {"llm": "m-2024-08-06"}
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    result, server = blended(answering_as(0, "m"), records, tmp_path / "b", concurrency=1)
    assert result.stopped.startswith("a server answered as model 'm', but the 2 answer(s) of step 'blend' kept in ")
    assert len(_cached(tmp_path / "b" / "cache.jsonl")) == 2 and len(server.requests) == 1


def test_a_cache_of_an_older_finecap_without_served_models_is_used_and_said_once(tmp_path, caplog):
    # Lines without served_model (an older finecap's) are used as they are; one warning for the whole run, its three
    # steps each reusing such answers; new lines record the model the replies named.
    records = _records(tmp_path, 6)
    with ChatServer(answering_as(10**6, "unused")) as server:
        backend = OpenAIBackend("m", server.url, backoff=0.01)
        cache = AnswerCache(tmp_path / "cache.jsonl")
        boost_records(records[:3], "holistic", backend, backend, cache, Prompts.load(), few_shot=False,
                      progress=False)  # fmt: skip
        cache.close()
    rows = _cached(tmp_path / "cache.jsonl")
    assert len(rows) == 9 and {row.pop("served_model") for row in rows} == {"m"}
    (tmp_path / "cache.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))  # as an older finecap
    caplog.clear()
    with ChatServer(answering_as(0, "m-2024-08-06")) as server:
        backend = OpenAIBackend("m", server.url, backoff=0.01)
        cache = AnswerCache(tmp_path / "cache.jsonl")
        result = boost_records(records, "holistic", backend, backend, cache, Prompts.load(), few_shot=False,
                               progress=False)  # fmt: skip
        cache.close()
    assert result.stopped is None and len(result.boosted) == 6 and len(server.requests) == 9
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"{tmp_path / 'cache.jsonl'}: 3 cached answer(s) of step 'blend' were written by an earlier "
                    "finecap, which did not record the model that gave them (served_model); they are used as "
                    "boost.llm_model's, unchecked against the model the server answers as now "
                    "(said once)"]  # fmt: skip
    new = _cached(tmp_path / "cache.jsonl")[9:]
    assert len(new) == 9 and {row["served_model"] for row in new} == {"m-2024-08-06"}
    assert result.served_model == {"llm": "m-2024-08-06", "vlm": "m-2024-08-06"}


def test_a_step_stopped_by_an_error_closes_its_progress_bar(tmp_path, monkeypatch):
    # a library caller's KeyboardInterrupt (or a backend's own error) left the step's bar open on the terminal
    import finecap.boost.engine as engine

    bars = []

    class Bar:
        def __init__(self, *args, **kwargs):
            self.closed = False
            bars.append(self)

        def update(self, n):
            pass

        def close(self):
            self.closed = True

    class Interrupted:
        def identity(self):
            return "interrupted"

        def run(self, tasks):
            raise KeyboardInterrupt
            yield  # a generator, as backends are

    monkeypatch.setattr(engine, "tqdm", Bar)
    cache = AnswerCache(tmp_path / "cache.jsonl")
    with pytest.raises(KeyboardInterrupt):
        run_step("blend", _tasks(_records(tmp_path, 2)), Interrupted(), cache, 0)
    cache.close()
    assert [bar.closed for bar in bars] == [True]


def test_sampled_requests_carry_a_seed_of_run_seed_and_the_request(tmp_path):
    # the in-process backends' samples follow run.seed; the openai backend sent no seed, so a server's samples at
    # boost.temperature > 0 could not repeat, and the cache key (identity) held no seed either
    from finecap.boost.backends import make_backend
    from finecap.config import load

    tasks = _tasks(_records(tmp_path, 2))
    with ChatServer() as server:
        cfg = load(None, ["boost.llm_backend=openai", "boost.llm_model=m", f"boost.llm_base_url={server.url}",
                          "boost.temperature=0.7", "run.seed=7"])  # fmt: skip
        backend = make_backend(cfg, "llm")
        list(backend.run(tasks))
        list(backend.run(tasks))  # the same requests again: the same seeds
        greedy = OpenAIBackend("m", server.url, temperature=0.0, seed=7)
        list(greedy.run(tasks[:1]))
        other = OpenAIBackend("m", server.url, temperature=0.7, seed=8)
        list(other.run(tasks[:1]))
    seeds = {}
    for r in server.requests[:4]:
        first = r["payload"]["messages"][-1]["content"].split("- ")[1].strip()  # "caption 0 a" or "caption 1 a"
        seeds.setdefault(first, set()).add(r["payload"]["seed"])
    assert all(len(s) == 1 for s in seeds.values()) and len(seeds) == 2  # one seed per request, repeated
    seed0, seed1 = (next(iter(seeds[f"caption {i} a"])) for i in range(2))
    assert seed0 != seed1 and all(0 <= s < 2**31 for s in (seed0, seed1))  # each request its own, any server's range
    assert "seed" not in server.requests[4]["payload"]  # greedy: no seed sent
    assert server.requests[5]["payload"]["seed"] != seed0  # another run.seed: another seed for the same request
    # the cache key holds run.seed when sampling (another seed into the same --out asks again), not when greedy
    assert backend.identity()["seed"] == 7 and other.identity()["seed"] == 8 and "seed" not in greedy.identity()


def test_refusals_content_filter_and_a_cut_off_with_no_text_fail_their_image_at_once(tmp_path):
    """Replies shaped as OpenAI's API and vLLM's server send them: a refusal (``message.refusal``, content null) was a
    malformed reply asked again 3 times, the same refusal each time; an answer the content filter stopped
    (``finish_reason: "content_filter"``, part of a caption) was taken as a caption; a reasoning model's answer cut at
    ``max_tokens`` before any text (``content: null``, ``finish_reason: "length"``) was asked again as malformed and
    reported as such, not as cut off."""
    records = _records(tmp_path, 4)

    def answer(payload, n):
        text = payload["messages"][-1]["content"]
        body = completion("boosted caption 1 a red")
        choice = body["choices"][0]
        if "caption 0 a" in text:
            choice["message"] |= {"content": None, "refusal": "I'm sorry, I cannot help with that."}
        elif "caption 1 a" in text:
            choice["finish_reason"] = "content_filter"
        elif "caption 2 a" in text:
            choice["message"]["content"], choice["finish_reason"] = None, "length"
        else:
            return echo_first_caption(payload, n)
        return 200, body

    result, server = blended(answer, records, tmp_path, max_tokens=9)
    assert [f["blend"] for f in result.fields] == [r.captions for r in records[:3]] + [["boosted caption 3 a"]]
    errors = {f.image_id: (f.error, f.attempts) for f in result.failures}
    assert errors == {
        0: (f"BackendError: {server.url}/chat/completions: the model refused to answer: "
            "\"I'm sorry, I cannot help with that.\"", 1),
        1: (f"BackendError: {server.url}/chat/completions: the server's content filter stopped the answer "
            "(finish_reason 'content_filter'): 'boosted caption 1 a red'", 1),
        2: ("CutOff: the answer reached boost.max_new_tokens=9 before the model ended it (finish_reason 'length'): "
            "''; raise boost.max_new_tokens", 1),
    }  # fmt: skip
    assert len(server.requests) == 4 and result.cut_off == {"blend": 1}  # none asked again
    assert [json.loads(line)["answer"] for line in (tmp_path / "cache.jsonl").read_text().splitlines()] == [
        "boosted caption 3 a"
    ]


def test_content_parts_are_read_as_text_and_an_undecodable_body_is_asked_again(tmp_path):
    """Some OpenAI-compatible servers send the content as a list of parts (``[{"type": "text", "text": ...}]``, a
    reasoning model's ``thinking`` part beside it): its text parts are the answer, where the reply was malformed and
    the image failed after its retries. A body whose ``Content-Encoding: gzip`` does not decode was httpx's
    ``DecodingError``, which failed the image at once; it is a malformed reply, asked again."""
    records = _records(tmp_path, 2)

    def answer(payload, n):
        status, body = echo_first_caption(payload, n)
        text = body["choices"][0]["message"]["content"]
        if "caption 0 a" in payload["messages"][-1]["content"] and n == 0:
            return 200, "not a gzip stream", {"Content-Encoding": "gzip"}
        parts = [{"type": "thinking", "thinking": "a caption, then"}, {"type": "text", "text": text}]
        body["choices"][0]["message"]["content"] = parts
        return status, body

    result, server = blended(answer, records, tmp_path)
    assert [f["blend"] for f in result.fields] == [["boosted caption 0 a"], ["boosted caption 1 a"]]
    assert result.failures == [] and len(server.requests) == 3
