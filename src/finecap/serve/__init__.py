"""The reward server: finecap's rewards over HTTP for trainers that run elsewhere (``finecap serve-reward``).

- :mod:`finecap.serve.protocol`: the requests, plain JSON only: finecap's own (``POST /reward``) and the
  OpenRLHF / CapRL remote-reward shape (``POST /get_reward``), their limits and structured errors;
- :mod:`finecap.serve.service`: the reward service: image ids checked against the served data set, concurrent
  requests batched (merged into one reward call when the reward scores each caption on its own), throughput logs;
- :mod:`finecap.serve.app`: the ASGI application (Starlette) and its server (uvicorn);
- :mod:`finecap.serve.client`: a small client (httpx) the adapters of :mod:`finecap.integrations` share.

The reward itself is the training loop's (:func:`finecap.rewards.build_reward` and its ``setup``), built by the
command (:mod:`finecap.app.serve_reward`); docs/integrations.md has the protocol and an example per framework.
"""
