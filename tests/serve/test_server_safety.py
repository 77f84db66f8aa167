"""The reward server as a network service: who may ask (Host, Origin, Content-Type, a bearer token), what a reward's
fault may tell a client (nothing of its text; a non-finite value is a named 500; the reply is strict JSON), and what a
client may cost (a stalled or departed client nothing, a maximal request not the event loop, the connections a cap).
Every server here serves a stand-in reward over 10 images on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest
import torch

from finecap.rewards import RewardOutput
from finecap.serve.app import HEALTH_CONNECTIONS, ConnectionLimits
from finecap.serve.protocol import Limits
from finecap.serve.service import ImageTable, RewardService
from helpers.served import open_connections, serving, serving_server
from helpers.waiting import until


class Words:
    """Each caption's length in words (a per-caption reward); a caption naming a fault makes the reward show it."""

    per_caption = True

    def __init__(self, delay: float = 0.0) -> None:
        self.delay, self.calls = delay, []

    def __call__(self, captions, batch):
        self.calls.append(list(captions))
        time.sleep(self.delay)
        for c in captions:
            if c == "leak-value":
                raise ValueError("cannot read /home/alice/.keys/reward-key.pem (token=sk-live-1234)")
            if c == "leak-key":
                raise KeyError("Bearer sk-live-1234")
            if c == "bug":
                raise RuntimeError("/srv/secret/path exploded")
            if c == "exit":
                raise SystemExit(3)
        total = torch.tensor([float(len(c.split())) for c in captions])
        if "nan-part" in captions:
            part = total.clone()
            part[captions.index("nan-part")] = float("nan")
            return RewardOutput(total, {"length": part})
        if "inf-total" in captions:
            total[captions.index("inf-total")] = float("inf")
        if "huge-total" in captions:  # finite in float64, beyond float32's range (3.4e38): inf as float32
            total = total.double()
            total[captions.index("huge-total")] = 1e39
        if "unscored" in captions:  # a judge that failed on it
            return RewardOutput(total, {"length": total}, failed=torch.tensor([c == "unscored" for c in captions]))
        return RewardOutput(total, {"length": total})


def strict_json(text: str):
    """The reply's JSON, refusing NaN / Infinity tokens (what a strict JSON reader does)."""

    def refuse(token):
        raise AssertionError(f"the reply holds a bare {token} token: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def service(reward=None, **kwargs) -> RewardService:
    return RewardService(reward or Words(), ImageTable(range(10)), log_every=0, name="words", **kwargs)


OK = {"captions": ["a red circle", "two squares"], "image_ids": [1, 2]}


# ---------------------------------------------------------------------------------------------------------------------
# Who may ask
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "field"),
    [
        ({"Host": "evil.example"}, 400, "Host"),  # DNS rebinding: a page's own name pointed at 127.0.0.1
        ({"Host": "evil.example:8000"}, 400, "Host"),
        ({"Host": "127.0.0.1.evil.example"}, 400, "Host"),
        ({"Host": "10.0.0.7"}, 400, "Host"),  # an IP literal of another address, on a loopback-bound server
        ({"Origin": "https://evil.example"}, 403, "Origin"),
        ({"Origin": "null"}, 403, "Origin"),  # a sandboxed frame or a file:// page
        ({"Origin": "http://127.0.0.1:8000"}, 403, "Origin"),  # the server has no pages: any browser origin
        ({"Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site"),
        ({"Sec-Fetch-Site": "same-site"}, 403, "Sec-Fetch-Site"),
        ({"Content-Type": "text/plain"}, 415, "Content-Type"),  # a "simple" cross-site POST: no preflight
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "Content-Type"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "Content-Type"),
        ({"Content-Type": ""}, 415, "Content-Type"),
    ],
)
def test_requests_a_web_page_could_send_are_refused(headers, status, field):
    reward = Words()
    with serving(service(reward)) as url:
        base = {"Content-Type": "application/json"}
        response = httpx.post(f"{url}/reward", content=json.dumps(OK), headers={**base, **headers})
        assert (response.status_code, strict_json(response.text)["error"]["field"]) == (status, field)
        if field != "Content-Type":  # /health too: its answer names the reward
            health = httpx.get(f"{url}/health", headers=headers)
            assert health.status_code == status
        assert reward.calls == []  # nothing was scored
        assert httpx.post(f"{url}/reward", json=OK).json()["total"] == [3.0, 2.0]  # a program's request is


def test_json_with_a_charset_and_the_loopback_names_are_accepted():
    with serving(service()) as url:
        port = url.rsplit(":", 1)[1]
        for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
            response = httpx.post(f"{url}/reward", content=json.dumps(OK), headers={
                "Host": host, "Content-Type": "Application/JSON; charset=utf-8"})  # fmt: skip
            assert response.status_code == 200, (host, response.text)


def test_a_name_clients_use_is_answered_only_when_allowed():
    # a docker-compose service or a cluster's DNS name: refused by default (naming the way), answered once allowed
    with serving(service()) as url:
        response = httpx.post(f"{url}/reward", json=OK, headers={"Host": "reward:8000"})
        assert response.status_code == 400 and "--allow-host NAME" in strict_json(response.text)["error"]["message"]
    with serving(service(), allowed_hosts=["reward", "Rewards.Cluster.Local"]) as url:
        for host in ("reward:8000", "REWARD", "rewards.cluster.local:80"):
            assert httpx.post(f"{url}/reward", json=OK, headers={"Host": host}).status_code == 200, host
        for host in ("reward.evil.example", "evil.example", "rewar"):
            assert httpx.post(f"{url}/reward", json=OK, headers={"Host": host}).status_code == 400, host


def test_a_bearer_token_is_required_when_given_and_compared_exactly():
    token = "s3cret-token-0123456789"
    with serving(service(), token=token) as url:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": token},
                        {"Authorization": f"Basic {token}"}, {"Authorization": f"Bearer {token}x"}):  # fmt: skip
            for response in (httpx.post(f"{url}/reward", json=OK, headers=headers),
                             httpx.get(f"{url}/health", headers=headers)):  # fmt: skip
                assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
                error = strict_json(response.text)["error"]
                assert error["field"] == "Authorization" and token not in response.text
        good = {"Authorization": f"bearer {token}"}  # the scheme is case-insensitive
        assert httpx.post(f"{url}/reward", json=OK, headers=good).json()["total"] == [3.0, 2.0]


# (method, path, the status once admitted): the routing's answers, which told a client without the token which
# endpoints exist (a 404 for a path, a 405 for an endpoint's other method, a 307 to the endpoint for a trailing slash)
ROUTED = [("GET", "/nowhere", 404), ("POST", "/nowhere", 404), ("GET", "/", 404), ("GET", "/reward", 405),
          ("OPTIONS", "/get_reward", 405), ("POST", "/health", 405), ("POST", "/reward/", 307),
          ("GET", "/health/", 307)]  # fmt: skip


def test_every_path_and_method_asks_for_the_token_before_it_is_routed():
    token = "s3cret-token-0123456789"
    reward = Words()
    with serving(service(reward), token=token) as url:
        for method, path, routed in ROUTED:
            response = httpx.request(method, f"{url}{path}", json={})
            assert response.status_code == 401, (method, path, response.status_code, response.text)
            assert strict_json(response.text)["error"]["field"] == "Authorization"
            assert response.headers["www-authenticate"] == "Bearer" and "allow" not in response.headers
            admitted = httpx.request(method, f"{url}{path}", json={}, headers={"Authorization": f"Bearer {token}"})
            assert admitted.status_code == routed, (method, path, admitted.text)
        assert reward.calls == []


@pytest.mark.parametrize(
    ("headers", "status", "field"),
    [({"Host": "evil.example"}, 400, "Host"), ({"Origin": "https://evil.example"}, 403, "Origin")],
)
def test_a_foreign_host_or_a_web_page_is_refused_before_any_path_is_routed(headers, status, field):
    with serving(service()) as url:
        for method, path, _ in ROUTED:
            response = httpx.request(method, f"{url}{path}", json={}, headers=headers)
            assert response.status_code == status, (method, path, response.status_code, response.text)
            assert strict_json(response.text)["error"]["field"] == field


