"""The connections of :meth:`finecap.serve.client.RewardClient.ascore` under a trainer's load: verl's reward loop
awaits each sample's ``compute_score_async`` (thousands a step, many at once, in one event loop; a trainer may start
a new loop each step, and run loops in several threads). Each request opened a connection of its own, which left a
socket in TIME_WAIT and cost a new httpx client (about 20 ms of CPU) a request; the requests of one loop now share
that loop's pool, closed when the loop ends (docs/integrations.md#from-python). The server counts the connections it
accepts (:func:`helpers.served.accepted_connections`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import pickle
import socket
import threading
import weakref

import pytest
import torch

from finecap.integrations.verl import compute_score_async
from finecap.rewards import RewardOutput
from finecap.serve.client import RewardClient, RewardServerError
from finecap.serve.service import ImageTable, RewardService
from helpers.served import accepted_connections, open_connections, serving_server, standing_in
from helpers.waiting import until


class Words:
    """Each caption's length in words, a per-caption reward (the server merges concurrent requests)."""

    per_caption = True

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"words": total})


def service() -> RewardService:
    return RewardService(Words(), ImageTable(range(10)), log_every=0, name="words")


async def many(client: RewardClient, n: int) -> list[list[float]]:
    """``n`` requests of one caption ("a red circle": 3 words) awaited together, as verl's reward loop awaits a step's
    samples."""
    outs = await asyncio.gather(*(client.ascore(["a red circle"], [k % 10]) for k in range(n)))
    return [out.total.tolist() for out in outs]


def test_the_requests_of_one_event_loop_share_its_few_connections_closed_when_it_ends():
    # each awaited request opened (and closed) a connection of its own: 200 requests, 200 connections
    with serving_server(service()) as (url, server):
        client = RewardClient(url, max_in_flight=4)
        for step in (1, 2):  # a new event loop each step, as a trainer's
            assert asyncio.run(many(client, 200)) == [[3.0]] * 200
            assert 1 <= accepted_connections(server) <= 4 * step  # the loop's pool: max_in_flight at most
            until(lambda: open_connections(server) == 0, "the ended loop's connections were never closed")
        client.close()


def test_verls_awaited_per_sample_reward_reuses_connections_step_after_step():
    # compute_score_async, as verl's reward loop awaits it: a step's samples together, a new loop a step
    async def verl_step(url: str) -> list[float]:
        calls = (compute_score_async("d", "a red circle", "", {"image_id": k % 10}, url=url) for k in range(150))
        return [r["score"] for r in await asyncio.gather(*calls)]

    with serving_server(service()) as (url, server):
        for _ in range(2):
            assert asyncio.run(verl_step(url)) == [3.0] * 150
        # each step's pool: the client's max_in_flight (64) at most; and one more, the threads' pool of the adapter's
        # one read of the served reward's /health tallies before its first call (a reward that counts nothing: no
        # read after it; Scorer.acounted)
        assert accepted_connections(server) <= 2 * 64 + 1
        until(lambda: open_connections(server) == 0, "the steps' connections were never closed")


