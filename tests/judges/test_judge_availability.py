"""A judge whose servers are down, one of several servers down, and one call asked by many at once (session 31's
review): the run stops with a one-line error rather than scoring every caption as failed, step after step; a dead
server among several costs no call; the samples of one image asking for its reference claims at once are asked once,
and every caller (a re-run from the cache too) gets the one answer kept."""

from __future__ import annotations

import json
import re
import threading

import pytest

from finecap.judges import openai as judges_openai
from finecap.judges.base import CANNOT_ANSWER, Ask, JudgeFailed, JudgeUnavailable, Question, Subject
from finecap.judges.cache import AnswerCache
from finecap.judges.claims import claim_scores
from finecap.judges.openai import OpenAIJudge
from finecap.judges.world import WorldJudge
from finecap.rewards.claims import ClaimsReward
from helpers.chat_server import ChatServer, completion
from helpers.waiting import until

Q = Question("0/color", "What colour is the circle?", ("red", "blue", "green"), "red")
OPTIONS = ("blue", "red", "green", CANNOT_ANSWER)


def judge_of(*urls: str, **options) -> OpenAIJudge:
    options.setdefault("sleep", lambda seconds: None)
    return OpenAIJudge(list(urls), "judge-model", **options)


def down(payload, n):
    return 503, {"error": "unavailable"}


def test_a_judge_server_down_stops_the_run_after_max_consecutive_failures_calls():
    asks = [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(12)]
    with ChatServer(down) as server:
        judge = judge_of(server.url, retries=1, concurrency=1, max_consecutive_failures=4)
        assert all(isinstance(a, JudgeFailed) for a in judge.answer(asks[:3]))  # below the limit: counted failures
        with pytest.raises(
            JudgeUnavailable, match=r"4 calls in a row got no answer from any of its 1 server\(s\)"
        ) as stopped:
            judge.answer(asks[3:])
        assert "judge.max_consecutive_failures=4" in str(stopped.value) and "HTTP 503" in str(stopped.value)
        sent = len(server.requests)
        assert sent == 4 * 2  # 4 calls, each tried twice by the client (retries=1), then no request
        with pytest.raises(JudgeUnavailable):
            judge.answer(asks[:1])
        assert len(server.requests) == sent  # every call after it raises without a request


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_refused_key_url_or_model_stops_every_later_call_too(status):
    # a holder that outlives the first error (a reward server answering request after request) got every later call
    # back as a JudgeFailed "not sent: the run is stopping" (the client's stop, set by the refusal), scoring every
    # caption as failed instead of saying why the judge cannot answer
    with ChatServer(lambda payload, n: (status, {"error": "refused"})) as server:
        judge = judge_of(server.url, retries=1)
        with pytest.raises(JudgeUnavailable, match=f"HTTP {status}") as first:
            judge.answer([Ask(Q, OPTIONS, "a red circle")])
        assert len(server.requests) == 1  # not retried
        for asks in ([Ask(Q, OPTIONS, "a blue circle")], [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(3)]):
            with pytest.raises(JudgeUnavailable) as later:
                judge.answer(asks)
            assert str(later.value) == str(first.value)
        assert len(server.requests) == 1  # every later call raises without a request


def test_a_judge_whose_account_is_out_of_quota_stops_at_once_without_retrying():
    # an HTTP 429 saying insufficient_quota was retried as a rate limit on every server, call after call, until
    # judge.max_consecutive_failures calls had each waited out their retries
    quota = {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                       "code": "insufficient_quota"}}  # fmt: skip
    waits: list[float] = []
    with ChatServer(lambda p, n: (429, quota)) as one, ChatServer(lambda p, n: (429, quota)) as two:
        judge = judge_of(one.url, two.url, retries=3, concurrency=1, sleep=waits.append)
        with pytest.raises(JudgeUnavailable, match=r"HTTP 429: the account's quota is spent \(insufficient_quota"):
            judge.answer([Ask(Q, OPTIONS, f"a red circle {i}") for i in range(3)])
        assert len(one.requests) + len(two.requests) == 1 and waits == []