# ---------------------------------------------------------------------------------------------------------------------
# What a reward's fault may tell a client
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("caption", ["leak-value", "leak-key", "bug"])
def test_a_rewards_exception_is_a_500_without_its_text_and_the_server_goes_on(caption, caplog):
    with caplog.at_level(logging.ERROR, logger="finecap.serve.service"), serving(service()) as url:
        response = httpx.post(f"{url}/reward", json={"captions": ["a b", caption], "image_ids": [1, 2]})
        assert response.status_code == 500
        error = strict_json(response.text)["error"]
        assert error["field"] is None and "the reward words failed on this request" in error["message"]
        for secret in ("sk-live-1234", "/home/alice", "reward-key", "/srv/secret", "Bearer"):
            assert secret not in response.text
        assert httpx.post(f"{url}/reward", json=OK).json()["total"] == [3.0, 2.0]
    assert "sk-live-1234" in caplog.text or "/srv/secret/path" in caplog.text  # the detail is the server's log's


def test_a_reward_failing_on_every_request_logs_its_traceback_once_per_period(caplog):
    # a reward failing on everything for days logged a full traceback on every request: the log filled
    now = [1000.0]
    svc = service()
    svc.failures.clock = lambda: now[0]
    svc.failures.line_every = 0  # a line each between the tracebacks (their own bound: the next test)
    with caplog.at_level(logging.ERROR, logger="finecap.serve.service"), serving(svc) as url:
        for k in range(5):
            now[0] += 1.0
            bad = {"captions": ["a b", "bug"] if k < 4 else ["leak-value"], "image_ids": [1, 2][: 2 - (k == 4)]}
            assert httpx.post(f"{url}/reward", json=bad, timeout=5).status_code == 500
        now[0] += svc.failures.every  # the period is over: the next one's traceback again
        assert httpx.post(f"{url}/reward", json={"captions": ["bug"], "image_ids": [1]}, timeout=5).status_code == 500
        health = httpx.get(f"{url}/health", timeout=5).json()
    said = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    # request #1: the traceback; #2-#4 (the same failure, the same code): one line each, counted; #5 (another
    # kind: a ValueError raised elsewhere) its own traceback; #6, a period later: the traceback again, with the count
    assert [full for _, full in said] == [True, False, False, False, True, True]
    assert said[0][0] == "reward server: words failed on request #1 (2 captions)"
    assert said[3][0] == ("reward server: words failed on request #4 (2 captions): RuntimeError: /srv/secret/path "
                          "exploded (the same failure 3 time(s) since its traceback 3 s ago; the next traceback in "
                          "597 s at most)")  # fmt: skip
    assert said[4][0] == "reward server: words failed on request #5 (1 captions)"
    assert said[5][0] == ("reward server: words failed on request #6 (1 captions) (the same failure 3 more time(s) "
                          "since its last traceback)")  # fmt: skip
    assert health["failed"] == health["failures"] == 6 and health["scored"] == 0  # every failed request counted


def test_repeated_non_finite_values_502s_and_server_errors_are_bounded_lines(caplog, monkeypatch):
    # a non-finite value, /get_reward's 502 and the server's own error logged a line (the last a traceback) on every
    # request, however many: a trainer asking 100 times a second for days filled the log
    import finecap.serve.app

    def broken_reply(request, out):
        raise RuntimeError("a bug of the server's")

    monkeypatch.setattr(finecap.serve.app, "finecap_reply", broken_reply)  # POST /reward's reply: the server's bug
    now = [1000.0]
    svc = service()
    svc.failures.clock = lambda: now[0]
    asks = [("/reward", {"captions": ["a b", "nan-part"], "image_ids": [1, 2]}, 500),  # a non-finite value
            ("/get_reward", {"query": ["a b", "unscored"], "labels": [1, 2]}, 502),  # a caption its judge failed on
            ("/reward", OK, 500)]  # the server's own error  # fmt: skip
    with caplog.at_level(logging.WARNING), serving(svc) as url:
        for seconds in (1.0, 1.0, 1.0, 9.0):  # four rounds of the three: the last 12 s after the first
            now[0] += seconds
            for path, body, status in asks:
                assert httpx.post(f"{url}{path}", json=body, timeout=5).status_code == status
        health = httpx.get(f"{url}/health", timeout=5).json()
    said = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    # each kind: its full report at 1001 s; its next two repeats (1002, 1003 s) counted, unsaid; the fourth (1012 s,
    # 11 s after its full report) one line, with the count since
    assert len(said) == 6, said
    nan_first, get_first, bug_first, nan_line, get_line, bug_line = said
    assert nan_first[0] == logging.ERROR and not nan_first[2]
    assert nan_first[1].startswith("reward server: request #1: reward 'words': part 'length' is nan at caption 1")
    assert get_first[0] == logging.WARNING and not get_first[2]
    assert get_first[1].startswith("reward server: POST /get_reward: the reward words could not score 1 of 2 captions "
                                   "(query[1])")  # fmt: skip
    assert bug_first == (logging.ERROR, "reward server: POST /reward failed", True)  # the traceback, once
    assert nan_line[1].startswith("reward server: request #10: reward 'words': part 'length' is nan")  # 3 a round
    assert nan_line[1].endswith("(the same failure 3 time(s) since its full report 11 s ago; the next full report "
                                "in 589 s at most)")  # fmt: skip
    assert get_line[0] == logging.WARNING and "(the same failure 3 time(s) since its full report 11 s" in get_line[1]
    assert bug_line == (logging.ERROR, "reward server: POST /reward failed: RuntimeError: a bug of the server's (the "
                        "same failure 3 time(s) since its traceback 11 s ago; the next traceback in 589 s at most)",
                        False)  # fmt: skip
    assert health["failures"] == 12  # every failure counted, said or not
    # every one failed: the non-finite values' 4 in the reward; the others' values (counted scored, the old count)
    # never reached their client: a 502 naming the failed caption, a 500 of the server's own error
    assert (health["failed"], health["scored"], health["timed_out"], health["left"]) == (12, 0, 0, 0)


def test_the_repeats_unsaid_when_the_server_stops_are_said_before_its_last_line(caplog):
    # the repeats counted between a kind's rate-limited lines were never logged when the server stopped: a
    # supervisor reading the log after a shutdown missed the last failures
    now = [1000.0]
    svc = service()
    svc.failures.clock = lambda: now[0]
    bug = {"captions": ["bug"], "image_ids": [1]}
    nan = {"captions": ["a b", "nan-part"], "image_ids": [1, 2]}
    with caplog.at_level(logging.INFO), serving(svc) as url:
        for seconds, body in [(1.0, bug), (1.0, bug), (1.0, bug), (1.0, nan), (11.0, bug), (1.0, bug), (1.0, nan),
                              (1.0, nan), (1.0, nan), (0.0, OK)]:  # fmt: skip
            now[0] += seconds
            assert httpx.post(f"{url}/reward", json=body, timeout=5).status_code == (200 if body is OK else 500)
        now[0] += 2.0  # the stop (should_exit: the block's end) at 1021 s
    said = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records
            if r.name.startswith("finecap")]  # fmt: skip
    # bug: its traceback (#1 at 1001 s), #2-#3 counted, #5 (1015 s) a line with 3, #6 (1016 s) counted, unsaid;
    # nan: its full report (#4 at 1004 s), #7 (1017 s) a line with 1, #8-#9 (1018, 1019 s) counted, unsaid;
    # the stop (1021 s): one line for each kind with its unsaid count, then the server's last line
    assert len(said) == 7, said
    assert said[0] == (logging.ERROR, "reward server: words failed on request #1 (1 captions)", True)
    assert said[1][1].startswith("reward server: request #4: reward 'words': part 'length' is nan at caption 1")
    assert said[2][1].endswith("(the same failure 3 time(s) since its traceback 14 s ago; the next traceback in 586 s "
                               "at most)")  # fmt: skip
    assert said[3][1].startswith("reward server: request #7: reward 'words': part 'length' is nan")
    assert said[4] == (logging.ERROR, "reward server: words failed on request #6 (1 captions): RuntimeError: "
                       "/srv/secret/path exploded (the same failure 1 more time(s) since its last line 6 s ago, "
                       "unsaid until the server stopped)", False)  # fmt: skip
    assert said[5][0] == logging.ERROR and not said[5][2]
    assert said[5][1].startswith("reward server: request #9: reward 'words': part 'length' is nan at caption 1")
    assert said[5][1].endswith("(the same failure 2 more time(s) since its last line 4 s ago, unsaid until the "
                               "server stopped)")  # fmt: skip
    assert said[6][1].startswith("reward server (words): in ")  # the server's last line, each outcome apart
    assert " s 1 requests scored, 9 failed (500, 502), 0 timed out (504, --score-timeout), 0 left" in said[6][1]
    assert svc.failures.total == 9


