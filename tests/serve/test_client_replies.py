"""What a client of the reward server believes: every reply is checked for its length, its types and its finiteness
before a trainer sees it, through the client and every adapter's ``url=``; no message shows the credentials of the
server's URL; the bearer token comes from the environment."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from finecap.integrations.openrlhf import reward_function as openrlhf_function
from finecap.integrations.swift import async_orm, orm
from finecap.integrations.verl import compute_score_batch
from finecap.serve.client import RewardClient, RewardServerError
from finecap.serve.protocol import FailedCaptions


@contextlib.contextmanager
def answering(body: bytes, status: int = 200) -> Iterator[tuple[str, list]]:
    """A stand-in server on 127.0.0.1 answering every POST with ``body``; yields its URL and the requests' headers."""
    seen: list = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length", 0)))
            seen.append(dict(self.headers))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


BAD_REPLIES = [  # (the reply's body, the field named, words)
    (b'{"total": [1.0, NaN]}', "total[1]", "non-finite value (nan)"),
    (b'{"total": [Infinity, 1.0]}', "total[0]", "non-finite value (inf)"),
    (b'{"total": [1.0]}', "total", "answered 1 values for 2 captions"),
    (b'{"total": [1.0, 2.0, 3.0]}', "total", "answered 3 values for 2 captions"),
    (b'{"total": [1.0, "2.0"]}', "total[1]", "answered str where a number belongs"),
    (b'{"total": [1.0, null]}', "total[1]", "answered NoneType where a number belongs"),
    (b'{"total": [null, null], "failed": 1}', "total[0]", "answered NoneType where a number belongs"),
    (b'{"total": [1.0, 2.0], "failed": 1}', "failed", "a failed count of 1 and no null value"),
    (b'{"total": [1.0, null], "failed": "1"}', "failed", "where a count of failed captions belongs"),
    (b'{"total": [1.0, null], "failed": 1, "parts": {"cider": [null, 1.0]}}', "parts.cider[0]", "NoneType"),
    (b'{"total": [true, 1.0]}', "total[0]", "answered bool where a number belongs"),
    (b'{"total": "1.0, 2.0"}', "total", "answered str where a list of numbers belongs"),
    (b'{"total": [1.0, 2.0], "parts": {"cider": [1.0]}}', "parts.cider", "answered 1 values for 2 captions"),
    (b'{"total": [1.0, 2.0], "parts": {"cider": [1.0, NaN]}}', "parts.cider[1]", "non-finite"),
    (b'{"total": [1.0, 2.0], "parts": [1.0, 2.0]}', "parts", "where an object belongs"),
    (b'{"total": [' + b"0.5, " * 2_999_999 + b"0.5]}", "total", "answered 3,000,000 values for 2 captions"),
]
"""The last body is what ``json.dumps({"total": [0.5] * 3_000_000}).encode()`` gives, byte for byte
(:func:`test_the_long_reply_is_json_of_three_million_values`), written out: dumping the list took half a second of
every collection of this module (a parameter, built at import), the request answered with it none."""


@pytest.mark.parametrize(("body", "field", "words"), BAD_REPLIES, ids=[b[1] + "-" + b[2][:20] for b in BAD_REPLIES])
def test_a_bad_reply_is_refused_by_the_client_and_every_adapter(body, field, words):
    captions, ids = ["a red circle", "a square"], [1, 2]
    infos = [{"image_id": i} for i in ids]
    with answering(body) as (url, _):
        calls = {
            "client": lambda: RewardClient(url).score(captions, ids),
            "client async": lambda: asyncio.run(RewardClient(url).ascore(captions, ids)),
            "verl": lambda: compute_score_batch(["d"] * 2, captions, ["", ""], infos, url=url),
            "ms-swift": lambda: orm(url=url)()(captions, image_id=ids),
            "ms-swift async": lambda: asyncio.run(async_orm(url=url)()(captions, image_id=ids)),
            "OpenRLHF": lambda: openrlhf_function(url=url)(captions, ["", ""], ids),
        }
        for who, call in calls.items():
            with pytest.raises(RewardServerError) as refused:
                call()
            assert refused.value.field == field, who
            assert words in str(refused.value), (who, str(refused.value))


def test_the_long_reply_is_json_of_three_million_values():
    assert BAD_REPLIES[-1][0] == json.dumps({"total": [0.5] * 3_000_000}).encode()


