"""The ``openai`` backend: any OpenAI-compatible chat-completions server (vLLM, llama.cpp server, Ollama, TGI,
``transformers serve``, OpenAI itself) over HTTP with ``httpx``.

``POST {base_url}/chat/completions`` with ``{"model", "messages", "max_tokens", "temperature"}``; the answer is
``choices[0].message.content``. For the ``visual`` step the image is sent inline as a base64 data URL in the last
user message (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``), which every server
above accepts for vision models. At most ``boost.concurrency`` requests are in flight (a thread pool of that size
sharing one connection pool). A request that times out (``boost.timeout``), fails to connect or gets HTTP 429 or 5xx
is retried up to ``boost.retries`` times with exponential backoff (``backoff * 2**attempt`` seconds, at most 30 s);
other HTTP errors fail at once. A response that is not chat-completions JSON counts as an empty answer, which the
engine asks again (:mod:`finecap.boost.engine`).

Why httpx rather than the ``openai`` package: the request is one POST, and httpx gives the time-out, connection pool
and error types directly; the ``openai`` client would add a dependency and its own retry layer on top of ours.
"""

from __future__ import annotations

import base64
import mimetypes
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import httpx

from finecap.boost.engine import BackendError, Task

DEFAULT_BASE_URL = "https://api.openai.com/v1"
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def image_data_url(path: str | Path) -> str:
    """``data:<mime>;base64,<bytes>`` of an image file."""
    mime = mimetypes.guess_type(str(path))[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def with_image(messages: list[dict[str, Any]], image: str | Path) -> list[dict[str, Any]]:
    """``messages`` with the image attached to the last user message (OpenAI content-parts format)."""
    out = [dict(m) for m in messages]
    last = out[-1]
    last["content"] = [{"type": "text", "text": last["content"]},
                       {"type": "image_url", "image_url": {"url": image_data_url(image)}}]  # fmt: skip
    return out


class OpenAIBackend:
    """Chat completions on an OpenAI-compatible server (module docstring)."""

    def __init__(
        self,
        model: str,
        base_url: str = "",
        api_key: str = "",
        *,
        concurrency: int = 8,
        timeout: float = 120.0,
        retries: int = 3,
        max_tokens: int = 120,
        temperature: float = 0.0,
        backoff: float = 1.0,
        key: str = "boost.llm",
    ) -> None:
        if not model:
            raise ValueError(f"{key}_model: the openai backend needs the served model name")
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        api_key = api_key or os.environ.get("OPENAI_API_KEY", "")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.concurrency, self.retries, self.backoff = concurrency, retries, backoff
        self.max_tokens, self.temperature = max_tokens, temperature
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.Client(headers=headers, timeout=timeout, limits=limits)
        self._lock = threading.Lock()
        self.requests_sent = 0

    def identity(self) -> dict[str, Any]:
        """Model and generation settings, not the URL: a resumed run may reach the same model at another address."""
        return {"backend": "openai", "model": self.model, "max_tokens": self.max_tokens,
                "temperature": self.temperature}  # fmt: skip

    def payload(self, task: Task) -> dict[str, Any]:
        messages = with_image(task.messages, task.image) if task.image is not None else task.messages
        return {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature}  # fmt: skip

    def complete(self, task: Task) -> str:
        """One request with retries; the answer text ("" when the response is not chat-completions JSON)."""
        payload = self.payload(task)
        url = f"{self.base_url}/chat/completions"
        error = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(30.0, self.backoff * 2 ** (attempt - 1)))
            with self._lock:
                self.requests_sent += 1
            try:
                response = self.client.post(url, json=payload)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                error = f"{type(e).__name__}: {e}"
                continue
            if response.status_code in RETRY_STATUS:
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise BackendError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
            try:
                content = response.json()["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                return ""
            return content if isinstance(content, str) else ""
        raise BackendError(f"{url}: gave up after {self.retries + 1} attempts; last error {error}")

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, str | BaseException]]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = {pool.submit(self.complete, t): i for i, t in enumerate(tasks)}
            for future in as_completed(futures):
                try:
                    yield futures[future], future.result()
                except Exception as e:  # noqa: BLE001 - every failure is logged per image, never raised mid-run
                    yield futures[future], e

    def close(self) -> None:
        self.client.close()