def test_event_loops_in_several_threads_at_once_each_keep_their_own_pool():
    # verl runs reward functions in threads too: each thread's loop has its pool, all at once
    with serving_server(service()) as (url, server):
        client = RewardClient(url, max_in_flight=3)
        start = threading.Barrier(4)
        results: list[list[list[float]]] = []

        def thread() -> None:
            start.wait()
            results.append(asyncio.run(many(client, 60)))

        threads = [threading.Thread(target=thread) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [[[3.0]] * 60] * 4
        assert accepted_connections(server) <= 4 * 3
        until(lambda: open_connections(server) == 0, "the threads' loops' connections were never closed")
        client.close()


def test_an_event_loop_that_ended_is_let_go():
    # each loop's turns (an asyncio.Semaphore, bound to the loop once a request waited its turn) were kept for ever,
    # and with them the loop: a trainer's new loop a step, never freed
    with serving_server(service()) as (url, _):
        client = RewardClient(url, max_in_flight=1)
        ended: list[weakref.ref] = []

        async def step() -> list[list[float]]:
            ended.append(weakref.ref(asyncio.get_running_loop()))
            return await many(client, 3)  # two of them wait their turn

        assert asyncio.run(step()) == [[3.0]] * 3
        loop = asyncio.new_event_loop()  # closed without asyncio.run's shutdown_asyncgens: let go at the next loop
        assert loop.run_until_complete(step()) == [[3.0]] * 3
        loop.close()
        del loop
        assert asyncio.run(many(client, 1)) == [[3.0]]
        gc.collect()
        assert [ref() for ref in ended] == [None, None]
        client.close()


def test_close_closes_the_pool_of_a_loop_that_keeps_running():
    # a loop that runs for the trainer's life (a Ray async actor's) keeps its pool between steps; close() ends it
    with serving_server(service()) as (url, server):
        client = RewardClient(url, max_in_flight=2)
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_forever)
        runner.start()
        try:
            assert asyncio.run_coroutine_threadsafe(many(client, 20), loop).result(60) == [[3.0]] * 20
            assert 1 <= open_connections(server) <= 2  # kept open for the next step
            client.close()
            until(lambda: open_connections(server) == 0, "close() left the running loop's connections open")
            assert asyncio.run_coroutine_threadsafe(many(client, 4), loop).result(60) == [[3.0]] * 4
            assert accepted_connections(server) <= 4  # a new pool after close
        finally:
            loop.call_soon_threadsafe(loop.stop)
            runner.join(30)
            loop.close()


def test_a_client_lets_an_idle_connection_go_before_the_server_would_close_it(monkeypatch):
    # both kept an idle connection 5 s (httpx's default, uvicorn's): a request sent as the server closed it failed
    import finecap.serve.client as client_module
    from finecap.serve.app import make_server

    server, sock = make_server(service())
    sock.close()
    assert server.config.timeout_keep_alive > client_module.KEEPALIVE_EXPIRY
    monkeypatch.setattr(client_module, "KEEPALIVE_EXPIRY", 0.0)  # each idle connection expired at the next request
    with serving_server(service()) as (url, server):
        client = RewardClient(url)
        assert [client.score(["a red circle"], [1]).total.tolist() for _ in range(3)] == [[3.0]] * 3

        async def one_after_another() -> list[list[float]]:
            return [(await client.ascore(["a red circle"], [1])).total.tolist() for _ in range(3)]

        assert asyncio.run(one_after_another()) == [[3.0]] * 3
        assert accepted_connections(server) == 6  # the threads' pool and the loop's both use the value
        client.close()


def one_score(client: RewardClient, awaited: bool, caption: str = "a red circle") -> list[float]:
    """The total of one caption of image 1 through :meth:`RewardClient.score` or, ``awaited``, ``ascore`` (in an event
    loop of its own, as a trainer's step)."""
    out = asyncio.run(client.ascore([caption], [1])) if awaited else client.score([caption], [1])
    return out.total.tolist()


@pytest.mark.parametrize("awaited", [False, True], ids=["score", "ascore"])
def test_a_reward_server_restarting_on_its_port_is_asked_again_until_it_listens(awaited, caplog):
    # a restarting server refuses connections for a moment (httpx's ConnectError), which was never asked again: the
    # trainer died on a restart of the reward server it had been scoring with
    caplog.set_level(logging.WARNING, logger="finecap.serve.client")
    with serving_server(service()) as (url, _):
        client = RewardClient(url)
        assert one_score(client, awaited) == [3.0]  # the server answered this client
    port = int(url.rsplit(":", 1)[1])

    def retried() -> bool:
        return any("asking again" in r.getMessage() for r in caplog.records)

    restarted, done = threading.Event(), threading.Event()

    def restart() -> None:  # started again on the same port once the client has been refused and waits
        until(retried, "the client never asked again after the server stopped")
        with serving_server(service(), port=port):
            restarted.set()
            done.wait(60)

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        assert one_score(client, awaited, "two blue squares on sand") == [5.0]
    finally:
        done.set()
        thread.join(60)
        client.close()
    assert restarted.is_set()
    said = [r.getMessage() for r in caplog.records]
    assert said and all("could not be connected to (restarting?) (ConnectError" in m for m in said), said
    assert "asking again in 1 s (retry 1 of 5)" in said[0], said
    # the server stopped again: a copy in another process (a Ray worker, which may not reach the URL at all) was
    # answered by no server, and is not asked again
    copy = pickle.loads(pickle.dumps(client))
    with pytest.raises(RewardServerError, match="it has never answered this client: not asked again"):
        one_score(copy, awaited)
    assert len(caplog.records) == len(said)