def test_a_reply_resets_the_streak_and_an_unreachable_port_counts_too():
    def every_third_answers(payload, n):
        number = int(re.search(r"a red circle (\d+)", payload["messages"][-1]["content"]).group(1))
        return (200, completion("B")) if number % 3 == 0 else down(payload, n)

    asks = [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(12)]
    with ChatServer(every_third_answers) as server:
        judge = judge_of(server.url, retries=0, concurrency=1, max_consecutive_failures=3)
        out = judge.answer(asks)  # never 3 in a row
        assert [isinstance(a, JudgeFailed) for a in out] == [i % 3 != 0 for i in range(12)]
    with ChatServer(down) as server:
        url = server.url
    closed = judge_of(url, retries=0, max_consecutive_failures=2)  # nothing listens there now: no connection
    with pytest.raises(JudgeUnavailable, match="ConnectError"):
        closed.answer(asks[:2])


def test_unparsable_answers_and_an_http_400_answer_the_call_and_never_stop_the_judge():
    # the server answered: an answer that does not parse, or a refusal of that request alone (400: a prompt too long)
    with (
        ChatServer(lambda payload, n: (200, completion("no idea"))) as chatty,
        ChatServer(lambda payload, n: (400, {"error": "prompt too long"})) as refusing,
    ):
        for server in (chatty, refusing):
            judge = judge_of(server.url, retries=0, max_consecutive_failures=1)
            assert all(isinstance(a, JudgeFailed) for a in judge.answer([Ask(Q, OPTIONS, f"c {i}") for i in range(3)]))


@pytest.mark.parametrize(
    ("reply", "hint"),
    [((500, {"error": "EngineDeadError"}), "fails every request"),
     ((429, {"error": {"code": "rate_limit_exceeded"}}), r"rate-limits the judge \(HTTP 429\): lower"),
     ((429, {"error": "slow down"}, {"Retry-After": "3600"}), "rate-limits the judge"),
     ((200, {"error": {"message": "engine dead"}}), "fails every request")],
)  # fmt: skip
def test_a_judge_whose_servers_all_fail_every_call_with_429_or_500_stops_naming_url_and_status(reply, hint):
    # before, a server up but failing (a dead vLLM engine's 500, a quota's 429, an error body) "reached" the server:
    # the streak never grew, and every caption of every later step came back a JudgeFailed, training on without a word
    waits: list[float] = []
    asks = [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(5)]
    with ChatServer(lambda payload, n: reply) as one, ChatServer(lambda payload, n: reply) as two:
        judge = judge_of(one.url, two.url, retries=1, concurrency=1, max_consecutive_failures=3, sleep=waits.append)
        assert all(isinstance(a, JudgeFailed) for a in judge.answer(asks[:2]))  # below the limit: counted failures
        with pytest.raises(JudgeUnavailable, match="3 calls in a row got no answer from any of its 2 server") as e:
            judge.answer(asks[2:])
        status = reply[0]
        message = str(e.value)
        assert re.search(hint, message), message
        assert f"HTTP {status}" in message and "/v1/chat/completions" in message  # the server's URL and status
        assert one.url in message or two.url in message
        sent = len(one.requests) + len(two.requests)
        retried = "Retry-After" not in (reply[2] if len(reply) > 2 else {})
        assert sent == 3 * 2 * (2 if retried else 1)  # 3 calls, each of both servers, each tried twice (retries=1)
        assert len(waits) == (3 * 2 if retried else 0)  # no real sleep: the waits are the injected sleep's
        with pytest.raises(JudgeUnavailable):
            judge.answer(asks[:1])
        assert len(one.requests) + len(two.requests) == sent  # every later call raises without a request
    assert judge.counts["failed"] == 2  # the third call raised