@pytest.mark.parametrize(("caption", "part"), [("nan-part", "part 'length' is nan"), ("inf-total", "total is inf"),
                                               ("huge-total", "total is inf")])  # fmt: skip
def test_a_non_finite_value_is_a_500_naming_the_reward_and_the_reply_is_strict_json(caption, part):
    # huge-total: a float64 value beyond float32's range passed the check and became inf once answered as float32
    # (json.dumps then refused it: a generic 500 without the reward's name)
    with serving(service()) as url:
        for path, body in (("/reward", {"captions": ["a b", caption], "image_ids": [1, 2]}),
                           ("/get_reward", {"query": ["a b", caption], "labels": [1, 2]})):  # fmt: skip
            response = httpx.post(f"{url}{path}", json=body)
            assert response.status_code == 500
            message = strict_json(response.text)["error"]["message"]
            assert f"reward 'words': {part} at caption 1 (1 of 2 captions not finite)" in message
            assert ("beyond float32's range" in message) == (caption == "huge-total")


def test_a_reward_raising_system_exit_stops_the_server():
    svc = service()
    with serving(svc) as url:
        response = httpx.post(f"{url}/reward", json={"captions": ["exit"], "image_ids": [1]})
        assert response.status_code == 500 and "stopped the server" in response.json()["error"]["message"]

        def answers() -> bool:
            try:
                httpx.get(f"{url}/health", timeout=1)
            except httpx.HTTPError:
                return False
            return True

        # the server shuts down by itself: nothing listens any more
        until(lambda: not answers(), "the server still answers after its reward raised SystemExit", 20, every=0.05)
    assert isinstance(svc.fatal, SystemExit)


