"""finecap's rewards as TRL reward functions: the signature, plain and conversational completions, the image ids from
a data-set column, each reward against an independent computation, and TRL's ``GRPOTrainer`` running two steps on a
tiny VLM with the CIDEr-D reward whose logged rewards are finecap's."""

from __future__ import annotations

import contextlib
import io
import math
import random

import pytest
import torch
from PIL import Image

from finecap.config import SRConfig
from finecap.integrations.trl import REWARDS, completion_text, reward_function
from finecap.metrics.ptb_tokenize import tokenize
from finecap.models.presets import save_tiny_clip
from finecap.models.retriever import Retriever
from finecap.rewards.cider import CiderReward
from finecap.world.captions import vocabulary
from finecap.world.scene import Obj, Scene

REFS = {
    1: ["A red circle on the grass.", "a small red circle", "red disc on a lawn"],
    2: ["Two blue squares at the top.", "blue squares", "two squares"],
    3: ["a green triangle", "one green triangle on sand", "a triangle"],
}


def conversational(text: str) -> list[dict]:
    return [{"role": "assistant", "content": [{"type": "text", "text": text}]}]


def test_completion_text_of_plain_and_conversational_completions():
    assert completion_text("a red circle") == "a red circle"
    assert completion_text([{"role": "assistant", "content": "a red circle"}]) == "a red circle"
    assert completion_text(conversational("a red circle")) == "a red circle"
    two_turns = [{"role": "assistant", "content": "first"}, {"role": "assistant", "content": "second"}]
    assert completion_text(two_turns) == "second"
    with pytest.raises(ValueError, match=r"^completions\[0\]: expected a string or a list of messages, got int$"):
        completion_text(3)


def test_names_options_and_columns_are_checked():
    with pytest.raises(ValueError, match="unknown reward 'bleu'; valid: cider, retrieval, listener, chair"):
        reward_function("bleu")
    with pytest.raises(TypeError, match=r"reward_function\('cider'\):.*unexpected keyword argument 'refs'"):
        reward_function("cider", refs=REFS)
    fn = reward_function("cider", references=REFS)
    names = {"cider", "retrieval", "listener", "chair", "qa_utility", "claims", "length"}
    assert fn.__name__ == "cider" and set(REWARDS) == names
    with pytest.raises(KeyError, match="no 'image_id' column among the data set's columns \\['imgid'\\]"):
        fn(prompts=["p"], completions=["a red circle"], imgid=[1], trainer_state=None)
    trl_keywords = {"completion_ids": [[5]], "trainer_state": None, "log_extra": print, "log_metric": print,
                    "environments": [None]}  # what TRL 1.16's GRPOTrainer passes beside the columns  # fmt: skip
    with pytest.raises(KeyError, match="no 'image_id' column among the data set's columns \\['imgid'\\]"):
        fn(prompts=["p"], completions=["a red circle"], imgid=[1], **trl_keywords)
    other = reward_function("cider", references=REFS, image_id_column="imgid")
    assert other(prompts=["p"], completions=["a red circle"], imgid=[1]) == fn(["p"], ["a red circle"], image_id=[1])


def test_the_adapter_reads_the_training_loops_reward_table_and_refuses_missing_data():
    from finecap import registry

    assert REWARDS is registry.REWARDS  # one table: a reward registered for rl.rewards is a TRL reward too
    with pytest.raises(ValueError, match="cider: outside a training run give references="):
        reward_function("cider")
    with pytest.raises(ValueError, match=r"cider: references=\{image_id: \[captions\]\} is empty"):
        reward_function("cider", references={})
    with pytest.raises(ValueError, match="retrieval: give retriever= and one image table"):
        reward_function("retrieval", embeddings={1: torch.ones(4)})
    with pytest.raises(ValueError, match="listener: outside a training run give scenes="):
        reward_function("listener")


def test_the_url_route_asks_a_running_reward_server(served):
    """``reward_function(url=...)``: the values of a ``finecap serve-reward`` on 127.0.0.1, bit for bit those of the
    same reward in process (by a built reward) and of the registry name with the same references."""
    from finecap.serve.client import RewardServerError
    from helpers.served import serving

    service = served["cider"]
    captions, ids = served["groups"][2]
    completions = [conversational(c) for c in captions]
    refs = {}
    for r in served["records"]:
        refs.setdefault(r.image_id, []).extend(r.captions)
    with serving(service) as url:
        remote = reward_function(url=url, name="cider")
        got = remote(prompts=[""] * len(captions), completions=completions, image_id=ids)
        with pytest.raises(RewardServerError, match=r"\(image_id\[0\]\): unknown image id 'nope'.*\[HTTP 400\]"):
            remote(prompts=[""], completions=["a"], image_id=["nope"])  # the server's refusal, by TRL's column
    assert remote.__name__ == "cider" and reward_function(url=url).__name__ == "finecap"
    assert got == reward_function(service.reward)(prompts=[""] * len(captions), completions=completions, image_id=ids)
    assert got == reward_function("cider", references=refs)(prompts=[""] * len(captions), completions=completions,
                                                             image_id=ids)  # fmt: skip
    assert max(got) > 0
    with pytest.raises(TypeError, match=r"reward_function\('finecap'\): options \['references'\] are the reward's"):
        reward_function(url=url, references=refs)
    with pytest.raises(ValueError, match="give a finecap reward .* or a reward server's URL"):
        reward_function()


