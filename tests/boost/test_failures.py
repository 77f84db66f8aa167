"""Failures fail (issue 21 item 6) and one writer per output (issue 22 item 6): a dead server, the failure budget,
consecutive connection failures, 401, malformed URLs, unsafe output folders, the output lock (two concurrent runs, a
stale lock)."""

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from finecap.app.boost import main as boost
from finecap.boost.engine import (
    BackendError,
    BoostFailed,
    EngineFailing,
    FailureBudget,
    ServerFailing,
    ServerUnavailable,
)
from finecap.config import ConfigError, load
from finecap.locks import LOCK_NAME, OutputLocked, output_lock
from helpers.chat_server import ChatServer, completion, echo_first_caption
from helpers.cli import run_cli
from helpers.tiny_world import make_tiny_world, world_items

SRC = str(Path(__file__).parents[2] / "src")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    return make_tiny_world(out)


def _openai(url: str, *extra: str) -> list[str]:
    return ["boost.mode=blend", "boost.llm_backend=openai", "boost.llm_model=m", f"boost.llm_base_url={url}", *extra]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: connections are refused


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen([sys.executable, "-m", "finecap.app.cli", "boost", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _captions(payload: dict) -> tuple[str, ...]:
    """The human captions in a blend request (its ``- `` lines)."""
    return tuple(ln[2:] for ln in payload["messages"][-1]["content"].splitlines() if ln.startswith("- "))


def _image_order(world: Path) -> dict[tuple[str, ...], int]:
    """Position of each world image in the data set, by its human captions (which tell the 32 images apart)."""
    images = json.loads((world / "dataset.json").read_text())["images"]
    order = {tuple(s["raw"] for s in img["sentences"]): i for i, img in enumerate(images)}
    assert len(order) == len(images)
    return order


def _cache_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_dead_server_exits_nonzero_writes_no_success_and_keeps_the_cache(world, tmp_path):
    # An earlier run cached the answers of 10 images (the first 10 of the world).
    with ChatServer() as server:
        cfg = load(None, [*world_items(world), *_openai(server.url, "boost.limit=10")])
        boost(cfg, tmp_path / "a", progress=False)
    out = tmp_path / "b"
    out.mkdir()
    cached = (tmp_path / "a" / "cache.jsonl").read_bytes()
    (out / "cache.jsonl").write_bytes(cached)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    # A budget of 100 % leaves the stop to the consecutive connection failures.
    settings = ["boost.retries=1", "boost.concurrency=2", "boost.max_consecutive_failures=3"]
    settings.append("boost.max_failure_rate=1")
    proc = _cli("--out", str(out), *world_items(world), *_openai(url, *settings))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert "finecap: error: boost stopped:" in stderr and "could not reach the server" in stderr
    assert url in stderr and "Traceback" not in stderr
    assert not (out / "dataset.json").exists()  # nothing that claims success
    summary = json.loads((out / "boost.json").read_text())
    assert summary["status"] == "failed" and summary["output"] is None
    assert summary["boosted"] == 10 and summary["failed"] >= 3 and summary["cached"] == {"blend": 10}
    assert summary["boosted"] + summary["failed"] + summary["not_done"] == summary["to_boost"] == 32
    assert (out / "cache.jsonl").read_bytes() == cached  # every cached answer kept, nothing added
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert len(failures) == summary["failed"] and all("ServerUnavailable" in f["error"] for f in failures)
    assert not (out / LOCK_NAME).exists()


def test_failure_budget_stops_the_run_as_it_goes(world, tmp_path):
    # Concurrency 1: requests go one at a time. The first 8 images fail (HTTP 400, not retried); 10 % of 32 images
    # allows 3 failures: the 4th failed image stops the run. The worker may have started the 5th request meanwhile.
    order = _image_order(world)

    def by_image(payload, n):
        return (400, {"error": "prompt rejected"}) if order[_captions(payload)] < 8 else echo_first_caption(payload, n)

    with ChatServer(by_image) as server:
        cfg = load(None, [*world_items(world), *_openai(server.url, "boost.concurrency=1", "boost.few_shot=false",
                                                         "boost.max_failure_rate=0.1")])  # fmt: skip
        with pytest.raises(BoostFailed, match=r"4 of 32 images failed, more than boost.max_failure_rate=0.1 allows"):
            boost(cfg, tmp_path / "out", progress=False)
    assert 4 <= len(server.requests) <= 5
    summary = json.loads((tmp_path / "out" / "boost.json").read_text())
    assert (summary["status"], summary["boosted"], summary["failed"], summary["not_done"]) == ("failed", 0, 4, 28)
    assert not (tmp_path / "out" / "dataset.json").exists()


@pytest.mark.slow
def test_failures_within_budget_are_counted_apart_and_exit_zero(world, tmp_path):
    order = _image_order(world)

    def two_bad(payload, n):
        return (400, {"error": "rejected"}) if order[_captions(payload)] in (3, 7) else echo_first_caption(payload, n)

    with ChatServer(two_bad) as server:
        settings = ["boost.few_shot=false", "boost.max_failure_rate=0.1"]
        cfg = load(None, [*world_items(world), *_openai(server.url, *settings)])
        summary = boost(cfg, tmp_path / "out", progress=False)
    assert (summary["status"], summary["boosted"], summary["failed"], summary["not_done"]) == ("ok", 30, 2, 0)
    assert summary["failed_steps"] == {"blend": 2}
    raw = json.loads((tmp_path / "out" / "dataset.json").read_text())["images"]
    assert raw[3]["boost"]["blend"] == raw[3]["boost"]["original"]  # a failed image keeps its human captions
    assert raw[4]["boost"]["blend"] == [f"boosted {raw[4]['boost']['original'][0]}"]


def test_budget_counts_consecutive_connection_failures_only():
    budget = FailureBudget(100, max_rate=1.0, max_consecutive=3)
    down, http = ServerUnavailable("refused"), BackendError("HTTP 400")
    assert budget.failed(0, down) is None and budget.failed(1, down) is None
    budget.succeeded()  # an answer in between resets the count
    assert budget.failed(2, down) is None and budget.failed(3, down) is None
    assert budget.failed(4, http) is None  # the server answered: not a connection failure, resets too
    assert budget.failed(5, down) is None and budget.failed(6, down) is None
    reason = budget.failed(7, down)
    assert reason.startswith("3 requests in a row could not reach the server (boost.max_consecutive_failures=3)")


def test_budget_counts_an_engine_that_raised_as_a_server_not_reached():
    # an in-process engine raising instead of answering (EngineFailing) did not count: with max_rate=1 a dead engine
    # failed every image and the run ended "ok"; a failing server's answers (ServerFailing) still do not count
    budget = FailureBudget(100, max_rate=1.0, max_consecutive=3)
    text = "the vLLM engine failed: EngineDeadError: EngineCore encountered an issue."
    dead = EngineFailing(text)  # one failed batch: its images share the engine's one failure (InProcessBackend.run)
    assert all(budget.failed(i, dead) is None for i in range(5))  # a batch of 5 counts once, not 5 times
    assert budget.consecutive == 1
    assert budget.failed(5, EngineFailing(text)) is None  # the next batch: 2 in a row
    assert budget.failed(6, ServerFailing("HTTP 500", status=500)) is None  # the server answered: resets the count
    assert budget.failed(7, ServerUnavailable("refused")) is None and budget.failed(8, EngineFailing(text)) is None
    assert budget.failed(9, last := EngineFailing(text)) == (
        f"3 requests in a row got no answer from the in-process engine (boost.max_consecutive_failures=3); "
        f"last error: {last}")  # fmt: skip


def test_a_budget_of_100_percent_still_stops_a_run_whose_every_image_failed():
    # boost.max_failure_rate=1 let every image fail and the run end "ok" (exit 0, nothing boosted): it tolerates failed
    # images, not a run of nothing else. The last image failing stops it; an answered image keeps it within budget
    budget, http = FailureBudget(3, max_rate=1.0, max_consecutive=10), BackendError("HTTP 400")
    assert budget.failed(0, http) is None and budget.failed(1, http) is None and not budget.over_budget()
    assert budget.failed(2, http) == ("all 3 images failed, none boosted, whatever boost.max_failure_rate=1 allows; "
                                      "last error: HTTP 400")  # fmt: skip
    assert budget.over_budget()
    some = FailureBudget(3, max_rate=1.0, max_consecutive=10)
    assert some.failed(0, http) is None and some.failed(2, http) is None
    some.succeeded()  # image 1 answered
    assert not some.over_budget()
    assert not FailureBudget(0, max_rate=1.0).over_budget()  # nothing to boost: no run of failures
    # under a lower budget all images failing is over it as before, said as before
    low = FailureBudget(1, max_rate=0.5)
    said = low.failed(0, http)
    assert said == "1 of 1 images failed, more than boost.max_failure_rate=0.5 allows; last error: HTTP 400"


def test_401_stops_at_once(world, tmp_path):
    with ChatServer(lambda p, n: (401, {"error": {"message": "Incorrect API key provided"}}), delay=0.05) as server:
        cfg = load(None, [*world_items(world), *_openai(server.url, "boost.concurrency=2")])
        with pytest.raises(BoostFailed, match="HTTP 401: the server refused the API key"):
            boost(cfg, tmp_path / "out", progress=False)
    assert 1 <= len(server.requests) <= 2  # at most the requests already in flight; 30 images never sent
    summary = json.loads((tmp_path / "out" / "boost.json").read_text())
    assert summary["status"] == "failed" and summary["boosted"] == 0 and summary["not_done"] >= 30


@pytest.mark.parametrize(
    ("url", "error"),
    [("ftp://127.0.0.1/v1", "scheme 'ftp'"), ("localhost:8000/v1", "not an http"), ("http:///v1", "names no host"),
     ("http://127.0.0.1:99999999/v1", "malformed URL")],
)  # fmt: skip
def test_malformed_base_url_refused_before_anything(world, tmp_path, url, error):
    with pytest.raises(ConfigError, match=f"boost.llm_base_url: .*{error}"):
        load(None, [*world_items(world), *_openai(url)])


def test_malformed_url_from_environment_refused_before_any_request(world, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "localhost:8000")
    cfg = load(None, [*world_items(world), *_openai("")])
    with pytest.raises(ValueError, match="OPENAI_BASE_URL.*'localhost:8000': not an http"):
        boost(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "cache.jsonl").exists() and not (tmp_path / "out" / "boost.json").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1 http://127.0.0.1:8001/v1", "http://127.0.0.1:8000/v1\n",
                                 "http://bob:pa55word@127.0.0.1:8000/v1\tx"])  # fmt: skip