def test_a_good_reply_passes_and_the_token_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("FINECAP_REWARD_TOKEN", "env-token-0123456789")
    with answering(b'{"total": [1, 2.5], "parts": {"cider": [1, 2.5]}}') as (url, seen):
        scored = RewardClient(url).score(["a", "b"], [1, 2])
        assert scored.values() == ([1.0, 2.5], {"cider": [1.0, 2.5]}) and scored.failed is None
        RewardClient(url, token="given-token-0123456789").score(["a", "b"], [1, 2])
    assert seen[0]["Authorization"] == "Bearer env-token-0123456789"
    assert seen[1]["Authorization"] == "Bearer given-token-0123456789"


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:pa55word@127.0.0.1:9/",  # nothing listens on port 9 (discard): a connection error
        "http://sk-live-token@127.0.0.1:9",
        "http://127.0.0.1:9/?token=sk-live-token&x=1",
        "http://127.0.0.1:9/reward?api_key=sk-live-token",
    ],
)
def test_no_message_shows_the_credentials_of_the_url(url):
    # a URL with a ?query is refused when the client is made (/reward would be appended inside the query), the
    # others fail at the request (nothing listens): either way the message masks the credentials
    failure = ValueError if "?" in url else RewardServerError
    for who, call in {
        "client": lambda: RewardClient(url, timeout=2).score(["a"], [1]),
        "verl": lambda: compute_score_batch(["d"], ["a"], [""], [{"image_id": 1}], url=url),
        "ms-swift": lambda: orm(url=url)()(["a"], image_id=[1]),
        "OpenRLHF": lambda: openrlhf_function(url=url)(["a"], [""], [1]),
    }.items():
        with pytest.raises(failure) as refused:
            call()
        text = f"{refused.value} {refused.value!r} {refused.value.__cause__!r} {refused.value.__context__!r}"
        assert "pa55word" not in text and "sk-live-token" not in text, (who, text)
        assert "127.0.0.1:9" in str(refused.value)
    if failure is RewardServerError:
        assert "pa55word" not in repr(RewardClient(url)) and "sk-live-token" not in repr(RewardClient(url))


def test_an_error_reply_naming_a_url_is_masked_too():
    body = json.dumps({"error": {"field": None, "message": "upstream http://bob:hunter2@10.0.0.1/x failed"}}).encode()
    with answering(body, status=500) as (url, _), pytest.raises(RewardServerError) as refused:
        RewardClient(url).score(["a"], [1])
    assert "hunter2" not in str(refused.value) and "[HTTP 500]" in str(refused.value)


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://127.0.0.1/", "", None])
def test_a_url_that_is_no_http_url_is_refused_at_once(url):
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        RewardClient(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000 http://127.0.0.1:8001", "http://127.0.0.1:8000/\n",
                                 "http://bob:pa55word@127.0.0.1:8000\treward"])  # fmt: skip
def test_a_url_with_white_space_is_refused_at_once_by_the_rule_of_url_options(url):
    with pytest.raises(ValueError, match=r"RewardClient: the server's URL holds white space .*: a URL has none") as e:
        RewardClient(url)
    assert "pa55word" not in str(e.value)


def test_a_counted_null_is_a_failed_caption_through_the_client_and_every_adapter():
    """A server's ``null`` with its count (a caption the reward could not score) reaches each trainer in its own
    way: the client's mask, TRL's ``None`` (read by TRL as NaN), NaN for verl, ms-swift's classes and OpenRLHF's
    ``reward_func`` the error ``/get_reward`` answers 502 (ms-swift would sum a NaN as 0, OpenRLHF has no NaN
    handling); never a 0."""
    import math

    from finecap.integrations.trl import reward_function as trl_function

    body = b'{"total": [1.5, null], "parts": {"judge": [1.5, null]}, "failed": 1}'
    captions, ids = ["a red circle", "a square"], [1, 2]
    with answering(body) as (url, _):
        out = RewardClient(url).score(captions, ids)
        assert out.failed.tolist() == [False, True] and out.total[0].item() == 1.5 and math.isnan(out.total[1])
        assert trl_function(url=url)(prompts=["", ""], completions=captions, image_id=ids) == [1.5, None]
        verl = compute_score_batch(["d"] * 2, captions, ["", ""], [{"image_id": i} for i in ids], url=url)
        failed = r"the reward could not score 1 of 2 captions \(completions\[1\]\): its judge failed on them"
        with pytest.raises(FailedCaptions, match=rf"FinecapReward: {failed}, and ms-swift would pay a NaN as 0"):
            orm(url=url)()(captions, image_id=ids)  # ms-swift sums its reward functions with nansum
        with pytest.raises(FailedCaptions, match=rf"FinecapAsyncReward: {failed}"):
            asyncio.run(async_orm(url=url)()(captions, image_id=ids))
        with pytest.raises(FailedCaptions, match=r"the reward could not score 1 of 2 captions \(query\[1\]\)"):
            openrlhf_function(url=url)(captions, ["", ""], ids)  # OpenRLHF has no NaN handling: /get_reward's 502
        for who, values in {
            "verl": [r["score"] for r in verl],
            "verl part": [r["judge"] for r in verl],
        }.items():
            assert values[0] == 1.5 and math.isnan(values[1]), who