def test_the_command_exits_non_zero_when_its_reward_stops_the_server_and_closes_the_reward(monkeypatch, capsys):
    import finecap.serve.app as app
    from finecap.app import serve_reward
    from finecap.config import load
    from finecap.rewards import RewardBase

    closed = []

    class Closing(RewardBase):  # Words, recording its close (a judge it built: connections, an engine)
        per_caption = True

        def __call__(self, captions, batch):
            return Words()(captions, batch)

        def close(self):
            closed.append(self)

    monkeypatch.setattr(serve_reward, "build_service", lambda cfg, **kw: service(Closing()))
    make, found = app.make_server, {}

    def spy(svc, *args, **kwargs):  # the command's own server; its URL for the client below
        server, sock = make(svc, *args, **kwargs)
        found["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return server, sock

    monkeypatch.setattr(app, "make_server", spy)

    def client():
        while "url" not in found:
            time.sleep(0.01)
        for _ in range(500):
            try:
                httpx.post(f"{found['url']}/reward", json={"captions": ["exit"], "image_ids": [1]}, timeout=5)
                return
            except httpx.HTTPError:
                time.sleep(0.02)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    with pytest.raises(SystemExit, match="the reward words raised SystemExit, which stops the server") as stopped:
        serve_reward.main(load(None, []), port=0)
    assert stopped.value.code != 0 and len(closed) == 1
    thread.join(10)


# ---------------------------------------------------------------------------------------------------------------------
# What a client may cost
# ---------------------------------------------------------------------------------------------------------------------


def test_health_answers_within_a_second_while_a_maximal_request_is_checked():
    """A request at every limit, built to be slow to check: 16 MiB of OpenRLHF queries made of end-of-turn markers
    (stripped from each query's end) and of image paths with ``..`` (each resolved on the file system); meanwhile
    ``/health`` is asked every 20 ms and must answer each time within 1 s."""
    limits = Limits()
    query = "x" + "</s>" * ((limits.max_caption_chars - 1) // 4)
    label = json.dumps({"image": "a/../" * 1500})
    n = (limits.max_request_bytes - 100) // (len(json.dumps(query)) + len(json.dumps(label)) + 4)
    body = json.dumps({"query": [query] * n, "labels": [label] * n}).encode()
    assert limits.max_request_bytes - 50_000 < len(body) <= limits.max_request_bytes
    svc = RewardService(Words(), ImageTable(range(10), {"img.jpg": 1}), log_every=0)
    slowest = []
    with serving(svc) as url:
        done = threading.Event()
        result = {}

        def big():
            result["response"] = httpx.post(f"{url}/get_reward", content=body, timeout=120,
                                            headers={"Content-Type": "application/json"})  # fmt: skip
            done.set()

        threading.Thread(target=big, daemon=True).start()
        while not done.is_set():
            start = time.monotonic()
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
            slowest.append(time.monotonic() - start)
            time.sleep(0.02)
    assert result["response"].status_code == 400  # its paths name no image the server knows
    assert "labels" not in result["response"].text or "unknown image file" in result["response"].text
    assert len(slowest) >= 3 and max(slowest) < 1.0, (len(slowest), max(slowest))


def test_large_bodies_read_and_not_yet_checked_are_bounded(monkeypatch):
    """32 clients send a 1.5 MiB body at once while the check is slow (0.05 s each on the two check threads): the
    bodies the server holds read but not yet checked never exceed BODIES_AT_ONCE (each body was read as it came and
    queued for the check threads: up to --max-connections bodies of 16 MiB, and a 16 MiB body of empty objects costs
    about 400 MiB while parsed), and every request is answered."""
    import finecap.serve.app as app

    held, most, lock = [0], [0], threading.Lock()
    read, decode = app.read_body, app.decode_json

    async def counting_read(*args, **kwargs):
        body = await read(*args, **kwargs)
        with lock:
            held[0] += 1
            most[0] = max(most[0], held[0])
        return body

    def slow_decode(raw):
        time.sleep(0.05)
        try:
            return decode(raw)
        finally:
            with lock:
                held[0] -= 1

    monkeypatch.setattr(app, "read_body", counting_read)
    monkeypatch.setattr(app, "decode_json", slow_decode)
    body = json.dumps(OK).encode() + b" " * (3 << 19)  # 1.5 MiB: a large body (JSON's white space)
    assert len(body) > app.SMALL_BODY
    answers = []
    with serving(service()) as url:

        def client():
            reply = httpx.post(f"{url}/reward", content=body, headers={"Content-Type": "application/json"}, timeout=60)
            answers.append((reply.status_code, reply.json().get("total")))

        threads = [threading.Thread(target=client) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert answers == [(200, [3.0, 2.0])] * 32
    assert 2 <= most[0] <= app.BODIES_AT_ONCE, most[0]


def test_stalled_large_bodies_hold_up_no_small_request():
    """BODIES_AT_ONCE clients declare a large body and stall after a few bytes, holding every slot for large bodies:
    a small request (the trainers' requests are kilobytes) is answered meanwhile, and a large one once the stalled
    bodies are cut off (--body-timeout)."""
    from finecap.serve.app import BODIES_AT_ONCE, SMALL_BODY

    limits = ConnectionLimits(body_timeout=2.0)
    with serving(service(), connections=limits) as url:
        port = int(url.rsplit(":", 1)[1])
        stalled = []
        for _ in range(BODIES_AT_ONCE):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n{\"captions\"" % (2 * SMALL_BODY))  # fmt: skip
            stalled.append(s)
        assert httpx.post(f"{url}/reward", json=OK).json()["total"] == [3.0, 2.0]
        for s in stalled:  # still held: the small request did not wait for their slots
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
            s.setblocking(True)
        large = json.dumps(OK).encode() + b" " * (2 * SMALL_BODY)
        reply = httpx.post(f"{url}/reward", content=large, headers={"Content-Type": "application/json"}, timeout=60)
        assert reply.json()["total"] == [3.0, 2.0]
        for s in stalled:
            assert recv_all(s, 10).startswith(b"HTTP/1.1 408")
            s.close()


def recv_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data + b"<still open>"
    return data


def test_a_stalled_client_is_cut_off_and_costs_the_others_nothing():
    limits = ConnectionLimits(header_timeout=0.5, body_timeout=0.5)
    with serving(service(), connections=limits) as url:
        port = int(url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))  # connects and says nothing
        headers = socket.create_connection(("127.0.0.1", port))  # half of a request line's headers
        headers.sendall(b"POST /reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        body = socket.create_connection(("127.0.0.1", port))  # headers, then 10 of 100 bytes of body
        body.sendall(b"POST /reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"captions\"")  # fmt: skip
        kept = socket.create_connection(("127.0.0.1", port))  # a whole request, then a kept-alive silence
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        start = time.monotonic()
        assert httpx.post(f"{url}/reward", json=OK).json()["total"] == [3.0, 2.0]
        assert time.monotonic() - start < 0.4  # served at once meanwhile
        assert recv_all(silent, 5) == b""  # closed by the server, not by our timeout
        assert recv_all(headers, 5) == b""
        answer = recv_all(body, 5)
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer
        first = recv_all(kept, 0.2)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"<still open>")
        kept.sendall(b"GET /hea")  # the next request's headers, never finished
        assert recv_all(kept, 5) == b""
        for s in (silent, headers, body, kept):
            s.close()


class Held(Words):
    """One call a request, whose first call waits for :attr:`release` (a hung judge, a slow reward) and sets
    :attr:`started` when it begins: a test waits on these, not on the clock."""

    per_caption = False

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, captions, batch):
        first = not self.calls
        self.started.set()
        if first:
            self.release.wait(30)
        return super().__call__(captions, batch)


def test_departed_clients_leave_the_queue_while_the_reward_is_still_busy():
    """A reward call that does not return (a hung judge) while clients time out and ask again: each departed
    request leaves the queue at once, its captions with it, instead of waiting there for the call to return (the
    queue grew by one request of up to --max-request-bytes a retry, for as long as the call ran), and none of them is
    ever scored; /health shows the call's seconds and the requests waiting behind it. (This holds what
    test_a_departed_clients_request_is_never_scored checked with a 1 s reward and a clock, whose 0.8 s for five
    clients to leave a loaded machine once exceeded: the state is waited on here, not the clock.)"""
    reward = Held()
    svc = service(reward)
    with serving(svc) as url:
        first = threading.Thread(target=lambda: httpx.post(f"{url}/reward", json=OK, timeout=30), daemon=True)
        first.start()
        until(reward.started.is_set, "the first request was not scored")
        try:
            for k in range(20):
                with pytest.raises(httpx.TimeoutException):
                    httpx.post(f"{url}/reward", json={"captions": [f"retry {k}"] * 50, "image_ids": [1] * 50},
                               timeout=0.05)  # fmt: skip
            until(lambda: svc.meter.left == 20, "the departed requests were not dropped", timeout=5)
            assert svc.queued == 0  # the call still runs: nothing of the twenty is held
            waiting = threading.Thread(target=lambda: httpx.post(f"{url}/reward", json=OK, timeout=30), daemon=True)
            waiting.start()
            until(lambda: svc.queued == 1, "the waiting request did not queue")
            stuck = httpx.get(f"{url}/health", timeout=5).json()
        finally:
            reward.release.set()
        got = httpx.post(f"{url}/reward", json={"captions": ["next"], "image_ids": [2]}, timeout=30).json()
        first.join(10)
        waiting.join(10)
        idle = httpx.get(f"{url}/health", timeout=5).json()
    # /health shows the hung call (it said "ok" and nothing more): its seconds so far, and the request behind it
    assert stuck["queued"] == 1 and stuck["busy"] > 0 and stuck["scored"] == 0 and stuck["left"] == 20
    assert idle["queued"] == 0 and idle["busy"] == 0 and idle["scored"] == 3 and idle["left"] == 20
    assert got["total"] == [1.0]
    assert reward.calls == [OK["captions"], OK["captions"], ["next"]]


def server_threads() -> int:
    """Threads of this process but the test's own clients (named ``client ...``)."""
    return sum(not t.name.startswith("client ") for t in threading.enumerate())


def test_a_hung_reward_call_is_a_504_naming_score_timeout_for_it_and_every_request_behind_it(caplog):
    """A reward call that does not return (a judge that never answers): its request and the ten queued behind it
    each get a 504 naming --score-timeout once their deadline passes (they waited for ever: as long as the call),
    the ten leave the queue unscored, no thread is started for any of them, each 504 is counted in /health's
    failures and logged in bounded lines; once the call returns the server scores the next request."""
    reward = Held()
    svc = service(reward, score_timeout=2.0)  # the ten queue before the call is stuck (after it: 503s, next test)
    replies: dict[str, httpx.Response] = {}

    def ask(name: str, captions: list[str]) -> threading.Thread:
        def post() -> None:
            replies[name] = httpx.post(f"{url}/reward", json={"captions": captions, "image_ids": [1]}, timeout=30)

        thread = threading.Thread(target=post, name=f"client {name}", daemon=True)
        thread.start()
        return thread

    caplog.set_level(logging.WARNING, logger="finecap.serve")
    caplog.set_level(logging.INFO, logger="finecap.serve.app")  # the throughput line as the server stops
    with serving(svc) as url:
        try:
            hung = ask("hung", ["first"])
            until(reward.started.is_set, "the first request was not scored")
            threads = server_threads()
            behind = [ask(f"behind {k}", [f"behind {k}"]) for k in range(10)]
            until(lambda: svc.queued == 10 or svc.stuck(), "the ten never queued")
            assert not svc.stuck(), "the call was stuck before the ten queued behind it (a machine that slow?)"
            for thread in (hung, *behind):
                thread.join(20)
            answered = len(replies)
            queued_after, threads_after = svc.queued, server_threads()
        finally:
            reward.release.set()
        until(lambda: svc.busy_for == 0, "the released call did not return")
        after = httpx.post(f"{url}/reward", json={"captions": ["next one"], "image_ids": [2]}, timeout=30)
        health = httpx.get(f"{url}/health", timeout=5).json()
    assert answered == 11, f"{11 - answered} request(s) still wait behind the hung call"
    for name, reply in replies.items():
        assert reply.status_code == 504, (name, reply.status_code, reply.text)
        error = strict_json(reply.text)["error"]
        assert error["field"] is None and "not scored within 2 s (--score-timeout)" in error["message"], error
    assert "was in a reward call" in replies["hung"].json()["error"]["message"]
    assert "waited behind a reward call" in replies["behind 3"].json()["error"]["message"]
    assert queued_after == 0 and threads_after == threads  # the ten left the queue; no thread was started for them
    assert after.status_code == 200 and after.json()["total"] == [2.0]
    assert reward.calls == [["first"], ["next one"]]  # the ten timed out in the queue: never scored
    assert health["status"] == "ok" and health["failures"] == 11 and svc.meter.timed_out == 11
    # the next one alone was scored: the hung one (its 504 sent, its values dropped once its call returned) and the
    # ten timed out (/health's "requests" once counted the hung one as answered, once its call returned)
    assert (health["scored"], health["timed_out"], health["left"], health["failed"]) == (1, 11, 0, 0)
    said = [r.getMessage() for r in caplog.records if "--score-timeout" in r.getMessage() and r.levelno >= 30]
    assert 1 <= len(said) <= 3, said  # a full report per kind (in a call, behind one), its repeats counted
    # the throughput line counts the 504s apart (they were in no latency percentile and in no count of it)
    last = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reward server (words): in ")]
    assert len(last) == 1, last
    assert ("1 requests scored, 0 failed (500, 502), 11 timed out (504, --score-timeout), 0 left by their client, 0 "
            "refused (503: stuck, or the queue full)") in last[0], last  # fmt: skip


def test_requests_arriving_while_the_server_is_stuck_are_a_503_at_once_naming_the_call_and_the_option(caplog):
    """A request arriving while the current call has run past --score-timeout was queued behind it and waited out a
    full deadline of its own for a 504 (a trainer lost that long a batch, a load balancer never moved on): it is now
    answered 503 at once, with Retry-After and an error naming the stuck call and the option, never queued nor
    scored, through both endpoints; each is counted in /health's "refused" and logged in bounded lines."""
    reward = Held()
    svc = service(reward, score_timeout=0.3)
    svc.retry_after = 7
    caplog.set_level(logging.WARNING, logger="finecap.serve")
    with serving(svc) as url:
        try:
            hung = threading.Thread(target=lambda: httpx.post(f"{url}/reward", json=OK, timeout=30), daemon=True)
            hung.start()
            until(reward.started.is_set, "the request was not scored")
            until(svc.stuck, "the call never ran past the deadline")
            refused = httpx.post(f"{url}/reward", json={"captions": ["late"], "image_ids": [2]}, timeout=30)
            openrlhf = httpx.post(f"{url}/get_reward", json={"query": ["late too"], "labels": [3]}, timeout=30)
            queued, health = svc.queued, httpx.get(f"{url}/health", timeout=5).json()
        finally:
            reward.release.set()
        hung.join(10)
        until(lambda: svc.busy_for == 0, "the released call did not return")
        after = httpx.post(f"{url}/reward", json={"captions": ["next one"], "image_ids": [2]}, timeout=30)
    for reply in (refused, openrlhf):
        assert reply.status_code == 503, (reply.status_code, reply.text)  # it was a 504 once its own 0.3 s passed
        assert reply.headers["retry-after"] == "7"
        error = strict_json(reply.text)["error"]
        assert error["field"] is None and "the reward server is stuck: a call of the reward words has run" in \
            error["message"] and "past --score-timeout (0.3 s)" in error["message"], error  # fmt: skip
    assert queued == 0 and health["status"] == "stuck" and health["refused"] == 2 and health["timed_out"] == 1
    assert after.status_code == 200 and reward.calls == [OK["captions"], ["next one"]]  # the two never scored
    said = [r.getMessage() for r in caplog.records if "refused (503)" in r.getMessage()]
    assert len(said) == 2 and "unsaid until the server stopped" in said[1], said  # the second: counted, said at stop


def posted(port: int, body: bytes, path: str = "/reward") -> socket.socket:
    """A connection that has sent one POST of ``body`` (JSON) to ``path``: closing it is a client that leaves."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
              % (path.encode(), len(body), body))  # fmt: skip
    return s


def test_requests_beyond_max_queued_bytes_behind_a_slow_call_are_a_503_at_once_and_never_scored(caplog):
    """While a reward call is slow or hung (not yet past --score-timeout: not stuck), every checked request queued
    behind it, up to --max-connections of up to --max-request-bytes each (4 GiB at the defaults): a request that would
    take the queue's bodies past --max-queued-bytes is now answered 503 at once, with Retry-After and an error naming
    the option, through both endpoints, never queued nor scored, counted in /health's "refused" and logged; the
    queue's bytes leave with a departed client (the next request fits again), and the queued ones are scored once the
    call returns."""
    reward = Held()
    bodies = [json.dumps({"captions": [f"behind {k}"], "image_ids": [1]}).encode() for k in range(4)]
    size = len(bodies[0])
    assert all(len(b) == size for b in bodies)
    svc = service(reward, limits=Limits(max_request_bytes=2 * size), max_queued_bytes=2 * size + size // 2)
    svc.retry_after = 7
    caplog.set_level(logging.WARNING, logger="finecap.serve")
    with serving(svc) as url:
        port = int(url.rsplit(":", 1)[1])
        try:
            hung = threading.Thread(target=lambda: httpx.post(f"{url}/reward", json=OK, timeout=30), daemon=True)
            hung.start()
            until(reward.started.is_set, "the first request was not scored")
            kept = posted(port, bodies[0])
            leaving = posted(port, bodies[1])
            until(lambda: svc.queued == 2, "the two requests did not queue behind the call")
            refused = httpx.post(f"{url}/reward", content=bodies[2], headers={"Content-Type": "application/json"},
                                 timeout=10)  # fmt: skip
            openrlhf = httpx.post(f"{url}/get_reward", json={"query": ["late"], "labels": [3]}, timeout=10)
            full = httpx.get(f"{url}/health", timeout=5).json()
            leaving.close()  # its client leaves: its bytes leave the queue with it
            until(lambda: svc.meter.left == 1, "the departed request was not dropped")
            left_bytes = svc.queued_bytes
            fits = posted(port, bodies[3])
            until(lambda: svc.queued == 2, "the request after the departure did not queue")
        finally:
            reward.release.set()
        hung.join(10)
        answers = [recv_all(s, 10) for s in (kept, fits)]
        for s in (kept, fits):
            s.close()
        idle = httpx.get(f"{url}/health", timeout=5).json()
    for reply in (refused, openrlhf):
        assert reply.status_code == 503, (reply.status_code, reply.text)
        assert reply.headers["retry-after"] == "7"
        error = strict_json(reply.text)["error"]
        assert error["field"] is None and "the reward server's queue is full: 2 requests of " in error["message"]
        assert f"past --max-queued-bytes ({2 * size + size // 2:,})" in error["message"], error
    assert full["status"] == "ok"  # the call is slow, not past --score-timeout (120 s): the queue refused them
    assert full["queued"] == 2 and full["queued_bytes"] == 2 * size and full["refused"] == 2, full
    assert left_bytes == size
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 200") and b'"total":[2.0]' in answer, answer[:300]
    assert reward.calls == [OK["captions"], ["behind 0"], ["behind 3"]]  # the refused ones were never scored
    assert idle["queued"] == 0 and idle["queued_bytes"] == 0 and idle["refused"] == 2 and idle["scored"] == 3, idle
    said = [r.getMessage() for r in caplog.records if "refused (503)" in r.getMessage()]
    assert said and "--max-queued-bytes" in said[0], said


def test_finecap_client_asks_again_after_a_503_and_gets_the_values_once_the_call_returns(caplog):
    """RewardClient failed a trainer's batch at the first 503 (a stuck server, or all its connections open): it asks
    again with backoff (the server's Retry-After at least), sync and async, and gets the values once the stuck call
    has returned; with retries=0 the 503 is its error at once."""
    import asyncio

    from finecap.serve.client import RewardClient, RewardServerError

    reward = Held()
    svc = service(reward, score_timeout=0.3)
    svc.retry_after = 1
    got: dict[str, object] = {}
    caplog.set_level(logging.WARNING, logger="finecap.serve.client")
    with serving(svc) as url:
        client = RewardClient(url, timeout=30)
        try:
            hung = threading.Thread(target=lambda: httpx.post(f"{url}/reward", json=OK, timeout=30), daemon=True)
            hung.start()
            until(reward.started.is_set, "the request was not scored")
            until(svc.stuck, "the call never ran past the deadline")
            with pytest.raises(RewardServerError, match=r"the reward server is stuck.*\[HTTP 503\]"):
                RewardClient(url, retries=0).score(["not retried"], image_ids=[1])
            askers = [threading.Thread(target=lambda: got.update(sync=client.score(["late one"], image_ids=[2]))),
                      threading.Thread(target=lambda: got.update(
                          asynchronous=asyncio.run(client.ascore(["late two words"], image_ids=[3])))),
                      ]  # fmt: skip
            for t in askers:
                t.start()
            until(lambda: svc.meter.refused >= 3, "the clients' requests were never refused")
        finally:
            reward.release.set()
        for t in askers:
            t.join(60)
        client.close()
    assert got["sync"].total.tolist() == [2.0] and got["asynchronous"].total.tolist() == [3.0]
    retried = [r.getMessage() for r in caplog.records if "answered 503" in r.getMessage()]
    assert len(retried) >= 2 and all("asking again in" in m and "the reward server is stuck" in m for m in retried)


def hung_mount(monkeypatch) -> tuple[threading.Event, list[str]]:
    """A stand-in for a hung network file system, for the reward service's checks: resolving a path under
    /mnt/hung-nfs/ waits until the returned event is set (a server that never answers), each such path listed as
    it blocks."""
    import finecap.serve.service as service_module

    release, blocked = threading.Event(), []
    real_path = service_module.real_path

    def hung_mount_path(path: str) -> str:
        if path.startswith("/mnt/hung-nfs/"):
            blocked.append(path)
            release.wait(60)
        return real_path(path)

    monkeypatch.setattr(service_module, "real_path", hung_mount_path)
    return release, blocked


def test_image_paths_on_a_file_system_that_never_answers_are_a_504_naming_score_timeout(monkeypatch):
    """A request naming image paths on a hung network file system blocked a check thread for ever, its client
    waiting as long (the check had no deadline): it is answered 504 naming --score-timeout once the deadline passes;
    once both check threads are so held, a request is answered 503 at once (never checked, nor queued for a thread);
    once the file system answers, requests are served again. The hang is a stand-in for the mount: a path under
    /mnt/hung-nfs/ whose resolution waits on an event."""
    release, blocked = hung_mount(monkeypatch)
    svc = RewardService(Words(), ImageTable(range(10), {"/data/1.png": 1}), log_every=0, name="words",
                        score_timeout=0.5)  # fmt: skip
    hung = [{"captions": ["a b"], "images": [f"/mnt/hung-nfs/{k}.png"]} for k in range(2)]
    with serving(svc) as url:
        try:
            first = httpx.post(f"{url}/reward", json=hung[0], timeout=20)  # it waited for ever (the old check)
            second = httpx.post(f"{url}/reward", json=hung[1], timeout=20)
            until(svc.checks_stuck, "the second check never ran past the deadline")
            waiting = httpx.post(f"{url}/reward", json=OK, timeout=20)  # both check threads are held
        finally:
            release.set()
        after = httpx.post(f"{url}/reward", json={"captions": ["a b c"], "images": ["/data/1.png"]}, timeout=20)
        health = httpx.get(f"{url}/health", timeout=5).json()
    for reply in (first, second):
        assert reply.status_code == 504, (reply.status_code, reply.text)
        error = strict_json(reply.text)["error"]
        assert error["field"] is None and "not checked within 0.5 s (--score-timeout)" in error["message"], error
    assert waiting.status_code == 503 and "cannot check requests" in waiting.text, waiting.text  # at once
    assert blocked == ["/mnt/hung-nfs/0.png", "/mnt/hung-nfs/1.png"]  # the waiting request was never checked
    assert after.status_code == 200 and after.json()["total"] == [3.0]
    assert health["timed_out"] == 2 and health["refused"] == 1 and health["failures"] == 3 and health["scored"] == 1


def test_health_is_a_503_saying_checks_stuck_while_both_check_threads_are_blocked(monkeypatch):
    """While both check threads were blocked on a file system that never answers (no request could be checked:
    each waited out its deadline for a thread), /health said "ok": a supervisor's probe could not see it. With one
    blocked it is still 200 "ok" (the other thread checks), with both a 503 "checks_stuck" counting them in
    "blocked_checks" (and a request arriving then a 503 at once, as while a reward call is stuck), and 200 "ok"
    again once the file system answers. The hang is the stand-in mount of the test
    above: a path under /mnt/hung-nfs/ whose resolution waits on an event."""
    release, blocked = hung_mount(monkeypatch)
    svc = RewardService(Words(), ImageTable(range(10)), log_every=0, name="words", score_timeout=0.5)
    hung = [{"captions": ["a b"], "images": [f"/mnt/hung-nfs/{k}.png"]} for k in range(2)]
    with serving(svc) as url:
        try:
            first = httpx.post(f"{url}/reward", json=hung[0], timeout=20)
            until(lambda: svc.blocked_checks == 1, "the first check never ran past the deadline")
            one = httpx.get(f"{url}/health", timeout=5)
            second = httpx.post(f"{url}/reward", json=hung[1], timeout=20)
            until(svc.checks_stuck, "the second check never ran past the deadline")
            both = httpx.get(f"{url}/health", timeout=5)
            refused = httpx.post(f"{url}/reward", json={"captions": ["a b"], "images": ["/mnt/hung-nfs/2.png"]},
                                 timeout=20)  # fmt: skip  # no thread to check it: a 503 at once, never checked
            counted = httpx.get(f"{url}/health", timeout=5).json()
        finally:
            release.set()
        until(lambda: svc.blocked_checks == 0, "the released checks did not return")
        healthy = httpx.get(f"{url}/health", timeout=5)
        after = httpx.post(f"{url}/reward", json=OK, timeout=20)
    assert blocked == ["/mnt/hung-nfs/0.png", "/mnt/hung-nfs/1.png"]
    # it waited out its own deadline for a thread and got a 504 (the old off_loop); now a 503 with Retry-After
    assert refused.status_code == 503 and refused.headers["retry-after"] == str(svc.retry_after), refused.text
    assert "cannot check requests" in refused.json()["error"]["message"] and counted["refused"] == 1
    assert first.status_code == second.status_code == 504, (first.text, second.text)
    assert one.status_code == 200 and one.json()["status"] == "ok" and one.json()["blocked_checks"] == 1, one.text
    assert both.status_code == 503, both.text
    assert both.json()["status"] == "checks_stuck" and both.json()["blocked_checks"] == 2, both.text
    assert both.json()["busy"] == 0 and both.json()["timed_out"] == 2  # the reward itself is idle, not stuck
    assert healthy.status_code == 200 and healthy.json()["status"] == "ok" and healthy.json()["blocked_checks"] == 0
    assert after.status_code == 200 and after.json()["total"] == [3.0, 2.0]


def test_a_request_waiting_for_a_check_thread_is_a_503_once_both_are_blocked_not_a_504_at_its_deadline(monkeypatch):
    """A request arriving while both check threads were held by hung checks not yet past their deadline waited for a
    thread until its own deadline and got a 504, where one arriving a moment later got the 503 with Retry-After of a
    server known stuck. The checks it waits behind began before it, so they pass the deadline first: it is answered
    that 503 then, never checked (its path, under the stand-in hung mount, would be in ``blocked``)."""
    release, blocked = hung_mount(monkeypatch)
    svc = RewardService(Words(), ImageTable(range(10)), log_every=0, name="words", score_timeout=3.0)
    hung = [{"captions": ["a b"], "images": [f"/mnt/hung-nfs/{k}.png"]} for k in range(3)]
    replies: dict[int, httpx.Response] = {}

    def ask(k: int) -> None:
        replies[k] = httpx.post(f"{url}/reward", json=hung[k], timeout=20)

    with serving(svc) as url:
        try:
            holders = [threading.Thread(target=ask, args=(k,), daemon=True) for k in range(2)]
            for thread in holders:
                thread.start()
            until(lambda: len(blocked) == 2, "the two hung checks never began")
            assert svc.blocked_checks == 0  # both threads busy, neither past its deadline: the waiting request's case
            ask(2)
            health = httpx.get(f"{url}/health", timeout=5).json()
        finally:
            release.set()
        for thread in holders:
            thread.join(20)
    waiting = replies[2]
    assert waiting.status_code == 503, (waiting.status_code, waiting.text)  # a 504 at its own deadline (old)
    assert waiting.headers["retry-after"] == str(svc.retry_after)
    message = waiting.json()["error"]["message"]
    assert "cannot check requests" in message and "waited" in message and "was not checked" in message, message
    assert sorted(blocked) == ["/mnt/hung-nfs/0.png", "/mnt/hung-nfs/1.png"]  # never checked
    assert replies[0].status_code == replies[1].status_code == 504
    assert (health["refused"], health["timed_out"], health["failures"]) == (1, 2, 3), health


def test_health_is_a_503_saying_stuck_while_a_call_runs_past_the_score_timeout():
    """/health said "ok" with a hung call (only its growing "busy" told): a supervisor's probe, which reads the
    status code, could not see it. Past --score-timeout it is a 503 "stuck", and "ok" again once the call returns."""
    reward = Held()
    svc = service(reward, score_timeout=0.3)
    with serving(svc) as url:
        try:
            client = threading.Thread(target=lambda: httpx.post(f"{url}/reward", json=OK, timeout=30), daemon=True)
            client.start()
            until(reward.started.is_set, "the request was not scored")
            early = httpx.get(f"{url}/health", timeout=5)
            until(lambda: svc.busy_for > 0.3, "the call never ran past the deadline")
            stuck = httpx.get(f"{url}/health", timeout=5)
        finally:
            reward.release.set()
        until(lambda: svc.busy_for == 0, "the released call did not return")
        healthy = httpx.get(f"{url}/health", timeout=5)
        client.join(10)
    assert early.status_code == 200 or early.json()["busy"] > 0.3  # a loaded machine may be slow to ask
    assert stuck.status_code == 503, stuck.text
    assert stuck.json()["status"] == "stuck" and stuck.json()["busy"] > 0.3 and stuck.json()["score_timeout"] == 0.3
    assert healthy.status_code == 200 and healthy.json()["status"] == "ok" and healthy.json()["busy"] == 0


def test_connections_beyond_the_cap_are_closed_at_once_and_the_server_recovers(caplog):
    limits = ConnectionLimits(max_connections=4, header_timeout=30)
    caplog.set_level(logging.WARNING, logger="finecap.serve.app")
    with serving_server(service(), connections=limits) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4 + HEALTH_CONNECTIONS)]
        until(lambda: open_connections(server) == 4 + HEALTH_CONNECTIONS, "the server never held the connections")
        extra = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        assert [recv_all(e, 5) for e in extra] == [b""] * 3  # closed at once: the cap and the probes' are full
        for s in [*held, *extra]:
            s.close()
        until(lambda: open_connections(server) == 0, "the server never saw the connections close")
        assert httpx.post(f"{url}/reward", json=OK).json()["total"] == [3.0, 2.0]
    # one line at the first, the other two counted within its 10 s: said as the server stopped, not lost with it
    closed = [r.getMessage() for r in caplog.records if "closed at once" in r.getMessage()]
    assert [m.split(" connection(s)")[0] for m in closed] == ["reward server: 1", "reward server: 2"], closed


def test_a_health_probe_gets_through_while_a_trainer_holds_every_connection():
    # the probe's connection was closed at once like any beyond the cap: a supervisor restarted a healthy server
    limits = ConnectionLimits(max_connections=4, header_timeout=30)
    with serving_server(service(), connections=limits) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]  # the trainer's, all of them
        until(lambda: open_connections(server) == 4, "the server never held the 4 connections")
        with httpx.Client(timeout=5) as probe:  # one kept-alive connection beyond the cap, asked twice
            for _ in range(2):
                health = probe.get(f"{url}/health")
                assert health.status_code == 200 and health.json()["status"] == "ok"
        # a connection beyond the cap answers nothing else: a 503 naming the option, and it is closed
        refused = httpx.post(f"{url}/reward", json=OK, timeout=5)
        assert refused.status_code == 503 and refused.headers["connection"] == "close"
        assert "--max-connections" in strict_json(refused.text)["error"]["message"]
        # the policy holds on those connections too: a web page's probe is refused
        assert httpx.get(f"{url}/health", headers={"Origin": "https://evil.example"}, timeout=5).status_code == 403
        for s in held:
            s.close()
        until(lambda: open_connections(server) == 0, "the server never saw the connections close")
        assert httpx.post(f"{url}/reward", json=OK, timeout=5).json()["total"] == [3.0, 2.0]


class ManyParts(Words):
    """A reply of about 12 MB (1,500 parts of 2,000 captions' values): beyond what the sockets' kernel buffers hold
    (Linux's tcp_wmem allows 4 MiB), so that a client reading nothing leaves the reply waiting in the server."""

    per_caption = True

    def __call__(self, captions, batch):
        total = torch.ones(len(captions))
        return RewardOutput(total, {f"part{k}": total for k in range(1500)})


def test_a_reply_its_client_does_not_read_is_dropped_after_the_write_timeout(caplog):
    # a client that sent a request and never read its large reply held the connection and the reply for ever
    limits = ConnectionLimits(write_timeout=0.5)
    request = json.dumps({"captions": ["a"] * 2000, "image_ids": [1] * 2000}).encode()
    svc = service(ManyParts())
    with caplog.at_level(logging.WARNING, logger="finecap.serve.app"), \
            serving_server(svc, connections=limits) as (url, server):  # fmt: skip
        port = int(url.rsplit(":", 1)[1])
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing: the reply fills the buffers
        reader.connect(("127.0.0.1", port))
        reader.sendall(b"POST /reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(request)).encode() + b"\r\n\r\n" + request)  # fmt: skip
        until(lambda: svc.meter.total_scored == 1, "the request was never scored")
        until(lambda: open_connections(server) == 0, "the unread reply's connection was never closed", timeout=8)
        assert httpx.post(f"{url}/reward", json=OK, timeout=5).json()["total"] == [1.0, 1.0]  # the others served
        reader.close()
    said = [r.getMessage() for r in caplog.records if "--write-timeout" in r.getMessage()]
    assert len(said) == 1 and "1 connection(s) read no more of their reply for 0.5 s" in said[0]


def test_accept_errors_are_one_line_every_ten_seconds(caplog):
    import asyncio

    from finecap.serve.app import QuietAcceptErrors

    handler = QuietAcceptErrors(every=10.0)
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING, logger="finecap.serve.app"):
            for _ in range(500):
                handler(loop, {"message": "socket.accept() out of system resource",
                               "exception": OSError(24, "Too many open files")})  # fmt: skip
    finally:
        loop.close()
    lines = [r for r in caplog.records if "could not be accepted" in r.getMessage()]
    assert len(lines) == 1 and "Too many open files" in lines[0].getMessage() and lines[0].exc_info is None
    assert handler.count == 499  # counted for the next line


def test_the_connection_cap_stays_under_the_file_descriptor_limit():
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = ConnectionLimits(max_connections=65_536).connection_cap()
    assert cap <= max(1, soft - 64) and cap >= 1
    assert ConnectionLimits(max_connections=3).connection_cap() == 3 or soft < 67


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"header_timeout": float("inf")}, "--header-timeout: must be a number of seconds above 0"),
        ({"header_timeout": 0.0}, "--header-timeout"),
        ({"body_timeout": float("nan")}, "--body-timeout"),
        ({"max_connections": 0}, "--max-connections: must be from 1 to 65536"),
        ({"write_timeout": -1.0}, "--write-timeout: must be a number of seconds above 0"),
    ],
)
def test_connection_limits_are_checked(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ConnectionLimits(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"batch_wait": float("inf")}, "--batch-wait-ms: must be a number from 0 to 60000, got inf"),
        ({"batch_wait": float("nan")}, "--batch-wait-ms"),
        ({"batch_wait": -0.001}, "--batch-wait-ms"),
        ({"batch_size": 10**7}, "--batch-size: must be from 1 to 1,000,000"),
        ({"log_every": float("inf")}, "--log-every: must be a finite number"),
        ({"score_timeout": 0.0}, "--score-timeout: must be a number of seconds above 0 and at most 86400, got 0"),
        ({"score_timeout": float("nan")}, "--score-timeout"),
        ({"score_timeout": 1e6}, "--score-timeout"),
        ({"batch_wait": 2.0, "score_timeout": 2.0}, r"--score-timeout: must exceed --batch-wait-ms \(2000 ms\)"),
        ({"max_queued_bytes": 0}, "--max-queued-bytes: must be from 1 to 1,099,511,627,776, got 0"),
        ({"max_queued_bytes": 2**41}, "--max-queued-bytes: must be from 1"),
        # a request of the largest size allowed would be refused even by an empty queue
        (
            {"max_queued_bytes": 2**20},
            r"--max-queued-bytes: must be at least --max-request-bytes \(16,777,216\), got 1,048,576",
        ),
        (
            {"max_queued_bytes": 999, "limits": Limits(max_request_bytes=1000)},
            r"at least --max-request-bytes \(1,000\)",
        ),
    ],
)
def test_service_options_are_checked(kwargs, words):
    with pytest.raises(ValueError, match=words):
        RewardService(Words(), ImageTable(range(3)), **kwargs)