def test_a_url_from_environment_with_white_space_is_refused_as_the_option_would_be(world, tmp_path, monkeypatch, url):
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    cfg = load(None, [*world_items(world), *_openai("")])
    with pytest.raises(ValueError, match=r"OPENAI_BASE_URL \(environment, boost.llm_base_url empty\): holds white "
                                         r"space .*: a URL has none") as e:  # fmt: skip
        boost(cfg, tmp_path / "out", progress=False)
    assert "pa55word" not in str(e.value)
    assert not (tmp_path / "out" / "cache.jsonl").exists() and not (tmp_path / "out" / "boost.json").exists()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["world", "world/boosted", "world/images/x"])
def test_out_in_the_source_folder_refused_before_any_request_or_file(world, tmp_path, where):
    before = _snapshot(world)
    out = world.parent / where.replace("world", world.name, 1)
    with ChatServer() as server:
        cfg = load(None, [*world_items(world), *_openai(server.url)])
        with pytest.raises(ValueError, match=f"--out {out}: inside the source data set's folder {world.resolve()}"):
            boost(cfg, out, progress=False)
    assert server.requests == []
    assert _snapshot(world) == before and not (world / "boosted").exists() and not (world / "images" / "x").exists()


def test_out_inside_the_image_root_and_user_folders_refused(world, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    src = tmp_path / "src" / "data.jsonl"
    src.parent.mkdir()
    src.write_text(json.dumps({"image": "a.png", "captions": ["a dog"]}) + "\n")
    cfg = load(None, ["data.format=jsonl", f"data.path={src}", f"data.images={images}", "boost.mode=blend"])
    with pytest.raises(ValueError, match="inside the image folder"):
        boost(cfg, images / "boosted", progress=False)
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files but no finecap boost output"):
        boost(cfg, user, progress=False)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "boost.json").mkdir()
    with pytest.raises(ValueError, match="boost.json is a folder"):
        boost(cfg, tmp_path / "out", progress=False)
    assert _snapshot(user) == {"notes.txt": b"mine"} and os.listdir(images) == []