def test_a_server_failing_with_500_among_live_ones_costs_no_call_and_never_stops_the_judge():
    with (
        ChatServer(lambda payload, n: (500, {"error": "bug"})) as broken,
        ChatServer(lambda payload, n: (200, completion("B"))) as live,
    ):
        judge = judge_of(broken.url, live.url, retries=0, concurrency=1, max_consecutive_failures=1)
        assert judge.answer([Ask(Q, OPTIONS, f"a red circle {i}") for i in range(6)]) == ["red"] * 6
        assert len(live.requests) == 6 and len(broken.requests) >= 1  # each call that met the broken one moved on
        assert judge.counts["failed"] == 0


def test_a_failing_server_is_asked_after_the_live_ones_until_a_probe_finds_it_back(monkeypatch):
    # before, every call went to it first (passing over it moved the round robin on, to it again), waiting out its
    # retries there
    monkeypatch.setattr(judges_openai, "PROBE_EVERY", 3)
    sick = threading.Event()
    sick.set()
    waits: list[float] = []
    with (
        ChatServer(lambda payload, n: (500, {"error": "bug"}) if sick.is_set() else (200, completion("B"))) as one,
        ChatServer(lambda payload, n: (200, completion("B"))) as live,
    ):
        judge = judge_of(one.url, live.url, retries=1, concurrency=1, sleep=waits.append)
        asks = [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(16)]
        assert judge.answer(asks[:6]) == ["red"] * 6
        # its turn comes every other call. Call 0 fails on it (2 attempts, 1 wait) and goes on to the live server;
        # its turns in calls 1 and 3 are passed over, the 3rd since (call 5) is kept: a probe, failing again
        assert (len(one.requests), len(live.requests), len(waits)) == (2 + 2, 6, 2)
        sick.clear()  # it is back
        assert judge.answer(asks[6:]) == ["red"] * 10
        # its turns in calls 6 and 8 passed over, the probe in call 10 answered: turn and turn about again (12, 14)
        assert (len(one.requests), len(live.requests), len(waits)) == (4 + 3, 6 + 7, 2)
    assert judge.counts["failed"] == 0


def test_a_dead_server_among_several_costs_no_call():
    with ChatServer(down) as dead, ChatServer(lambda payload, n: (200, completion("B"))) as live:
        judge = judge_of(dead.url, live.url, retries=0, concurrency=1)
        assert judge.answer([Ask(Q, OPTIONS, f"a red circle {i}") for i in range(6)]) == ["red"] * 6
        assert len(live.requests) == 6 and 1 <= len(dead.requests) <= 6  # each call that met the dead one moved on
        assert judge.counts["failed"] == 0