def test_a_client_keeps_its_requests_under_the_servers_cap_and_its_threads_share_one_pool():
    # a trainer awaiting many samples at once (verl's reward loop) had most of them closed by the cap; threads one
    # after another each kept a pool (and its connection) for ever
    import asyncio

    from finecap.serve.client import RewardClient

    limits = ConnectionLimits(max_connections=4, header_timeout=30)
    with serving_server(service(), connections=limits) as (url, server):
        client = RewardClient(url, max_in_flight=2)

        async def many():
            return await asyncio.gather(*(client.ascore(["a red circle"], [1]) for _ in range(24)))

        assert [out.total.tolist() for out in asyncio.run(many())] == [[3.0]] * 24
        until(lambda: open_connections(server) == 0, "the awaited requests' connections never closed")
        for _ in range(8):
            thread = threading.Thread(target=lambda: client.score(["a red circle"], [1]))
            thread.start()
            thread.join()
        until(lambda: open_connections(server) == 1, "the threads' requests kept more than one connection", timeout=5)
        client.close()


def test_a_request_the_server_cannot_read_is_a_400_never_a_500(caplog):
    # an integer of over 4,300 digits (past Python's limit) and a path holding a NUL character were answered 500
    # with a logged traceback, as if the server had failed
    with serving(RewardService(Words(), ImageTable(range(10), {"img.jpg": 1}), log_every=0)) as url:
        huge = b'{"captions": ["a"], "image_ids": [' + b"9" * 5000 + b"]}"
        reply = httpx.post(f"{url}/reward", content=huge, headers={"content-type": "application/json"})
        assert reply.status_code == 400 and "a number too long to read" in reply.json()["error"]["message"]
        reply = httpx.post(f"{url}/reward", json={"captions": ["a"], "images": ["img\u0000.jpg"]})
        assert reply.status_code == 400 and reply.json()["error"]["field"] == "images[0]"
        assert "unknown image file" in reply.json()["error"]["message"]
    assert not [r for r in caplog.records if r.exc_info]


