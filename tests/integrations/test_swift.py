"""finecap's rewards through ms-swift's own reward loading: a plugin file registers an ``ORM`` (the reward in
process) and an ``AsyncORM`` (the reward server) in ``orms``, ms-swift imports it as ``--external_plugins`` does,
resolves ``--reward_funcs`` by name and scores GRPO samples (data-set columns in ``extra``) with its own
``compute_rewards_per_func``: the hand-computed mixture's values, bit for bit the in-process ones. Skipped without
ms-swift (not in finecap's test extra: on this CPU it installs in a throwaway venv, docs/integrations.md); the
documented signatures are tested without it in tests/serve/test_front_ends.py."""

from __future__ import annotations

import pytest

pytest.importorskip("swift.rewards", reason="ms-swift (4.x) is not installed (pip install ms-swift)")

import torch  # noqa: E402

from finecap.rewards import call_batch  # noqa: E402
from finecap.serve.service import ImageTable, RewardService  # noqa: E402
from helpers.served import CAPTIONS, EXPECTED, IDS, serving, small_mixture  # noqa: E402

PLUGIN = """
from swift.rewards import orms
from finecap.integrations.swift import async_orm, orm
from helpers.served import small_mixture

orms["finecap_mix"] = orm(small_mixture(), name="FinecapMix")
orms["finecap_served"] = async_orm(url={url!r})
"""


def test_ms_swifts_plugin_loading_and_reward_computation(tmp_path):
    from swift.rewards import ORM, AsyncORM
    from swift.rl_core.data import GRPOSample
    from swift.rl_core.grpo_algorithm import compute_rewards_per_func
    from swift.rlhf_trainers.utils import resolve_reward_funcs
    from swift.utils import import_external_file

    reward = small_mixture()
    in_process = reward(CAPTIONS, call_batch(IDS)).total.tolist()
    assert in_process == pytest.approx(EXPECTED, abs=1e-5)
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        plugin = tmp_path / "finecap_plugin.py"
        plugin.write_text(PLUGIN.format(url=url))
        import_external_file(str(plugin))  # what --external_plugins does
        funcs, names = resolve_reward_funcs(["finecap_mix", "finecap_served"])
        assert names == ["FinecapMix", "FinecapAsyncReward"]
        assert isinstance(funcs[0], ORM) and isinstance(funcs[1], AsyncORM)
        samples = [GRPOSample(messages=[{"role": "user", "content": "<image>Describe the image."},
                                        {"role": "assistant", "content": c}], extra={"image_id": i})
                   for c, i in zip(CAPTIONS, IDS, strict=True)]  # fmt: skip
        rewards = compute_rewards_per_func(samples, funcs, None, torch.device("cpu"))  # (4, 2)
    assert rewards[:, 0].tolist() == in_process and rewards[:, 1].tolist() == in_process