@pytest.mark.parametrize(
    ("stopping", "stopper_sent", "stopper_waits", "says"),
    [((503, {"error": "unavailable"}), 2 * 4, 2 * 3, r"1 calls in a row got no answer from any of its 2 server\(s\)"),
     ((401, {"error": "refused"}), 1, 0, "HTTP 401: the server refused the API key")],
)  # fmt: skip
def test_calls_in_flight_when_the_judge_stops_end_at_their_next_retry_with_its_error(
    stopping, stopper_sent, stopper_waits, says
):
    # before, a call in flight when another stopped the judge (the streak at judge.max_consecutive_failures, a refused
    # key) went on with its retries and backoff against the dead servers, and then with the next server, before it
    # noticed: retries x backoff per thread (minutes) for a stop that is known at once; one cancelled by the refusal
    # read as an answered call, went on to the other server and came back a JudgeFailed, counted as failed.
    # 7 calls in flight on 2 servers, each answered HTTP 503 and retried once; their second attempt is held until the
    # judge has stopped: the last call, answered once the 7 second attempts are held, ends the streak (503 on each
    # attempt of both servers) or is refused (401). The judge's 9th call starts when the last call's thread is free:
    # the judge stopped then.
    judge = None
    stopper = "the call that stops the judge"
    lock, held = threading.Lock(), []

    def dying(payload, n):
        content = payload["messages"][-1]["content"]
        if stopper in content:
            until(lambda: len(held) >= 7, "the 7 other calls' second attempts were never in flight")
            return stopping
        if n == 1:  # an attempt in flight when the judge stops
            with lock:
                held.append(content)
            until(lambda: judge.counts["calls"] == 9, "the judge never stopped")
        return down(payload, n)

    waits: list[float] = []
    asks = [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(7)] + [Ask(Q, OPTIONS, stopper), Ask(Q, OPTIONS, "9")]
    with ChatServer(dying) as one, ChatServer(dying) as two:
        judge = judge_of(one.url, two.url, retries=3, concurrency=8, max_consecutive_failures=1, sleep=waits.append)
        with pytest.raises(JudgeUnavailable, match=says) as stopped:  # the first call's, one of those in flight
            judge.answer(asks)
        # the stopper's requests, and each call in flight its first attempt and the one in flight at the stop: no
        # retry after it (before: 4 attempts each, on both servers after a refusal), no other server, no wait
        sent = len(one.requests) + len(two.requests)
        assert sent == stopper_sent + 7 * 2, sent
        assert len(waits) == stopper_waits + 7 * 1
        with pytest.raises(JudgeUnavailable) as later:
            judge.answer(asks[:1])
        assert str(later.value) == str(stopped.value)  # the one error, whichever call said it
    assert judge.counts["failed"] == 0 and judge.counts["calls"] == 10


def test_a_wait_between_attempts_ends_at_once_when_the_judge_stops():
    # the judge's own wait (no sleep injected) of 60 s before each retry: before, the calls in flight when the judge
    # stopped each waited it out (and then retried the dead server), so a stop known at once took a minute or more
    judge = None
    stopper = "the call that stops the judge"
    lock, asked = threading.Lock(), set()

    def dying(payload, n):
        content = payload["messages"][-1]["content"]
        with lock:
            asked.add(content)
        if stopper not in content:
            return down(payload, n)  # then the 60 s wait
        until(lambda: len(asked) == 8, "the 7 other calls were never in flight")
        return 503, {"error": "unavailable"}, {"x-should-retry": "false"}  # no answer: the streak at its limit

    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            judge.answer([Ask(Q, OPTIONS, f"a red circle {i}") for i in range(7)] + [Ask(Q, OPTIONS, stopper)])
        except JudgeUnavailable as e:
            outcome.append(e)

    with ChatServer(dying) as server:
        judge = judge_of(server.url, retries=1, concurrency=8, max_consecutive_failures=1, backoff=60.0,
                         retry_max_wait=60.0, sleep=None)  # fmt: skip
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(timeout=30)  # a liveness bound for a loaded machine: without the stop, 60 s at least
        assert not asking.is_alive(), "the calls in flight waited out their 60 s wait before a retry"
        assert len(server.requests) == 8, len(server.requests)  # each call's first attempt, no retry
    assert len(outcome) == 1 and "1 calls in a row got no answer" in str(outcome[0])
    assert "x-should-retry: false" in str(outcome[0])


def test_one_call_asked_by_many_at_once_is_asked_once_and_all_get_its_answer():
    lock, numbers = threading.Lock(), iter(range(1, 100))
    judge = None

    def another_answer_each_time(payload, n):  # a server whose answers vary from request to request
        # answered once the 7 other threads found this call in flight (a fixed delay let a thread that started late
        # on a loaded machine ask after the answer came, and ask again: there is no answer cache here)
        until(lambda: judge.counts["shared"] >= 7, "the other 7 threads never found the call in flight")
        with lock:
            k = next(numbers)
        return 200, completion(json.dumps([f"claim {k}"]))

    with ChatServer(another_answer_each_time) as server:
        judge = judge_of(server.url, concurrency=8)
        out = judge.claims(["a red circle"] * 8)
        assert out == [["claim 1"]] * 8 and len(server.requests) == 1
        assert judge.counts["calls"] == 8 and judge.counts["shared"] == 7