def test_an_overflowing_id_a_link_loop_and_a_departing_body_are_answered_quietly(tmp_path, caplog):
    """Three requests that made a 500 and a logged traceback: an id of 1e999 (a valid JSON number that
    reads as infinity, which no JSON reply can echo), an image path inside a symbolic link loop (pathlib raises
    RuntimeError there before Python 3.13), and a client that leaves while sending its body."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with serving(RewardService(Words(), ImageTable(range(10), {"img.jpg": 1}), log_every=0)) as url:
        for number in (b"1e999", b"-1e999"):
            body = b'{"id": ' + number + b', "captions": ["a"], "image_ids": [1]}'
            reply = httpx.post(f"{url}/reward", content=body, headers={"content-type": "application/json"})
            assert reply.status_code == 400 and reply.json()["error"]["field"] == "id", reply.text
        for path in (str(loop), str(loop / "x")):
            reply = httpx.post(f"{url}/reward", json={"captions": ["a"], "images": [path]})
            assert reply.status_code == 400 and "unknown image file" in reply.json()["error"]["message"], reply.text
        port = int(url.rsplit(":", 1)[1])
        for _ in range(20):
            gone = socket.create_connection(("127.0.0.1", port))
            gone.sendall(b"POST /reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{")  # fmt: skip
            gone.close()
        assert httpx.post(f"{url}/reward", json=OK).json()["total"] == [3.0, 2.0]  # and the server goes on
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


def test_reference_captions_beyond_the_limit_are_a_413():
    """3 million two-letter references fit in 16 MiB and took a gigabyte to score: the request's references in all
    are bounded (--max-references), for /reward and for /get_reward's labels."""
    limits = Limits(max_references=6)
    with serving(service(limits=limits)) as url:
        body = {"captions": ["a", "b"], "image_ids": [1, 2], "references": [["r"] * 3, ["r"] * 3]}
        assert httpx.post(f"{url}/reward", json=body).status_code == 200  # 6: at the limit
        body["references"][1].append("r")
        reply = httpx.post(f"{url}/reward", json=body)
        assert reply.status_code == 413 and reply.json()["error"] == {
            "field": "references", "message": "7 reference captions, more than the 6 a request may hold "
            "(--max-references)"}  # fmt: skip
        labels = [{"image_id": 1, "references": ["r"] * 4}, {"image_id": 2, "references": ["r"] * 3}]
        reply = httpx.post(f"{url}/get_reward", json={"query": ["a", "b"], "labels": labels})
        assert reply.status_code == 413 and reply.json()["error"]["field"] == "labels"