@pytest.mark.slow
def test_two_concurrent_boosts_on_one_folder(world, tmp_path):
    out = tmp_path / "out"
    with ChatServer(delay=0.05) as server:
        first = _cli("--out", str(out), *world_items(world), *_openai(server.url, "boost.concurrency=1"))
        deadline = time.time() + 120
        while len(server.requests) < 3 and time.time() < deadline and first.poll() is None:
            time.sleep(0.02)
        assert first.poll() is None, "the first run must still be running"
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
        cfg = load(None, [*world_items(world), *_openai(server.url)])
        busy = rf"another finecap boost is writing to this folder \(pid {first.pid} on host {socket.gethostname()}"
        with pytest.raises(OutputLocked, match=busy):
            boost(cfg, out, progress=False)
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert len(server.requests) == 32  # the second run sent nothing: no double cost
    lines = [json.loads(line) for line in _cache_lines(out / "cache.jsonl")]
    assert len(lines) == len({row["key"] for row in lines}) == 32
    raw = json.loads((out / "dataset.json").read_text())["images"]
    assert sorted(img["boost"]["blend"][0] for img in raw) == sorted(row["answer"] for row in lines)
    assert not (out / LOCK_NAME).exists()


def test_stale_lock_of_a_dead_process_is_taken_over(world, tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": 1.7e9}))
    boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)
    said = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)  # a warning
    assert f"taking over the lock of pid {dead.pid} on host {socket.gethostname()}" in said
    assert "which ended without releasing it" in said
    assert json.loads((out / "boost.json").read_text())["status"] == "ok" and not (out / LOCK_NAME).exists()


