"""finecap's rewards through OpenRLHF's own reward client: its single-turn executor asks the reward server's
``/get_reward`` (one sample a request, as OpenRLHF 0.9+ does: the server serves ``sr.distractors=hard``, whose mined
distractor is the same whatever the request holds) and loads ``reward_func`` from a file (``--remote_rm_url
file.py``); the values are the hand-computed mixture's, bit for bit the in-process ones. Skipped without OpenRLHF
(not in finecap's test extra: its CUDA dependencies do not build on a CPU, ``pip install --no-deps openrlhf`` does;
docs/integrations.md); the request shape is tested without it in tests/serve."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("openrlhf.utils.agent", reason="OpenRLHF is not installed (make test-adapters installs it)")

from finecap.config import SRConfig  # noqa: E402
from finecap.rewards import call_batch  # noqa: E402
from finecap.serve.service import ImageTable, RewardService  # noqa: E402
from helpers.served import CAPTIONS, EXPECTED, IDS, PROMPT, serving, small_mixture  # noqa: E402

REWARD_FILE = """
from finecap.config import SRConfig
from finecap.integrations.openrlhf import reward_function
from helpers.served import small_mixture

reward_func = reward_function(small_mixture(SRConfig(distractors="hard")))
"""


def test_openrlhfs_executor_asks_the_server_and_loads_a_reward_file(tmp_path):
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    reward = small_mixture(SRConfig(distractors="hard"))
    in_process = [
        reward([c], call_batch([i])).total.item() for c, i in zip(CAPTIONS, IDS, strict=True)
    ]  # one sample a call
    assert in_process == pytest.approx(EXPECTED, abs=1e-5)
    queries = [PROMPT + c + "<|im_end|>" for c in CAPTIONS]
    labels = [json.dumps({"image_id": i}) for i in IDS]
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        executor = SingleTurnAgentExecutor(remote_rm_url=f"{url}/get_reward")
        answers = [asyncio.run(executor._fetch_rewards_via_http([q], [PROMPT], [label]))[0]
                   for q, label in zip(queries, labels, strict=True)]  # fmt: skip
    assert [a["rewards"][0] for a in answers] == in_process
    assert set(answers[0]["extra_logs"]) >= {"retrieval", "cider", "retrieval/candidates"}
    path = tmp_path / "finecap_reward.py"
    path.write_text(REWARD_FILE)
    executor = SingleTurnAgentExecutor(remote_rm_url=str(path))
    answers = asyncio.run(executor._fetch_rewards_via_func(queries, [PROMPT] * 4, labels))  # one call per sample
    assert [a["rewards"].item() for a in answers] == in_process
