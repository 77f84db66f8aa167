"""A client of finecap's reward server (``POST /reward``), synchronous and asynchronous, over httpx: what the
adapters of :mod:`finecap.integrations` (verl, ms-swift, OpenRLHF's reward function) send when they are given the
server's URL instead of a reward.

Example (a server from ``finecap serve-reward demo/sr_bagcurri --port 8000``)::

    client = RewardClient("http://127.0.0.1:8000")
    client.score(["a red circle on sand", "two blue squares"], image_ids=[17, 4]).total   # [-0.41, -1.9]
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Any

import httpx

from finecap.serve.service import Scored


class RewardServerError(RuntimeError):
    """The server refused a request (its status, the field it named and its message) or could not be reached."""

    def __init__(self, status: int | None, field: str | None, message: str) -> None:
        where = f" ({field})" if field else ""
        super().__init__(f"reward server{where}: {message}" + (f" [HTTP {status}]" if status else ""))
        self.status, self.field = status, field


def reward_url(url: str) -> str:
    """The ``/reward`` endpoint of a server given by its base URL (or by the endpoint itself)."""
    url = url.rstrip("/")
    for endpoint in ("/reward", "/get_reward", "/health"):
        if url.endswith(endpoint):
            url = url[: -len(endpoint)]
    return f"{url}/reward"


class RewardClient:
    """Scores captions on a reward server.

    Args:
        url: the server (``http://127.0.0.1:8000``, or its ``/reward`` endpoint).
        timeout: seconds per request.
    """

    def __init__(self, url: str, timeout: float = 180.0) -> None:
        self.url = reward_url(url)
        self.timeout = timeout
        self._local = threading.local()  # one connection pool per thread (trainers call from worker threads)

    @staticmethod
    def payload(captions: Sequence[str], image_ids: Sequence[Hashable] | None = None, *,
                images: Sequence[str] | None = None, references: Sequence[Sequence[str]] | None = None,
                request_id: Any = None) -> dict[str, Any]:  # fmt: skip
        """The JSON of a ``/reward`` request."""
        if (image_ids is None) == (images is None):
            raise ValueError("RewardClient: give image_ids or images (paths), one of them")
        body: dict[str, Any] = {"captions": list(captions)}
        if image_ids is not None:
            body["image_ids"] = [i if isinstance(i, str | int) else str(i) for i in image_ids]
        else:
            body["images"] = [str(p) for p in images]
        if references is not None:
            body["references"] = [list(r) for r in references]
        if request_id is not None:
            body["id"] = request_id
        return body

    @staticmethod
    def reply(response: httpx.Response) -> Scored:
        """The values of a reply, or :class:`RewardServerError`."""
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code != 200 or not isinstance(data, dict) or "total" not in data:
            error = (data or {}).get("error") if isinstance(data, dict) else None
            if isinstance(error, dict):
                raise RewardServerError(response.status_code, error.get("field"), str(error.get("message")))
            raise RewardServerError(response.status_code, None, response.text[:300])
        return Scored(data["total"], data.get("parts", {}))

    def _client(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(timeout=self.timeout)
        return client

    def score(self, captions: Sequence[str], image_ids: Sequence[Hashable] | None = None, **kwargs: Any) -> Scored:
        """The values of ``captions`` (keyword arguments: :meth:`payload`'s)."""
        body = self.payload(captions, image_ids, **kwargs)
        try:
            response = self._client().post(self.url, json=body)
        except httpx.HTTPError as e:
            raise RewardServerError(None, None, f"{self.url}: {e}") from e
        return self.reply(response)

    async def ascore(self, captions: Sequence[str], image_ids: Sequence[Hashable] | None = None,
                     **kwargs: Any) -> Scored:  # fmt: skip
        """:meth:`score`, awaited (a connection of its own: trainers run each step in a new event loop)."""
        body = self.payload(captions, image_ids, **kwargs)
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.post(self.url, json=body)
        except httpx.HTTPError as e:
            raise RewardServerError(None, None, f"{self.url}: {e}") from e
        return self.reply(response)
