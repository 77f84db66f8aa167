"""Credentials in a server's URL (``http://user:password@host/v1``) are sent as HTTP basic authentication and never
requested in the URL, which httpx logs at INFO for every request (``HTTP Request: POST <url>``): each HTTP client of
finecap (boost's openai backend, the openai judge, the reward server's client and the adapters over it) against a
real server on 127.0.0.1, with httpx's and httpcore's loggers at DEBUG, and every file a boost run writes."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from finecap.app.boost import main as boost
from finecap.boost.engine import Task
from finecap.boost.openai_backend import OpenAIBackend
from finecap.config import ConfigError, load
from finecap.config.secrets import masked_authorization, split_credentials
from finecap.integrations.swift import async_orm
from finecap.integrations.verl import compute_score_batch
from finecap.judges.base import Ask, Question
from finecap.judges.openai import OpenAIJudge
from finecap.serve.client import RewardClient
from helpers.chat_server import ChatServer, completion, echo_first_caption
from helpers.tiny_world import make_tiny_world, world_items

USER, PASSWORD = "alice", "pa55-w0rd@x"  # an '@' in the password, written %40 in the URL
SECRETS = (PASSWORD, "pa55-w0rd%40x", base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
BASIC = f"Basic {base64.b64encode(f'{USER}:{PASSWORD}'.encode()).decode()}"


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:pa55-w0rd%40x@")


@pytest.fixture
def http_logs(caplog):
    """Every record of httpx, httpcore and finecap, at DEBUG (a user's ``basicConfig(level=DEBUG)``)."""
    for name in ("httpx", "httpcore", "finecap"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def assert_no_secret_in(caplog, server: ChatServer) -> None:
    """No secret in any record (its message and its arguments), and httpx did log the request it made: the check
    reads the records that would hold the URL."""
    texts = [f"{r.getMessage()} {r.args!r} {r.msg!r}" for r in caplog.records]
    requested = [t for t in texts if "HTTP Request: POST" in t and server.url.split("//")[1].split("/")[0] in t]
    assert requested, texts
    for secret in SECRETS:
        assert not [t for t in texts if secret in t], secret


def test_split_credentials():
    assert split_credentials("http://alice:pa55-w0rd%40x@127.0.0.1:8000/v1?x=1#f") == (
        "http://127.0.0.1:8000/v1?x=1#f", ("alice", "pa55-w0rd@x"))  # fmt: skip
    assert split_credentials("https://a@b:c@host/v1") == ("https://host/v1", ("a@b", "c"))  # the last '@' ends it
    assert split_credentials("http://sk-token@host") == ("http://host", ("sk-token", ""))
    assert split_credentials("http://@host/v1") == ("http://host/v1", None)
    assert split_credentials("http://host/a@b?c=d@e") == ("http://host/a@b?c=d@e", None)  # an '@' past the host
    assert split_credentials("http://127.0.0.1:8000") == ("http://127.0.0.1:8000", None)
    assert split_credentials("not a url@all") == ("not a url@all", None)


def test_the_boost_backend_sends_basic_auth_and_logs_no_password(http_logs):
    with ChatServer() as server:
        backend = OpenAIBackend("m", with_credentials(server.url), "", sleep=lambda s: None)
        try:
            task = Task(0, None, "blend", [{"role": "user", "content": "- a cat"}], {})
            assert backend.complete(task) == "boosted a cat"
        finally:
            backend.close()
    assert [r["headers"]["Authorization"] for r in server.requests] == [BASIC]
    assert PASSWORD not in backend.url and "pa55" not in backend.url
    assert_no_secret_in(http_logs, server)


def test_the_judge_sends_basic_auth_and_no_message_or_log_shows_the_password(http_logs):
    def answer(payload, n):  # the green circle's call fails, the blue one's is answered
        return (500, {"error": "busy"}) if "green" in payload["messages"][-1]["content"] else (200, completion("B"))

    question = Question("0/c", "What colour?", ("red", "blue"), "blue")
    with ChatServer(answer) as server:
        judge = OpenAIJudge([with_credentials(server.url)], "judge-model", sleep=lambda s: None, retries=0)
        try:
            first, second = judge.answer([Ask(question, ("red", "blue"), f"a {c} circle") for c in ("green", "blue")])
        finally:
            judge.close()
    assert {r["headers"]["Authorization"] for r in server.requests} == {BASIC}
    assert second == "blue" and "HTTP 500" in str(first)  # a failure's message names the URL
    assert not [s for s in SECRETS if s in str(first)] and "http://***@127.0.0.1" in str(first)  # as given, masked
    assert_no_secret_in(http_logs, server)


def test_the_reward_client_and_its_adapters_send_basic_auth_and_log_no_password(http_logs):
    with ChatServer(lambda payload, n: (200, {"total": [1.0] * len(payload["captions"])})) as server:
        url = with_credentials(server.url.removesuffix("/v1"))
        client = RewardClient(url)
        try:
            assert client.score(["a"], [1]).total.tolist() == [1.0]
        finally:
            client.close()
        assert asyncio.run(RewardClient(url).ascore(["a"], [1])).total.tolist() == [1.0]
        assert [r["score"] for r in compute_score_batch(["d"], ["a"], [""], [{"image_id": 1}], url=url)] == [1.0]
        assert asyncio.run(async_orm(url=url)()(["a"], image_id=[1])) == [1.0]
    assert [r["headers"]["Authorization"] for r in server.requests] == [BASIC] * 4
    assert_no_secret_in(http_logs, server)


def test_a_boost_run_writes_and_logs_no_password(tmp_path, http_logs, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    small = ("world.n_train=4", "world.n_val=1", "world.n_test=1")
    world = make_tiny_world(tmp_path / "world", small)
    items = [*world_items(world, small), "boost.mode=blend", "boost.llm_backend=openai", "boost.llm_model=m",
             "boost.few_shot=false"]  # fmt: skip
    with ChatServer(echo_first_caption) as server:
        summary = boost(load(None, [*items, f"boost.llm_base_url={with_credentials(server.url)}"]), tmp_path / "out",
                        progress=False)  # fmt: skip
    assert summary["failed"] == 0 and server.requests
    assert {r["headers"]["Authorization"] for r in server.requests} == {BASIC}
    printed = capsys.readouterr()
    files = {p: p.read_bytes() for p in Path(tmp_path / "out").rglob("*") if p.is_file()}
    assert Path(tmp_path / "out" / "boost.json") in files
    for secret in SECRETS:
        assert secret not in printed.out + printed.err
        assert not [p for p, data in files.items() if secret.encode() in data], secret
    assert_no_secret_in(http_logs, server)


@pytest.mark.parametrize("tail", ["?api_key=s3cr3t-q", "?x=1&token=s3cr3t-q", "#frag"])
def test_a_server_url_with_a_query_or_fragment_is_refused_before_any_request(tail, http_logs):
    # the clients append /chat/completions or /reward to the URL, which landed inside its query (a request to
    # '/v1?api_key=...' + '/chat/completions' that httpx logged at INFO, secret and all); now refused first
    with pytest.raises(ValueError, match=r"boost.llm_base_url=.*a base URL takes no \?query or #fragment") as e:
        OpenAIBackend("m", f"http://127.0.0.1:9/v1{tail}", "", key="boost.llm", sleep=lambda s: None)
    with pytest.raises(ValueError, match=r"RewardClient: the server's URL takes no \?query or #fragment") as r:
        RewardClient(f"http://127.0.0.1:9{tail}")
    assert "s3cr3t" not in str(e.value) + str(r.value)
    assert not http_logs.records


@pytest.mark.parametrize(
    "override",
    [f"judge.urls=[http://{USER}:pa55-w0rd%40x@127.0.0.1:9/v1", "judge.urls=[http://127.0.0.1:9/v1?api_key=pa55-w0rd",
     "data.hf=https://pa55-w0rd@hub.example/d"],
)  # fmt: skip
def test_a_configuration_error_never_repeats_url_credentials_through_the_api(override):
    # The command line masks URL credentials in the error it prints, but the ConfigError itself (what load(), the
    # Python API and a traceback show) repeated the value whole where it could not read it (a list with an unclosed
    # bracket, a section given one value)
    with pytest.raises(ConfigError) as e:
        load(None, [override])
    assert "***" in str(e.value) and "pa55-w0rd" not in str(e.value) and USER not in str(e.value)


def test_a_configuration_printed_shows_no_secret():
    # repr(cfg) (a notebook's output, a failed assertion, a traceback with its locals) showed boost.llm_api_key and
    # every URL's password as given; it masks them as config.yaml does, and shows every other value as before
    cfg = load(None, ["boost.llm_api_key=sk-pa55-w0rd", f"boost.llm_base_url={with_credentials('http://h:8000/v1')}",
                      "judge.urls=[http://127.0.0.1:9/v1, http://tok-pa55-w0rd@h/v1]", "train.lr=3e-4"])  # fmt: skip
    for shown in (repr(cfg), repr(cfg.boost), str(cfg.judge), repr(cfg.data)):
        assert "pa55-w0rd" not in shown, shown
    assert "llm_api_key='***'" in repr(cfg.boost) and "vlm_api_key=''" in repr(cfg.boost)
    assert "llm_base_url='http://***@h:8000/v1'" in repr(cfg)
    assert "urls=['http://127.0.0.1:9/v1', 'http://***@h/v1']" in repr(cfg.judge)
    assert "lr=0.0003" in repr(cfg.train) and "hf=HfDataConfig(image_column='image'" in repr(cfg.data)


TOKEN = "rw-t0ken-pa55-w0rd"
"""The reward server's bearer token in the tests of a server that echoes the request's headers."""


def echoing_authorization(server_box: list[ChatServer], status: int, then: tuple[int, Any] | None = None):
    """A server or proxy that answers ``status`` repeating the ``Authorization`` header it got (httpx's, as httpbin
    or a debugging proxy would), then ``then`` to every later request."""

    def answer(payload, n):
        if then is not None and len(server_box[0].requests) > 1:
            return then
        header = server_box[0].requests[-1]["headers"]["Authorization"]
        return status, {"error": {"message": f"refused: got headers {{'Authorization': '{header}'}}"}}

    return answer


@pytest.mark.parametrize("credentials", ["token", "url"])
def test_a_server_echoing_the_authorization_header_shows_no_credential(credentials, http_logs):
    # a reward server (or a proxy) repeating the request's Authorization header in its error: the client's error
    # repeated its words, the bearer token (or the URL's user:password, in base64) with them
    box: list[ChatServer] = []
    with ChatServer(echoing_authorization(box, 401)) as server:
        box.append(server)
        url = server.url.removesuffix("/v1")
        client = RewardClient(url, token=TOKEN) if credentials == "token" else RewardClient(with_credentials(url))
        try:
            with pytest.raises(RuntimeError) as refused:
                client.score(["a"], [1])
        finally:
            client.close()
    sent = server.requests[0]["headers"]["Authorization"]
    assert sent == (f"Bearer {TOKEN}" if credentials == "token" else BASIC)
    assert "refused: got headers {'Authorization': '" in str(refused.value)  # the server's words, its header masked
    assert sent.split()[1] not in str(refused.value) and "***" in str(refused.value)


def test_a_retried_reply_echoing_the_authorization_header_logs_no_token(http_logs):
    box: list[ChatServer] = []
    with ChatServer(echoing_authorization(box, 503, then=(200, {"total": [1.0]}))) as server:
        box.append(server)
        client = RewardClient(server.url.removesuffix("/v1"), token=TOKEN, retries=1)
        try:
            with mock.patch("time.sleep"):
                assert client.score(["a"], [1]).total.tolist() == [1.0]
        finally:
            client.close()
    retried = [r.getMessage() for r in http_logs.records if "asking again" in r.getMessage()]
    assert len(retried) == 1 and "answered 503" in retried[0], retried
    assert not [r for r in http_logs.records if TOKEN in r.getMessage()]


def test_the_boost_backend_masks_an_echoed_basic_authorization(http_logs):
    # the openai backend masked its API key in a server's words, not the basic authentication of its URL's
    # user:password, which an echoing server repeated in base64 (what the judge's errors show too)
    box: list[ChatServer] = []
    with ChatServer(echoing_authorization(box, 401)) as server:
        box.append(server)
        backend = OpenAIBackend("m", with_credentials(server.url), "", sleep=lambda s: None)
        try:
            with pytest.raises(Exception) as refused:
                backend.complete(Task(0, None, "blend", [{"role": "user", "content": "- a cat"}], {}))
        finally:
            backend.close()
    assert server.requests[0]["headers"]["Authorization"] == BASIC
    assert "HTTP 401" in str(refused.value) and "Authorization': 'Basic ***'" in str(refused.value)
    assert not [s for s in SECRETS if s in str(refused.value)]


@pytest.mark.parametrize(
    "echoed",
    [
        '{"headers":{"Authorization":["Bearer TOKEN"],"Host":["h"]}}',  # Go's http.Header in JSON: a list
        "{'HTTP_AUTHORIZATION': 'Bearer TOKEN', 'PATH_INFO': '/score'}",  # a WSGI environ (Flask, Django)
        '{"detail": "upstream said {\\"Authorization\\": \\"Bearer TOKEN\\"}"}',  # a JSON string in JSON
        "raw headers {b'host': b'h', b'authorization': b'Bearer TOKEN'}",  # a dict of bytes, as printed
        "request.headers => {authorization => 'Bearer TOKEN'}",  # Ruby's hash
    ],
)
def test_an_echoed_authorization_header_in_any_common_spelling_is_masked(echoed):
    # masked_authorization read a header followed by ':' or '=' and at most one quote: a list around the value, a
    # variable named HTTP_AUTHORIZATION (no word boundary before the name), an escaped quote or a bytes literal
    # left the bearer token in the message
    masked = masked_authorization(echoed.replace("TOKEN", TOKEN))
    assert TOKEN not in masked and "Bearer ***" in masked, masked