def test_a_caption_the_reward_could_not_score_is_none_for_trl():
    from finecap.rewards import RewardBase, RewardOutput

    class Judge(RewardBase):
        def __call__(self, captions, batch):
            return RewardOutput(torch.tensor([1.0, float("nan")]), failed=torch.tensor([False, True]))

    fn = reward_function(Judge(), name="judge")
    assert fn(prompts=["", ""], completions=["a", "b"], image_id=[1, 2]) == [1.0, None]  # TRL reads None as NaN
    # beside other reward functions TRL 1.16 nansums a None as 0 (a row is left out only when every function is None):
    # failed="raise" refuses the call, naming the completion, as ms-swift's adapter does
    from finecap.serve.protocol import FailedCaptions

    strict = reward_function(Judge(), name="judge", failed="raise")
    message = (
        r"^reward_function\('judge'\): the reward could not score 1 of 2 captions \(completions\[1\]\): its "
        r"judge failed on them, and TRL would pay a None as 0 beside other reward functions \(nansum\)$"
    )
    with pytest.raises(FailedCaptions, match=message):
        strict(prompts=["", ""], completions=["a", "b"], image_id=[1, 2], trainer_state=None)
    with pytest.raises(ValueError, match=r"^reward_function\('cider'\): failed='nan'; valid: none, raise$"):
        reward_function("cider", references=REFS, failed="nan")
    call = {"prompts": ["", ""], "completions": ["a red circle", "two squares"], "image_id": [1, 2]}
    scored = reward_function("cider", references=REFS, failed="raise")(**call)  # nothing failed: the same values
    assert scored == reward_function("cider", references=REFS)(**call) and min(scored) > 0


def test_cider_with_the_evaluated_set_as_references_is_pycocoevalcaps_per_image_cider_d():
    from pycocoevalcap.cider.cider import Cider

    preds = {1: "a red circle on grass", 2: "two blue squares", 3: "a red triangle"}
    fn = reward_function("cider", references=REFS)
    ids = list(preds)
    ours = fn(prompts=[""] * 3, completions=[conversational(preds[i]) for i in ids], image_id=ids)
    gts = {i: [tokenize(c) for c in refs] for i, refs in REFS.items()}
    res = {i: [tokenize(preds[i])] for i in ids}
    with contextlib.redirect_stdout(io.StringIO()):
        _, per_image = Cider().compute_score(gts, res)
    assert ours == pytest.approx([float(s) for s in per_image], abs=1e-5)
    assert max(ours) > 1.0
    # plain completions give the same rewards; the same image twice gets the same score
    assert fn(prompts=[""] * 3, completions=[preds[i] for i in ids], image_id=ids) == ours
    assert fn(prompts=["", ""], completions=[preds[1]] * 2, image_id=[1, 1]) == [ours[0]] * 2


def test_retrieval_scores_against_the_calls_other_images(tmp_path):
    retriever = Retriever.from_pretrained(save_tiny_clip(tmp_path / "clip", image_size=16, patch_size=8))
    g = torch.Generator().manual_seed(0)
    images = {i: Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy()) for i in (7, 8, 9)}
    fn = reward_function("retrieval", retriever=retriever, images=images)
    texts = ["a red circle", "two blue squares", "a green triangle", "one star"]
    ids = [7, 7, 9, 9]  # two prompts (images 7 and 9) with two completions each: image 8 is not a candidate
    got = fn(prompts=[""] * 4, completions=texts, image_id=ids)
    # by hand: log-softmax over the call's images {7, 9} of s * cos(text, image)
    image_emb = retriever.embed_images([images[7], images[9]])  # (2, D) unit norm
    text_emb = retriever.embed_texts(texts)  # (4, D) unit norm
    logits = retriever.logit_scale * text_emb @ image_emb.T  # (4, 2)
    want = torch.log_softmax(logits, dim=1)[torch.arange(4), torch.tensor([0, 0, 1, 1])]
    assert got == pytest.approx(want.tolist(), abs=1e-5)
    embeddings = {i: image_emb[j] for j, i in enumerate((7, 9))}
    same = reward_function("retrieval", retriever=retriever, embeddings=embeddings)
    assert same(prompts=[""] * 4, completions=texts, image_id=ids) == pytest.approx(got, abs=1e-5)
    # the options are the sr section's: top-1 hits with sr.reward=accuracy; a scale of 1 instead of the retriever's
    hits = reward_function("retrieval", retriever=retriever, embeddings=embeddings, sr=SRConfig(reward="accuracy"))
    right = (logits.argmax(dim=1) == torch.tensor([0, 0, 1, 1])).float()
    assert hits(prompts=[""] * 4, completions=texts, image_id=ids) == right.tolist()
    unit = reward_function("retrieval", retriever=retriever, embeddings=embeddings, sr=SRConfig(logit_scale=1.0))
    want = torch.log_softmax(text_emb @ image_emb.T, dim=1)[torch.arange(4), torch.tensor([0, 0, 1, 1])]
    assert unit(prompts=[""] * 4, completions=texts, image_id=ids) == pytest.approx(want.tolist(), abs=1e-5)
    # the reward's parts reach TRL's log_metric (they were dropped: TRL logged the total alone)
    logged = {}
    got = same(prompts=[""] * 4, completions=texts, image_id=ids, log_metric=logged.__setitem__)
    assert logged["rewards/retrieval/accuracy/mean"] == pytest.approx(float(right.mean()))
    assert logged["rewards/retrieval/log_prob/mean"] == pytest.approx(sum(got) / 4, abs=1e-6)
    assert "rewards/retrieval/retrieval/mean" not in logged  # the total is TRL's own rewards/retrieval/mean
    with pytest.raises(ValueError, match="sr.distractors=hard; TRL gives batch only"):
        reward_function("retrieval", retriever=retriever, embeddings=embeddings, sr=SRConfig(distractors="hard"))


