"""The reward server over real HTTP on 127.0.0.1: both endpoints answer with the in-process values, every refused
request names its field (400, 413, 404, 405) and the server goes on serving; 32 concurrent clients for a bounded
time lose and mix up nothing (slow); ``finecap serve-reward`` stops cleanly on SIGTERM and SIGHUP (slow)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from finecap.rewards import RewardBase, RewardOutput, call_batch
from finecap.serve.service import ImageTable, RewardService
from helpers.served import serve_command, serving
from helpers.waiting import until

SRC = Path(__file__).resolve().parents[2] / "src"


def in_process(service, captions, ids) -> tuple[list[float], dict[str, list[float]]]:
    out = service.reward(captions, call_batch([service.images.by_text[str(i)] for i in ids]))
    return out.total.tolist(), {k: v.tolist() for k, v in out.parts.items()}


def test_both_endpoints_answer_the_in_process_values_and_echo_the_request(served):
    service = served["mix"]
    captions, ids = served["groups"][0]
    total, parts = in_process(service, captions, ids)
    with serving(service) as url:
        got = httpx.post(f"{url}/reward", json={"id": "g0", "captions": captions, "image_ids": ids}).json()
        assert (got["id"], got["image_ids"], got["total"], got["parts"]) == ("g0", ids, total, parts)
        assert set(parts) >= {"retrieval", "cider", "retrieval/truncated", "retrieval/accuracy"}
        # ids as strings and images as paths are the same images
        paths = {r.image_id: str(r.path) for r in served["records"]}
        got = httpx.post(f"{url}/reward", json={"captions": captions, "images": [paths[i] for i in ids]}).json()
        assert got["total"] == total and got["images"] == [paths[i] for i in ids]
        got = httpx.post(f"{url}/reward", json={"captions": captions, "image_ids": [str(i) for i in ids]}).json()
        assert got["total"] == total
        prompt = "<|im_start|>user\n<image>Describe the image.<|im_end|>\n<|im_start|>assistant\n"
        body = {"query": [prompt + c + "<|im_end|>" for c in captions], "prompts": [prompt] * len(captions),
                "labels": [json.dumps({"image_id": i}) for i in ids]}  # fmt: skip
        got = httpx.post(f"{url}/get_reward", json=body).json()
        assert got == {"rewards": total, "extra_logs": parts}
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok" and health["images"] == len(served["records"]) and health["scored"] >= 4
        assert health["reward"] == "1*retrieval + 0.5*cider"


class Judge(RewardBase):
    """Each caption's number of words; a caption holding "?" is one the judge could not score (its value planted 0,
    which must never be answered)."""

    per_caption = True

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        failed = torch.tensor(["?" in c for c in captions])
        total[failed] = 0.0
        return RewardOutput(total, {"words": total.clone()}, failed)


def test_a_failed_caption_is_answered_null_with_the_count_of_failed_captions():
    with serving(RewardService(Judge(), ImageTable(range(5)), log_every=0)) as url:
        got = httpx.post(f"{url}/reward", json={"captions": ["a b", "what ?", "c", "?"], "image_ids": [0, 1, 2, 3]})
        assert got.status_code == 200
        assert got.json() == {"id": None, "image_ids": [0, 1, 2, 3], "total": [2.0, None, 1.0, None],
                              "parts": {"words": [2.0, None, 1.0, None]}, "failed": 2}  # fmt: skip
        got = httpx.post(f"{url}/reward", json={"captions": ["a b"], "image_ids": [0]}).json()
        assert "failed" not in got and got["total"] == [2.0]  # no caption failed: no count


def test_get_reward_refuses_a_request_holding_a_failed_caption_with_a_502_naming_it(caplog):
    """OpenRLHF reads every reward of the reply as a number (``torch.tensor``): the ``null`` of a failed caption
    stopped it with a TypeError naming nothing, and a NaN would spread through its group's advantages. /get_reward
    answers a number for every caption or a 502 naming the failed ones (OpenRLHF retries it, then stops)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="finecap.serve"), \
            serving(RewardService(Judge(), ImageTable(range(5)), log_every=0, name="words")) as url:  # fmt: skip
        got = httpx.post(f"{url}/get_reward", json={"query": ["a b", "why ?", "c", "?"], "labels": [0, 1, 2, 3]})
        assert got.status_code == 502, got.text
        error = got.json()["error"]
        assert error["field"] is None
        assert error["message"].startswith("the reward words could not score 2 of 4 captions (query[1], query[3]): "
                                           "its judge failed on them"), error["message"]  # fmt: skip
        got = httpx.post(f"{url}/get_reward", json={"query": ["a b", "c"], "labels": [0, 1]})  # none failed
        assert got.status_code == 200 and got.json() == {"rewards": [2.0, 1.0], "extra_logs": {"words": [2.0, 1.0]}}
    assert any("could not score 2 of 4 captions" in r.getMessage() for r in caplog.records)  # the server's log too