def test_lock_in_process(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["finecap", "boost", "--out", str(tmp_path), "boost.llm_api_key=sk-5ecret"])
    with output_lock(tmp_path, name=LOCK_NAME, holder="finecap boost", log=print) as me:
        assert json.loads((tmp_path / LOCK_NAME).read_text()) == me
        assert shlex.split(me["command"])[-1] == "boost.llm_api_key=***"  # a key on the command line is not recorded
        assert "sk-5ecret" not in (tmp_path / LOCK_NAME).read_text()
        with (
            pytest.raises(OutputLocked, match=f"pid {os.getpid()}"),
            output_lock(tmp_path, name=LOCK_NAME, holder="x"),
        ):
            pass
        assert json.loads((tmp_path / LOCK_NAME).read_text()) == me  # the loser did not touch the holder's record
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.slow
def test_non_json_reply_is_reported_as_such(world, tmp_path):
    with ChatServer(lambda p, n: (200, "<html>proxy error</html>")) as server:
        cfg = load(None, [*world_items(world), *_openai(server.url, "boost.retries=1", "boost.max_failure_rate=1")])
        with pytest.raises(BoostFailed, match="^boost stopped: all 32 images failed, none boosted, whatever"):
            boost(cfg, tmp_path / "out", progress=False)  # a budget of 100 % allows failed images, not all
    summary = json.loads((tmp_path / "out" / "boost.json").read_text())
    assert summary["failed"] == 32 and summary["status"] == "failed"
    errors = {json.loads(line)["error"] for line in (tmp_path / "out" / "failures.jsonl").read_text().splitlines()}
    assert errors == {"malformed reply: HTTP 200 but the reply is not JSON: '<html>proxy error</html>'"}
    assert summary["requested"] == {"blend": 64}  # asked again once (boost.retries=1), as an empty answer is