def test_listener_expected_r1_among_the_calls_images():
    scenes = {
        0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
        1: Scene(1, "sand", [Obj("circle", "red", "large", 1, 1)]),
        2: Scene(2, "sand", [Obj("square", "blue", "large", 1, 1)]),
    }
    fn = reward_function("listener", scenes=scenes)
    texts = ["a red circle", "a red circle on sand", "a blue square", "a red circle on sand"]
    got = fn(prompts=[""] * 4, completions=texts, image_id=[0, 1, 2, 0])
    # "a red circle": scenes 0 and 1 tie at support 2 (scene 2: -2): 1/2. "... on sand" for scene 1: support 3 vs 1
    # and -1: 1. "a blue square" for scene 2: 2 vs -2, -2: 1. "... on sand" for scene 0: scene 1 has more: 0.
    assert got == [0.5, 1.0, 1.0, 0.0]
    assert reward_function("listener", scenes={str(k): v for k, v in scenes.items()})(
        prompts=[""] * 4, completions=texts, image_id=[0, 1, 2, 0]) == got  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# TRL's GRPOTrainer on a tiny VLM
# --------------------------------------------------------------------------------------------------------------------


class Recorder:
    """A TRL reward function that calls finecap's and records what it saw and returned."""

    def __init__(self, fn) -> None:
        self.fn, self.__name__, self.calls = fn, fn.__name__, []

    def __call__(self, prompts, completions, **kwargs):
        out = self.fn(prompts, completions, **kwargs)
        self.calls.append(([completion_text(c) for c in completions], list(kwargs["image_id"]), out))
        return out


@pytest.mark.slow
def test_grpo_trainer_two_steps_logs_finecaps_cider(tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from finecap.models.presets import tiny_vlm

    torch.manual_seed(0)
    model, processor = tiny_vlm("idefics3")
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy()) for _ in range(4)]
    rng, words = random.Random(0), sorted(set(vocabulary()))
    references = {i: [" ".join(rng.sample(words, 12)) for _ in range(4)] for i in range(4)}  # share the model's words
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    dataset = Dataset.from_list([{"prompt": prompt, "image": images[i], "image_id": i} for i in range(4)])
    reward = Recorder(reward_function("cider", references=references))
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, max_steps=2, logging_steps=1, report_to="none", use_cpu=True,
                      learning_rate=1e-3, save_strategy="no", bf16=False, seed=0, beta=0.0)  # fmt: skip
    trainer = GRPOTrainer(model=model, processing_class=processor, reward_funcs=[reward], args=args,
                          train_dataset=dataset)  # fmt: skip
    trainer.train()

    logged = [h["rewards/cider/mean"] for h in trainer.state.log_history if "rewards/cider/mean" in h]
    assert len(logged) == 2 == len(reward.calls)
    own = CiderReward(references)  # finecap's own computation on what TRL generated
    for (texts, ids, returned), value in zip(reward.calls, logged, strict=True):
        assert len(texts) == 4 and sorted(set(ids)) == sorted(ids)[::2]  # two completions per prompt
        mine = own([t.strip() for t in texts], {"image_ids": ids}).total
        assert returned == pytest.approx(mine.tolist(), abs=1e-6)
        assert math.isclose(value, float(mine.mean()), abs_tol=1e-5)
    assert any(r > 0 for _, _, out in reward.calls for r in out)  # the rewards are not all zero