def test_health_shows_the_judge_tallies_of_the_served_reward_and_no_secret():
    """/health said nothing of a judged reward's judge: a server left running whose judge failed call after call
    answered its captions null and its probes "ok", with no count of the judge's calls, unparsable answers or failed
    calls anywhere. /health's ``tallies`` now holds the reward's (RewardBase.tallies, as training logs them), names
    and counts alone: neither the judge's URL credentials nor its API key; an adapter's Scorer reads them, in process
    or from the server's /health."""
    from finecap.integrations.scoring import Scorer
    from finecap.judges.openai import OpenAIJudge
    from finecap.rewards.claims import ClaimsReward
    from helpers.chat_server import ChatServer, judging

    with ChatServer(judging("nonsense")) as judge_server:
        secret_url = judge_server.url.replace("http://", "http://user:url-secret@")
        judge = OpenAIJudge([secret_url], "judge-model", api_key="sk-key-secret", retries=1, sleep=lambda s: None)
        reward = ClaimsReward(judge, references={0: ["a red circle"], 1: ["a blue square"]})
        with serving(RewardService(reward, ImageTable(range(2)), log_every=0, name="claims")) as url:
            before = httpx.get(f"{url}/health")
            got = httpx.post(f"{url}/reward", json={"captions": ["a red circle", "nonsense"], "image_ids": [0, 1]})
            health = httpx.get(f"{url}/health")
            with Scorer(url=url) as scorer:  # an adapter's scorer over the server reads them from /health
                through_server = scorer.tallies()
        judge.close()
    assert got.json()["total"][1] is None and got.json()["failed"] == 1  # the judge failed on "nonsense"
    zero = {"judge/calls": 0, "judge/cache_hits": 0, "judge/unparsable": 0, "judge/failed": 0, "judge/rate_limited": 0}
    assert before.json()["tallies"] == zero
    # 2 reference-claims calls, 2 splits ("nonsense": unparsable twice, then failed), 2 checks of the other caption
    assert health.status_code == 200 and health.json()["tallies"] == {
        **zero, "judge/calls": 6, "judge/unparsable": 2, "judge/failed": 1
    }  # fmt: skip
    assert "secret" not in health.text and "user" not in health.text and judge_server.url not in health.text
    assert through_server == {k: float(v) for k, v in health.json()["tallies"].items()}
    assert Scorer(reward).tallies() == through_server  # in process: the reward's own, the same counts


def test_a_rewards_tallies_that_raise_leave_health_ok_with_null_tallies_said_once(caplog):
    """/health called the reward's ``tallies()`` unguarded: a reward of one's own whose ``tallies`` raised made every
    probe a 500, and a supervisor would restart a server that scores well. The probe answers as before with
    ``tallies`` null, and the error is logged once, not at each probe."""

    class Untallied(Judge):
        def tallies(self) -> dict[str, float]:
            raise RuntimeError("counts are kept elsewhere")

    service = RewardService(Untallied(), ImageTable(range(2)), log_every=0, name="untallied")
    with caplog.at_level("WARNING", logger="finecap.serve.app"), serving(service) as url:
        probes = [httpx.get(f"{url}/health") for _ in range(3)]
        scored = httpx.post(f"{url}/reward", json={"captions": ["a b"], "image_ids": [0]})
    assert [p.status_code for p in probes] == [200, 200, 200]
    assert all(p.json()["status"] == "ok" and p.json()["tallies"] is None for p in probes)
    assert scored.status_code == 200
    said = [r.getMessage() for r in caplog.records if "tallies() failed" in r.getMessage()]
    assert len(said) == 1 and "untallied" in said[0] and "counts are kept elsewhere" in said[0], said


def test_health_says_the_seconds_since_the_start_its_counts_cover():
    """/health counted requests "since the start" and never said when that was: a supervisor could not tell a server
    restarted by its orchestrator (the counts fall) from one whose counts it misread, nor turn them into rates."""
    made = time.perf_counter()
    service = RewardService(Judge(), ImageTable(range(5)), log_every=0, name="words")
    with serving(service) as url:
        first = httpx.get(f"{url}/health").json()
        elapsed = time.perf_counter() - made
        httpx.post(f"{url}/reward", json={"captions": ["a b"], "image_ids": [0]})
        second = httpx.get(f"{url}/health").json()
    assert 0 < first["uptime"] <= elapsed + 0.001, (first, elapsed)  # rounded to the millisecond
    assert second["uptime"] > first["uptime"] and second["scored"] == first["scored"] + 1