def test_the_answer_kept_in_the_cache_is_the_one_every_writer_gets(tmp_path):
    cache = AnswerCache(tmp_path / "answers.sqlite")
    assert cache.put("k", ["first"]) == ["first"]
    assert cache.put("k", ["second"]) == ["first"]  # another process answered the same call first: its answer
    assert cache.get("k") == ["first"]
    cache.close()


def test_the_reference_claims_are_asked_once_per_image():
    class Counting(WorldJudge):
        def __init__(self):
            super().__init__()
            self.subjects = []

        def reference_claims(self, subjects):
            self.subjects.append(list(subjects))
            return super().reference_claims(subjects)

    judge = Counting()
    one, two = Subject(0, ("a red circle",)), Subject(1, ("a blue square",))
    captions = ["a red circle", "a circle", "a blue square", "a red circle"]
    scores = claim_scores(judge, captions, [one, one, two, Subject(0, ("a red circle",))])
    assert judge.subjects == [[one, two]]  # 4 captions, 2 images
    alone = claim_scores(Counting(), captions[3:], [one])
    assert scores[3] == alone[0]


def test_an_image_with_an_empty_reference_list_and_no_scene_is_refused():
    reward = ClaimsReward(WorldJudge(), references={0: []})
    with pytest.raises(ValueError, match="image 0 has no references and no scene"):
        reward(["a red circle"], {"image_ids": [0], "image_index": [0]})


@pytest.mark.slow
def test_one_caption_whose_asks_time_out_fails_alone_while_the_server_answers_the_others():
    """A server up and answering, but timing out on every ask of one caption (its prompt, not the server): that
    caption fails and the batch is scored. Before, the caption's asks were sent one after another, filled every slot
    of judge.concurrency and timed out in a row, and the judge stopped the run ("is it running?") at
    judge.max_consecutive_failures of them, though the server answered every other call."""
    from finecap.rewards.qa_utility import QAUtilityReward

    released = threading.Event()  # set at the end: the held replies end with the test

    def slow_for_one_caption(payload, n):
        text = payload["messages"][-1]["content"]
        if "a red circle 0" in text:
            released.wait(30)  # past the client's time-out: this caption's asks get no answer
        chosen = "red" if "Caption:" in text else CANNOT_ANSWER  # blind: no question is dropped
        return 200, completion(re.search(rf"^([A-Z])\. {chosen}$", text, re.MULTILINE).group(1))

    questions = [Question(f"0/q{k}", f"Question {k}?", ("red", "blue", "green"), "red") for k in range(4)]
    captions = [f"a red circle {i}" for i in range(8)]
    batch = {"image_ids": [0], "image_index": [0] * len(captions)}
    try:
        with ChatServer(slow_for_one_caption) as server:
            # 4 asks of caption 0 against 4 slots and a streak of 2: sent together, they were 4 failures in a row
            judge = judge_of(server.url, retries=0, timeout=1.0, concurrency=4, max_consecutive_failures=2)
            out = QAUtilityReward(judge, questions={0: questions}, shuffles=1)(captions, batch)
        assert out.failed.tolist() == [True] + [False] * 7
        assert out.total[1:].tolist() == [1.0] * 7  # every other caption's 4 asks answered right
        assert judge.tallies()["failed"] == 4 and judge.tallies()["calls"] == 4 + 32  # the blind asks, the batch's
        hung = [Ask(Q, OPTIONS, f"a red circle 0 ask {i}") for i in range(8)]  # every call times out: still stopped
        with ChatServer(slow_for_one_caption) as server:
            judge = judge_of(server.url, retries=0, timeout=1.0, concurrency=4, max_consecutive_failures=2)
            with pytest.raises(JudgeUnavailable, match="2 calls in a row got no answer"):
                judge.answer(hung)
    finally:
        released.set()