def test_connections_cut_off_for_their_headers_are_one_log_line_every_ten_seconds(caplog):
    """A client holding many idle connections made a log line for each one the header deadline closed (26 lines a
    second under one client's load): now at most one line every 10 s, with the count, and those counted since the
    last line said as the server stops."""
    limits = ConnectionLimits(header_timeout=0.3)
    with caplog.at_level(logging.INFO, logger="finecap"), serving(service(), connections=limits) as url:
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
        for s in idle:
            assert recv_all(s, 5) == b""  # each closed by the server's deadline
            s.close()
        assert httpx.post(f"{url}/reward", json=OK).json()["total"] == [3.0, 2.0]
    said = [r.getMessage() for r in caplog.records if "no complete request headers" in r.getMessage()]
    assert [m.split(" connection(s)")[0] for m in said] == ["reward server: 1", "reward server: 11"], said
    assert said[0].startswith("reward server: 1 connection(s) sent no complete request headers")


def test_requests_that_are_no_http_or_ask_for_an_upgrade_are_one_log_line_every_ten_seconds(caplog):
    """uvicorn logged a warning for each request that was no HTTP/1.1 (a TLS client, a port scanner) and two for each
    asking for an ``Upgrade`` (the second advising to install a WebSocket library, which a reward server never
    serves): 300 lines for 100 of each, for days. Now one line each at most every 10 s with the count, the rest said
    as the server stops; every such request is still answered."""
    with caplog.at_level(logging.INFO, logger="finecap"), serving(service()) as url:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port)) as garbage:
                garbage.sendall(b"\x16\x03\x01 not http\r\n\r\n")
                assert recv_all(garbage, 5).startswith(b"HTTP/1.1 400")
        with httpx.Client() as client:
            for _ in range(20):
                reply = client.post(f"{url}/reward", json=OK, headers={"Upgrade": "h2c", "Connection": "Upgrade"})
                assert reply.json()["total"] == [3.0, 2.0]
    said = [r.getMessage() for r in caplog.records if r.name.startswith(("finecap", "uvicorn"))]
    invalid = [m for m in said if "Invalid HTTP request received." in m]
    upgrades = [m for m in said if "upgrade" in m.lower() or "WebSocket" in m]
    assert [m.split(" request(s)")[0] for m in invalid] == ["reward server: 1", "reward server: 19"], said
    assert [m.split(" request(s)")[0] for m in upgrades] == ["reward server: 1", "reward server: 19"], said
    assert "answered 400" in invalid[0] and "answered over HTTP/1.1" in upgrades[0]