def test_health_counts_a_502_of_get_reward_as_failed_not_scored():
    """/health counted a /get_reward request answered 502 (captions the reward could not score) under "scored", with
    its captions, as if its values had been handed back: it counts under "failed" (and "failures"), as the docs say
    of failed requests; /reward's answer of the same captions (200, their values null) stays scored."""
    with serving(RewardService(Judge(), ImageTable(range(5)), log_every=0, name="words")) as url:
        refused = httpx.post(f"{url}/get_reward", json={"query": ["a b", "why ?"], "labels": [0, 1]})
        health = httpx.get(f"{url}/health").json()
        answered = httpx.post(f"{url}/reward", json={"captions": ["a b", "why ?"], "image_ids": [0, 1]})
        after = httpx.get(f"{url}/health").json()
    assert refused.status_code == 502 and answered.status_code == 200, (refused.text, answered.text)
    assert (health["scored"], health["captions"], health["failed"], health["failures"]) == (0, 0, 1, 1), health
    assert (after["scored"], after["captions"], after["failed"], after["failures"]) == (1, 2, 1, 1), after


def test_refused_requests_name_their_field_and_the_server_goes_on(served):
    service = served["cider"]
    captions, ids = served["groups"][1]
    total, _ = in_process(service, captions, ids)
    limit = service.limits.max_request_bytes
    with serving(service) as url:

        def refused(path: str, status: int, field: str | None, words: str, **kwargs) -> None:
            if "content" in kwargs:  # raw bytes, said to be JSON (the server scores application/json only)
                kwargs["headers"] = {"content-type": "application/json"}
            response = httpx.request("POST" if path != "/health" else "GET", f"{url}{path}", **kwargs)
            error = response.json()["error"]
            assert (response.status_code, error["field"]) == (status, field), response.text
            assert words in error["message"], error["message"]
            # and the next request is served as if nothing had happened
            assert httpx.post(f"{url}/reward", json={"captions": captions, "image_ids": ids}).json()["total"] == total

        refused("/reward", 400, "body", "not valid JSON", content=b'{"captions": ["a red')
        refused("/reward", 400, "captions[2]", "expected a string, got a number",
                json={"captions": ["a", "b", 3], "image_ids": [1, 2, 3]})  # fmt: skip
        refused("/reward", 400, "image_ids[0]", "unknown image id 999999: the server scores the 100 training images",
                json={"captions": ["a"], "image_ids": [999999]})  # fmt: skip
        refused("/reward", 400, "caption", "unknown field", json={"caption": ["a"], "image_ids": [1]})
        refused("/get_reward", 400, "labels", "missing", json={"query": ["a"]})
        refused("/reward", 413, "body", "exceed the server's limit", content=b" " * (limit + 1))

        def chunks():  # no Content-Length: the body is read up to the limit and no further
            for _ in range(limit // 65536 + 2):
                yield b" " * 65536

        refused("/reward", 413, "body", "more than", content=chunks())
        refused("/reward", 413, "captions", "--max-captions", json={"captions": ["a"] * 8193, "image_ids": [1] * 8193})
        refused("/reward", 413, "captions[0]", "--max-caption-chars", json={"captions": ["a" * 20_001],
                                                                             "image_ids": [ids[0]]})  # fmt: skip
        refused("/nowhere", 404, None, "Not Found", json={})
        response = httpx.get(f"{url}/reward")
        assert response.status_code == 405 and response.json()["error"]["field"] is None


def test_a_lone_surrogate_is_the_clients_400_not_the_rewards_500(served, caplog):
    """``"\\ud800"`` is valid JSON and no Unicode text: the retriever's tokenizer raised on it (TypeError), answered
    500 "the reward failed" with a traceback in the log, found by posting it to a running ``finecap serve-reward``."""
    service = served["mix"]
    captions, ids = served["groups"][0]
    total, _ = in_process(service, captions[:4], ids[:4])
    with serving(service) as url:
        body = json.dumps({"captions": [*captions[:3], "a red \ud800 circle"], "image_ids": ids[:4]})
        reply = httpx.post(f"{url}/reward", content=body, headers={"content-type": "application/json"})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["field"] == "captions[3]" and "lone surrogate" in error["message"]
        reply = httpx.post(f"{url}/reward", json={"captions": captions[:4], "image_ids": ids[:4]})
        assert reply.json()["total"] == total  # and the server goes on
    assert not [r for r in caplog.records if r.exc_info]


def test_a_405_names_the_methods_allowed():
    # the error handler answered the JSON error without the Allow header RFC 9110 requires of a 405
    with serving(RewardService(Judge(), ImageTable(range(3)), log_every=0)) as url:
        for method, path, allowed in (("PUT", "/reward", {"POST"}), ("GET", "/get_reward", {"POST"}),
                                      ("POST", "/health", {"GET", "HEAD"})):  # fmt: skip
            response = httpx.request(method, f"{url}{path}", json={})
            assert response.status_code == 405 and response.json()["error"]["field"] is None, response.text
            assert set(response.headers.get("allow", "").replace(" ", "").split(",")) == allowed, response.headers


def test_every_get_reward_refusal_names_the_field_openrlhf_sent():
    """/get_reward's request holds query, prompts and labels; a refusal naming captions[i], image_ids[i] or
    references[i][j] (the /reward request's fields) would name a field its caller never sent. Each kind of refusal,
    over HTTP: a caption's type, size and count (query[i], query), a missing or malformed field, a label's image and
    references, and the checks after parsing (an unknown image: labels[i])."""
    from finecap.serve.protocol import Limits

    limits = Limits(max_captions=2, max_caption_chars=30, max_references=3)
    long = "x" * 40
    cases = [
        ({"query": ["a", 3], "labels": [0, 1]}, 400, "query[1]", "expected a string, got a number"),
        ({"query": ["a", long], "labels": [0, 1]}, 413, "query[1]", "--max-caption-chars"),
        ({"query": ["Q: a", f"Q: {long}"], "prompts": ["Q:", "Q:"], "labels": [0, 1]}, 413, "query[1]",
         "--max-caption-chars"),
        ({"query": ["a"] * 3, "labels": [0] * 3}, 413, "query", "--max-captions"),
        ({"query": "a", "labels": [0]}, 400, "query", "expected an array of strings"),
        ({"labels": [0]}, 400, "query", "missing"),
        ({"query": ["a"], "prompts": ["p", "q"], "labels": [0]}, 400, "prompts", "has 2 entries for 1 queries"),
        ({"query": ["a"], "prompts": [7], "labels": [0]}, 400, "prompts[0]", "expected a string"),
        ({"query": ["a"], "prompts": ["not in the query"], "labels": [0]}, 400, "prompts[0]", "not in the query"),
        ({"query": ["a", "b"], "labels": [0]}, 400, "labels", "has 1 entries for 2 queries"),
        ({"query": ["a"], "labels": [1.5]}, 400, "labels[0]", "expected an image id"),
        ({"query": ["a", "b"], "labels": [0, 99]}, 400, "labels[1]", "unknown image id 99"),
        ({"query": ["a"], "labels": [{"image_id": 0, "references": [long]}]}, 413, "labels[0].references[0]",
         "--max-caption-chars"),
        ({"query": ["a"], "labels": [{"image_id": 0, "references": [3]}]}, 400, "labels[0].references[0]",
         "expected a string"),
        ({"query": ["a", "b"], "labels": [{"image_id": i, "references": ["r", "s"]} for i in (0, 1)]}, 413, "labels",
         "--max-references"),
    ]  # fmt: skip
    with serving(RewardService(Judge(), ImageTable(range(5)), limits=limits, log_every=0)) as url:
        for body, status, field, words in cases:
            response = httpx.post(f"{url}/get_reward", json=body)
            error = response.json()["error"]
            assert (response.status_code, error["field"]) == (status, field), (body, response.text)
            assert words in error["message"], (body, error["message"])
        assert httpx.post(f"{url}/get_reward", json={"query": ["a b"], "labels": [0]}).json()["rewards"] == [2.0]


def test_a_reward_comparing_images_refuses_a_one_image_request(served):
    captions, ids = served["groups"][0]
    with serving(served["mix"]) as url:
        response = httpx.post(f"{url}/get_reward", json={"query": captions[:2], "labels": [ids[0]] * 2})
        assert response.status_code == 400 and response.json()["error"]["field"] == "labels"  # its images
        assert "send a generation batch of several images per request" in response.json()["error"]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["cider", "mix"])
