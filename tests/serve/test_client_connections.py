"""The connections of :meth:`finecap.serve.client.RewardClient.ascore` under a trainer's load: verl's reward loop
awaits each sample's ``compute_score_async`` (thousands a step, many at once, in one event loop; a trainer may start
a new loop each step, and run loops in several threads). Each request opened a connection of its own, which left a
socket in TIME_WAIT and cost a new httpx client (about 20 ms of CPU) a request; the requests of one loop now share
that loop's pool, closed when the loop ends (docs/integrations.md#from-python). The server counts the connections it
accepts (:func:`helpers.served.accepted_connections`)."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import torch

from finecap.integrations.verl import compute_score_async
from finecap.rewards import RewardOutput
from finecap.serve.client import RewardClient
from finecap.serve.service import ImageTable, RewardService
from helpers.served import accepted_connections, open_connections, serving_server
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