@pytest.mark.parametrize("awaited", [False, True], ids=["score", "ascore"])
@pytest.mark.parametrize(("act", "said"), [("close", "closed the connection without answering (RemoteProtocolError"),
                                           ("reset", "broke the connection without answering (ReadError")],
                         ids=["close", "reset"])  # fmt: skip
def test_a_connection_the_server_dropped_unanswered_is_asked_again(act, said, awaited, caplog):
    # a RemoteProtocolError (a restarting server's, or one closing a connection over its --max-connections at once)
    # failed the trainer's batch at once, where a 503 of the same server was asked again; a connection reset midway
    # through the answer (ReadError) still did
    caplog.set_level(logging.WARNING, logger="finecap.serve.client")
    with standing_in(["answer", act]) as (url, bodies):
        client = RewardClient(url)
        assert one_score(client, awaited) == [3.0]
        assert one_score(client, awaited, "two blue squares") == [3.0]  # the stand-in's 3.0 again, once asked again
        client.close()
    assert len(bodies) == 3 and bodies[1] == bodies[2] != bodies[0]  # the same request, asked again
    retried = [r.getMessage() for r in caplog.records]
    assert len(retried) == 1 and said in retried[0], retried
    assert "asking again in 1 s (retry 1 of 5)" in retried[0], retried


def test_a_server_that_keeps_closing_the_connection_fails_once_the_retries_are_spent(caplog):
    caplog.set_level(logging.WARNING, logger="finecap.serve.client")
    with standing_in(["answer"] + ["close"] * 10) as (url, bodies):
        client = RewardClient(url, retries=1)
        assert one_score(client, False) == [3.0]
        with pytest.raises(RewardServerError, match=r"the server closed the connection: restarting, or more open"):
            client.score(["a red circle"], [1])
        client.retries = 0
        with pytest.raises(RewardServerError, match=r"the server closed the connection") as failed:
            client.score(["not retried"], [1])
        assert "never answered" not in str(failed.value)
    assert len(bodies) == 4  # the answered request, the failed one and its one retry; retries=0: asked once
    assert len(caplog.records) == 1


@pytest.mark.parametrize("act", ["close", "reset", "garbage"])
def test_a_server_that_never_answered_this_client_is_not_asked_again(act, caplog):
    # a port that closes, resets or speaks no HTTP (a wrong port) was asked again for 31 s when it closed the
    # connection (a RemoteProtocolError: "close", "garbage") before the error was said
    caplog.set_level(logging.WARNING, logger="finecap.serve.client")
    with standing_in([act] * 3) as (url, bodies), pytest.raises(RewardServerError) as failed:
        RewardClient(url, retries=2).score(["a red circle"], [1])
    assert len(bodies) == 1  # asked once
    assert caplog.records == []
    assert "it has never answered this client: not asked again" in str(failed.value)


def test_a_server_that_cannot_be_reached_is_said_at_once(caplog):
    # a wrong URL (nothing listens there) is not asked again: no backoff before the error
    caplog.set_level(logging.WARNING, logger="finecap.serve.client")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with pytest.raises(RewardServerError, match=rf"127\.0\.0\.1:{port}/reward: .*it has never answered this client"):
        RewardClient(f"http://127.0.0.1:{port}").score(["a red circle"], [1])
    assert caplog.records == []