def test_32_concurrent_clients_lose_and_mix_up_nothing(served, which):
    """32 threads post requests for a bounded time (1.5 s), each a random slice of the fixture with its own id; every
    answer must echo its request's id and image ids and carry its captions' in-process values, bit for bit (the
    CIDEr-D service merges concurrent requests into one call; the mixture calls each alone)."""
    import random

    service = served[which]
    captions, ids = served["captions"], served["image_ids"]
    answers: list[tuple[tuple[int, int], list[float]]] = []
    bad: list[str] = []
    counts = [0] * 32
    with serving(service) as url:
        before = httpx.get(f"{url}/health").json()["scored"]  # the session's services served other tests before

        def client(k: int) -> None:
            rng = random.Random(k)
            deadline = time.monotonic() + 1.5
            with httpx.Client(timeout=60) as http:
                while counts[k] == 0 or time.monotonic() < deadline:  # at least one request, however late it starts
                    start = rng.randrange(0, len(captions) - 60)
                    span = (start, start + rng.randrange(5, 60))
                    request_id = f"{k}-{counts[k]}"
                    body = {"id": request_id, "captions": captions[span[0] : span[1]],
                            "image_ids": ids[span[0] : span[1]]}  # fmt: skip
                    try:
                        got = http.post(f"{url}/reward", json=body).json()
                    except Exception as e:  # noqa: BLE001 - a lost answer: reported below with its request
                        got = {"error": repr(e)}
                    if got.get("id") != request_id or got.get("image_ids") != body["image_ids"]:
                        bad.append(f"{request_id}: answered {got}"[:200])
                    else:
                        answers.append((span, got["total"]))
                    counts[k] += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        served_requests = httpx.get(f"{url}/health").json()["scored"] - before
    assert not bad, bad[:5]
    assert sum(counts) == served_requests == len(answers) and min(counts) >= 1  # all answered, every client served
    for span, total in answers:  # the values of each request's own captions, bit for bit
        assert total == in_process(service, captions[span[0] : span[1]], ids[span[0] : span[1]])[0], span