def test_a_reply_from_another_model_stops_the_run_exits_2_and_is_not_cached(world, tmp_path):
    # A proxy that falls back to a cheaper model after three answers: its answers were cached and written as
    # boost.llm_model's. One request at a time: the 4th reply names the fallback and stops the run (exit 2), and no
    # request starts after it.
    count = iter(range(10**6))

    def falls_back(payload, n):
        model = "m" if next(count) < 3 else "cheap-fallback"
        body = completion(f"a caption by {model}")
        body["model"] = model
        return 200, body

    out = tmp_path / "out"
    with ChatServer(falls_back) as server:
        argv = ["boost", "--out", str(out), *world_items(world), *_openai(server.url, "boost.concurrency=1")]
        code, _, err = run_cli(argv)
    assert code == 2, err
    assert ("finecap: error: boost stopped: a server answered as model 'cheap-fallback' after answering as 'm' "
            "(boost.llm_model='m')") in err and "Traceback" not in err  # fmt: skip
    assert len(server.requests) == 4  # the run stopped at the fallback's reply
    answers = [json.loads(line)["answer"] for line in _cache_lines(out / "cache.jsonl")]
    assert answers == ["a caption by m"] * 3  # the fallback's answer is not kept
    summary = json.loads((out / "boost.json").read_text())
    assert (summary["status"], summary["boosted"], summary["failed"], summary["not_done"]) == ("failed", 3, 1, 28)
    assert not (out / "dataset.json").exists()


def _answering_as(model: str):
    def answer(payload, n):
        body = completion(f"a caption by {model}")
        body["model"] = model
        return 200, body

    return answer


def test_a_run_resumed_against_another_model_exits_2_before_caching_and_boost_json_names_the_model(world, tmp_path):
    # cache.jsonl and boost.json did not record the model that answered: the same command run again against a server
    # now serving another model boosted the rest with it, the two models' answers mixed under boost.llm_model.
    out = tmp_path / "out"
    with ChatServer(_answering_as("m-2024-08-06")) as server:
        code, _, err = run_cli(
            ["boost", "--out", str(out), *world_items(world), *_openai(server.url, "boost.limit=3")]
        )
    assert code == 0, err
    assert json.loads((out / "boost.json").read_text())["served_model"] == {"llm": "m-2024-08-06"}
    assert [json.loads(line)["served_model"] for line in _cache_lines(out / "cache.jsonl")] == ["m-2024-08-06"] * 3
    kept = (out / "cache.jsonl").read_bytes()
    with ChatServer(_answering_as("cheap-fallback")) as server:  # the same command, without the limit (one at a time)
        code, _, err = run_cli(
            ["boost", "--out", str(out), *world_items(world), *_openai(server.url, "boost.concurrency=1")]
        )
    assert code == 2, err
    cache = out / "cache.jsonl"
    assert (f"finecap: error: boost stopped: a server answered as model 'cheap-fallback', but the 3 answer(s) of step "
            f"'blend' kept in {cache} came from model 'm-2024-08-06' (boost.llm_model='m'): resumed, the run would "
            "mix two models' answers under boost.llm_model; serve 'm-2024-08-06' again") in err  # fmt: skip
    assert len(server.requests) == 1 and (out / "cache.jsonl").read_bytes() == kept
    summary = json.loads((out / "boost.json").read_text())
    assert (summary["status"], summary["boosted"], summary["failed"], summary["not_done"]) == ("failed", 3, 1, 28)
    assert summary["served_model"] == {"llm": "m-2024-08-06"}  # the model of the answers kept


def test_whole_multi_paragraph_answer_is_kept(world, tmp_path):
    text = "Caption: A red circle in the middle.\n\nA blue square sits above it.\n  Both shapes are small.\n"
    with ChatServer(lambda p, n: (200, completion(text))) as server:
        cfg = load(None, [*world_items(world), *_openai(server.url, "boost.limit=1")])
        boost(cfg, tmp_path / "out", progress=False)
    raw = json.loads((tmp_path / "out" / "dataset.json").read_text())["images"]
    expected = "A red circle in the middle. A blue square sits above it. Both shapes are small."
    assert raw[0]["boost"]["blend"] == [expected] and raw[0]["sentences"][0]["raw"] == expected


