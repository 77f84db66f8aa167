"""A small OpenAI-compatible chat-completions server on 127.0.0.1 for the backend tests (standard library only).

``ChatServer(answer)`` serves ``POST /v1/chat/completions``; ``answer(payload, n) -> (status, body)`` or
``(status, body, headers)`` decides each response (``n`` = how many requests with the same payload came before) and
may sleep; with ``drip`` seconds the body is sent one byte at a time, that long apart (a server that never stops
answering). The server records every request (headers, JSON payload and the raw body bytes) and the largest number of
requests it handled at once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[dict[str, Any], int], tuple[Any, ...]]


def completion(content: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }


def echo_first_caption(payload: dict[str, Any], n: int) -> tuple[int, Any]:
    """Answer ``"boosted <first '- ' line of the last user message>"`` (or ``"described"`` without one)."""
    content = payload["messages"][-1]["content"]
    text = content if isinstance(content, str) else next(p["text"] for p in content if p["type"] == "text")
    lines = [ln[2:] for ln in text.splitlines() if ln.startswith("- ")]
    return 200, completion(f"boosted {lines[0]}" if lines else "described")


def answering_as(*models: str) -> Answer:
    """A server answering ``"B"`` as ``models[k]`` to its k-th request (the last one after that): a judge's letter,
    from a server whose model changes (a proxy's fallback)."""
    count = iter(range(10**6))

    def answer(payload: dict[str, Any], n: int) -> tuple[int, Any]:
        body = completion("B")
        body["model"] = models[min(next(count), len(models) - 1)]
        return 200, body

    return answer


def judging(unparsable: str) -> Answer:
    """A judge's server for the ``claims`` and ``clair`` prompts (src/finecap/judges/prompts/judge.yaml): a rating of
    70 for every caption, the claims ``["a claim"]`` of every text but the caption ``unparsable``, whose split is
    answered ``"no idea"`` (it never parses: the call fails after the retries), and "yes" to every claim checked."""

    def answer(payload: dict[str, Any], n: int) -> tuple[int, Any]:
        asked = payload["messages"][-1]["content"]
        if "Candidate caption:" in asked:  # rate
            return 200, completion(json.dumps({"score": 70, "reason": "mostly right"}))
        if asked.startswith("Description:"):  # claims (a caption's, or a reference's)
            return 200, completion("no idea" if json.dumps(unparsable) in asked else json.dumps(["a claim"]))
        claims = int(re.search(r"as a JSON list of (\d+) strings", asked).group(1))  # supports
        return 200, completion(json.dumps(["yes"] * claims))

    return answer


class ChatServer:
    def __init__(self, answer: Answer = echo_first_caption, delay: float = 0.0, drip: float = 0.0) -> None:
        self.answer, self.delay, self.drip = answer, delay, drip
        self.requests: list[dict[str, Any]] = []
        self.seen: Counter[str] = Counter()
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                payload = json.loads(body)
                key = json.dumps(payload, sort_keys=True)
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "payload": payload,
                                            "body": body})  # fmt: skip
                    n = server.seen[key]
                    server.seen[key] += 1
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay)
                    status, out, *extra = server.answer(payload, n)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in (extra[0] if extra else {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    if not server.drip:
                        self.wfile.write(data)
                    for k in range(len(data) if server.drip else 0):
                        self.wfile.write(data[k : k + 1])
                        self.wfile.flush()
                        time.sleep(server.drip)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and went away

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        # shutdown() waits for the serving loop's next poll: 20 ms, not the default half second per server
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