@pytest.mark.slow
def test_the_command_serves_and_stops_cleanly_on_sigterm(served, tmp_path):
    """``finecap serve-reward`` in a process of its own (the tiny world's configuration, --port 0): it prints its
    address, answers, logs its throughput, and on SIGTERM finishes and exits 0."""
    captions, ids = served["groups"][2]
    with serve_command([*served["base"], "rl.rewards={cider: 1.0}", "--log-every", "0.5"], tmp_path) as command:
        assert "finecap serve-reward: 1*cider over 100 training images on http://127.0.0.1:" in command.out
        for _ in range(3):
            got = httpx.post(f"{command.url}/reward", json={"captions": captions, "image_ids": ids}, timeout=60)
        assert got.json()["total"] == in_process(served["cider"], captions, ids)[0]
        time.sleep(0.6)  # a throughput line is due at the next request
        httpx.post(f"{command.url}/reward", json={"captions": captions, "image_ids": ids}, timeout=60)
    assert command.code == 0, command.err
    assert (
        "stopped after 4 requests scored (400 captions), 0 failed, 0 timed out, 0 left by their client, 0 "
        "refused (503: stuck, or the queue full)"
    ) in command.out
    assert "reward server (1*cider): " in command.err and "captions/s" in command.err and "latency p50" in command.err
    assert not list(tmp_path.iterdir())  # nothing written to the working directory


@pytest.mark.slow
def test_ctrl_c_is_a_clean_stop_too(served, tmp_path):
    """Ctrl-C (SIGINT) stops the server as SIGTERM does, exit 0 with its closing line (docs/integrations.md); uvicorn
    re-raised it after the graceful stop, and the command exited 130 as interrupted."""
    import signal

    captions, ids = served["groups"][2]
    with serve_command([*served["base"], "rl.rewards={cider: 1.0}"], tmp_path, stop=signal.SIGINT) as command:
        httpx.post(f"{command.url}/reward", json={"captions": captions, "image_ids": ids}, timeout=60)
    assert command.code == 0, command.err
    assert (
        "stopped after 1 requests scored (100 captions), 0 failed," in command.out and "interrupted" not in command.err
    )


@pytest.mark.slow
@pytest.mark.usefixtures("hangup_default")  # a suite run under nohup ignores SIGHUP
def test_a_hang_up_is_a_clean_stop_too(served, tmp_path):
    """SIGHUP (the SSH session of a server started without nohup or tmux dropped) stops the server as SIGTERM does,
    exit 0 with its closing line; uvicorn left it to its default, which killed the process at once (no closing line,
    the reward unclosed: a vLLM judge's engine orphaned)."""
    import signal

    captions, ids = served["groups"][2]
    with serve_command([*served["base"], "rl.rewards={cider: 1.0}"], tmp_path, stop=signal.SIGHUP) as command:
        httpx.post(f"{command.url}/reward", json={"captions": captions, "image_ids": ids}, timeout=60)
    assert command.code == 0, command.err
    assert "stopped after 1 requests scored (100 captions), 0 failed," in command.out
    assert "Traceback" not in command.err