def test_an_answer_cut_off_at_max_new_tokens_fails_its_image_and_is_counted(world, tmp_path):
    # The server stops image 3's answer at max_tokens (finish_reason "length"): a cut-off caption is no caption.
    order = _image_order(world)

    def cut_at_3(payload, n):
        if order[_captions(payload)] != 3:
            return echo_first_caption(payload, n)
        body = completion("boosted a striped")
        body["choices"][0]["finish_reason"] = "length"
        return 200, body

    settings = ["boost.few_shot=false", "boost.max_new_tokens=7"]
    with ChatServer(cut_at_3) as server:
        cfg = load(None, [*world_items(world), *_openai(server.url, *settings, "boost.max_failure_rate=0.1")])
        summary = boost(cfg, tmp_path / "out", progress=False)
        assert len(server.requests) == 32  # not asked again: the same settings would cut it again
        # Within the default budget (1 %) it stops the run, naming the option to raise.
        cfg = load(None, [*world_items(world), *_openai(server.url, *settings)])
        stop = r"1 of 32 images failed, .*; last error: the answer reached boost.max_new_tokens=7 .*; raise boost"
        with pytest.raises(BoostFailed, match=stop + r"\.max_new_tokens\. "):
            boost(cfg, tmp_path / "stopped", progress=False)
    out = tmp_path / "out"
    assert (summary["status"], summary["boosted"], summary["failed"], summary["not_done"]) == ("ok", 31, 1, 0)
    assert summary["cut_off"] == {"blend": 1} and summary["failed_steps"] == {"blend": 1}
    raw = json.loads((out / "dataset.json").read_text())["images"]
    assert raw[3]["boost"]["blend"] == raw[3]["boost"]["original"]  # the human captions kept
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["step"], f["error"], f["attempts"]) for f in failures] == [
        ("blend", "CutOff: the answer reached boost.max_new_tokens=7 before the model ended it (finish_reason "
                  "'length'): 'boosted a striped'; raise boost.max_new_tokens", 1)]  # fmt: skip
    answers = [json.loads(line)["answer"] for line in _cache_lines(out / "cache.jsonl")]
    assert len(answers) == 31 and "boosted a striped" not in answers  # never cached


def test_ctrl_c_keeps_the_answers_in_flight_and_says_interrupted(world, tmp_path):
    # Two requests at a time. The first two wait for each other (a barrier), one of them interrupts the main thread
    # as a Ctrl-C does (SIGINT), and both answer only once the backend has said it is waiting for them: their answers
    # arrive after the interrupt, and nothing more is sent.
    barrier, waiting, main = threading.Barrier(2), threading.Event(), threading.main_thread().ident

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("interrupted: waiting for the 2 request(s) in flight"):
                waiting.set()

    def answer(payload, n):
        if barrier.wait(timeout=30) == 0:  # a real SIGINT to the main thread: it wakes a blocked wait
            signal.pthread_kill(main, signal.SIGINT)
        assert waiting.wait(timeout=30)
        return echo_first_caption(payload, n)

    said = Said()
    logging.getLogger("finecap.boost.openai_backend").addHandler(said)
    # Python's own Ctrl-C handler, as a user's process has it: once in the parallel suite (session 34) the SIGINT
    # raised nothing in this worker process, whose handler something run before had changed (not found)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ChatServer(answer) as server:
            cfg = load(None, [*world_items(world), *_openai(server.url, "boost.concurrency=2")])
            with pytest.raises(KeyboardInterrupt):
                boost(cfg, tmp_path / "out", progress=False)
    finally:
        signal.signal(signal.SIGINT, handler)
        logging.getLogger("finecap.boost.openai_backend").removeHandler(said)
    assert len(server.requests) == 2
    cached = [json.loads(line) for line in (tmp_path / "out" / "cache.jsonl").read_text().splitlines()]
    assert sorted(c["answer"] for c in cached) == sorted(
        echo_first_caption(r["payload"], 0)[1]["choices"][0]["message"]["content"] for r in server.requests
    )
    summary = json.loads((tmp_path / "out" / "boost.json").read_text())
    assert summary["status"] == "interrupted" and summary["answers_kept"] == 2 and summary["output"] is None
    assert summary["served_model"] == {"llm": "test-model"}  # as a finished run's boost.json says it
    assert not (tmp_path / "out" / "dataset.json").exists()
