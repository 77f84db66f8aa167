"""finecap's rewards through verl's own reward loading: ``get_custom_reward_fn`` reads ``custom_reward_function``
(``pkg://finecap.integrations.verl``, the server's URL in ``reward_kwargs``), and its reward loop's ``naive`` manager
(verl 0.6+'s default) and its legacy batch reward manager score batches (``DataProto``) of decoded responses; the
values are the hand-computed mixture's, bit for bit the in-process ones. Skipped without verl (not in finecap's test
extra: on this CPU it installs in a throwaway venv, docs/integrations.md); the documented signatures are tested
without it in tests/serve/test_front_ends.py."""

from __future__ import annotations

import pytest

verl = pytest.importorskip("verl", reason="verl is not installed (pip install verl)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from finecap.config import SRConfig  # noqa: E402
from finecap.rewards import call_batch  # noqa: E402
from finecap.serve.service import ImageTable, RewardService  # noqa: E402
from helpers.served import CAPTIONS, EXPECTED, IDS, serving, small_mixture  # noqa: E402


def verl_config(name: str, url: str):
    """verl's configuration of a custom reward function (0.6+: under ``reward``; before: at the top level)."""
    section = {"path": "pkg://finecap.integrations.verl", "name": name, "reward_kwargs": {"url": url}}
    return OmegaConf.create({"reward": {"custom_reward_function": section}, "custom_reward_function": section,
                             "data": {"reward_fn_key": "data_source"}})  # fmt: skip


class WordTokenizer:
    """A tokenizer of the captions' words (verl's managers only decode the responses)."""

    def __init__(self, captions):
        self.words = ["<pad>", *sorted({w for c in captions for w in c.split()})]

    def encode(self, text):
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.words[i] for i in ids if i != 0)


def test_verls_loader_and_batch_manager_call_the_server():
    from verl import DataProto
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager.batch import BatchRewardManager

    reward = small_mixture()
    in_process = reward(CAPTIONS, call_batch(IDS)).total.tolist()
    assert in_process == pytest.approx(EXPECTED, abs=1e-5)
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        batch_fn = get_custom_reward_fn(verl_config("compute_score_batch", url))
        got = batch_fn(data_sources=["finecap"] * 4, solution_strs=CAPTIONS, ground_truths=[""] * 4,
                       extra_infos=[{"image_id": i} for i in IDS])  # fmt: skip
        assert [r["score"] for r in got] == in_process
        # the batch reward manager: responses decoded from token ids, the score at each response's last token
        tokenizer = WordTokenizer(CAPTIONS)
        responses = torch.tensor([tokenizer.encode(c) for c in CAPTIONS])  # (4, 2)
        prompts = torch.ones(4, 3, dtype=torch.long)  # (4, 3)
        data = DataProto.from_dict(
            tensors={"prompts": prompts, "responses": responses, "attention_mask": torch.ones(4, 5, dtype=torch.long)},
            non_tensors={"data_source": np.array(["finecap"] * 4, dtype=object),
                         "reward_model": np.array([{"ground_truth": ""}] * 4, dtype=object),
                         "extra_info": np.array([{"image_id": i} for i in IDS], dtype=object)},
        )  # fmt: skip
        manager = BatchRewardManager(tokenizer, num_examine=0, compute_score=batch_fn)
        out = manager(data, return_dict=True)
        assert out["reward_tensor"][:, -1].tolist() == in_process  # (4, 2): the last response token
        assert out["reward_extra_info"]["cider"] == reward(CAPTIONS, call_batch(IDS)).parts["cider"].tolist()
        # the per-sample form is refused for a reward ranking a call's images; the server says why
        single = get_custom_reward_fn(verl_config("compute_score", url))
        with pytest.raises(RuntimeError, match="names one distinct image"):
            single(data_source="finecap", solution_str="1 0", ground_truth="", extra_info={"image_id": "a"})


def test_verls_reward_loop_scores_one_sample_a_call_with_mined_distractors():
    """verl 0.6+ scores one sample a call: its reward loop's ``naive`` manager (the default) decodes each response
    and calls the loaded function with keywords, awaiting a coroutine (``compute_score_async``) and running a plain
    function in a thread (``compute_score``), with ``num_turns`` and ``rollout_reward_scores`` added to
    ``extra_info``. Served with sr.distractors=hard each caption has its distractor whatever the call holds, and gets
    the hand-computed value, bit for bit the in-process one."""
    import asyncio

    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward = small_mixture(SRConfig(distractors="hard"))
    tokenizer = WordTokenizer(CAPTIONS)

    def sample(caption, image_id):  # one row of verl's batch: a prompt of 3 tokens and its response
        response = torch.tensor([tokenizer.encode(caption)])  # (1, 2)
        return DataProto.from_dict(
            tensors={"prompts": torch.ones(1, 3, dtype=torch.long), "responses": response,
                     "attention_mask": torch.ones(1, 5, dtype=torch.long)},
            non_tensors={"data_source": np.array(["finecap"], dtype=object),
                         "reward_model": np.array([{"ground_truth": ""}], dtype=object),
                         "extra_info": np.array([{"image_id": image_id}], dtype=object)},
        )  # fmt: skip

    def run(config):
        async def loop():
            manager = NaiveRewardManager(config, tokenizer, get_custom_reward_fn(config))
            return await asyncio.gather(
                *(manager.run_single(sample(c, i)) for c, i in zip(CAPTIONS, IDS, strict=True))
            )

        return asyncio.run(loop())

    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        awaited = run(verl_config("compute_score_async", url))
        threaded = run(verl_config("compute_score", url))
    in_process = [reward([c], call_batch([i])) for c, i in zip(CAPTIONS, IDS, strict=True)]
    assert [r["reward_score"] for r in awaited] == [r["reward_score"] for r in threaded]
    assert [r["reward_score"] for r in awaited] == [out.total.item() for out in in_process]
    assert [out.total.item() for out in in_process] == pytest.approx(EXPECTED, abs=1e-5)
    assert [r["reward_extra_info"]["cider"] for r in awaited] == [out.parts["cider"].item() for out in in_process]


VERL_FILE = """
from finecap.integrations.verl import VerlReward

compute_score = VerlReward(url={url!r})
"""


def test_verls_remote_manager_ships_a_file_defined_server_reward_to_its_workers(tmp_path):
    """verl's ``remote`` reward manager (``reward_manager.name=remote``) hands the loaded ``compute_score`` to Ray
    workers (``RewardComputeWorker.remote(compute_score)``: Ray's cloudpickle). A ``VerlReward(url=...)`` of a file
    of the user's could not be pickled (its client's lock and pool); the unpickled copy asks the server as the
    original does."""
    from ray import cloudpickle
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward = small_mixture(SRConfig(distractors="hard"))
    path = tmp_path / "finecap_reward.py"
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        path.write_text(VERL_FILE.format(url=url))
        config = OmegaConf.create({"reward": {"custom_reward_function": {"path": str(path), "name": "compute_score"}}})
        loaded = get_custom_reward_fn(config)
        loaded(data_source="finecap", solution_str=CAPTIONS[0], ground_truth="", extra_info={"image_id": IDS[0]})
        shipped = cloudpickle.loads(cloudpickle.dumps(loaded))  # what Ray does with RewardComputeWorker's argument
        got = [shipped(data_source="finecap", solution_str=c, ground_truth="", extra_info={"image_id": i})["score"]
               for c, i in zip(CAPTIONS, IDS, strict=True)]  # fmt: skip
    assert got == [reward([c], call_batch([i])).total.item() for c, i in zip(CAPTIONS, IDS, strict=True)]