@pytest.mark.usefixtures("hangup_default")  # a suite run under nohup ignores SIGHUP
def test_a_hang_up_stops_the_command_and_closes_its_reward(monkeypatch, capsys):
    """While ``finecap serve-reward`` serves, SIGHUP's handler is the server's SIGTERM stop: the request answered, the
    reward closed (its judge's engine or connections), ``main`` returns. The handler is called here from a thread, as
    the signal would call it in the main thread (a real hang-up: the slow test above)."""
    import signal

    from finecap.app import serve_reward
    from finecap.config import load

    class Closes(RewardBase):
        per_caption = True
        closed = 0

        def __call__(self, captions, batch):
            return RewardOutput(torch.ones(len(captions)), {})

        def close(self) -> None:
            self.closed += 1

    reward = Closes()
    svc = RewardService(reward, ImageTable(range(3)), log_every=0, name="closes")
    monkeypatch.setattr(serve_reward, "build_service", lambda cfg, **kw: svc)
    found, handlers = spied_server(monkeypatch), []

    def client():
        until(lambda: "url" in found and found["server"].started, "the command's server never started")
        httpx.post(f"{found['url']}/reward", timeout=60, json={"captions": ["a"], "image_ids": [1]})
        handlers.append(signal.getsignal(signal.SIGHUP))
        if callable(handlers[0]):
            handlers[0](signal.SIGHUP, None)
        else:  # SIGHUP's default (the old server): stop it as SIGTERM would, for the assertions below
            found["server"].should_exit = True

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    serve_reward.main(load(None, []), port=0)
    thread.join(10)
    assert callable(handlers[0]), handlers  # SIGHUP's default killed the process
    assert reward.closed == 1 and "stopped after 1 requests scored (1 captions)" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # put back when the server stopped


class Hangs(RewardBase):
    """A reward whose calls hang until ``release`` is set (at most a minute: an old server, which waited for it,
    ends then); ``called`` is set once a call began; ``closed`` counts its closes."""

    def __init__(self) -> None:
        self.called, self.release = threading.Event(), threading.Event()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    def __call__(self, captions, batch):
        self.called.set()
        self.release.wait(60)
        total = torch.ones(len(captions))
        return RewardOutput(total, {"one": total})


def start_hung_server(reward: Hangs):
    """A server of ``reward`` in a thread, one request hanging in its reward call: ``(server, service, thread)``."""
    from finecap.serve.app import make_server

    service = RewardService(reward, ImageTable(range(3)), log_every=0, name="hangs")
    server, sock = make_server(service)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def ask():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/reward", json={"captions": ["a"], "image_ids": [1]}, timeout=90)

    threading.Thread(target=ask, daemon=True).start()
    assert reward.called.wait(30), "the reward was never called"
    return server, service, thread


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_stop_ends_within_the_grace_when_a_reward_call_hangs(monkeypatch, caplog):
    """A reward call that never returns: the server's run returns the grace (shortened here) plus the service's
    stop_wait after the stop, logging the abandoned call (it waited for the call without limit, in
    ``ThreadPoolExecutor.shutdown(wait=True)``: here a minute, for ever in a real hang)."""
    import logging

    import finecap.serve.app as app

    monkeypatch.setattr(app, "SHUTDOWN_GRACE", 0.5)  # uvicorn's timeout_graceful_shutdown
    reward = Hangs()
    try:
        with caplog.at_level(logging.WARNING, logger="finecap.serve"):
            server, service, thread = start_hung_server(reward)
            service.stop_wait = 0.5
            stopped = time.monotonic()
            server.should_exit = True
            thread.join(20)
            took = time.monotonic() - stopped
        assert not thread.is_alive(), "the server's run still waits for the hung reward call"
        assert took < 0.5 + 0.5 + 5, took  # the grace, the stop_wait, and a liveness margin for a loaded machine
        assert service.abandoned and not reward.release.is_set()
        assert any("abandoned" in r.getMessage() and "hangs" in r.getMessage() for r in caplog.records)
    finally:
        reward.release.set()


