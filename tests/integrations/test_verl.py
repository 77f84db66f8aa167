"""finecap's rewards through verl's own reward loading: ``get_custom_reward_fn`` reads ``custom_reward_function``
(``pkg://finecap.integrations.verl``, the server's URL in ``reward_kwargs``) and its batch reward manager scores a
``DataProto`` of decoded responses; the values are the hand-computed mixture's, bit for bit the in-process ones.
Skipped without verl (not in finecap's test extra: on this CPU it installs in a throwaway venv, docs/integrations.md);
the documented signatures are tested without it in tests/serve/test_front_ends.py."""

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


def test_verls_per_sample_loader_with_mined_distractors():
    """verl 0.6+ scores one sample a call (its reward loop awaits a coroutine ``compute_score``): served with
    sr.distractors=hard each caption has its distractor whatever the call holds, and gets the hand-computed value."""
    import asyncio

    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward = small_mixture(SRConfig(distractors="hard"))
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        awaited = get_custom_reward_fn(verl_config("compute_score_async", url))
        single = get_custom_reward_fn(verl_config("compute_score", url))

        async def loop():
            calls = [awaited(data_source="finecap", solution_str=c, ground_truth="", extra_info={"image_id": i})
                     for c, i in zip(CAPTIONS, IDS, strict=True)]  # fmt: skip
            return await asyncio.gather(*calls)

        got = [r["score"] for r in asyncio.run(loop())]
        alone = [single(data_source="finecap", solution_str=c, ground_truth="", extra_info={"image_id": i})["score"]
                 for c, i in zip(CAPTIONS, IDS, strict=True)]  # fmt: skip
    in_process = [reward([c], call_batch([i])).total.item() for c, i in zip(CAPTIONS, IDS, strict=True)]
    assert got == alone == in_process and in_process == pytest.approx(EXPECTED, abs=1e-5)


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