def test_a_second_ctrl_c_ends_the_stop_at_once_when_a_reward_call_hangs(caplog):
    """Ctrl-C waits for the requests in flight (the grace: 30 s); a second one forces the exit, as the Server's
    docstring says: neither the grace nor the wait for the reward call (a forced exit once waited for the call
    without limit). The forced exit skips the app's own end, and still says the failures' unsaid repeats."""
    import signal

    reward = Hangs()
    try:
        server, service, thread = start_hung_server(reward)
        for _ in range(3):  # a kind's full report, then two repeats counted within its line's 10 s, unsaid
            try:
                raise RuntimeError("judge gone")
            except RuntimeError as e:
                service.failures.log(e, "reward server: hangs failed")
        port = server.servers[0].sockets[0].getsockname()[1]
        server.handle_exit(signal.SIGINT, None)  # the first: a graceful stop, which waits for the hung request
        until(lambda: not listening(port), "the first Ctrl-C did not start the stop")
        assert thread.is_alive()  # the listening socket closed, it waits for the request in flight
        forced = time.monotonic()
        server.handle_exit(signal.SIGINT, None)
        thread.join(20)
        took = time.monotonic() - forced
        assert not thread.is_alive(), "a second Ctrl-C did not end the stop"
        assert took < 3, took  # neither the 30 s grace nor the service's stop_wait
        assert service.abandoned
        said = [r.getMessage() for r in caplog.records if "unsaid" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("reward server: hangs failed: RuntimeError: judge gone (the same "
                                                     "failure 2 more time(s) since its last line")  # fmt: skip
    finally:
        reward.release.set()


def test_the_command_exits_non_zero_naming_the_reward_when_its_close_hangs(monkeypatch, caplog):
    """``finecap serve-reward`` stopped (SIGTERM, Ctrl-C) closes its reward: a ``close()`` that never returns (a
    judge's endpoint that never answers its goodbye) kept the command from exiting for ever. It waits CLOSE_WAIT
    seconds (shortened here), abandons the close, logs it naming the reward, and exits non-zero."""
    import logging

    from finecap.app import serve_reward
    from finecap.config import load

    class HangsInClose(RewardBase):
        per_caption = True

        def __init__(self) -> None:
            self.closing, self.release = threading.Event(), threading.Event()

        def __call__(self, captions, batch):
            total = torch.ones(len(captions))
            return RewardOutput(total, {"one": total})

        def close(self) -> None:
            self.closing.set()
            self.release.wait(30)  # an old command returned (exit 0) then

    monkeypatch.setattr(serve_reward, "CLOSE_WAIT", 0.5)
    reward = HangsInClose()
    svc = RewardService(reward, ImageTable(range(3)), log_every=0, name="closes-never")
    monkeypatch.setattr(serve_reward, "build_service", lambda cfg, **kw: svc)
    found = spied_server(monkeypatch)

    def stop() -> None:
        until(lambda: "url" in found and found["server"].started, "the command's server never started")
        found["server"].should_exit = True  # the stop SIGTERM and Ctrl-C make

    thread = threading.Thread(target=stop, daemon=True)
    thread.start()
    try:
        with caplog.at_level(logging.ERROR, logger="finecap.serve"), pytest.raises(SystemExit) as stopped:
            serve_reward.main(load(None, []), port=0)
        assert reward.closing.is_set() and not reward.release.is_set()  # abandoned, not waited for
        assert str(stopped.value.code) == ("finecap serve-reward: error: the reward closes-never did not close within "
                                           "0.5 s: abandoned (the process's end releases what it holds)")  # fmt: skip
        said = [r.getMessage() for r in caplog.records if "did not close" in r.getMessage()]
        assert len(said) == 1 and "the reward closes-never did not close within 0.5 s: abandoned" in said[0]
    finally:
        reward.release.set()
    thread.join(10)


def test_the_command_ends_and_leaves_the_reward_unclosed_when_a_call_of_it_hangs(monkeypatch, capsys):
    """``finecap serve-reward`` stopped while a reward call hangs: ``main`` returns (it waited without limit), and
    does not close the reward under the running call (its judge's connections or engine): the process's end does."""
    import finecap.serve.app as app
    from finecap.app import serve_reward
    from finecap.config import load

    monkeypatch.setattr(app, "SHUTDOWN_GRACE", 0.5)
    reward = Hangs()
    svc = RewardService(reward, ImageTable(range(3)), log_every=0, name="hangs")
    svc.stop_wait = 0.5
    monkeypatch.setattr(serve_reward, "build_service", lambda cfg, **kw: svc)
    found = spied_server(monkeypatch)  # the command's own server, stopped below once its reward call hangs

    def client():
        until(lambda: "url" in found and found["server"].started, "the command's server never started")
        threading.Thread(
            target=lambda: httpx.post(
                f"{found['url']}/reward", timeout=90, json={"captions": ["a"], "image_ids": [1]}
            ),
            daemon=True,
        ).start()
        assert reward.called.wait(30)
        found["server"].should_exit = True

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        serve_reward.main(load(None, []), port=0)  # returns: the stop did not wait for the call
        assert svc.abandoned and reward.closed == 0 and not reward.release.is_set()
        assert "stopped after" in capsys.readouterr().out
    finally:
        reward.release.set()
    thread.join(10)


def test_the_command_shows_no_progress_bar_while_serving(monkeypatch):
    """A reward call showed its progress bars (the retriever's "text features" for a request of over 4 x
    ``retriever.batch_size`` captions) in the log of ``finecap serve-reward``, one a request (seen in the stderr of a
    running server): serving turns them off, and gives the variable back as it found it when it stops."""
    from finecap.app import serve_reward
    from finecap.config import load
    from finecap.utils.system import PROGRESS_ENV, progress_enabled

    shown = []

    class Watches(RewardBase):
        per_caption = True

        def __call__(self, captions, batch):
            shown.append(progress_enabled())
            return RewardOutput(torch.ones(len(captions)), {})

    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    svc = RewardService(Watches(), ImageTable(range(3)), log_every=0)
    monkeypatch.setattr(serve_reward, "build_service", lambda cfg, **kw: svc)
    found = spied_server(monkeypatch)

    def client():
        until(lambda: "url" in found and found["server"].started, "the command's server never started")
        httpx.post(f"{found['url']}/reward", timeout=60, json={"captions": ["a"], "image_ids": [1]})
        found["server"].should_exit = True

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    serve_reward.main(load(None, []), port=0)
    thread.join(10)
    assert shown == [False]
    assert PROGRESS_ENV not in os.environ and progress_enabled()  # as it was


def test_serving_turns_bars_off_over_an_empty_switch(monkeypatch):
    # TQDM_DISABLE="" reads as unset (progress_enabled shows bars): it is no user's choice, and kept the bars on
    from finecap.app.serve_reward import quiet_progress
    from finecap.utils.system import PROGRESS_ENV, progress_enabled

    monkeypatch.setenv(PROGRESS_ENV, "")
    with quiet_progress():
        assert not progress_enabled()
    assert os.environ[PROGRESS_ENV] == ""


def test_the_listening_socket_gives_its_connections_tcp_nodelay():
    """asyncio sets TCP_NODELAY on the connections of a socket made with proto=IPPROTO_TCP only; without it every
    small answer waited for the client's delayed ACK (40 ms a request, measured before the fix)."""
    import socket

    from finecap.serve.app import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.getsockname()[1] > 0
        sock.listen()
        with pytest.raises(ValueError, match=r"--host 127.0.0.1 --port \d+: cannot listen there: "):
            bind("127.0.0.1", sock.getsockname()[1])  # another server listens there
    finally:
        sock.close()


def test_the_address_is_taken_at_once_a_second_bind_fails_and_an_early_client_waits_for_the_server():
    """:func:`bind` listens: a second command on the port fails at its bind, before it loads its reward (both bound
    with SO_REUSEADDR and neither listening, the second bound too and failed only once serving, its reward loaded),
    and a client that connects while the reward loads waits in the backlog and is answered once serving starts."""
    import socket

    from finecap.serve.app import bind
    from helpers.served import serving_server

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        with pytest.raises(ValueError, match=rf"--host 127.0.0.1 --port {port}: cannot listen there: "):
            bind("127.0.0.1", port)  # at once: not listening, the old socket let it bind
        early = socket.create_connection(("127.0.0.1", port), timeout=10)  # the reward is still loading
        early.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        with serving_server(RewardService(Judge(), ImageTable(range(3)), log_every=0), sock=sock):
            assert early.recv(65536).startswith(b"HTTP/1.1 200")
        early.close()
    finally:
        sock.close()


def spied_server(monkeypatch) -> dict:
    """Filled once ``finecap serve-reward``'s own server is made: ``{"server": uvicorn server, "url": its URL}``."""
    import finecap.serve.app as app

    make, found = app.make_server, {}

    def spy(service, *args, **kwargs):
        found["server"], sock = make(service, *args, **kwargs)
        found["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return found["server"], sock

    monkeypatch.setattr(app, "make_server", spy)
    return found
