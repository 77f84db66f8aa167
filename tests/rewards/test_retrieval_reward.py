"""Self-retrieval reward: the three variants, every distractor mode, near-duplicate exclusion, the global batch under
several processes, registry and configuration. Hand-computed with tiny 2-d embeddings (arithmetic in comments)."""

import math

import pytest
import torch

from finecap.config import ConfigError, SRConfig, load
from finecap.contract import StepInfo
from finecap.rewards import WeightedSum, get_reward, reward_of
from finecap.rewards.cider import CiderReward
from finecap.rewards.retrieval import RetrievalReward, candidate_mask, mine_hard, self_retrieval_scores

# Image embeddings (unit norm) of the table; captions are written as "x y" and embedded as that vector.
#   a = (1, 0)   b = (0, 1)   c = (0.6, 0.8)   d = (0.8, 0.6)   e = (-1, 0)
IDS = ["a", "b", "c", "d", "e"]
TABLE = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6], [-1.0, 0.0]])
SCALE = 2.0  # the stand-in retriever's logit scale


class VectorRetriever:
    """Stand-in retriever: a caption "x y ..." embeds as (x, y) normalised (further words ignored); logit scale 2."""

    logit_scale = SCALE

    def __init__(self):
        self.calls = 0

    def embed_texts(self, texts):
        self.calls += 1
        vectors = torch.tensor([[float(v) for v in t.split()[:2]] for t in texts])
        return torch.nn.functional.normalize(vectors, dim=-1)


def reward(**sr) -> RetrievalReward:
    return RetrievalReward(VectorRetriever(), SRConfig(**sr), image_ids=IDS, embeddings=TABLE)


def close(values, expected):
    return torch.allclose(torch.as_tensor(values, dtype=torch.float32), torch.as_tensor(expected), atol=1e-5)


# --------------------------------------------------------------------------------------------------------------------
# The scores
# --------------------------------------------------------------------------------------------------------------------


def test_scores_of_the_three_variants():
    text = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    images = TABLE[:3]  # a, b, c
    out = self_retrieval_scores(text, images, torch.tensor([0, 1]), torch.ones(2, 3, dtype=torch.bool), SCALE)
    # caption 0 -> a: cos (a, b, c) = (1, 0, 0.6); logits x2 = (2, 0, 1.2)
    #   log p = 2 - log(e^2 + e^0 + e^1.2) = 2 - log(7.389056 + 1 + 3.320117) = 2 - log(11.709173) = -0.460373
    #   accuracy: 2 > 1.2 -> 1;  cosine: 1
    # caption 1 -> b: cos = (0.6, 0.8, 0.6*0.6 + 0.8*0.8 = 1.0); logits = (1.2, 1.6, 2.0)
    #   log p = 1.6 - log(3.320117 + 4.953032 + 7.389056) = 1.6 - log(15.662205) = -1.151251
    #   accuracy: c scores 2.0 > 1.6 -> 0;  cosine: 0.8
    assert close(out["log_prob"], [-0.460373, -1.151251])
    assert out["accuracy"].tolist() == [1.0, 0.0]
    assert close(out["cosine"], [1.0, 0.8])
    assert out["candidates"].tolist() == [3.0, 3.0]


def test_masked_candidates_ties_and_no_distractor():
    text = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    images = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # columns 0 and 1 are the same vector
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = self_retrieval_scores(text, images, torch.tensor([0, 0]), mask, 1.0)
    # caption 0: candidates (0, 1), logits (1, 1): log p = 1 - log(2e) = -log 2; a tie is a miss (strict ">")
    # caption 1: the target alone: log p = 0, accuracy 1
    assert close(out["log_prob"], [-math.log(2.0), 0.0])
    assert out["accuracy"].tolist() == [0.0, 1.0]
    assert out["candidates"].tolist() == [2.0, 1.0]


def test_mine_hard_nearest_images_without_self_and_near_duplicates():
    # cos(a, .) = (b 0, c 0.6, d 0.8, e -1): nearest d then c;  cos(b, .) = (a 0, c 0.8, d 0.6, e 0): c then d
    assert mine_hard(TABLE, torch.tensor([0, 1]), 2).tolist() == [[3, 2], [2, 3]]
    # threshold 0.7 drops d for a (0.8) and c for b (0.8)
    assert mine_hard(TABLE, torch.tensor([0, 1]), 2, threshold=0.7).tolist() == [[2, 1], [3, 0]]
    # more than the pool: -1 where nothing is left (4 other images)
    assert mine_hard(TABLE, torch.tensor([0]), 6).tolist() == [[3, 2, 1, 4, -1, -1]]


# --------------------------------------------------------------------------------------------------------------------
# Candidate masks
# --------------------------------------------------------------------------------------------------------------------


def test_candidate_mask_batch_bag_and_fallback():
    target = torch.tensor([0, 2])
    assert candidate_mask("batch", target, 3, 3).all()
    bags = torch.tensor([0, 0, 1, 1])
    mask = candidate_mask("bag", target, 4, 4, bags=bags)
    assert mask.tolist() == [[True, True, False, False], [False, False, True, True]]
    # one bag per image (the random-batch epochs of BagCurri): no bag-mate, so the whole batch
    alone = candidate_mask("bag", target, 4, 4, bags=torch.tensor([0, 1, 2, 3]))
    assert alone.all()
    with pytest.raises(ValueError, match="data.sampler=bagcurri"):
        candidate_mask("bag", target, 4, 4)
    with pytest.raises(ValueError, match="sr.distractors"):
        candidate_mask("random", target, 4, 4)


def test_candidate_mask_hard_fills_up_with_batch_images():
    # 4 batch columns (0-3) + 2 mined outside the batch (4, 5); the target is column 0, mined: 4 and 2.
    # distractors = mined {4, 2} + (4 - 1 - 2 = 1) batch image in batch order, skipping target and mined: column 1
    mask = candidate_mask("hard", torch.tensor([0]), 4, 6, hard=torch.tensor([[4, 2]]))
    assert mask.tolist() == [[True, True, True, False, True, False]]
    # a missing mined distractor (-1) leaves room for one more batch image: columns 1 and 2
    mask = candidate_mask("hard", torch.tensor([0]), 4, 6, hard=torch.tensor([[4, -1]]))
    assert mask.tolist() == [[True, True, True, False, True, False]]


def test_candidate_mask_excludes_near_duplicates_but_keeps_the_target():
    duplicates = torch.tensor([[True, True, False]])  # columns 0 (the target itself) and 1 too similar
    mask = candidate_mask("batch", torch.tensor([0]), 3, 3, duplicates=duplicates)
    assert mask.tolist() == [[True, False, True]]


# --------------------------------------------------------------------------------------------------------------------
# The reward on batches
# --------------------------------------------------------------------------------------------------------------------


def test_in_batch_distractors():
    r = reward()
    out = r(["1 0", "0.6 0.8", "0 1"], {"image_ids": ["a", "b", "c"]})
    # captions 0 and 1: see test_scores_of_the_three_variants
    # caption 2 -> c, text (0, 1): cos (a, b, c) = (0, 1, 0.8); logits (0, 2, 1.6)
    #   log p = 1.6 - log(1 + 7.389056 + 4.953032) = 1.6 - log(13.342088) = -0.990924;  b wins -> accuracy 0
    assert close(out.total, [-0.460373, -1.151251, -0.990924])
    assert out.parts["accuracy"].tolist() == [1.0, 0.0, 0.0]
    assert close(out.parts["cosine"], [1.0, 0.8, 0.8])
    assert out.parts["candidates"].tolist() == [3.0, 3.0, 3.0]
    assert torch.equal(out.parts["retrieval"], out.total)


def test_sr_logit_scale_replaces_the_retrievers():
    # caption "1 0" of image a among (a, b): cos (1, 0); with sr.logit_scale=1 the logits are (1, 0), not the stand-in
    # retriever's 2x: log p = 1 - log(e + 1) = -0.313262 (with scale 2: 2 - log(e^2 + 1) = -0.126928)
    batch = {"image_ids": ["a", "b"], "image_index": torch.tensor([0])}
    assert close(reward(logit_scale=1.0)(["1 0"], batch).total, [1 - math.log(math.e + 1)])
    assert close(reward()(["1 0"], batch).total, [2 - math.log(math.e**2 + 1)])


def test_caption_embeddings_of_a_stand_in_are_normalised_as_the_image_table_is():
    # A user's own retriever whose embed_texts returns raw features: caption "1 0" as (3, 0) is still cos (1, 0)
    # with (a, b), so log p = 2 - log(e^2 + 1) = -0.126928 and cosine 1 (unnormalised: logits (6, 0), cosine 3).
    class RawRetriever(VectorRetriever):
        def embed_texts(self, texts):
            return 3 * super().embed_texts(texts)

    batch = {"image_ids": ["a", "b"], "image_index": torch.tensor([0])}
    out = RetrievalReward(RawRetriever(), SRConfig(), image_ids=IDS, embeddings=TABLE)(["1 0"], batch)
    assert close(out.total, [2 - math.log(math.e**2 + 1)])
    assert close(out.parts["cosine"], [1.0])


def test_variants_choose_the_total():
    batch = {"image_ids": ["a", "b", "c"]}
    captions = ["1 0", "0.6 0.8", "0 1"]
    assert reward(reward="accuracy")(captions, batch).total.tolist() == [1.0, 0.0, 0.0]
    assert close(reward(reward="cosine")(captions, batch).total, [1.0, 0.8, 0.8])


def test_several_samples_per_image_and_duplicate_images_in_the_batch():
    # image_index maps 4 captions to 2 rows; the batch holds image a twice (one candidate column)
    out = reward()(["1 0", "0 1", "0 1", "1 0"], {"image_ids": ["a", "b", "a"], "image_index": [0, 0, 1, 1]})
    # candidates a, b (logits a, b). Captions 0, 1 describe a (row 0), captions 2, 3 describe b (row 1):
    #   "1 0" of a: (2, 0): 2 - log(e^2 + 1) = 2 - log(8.389056) = -0.126928; "0 1" of a: 0 - log(8.389056) = -2.126928
    #   "0 1" of b: (0, 2): 2 - log(8.389056) = -0.126928;  "1 0" of b: 0 - log(8.389056) = -2.126928
    assert close(out.total, [-0.126928, -2.126928, -0.126928, -2.126928])
    assert out.parts["candidates"].tolist() == [2.0] * 4


def test_hard_distractors_mined_from_the_training_images():
    out = reward(distractors="hard", hard_k=1)(["1 0", "0 1", "-1 0"], {"image_ids": ["a", "b", "e"]})
    # a: mined d (cos 0.8), plus 3 - 1 - 1 = 1 batch image in batch order: b.  Candidates a, d, b
    #   text (1, 0): logits (2, 1.6, 0): 2 - log(7.389056 + 4.953032 + 1) = 2 - log(13.342088) = -0.590924
    # b: mined c (cos 0.8), plus a.  text (0, 1): logits b 2, c 1.6, a 0: the same, -0.590924
    # e: cos(e, .) = (a -1, b 0, c -0.6, d -0.8): mined b (in the batch), plus one batch image other than e and
    #   b: a.  Candidates e, b, a; text (-1, 0): logits (2, 0, -2)
    #   log p = 2 - log(e^2 + 1 + e^-2) = 2 - log(7.389056 + 1 + 0.135335) = 2 - log(8.524391) = -0.142931
    assert close(out.total, [-0.590924, -0.590924, -0.142931])
    assert out.parts["candidates"].tolist() == [3.0, 3.0, 3.0]


def test_hard_distractors_skip_near_duplicates():
    out = reward(distractors="hard", hard_k=1, duplicate_threshold=0.7)(["1 0"], {"image_ids": ["a"]})
    # d (0.8) is a near-duplicate of a, so c (0.6) is mined; no other batch image.  logits (a 2, c 1.2)
    #   log p = 2 - log(7.389056 + 3.320117) = 2 - log(10.709173) = -0.371101
    assert close(out.total, [-0.371101])


def test_hard_distractors_are_all_kept_in_a_batch_shorter_than_k_plus_one():
    out = reward(distractors="hard", hard_k=2)(["1 0"], {"image_ids": ["a"]})
    # a alone in its batch: both mined images, d (cos 0.8) and c (0.6), are its distractors. logits (a 2, d 1.6, c 1.2)
    #   log p = 2 - log(7.389056 + 4.953032 + 3.320117) = 2 - log(15.662205) = -0.751251
    assert close(out.total, [-0.751251])
    assert out.parts["candidates"].tolist() == [3.0] and out.failed is None


def test_two_ids_of_one_picture_tie_unless_dropped_as_near_duplicates():
    # "twin" is a's picture under another id: two candidates with one embedding, not one
    ids, table = ["a", "twin", "b"], torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    batch = {"image_ids": ["a", "twin", "b"], "image_index": [0]}
    out = RetrievalReward(VectorRetriever(), SRConfig(), image_ids=ids, embeddings=table)(["1 0"], batch)
    # logits (a 2, twin 2, b 0): 2 - log(2 e^2 + 1) = 2 - log(15.778112) = -0.758624; a tie is a miss
    assert close(out.total, [-0.758624]) and out.parts["accuracy"].tolist() == [0.0]
    dropped = RetrievalReward(VectorRetriever(), SRConfig(duplicate_threshold=0.99), image_ids=ids, embeddings=table)
    out = dropped(["1 0"], batch)
    # twin dropped (cos 1 > 0.99): logits (a 2, b 0): 2 - log(e^2 + 1) = -0.126928, a hit
    assert close(out.total, [-0.126928]) and out.parts["accuracy"].tolist() == [1.0]


def test_in_batch_near_duplicates_are_dropped():
    out = reward(duplicate_threshold=0.7)(["1 0"], {"image_ids": ["a", "d", "b"]})
    # d is dropped (cos(a, d) = 0.8 > 0.7): candidates a, b, logits (2, 0): -0.126928
    assert close(out.total, [-0.126928])
    assert out.parts["candidates"].tolist() == [2.0]


def test_a_caption_without_a_distractor_is_failed_not_paid_the_best_value():
    # A global batch of one image: both captions of a were scored log p = log(e^2 / e^2) = 0 and a hit, the one
    # pointing away from a (cos 0) as well as the one on it
    out = reward()(["1 0", "0 1"], {"image_ids": ["a"], "image_index": [0, 0]})
    assert out.failed.tolist() == [True, True]
    assert torch.isnan(out.total).all() and torch.isnan(out.parts["accuracy"]).all()
    assert close(out.parts["cosine"], [1.0, 0.0])  # no distractor needed
    assert out.parts["candidates"].tolist() == [1.0, 1.0]
    # every distractor of d dropped as a near-duplicate (cos(d, a) 0.8, cos(d, b) 0.6 > 0.5); a keeps b (cos 0):
    #   "1 0" of a among (a, b): logits (2, 0): 2 - log(e^2 + 1) = -0.126928
    out = reward(duplicate_threshold=0.5)(["1 0", "0.8 0.6"], {"image_ids": ["a", "d", "b"], "image_index": [0, 1]})
    assert out.failed.tolist() == [False, True]
    assert close(out.total[:1], [-0.126928]) and torch.isnan(out.total[1])
    assert out.parts["candidates"].tolist() == [2.0, 1.0]
    # accuracy: the lone caption is failed too; the cosine reward needs no distractor and scores it
    assert reward(reward="accuracy")(["0 1"], {"image_ids": ["a"]}).failed.tolist() == [True]
    cosine = reward(reward="cosine")(["0 1"], {"image_ids": ["a"]})
    assert cosine.failed is None and cosine.total.tolist() == [0.0]
    # with other images, nothing fails (failed=None, as before)
    assert reward()(["1 0"], {"image_ids": ["a", "b"]}).failed is None


def test_a_one_image_step_neither_trains_nor_moves_the_running_mean():
    # DiscriTune's running mean after one step of mean reward -1: b = -1. A one-image step's caption was paid 0,
    # advantage 0 - (-1) = +1 whatever it says, and the mean became -1 + (0 - (-1)) / 2 = -0.5
    from finecap.objectives.baselines import MeanBaseline
    from finecap.objectives.reinforce import Rollout

    baseline = MeanBaseline()
    baseline.load_state_dict({"mean": -1.0, "count": 1})
    out = WeightedSum({"retrieval": (1.0, reward())})(["0 1"], {"image_ids": ["a"]})
    b = baseline(out.total, torch.tensor([0]), None)
    assert b.tolist() == [-1.0]
    assert Rollout(None, out, b).advantage.tolist() == [0.0]  # no gradient
    baseline.end_step()
    assert baseline.state_dict() == {"mean": -1.0, "count": 1}  # no batch folded in


def test_bag_mates_only():
    batch = {"image_ids": ["a", "b", "c", "d"], "bag": torch.tensor([0, 0, 1, 1])}
    out = reward(distractors="bag")(["1 0", "0 1"], {**batch, "image_index": [0, 2]})
    # a with its bag-mate b: logits (2, 0): 2 - log(8.389056) = -0.126928
    # c with its bag-mate d, text (0, 1): cos (c 0.8, d 0.6) -> logits (1.6, 1.2)
    #   log p = 1.6 - log(4.953032 + 3.320117) = 1.6 - log(8.273149) = -0.513015
    assert close(out.total, [-0.126928, -0.513015])
    with pytest.raises(ValueError, match="data.sampler=bagcurri"):
        reward(distractors="bag")(["1 0"], {"image_ids": ["a"]})


def test_distractors_are_the_whole_steps_global_batch():
    # the loop gives every micro-batch its step's global batch (a, b here; c on another process or micro-batch)
    step = StepInfo(step=0, image_ids=["a", "b", "c"])
    out = reward()(["1 0", "0.6 0.8"], {"image_ids": ["a", "b"], "step_info": step})
    # candidates a, b (this micro-batch) + c: the values of test_scores_of_the_three_variants
    assert close(out.total, [-0.460373, -1.151251])
    assert out.parts["candidates"].tolist() == [3.0, 3.0]
    # without the step's ids only a and b are candidates: caption "0.6 0.8" -> b: logits (1.2, 1.6)
    #   1.6 - log(3.320117 + 4.953032) = -0.513015
    assert close(reward()(["1 0", "0.6 0.8"], {"image_ids": ["a", "b"]}).total[1:], [-0.513015])


def test_bag_mates_come_from_the_steps_global_batch_too():
    batch = {"image_ids": ["a", "c"], "bag": torch.tensor([0, 1]),
             "step_info": StepInfo(0, ["a", "c", "b"], {"bag": torch.tensor([0, 1, 0])})}  # fmt: skip
    out = reward(distractors="bag")(["1 0"], batch)
    # a's bag-mate b is in another micro-batch of the step: logits (a 2, b 0) -> -0.126928
    assert close(out.total, [-0.126928])


def test_errors_name_the_option():
    with pytest.raises(KeyError, match="image id 'z'"):
        reward()(["1 0"], {"image_ids": ["z"]})
    with pytest.raises(ConfigError, match="sr.reward: invalid value 'clipscore'"):
        RetrievalReward(sr=SRConfig(reward="clipscore"))
    with pytest.raises(ConfigError, match="sr.distractors: invalid value 'random'"):
        RetrievalReward(sr=SRConfig(distractors="random"))
    with pytest.raises(RuntimeError, match="setup"):
        RetrievalReward()(["1 0"], {"image_ids": ["a"]})


# --------------------------------------------------------------------------------------------------------------------
# Registry, configuration, joint reward
# --------------------------------------------------------------------------------------------------------------------


def test_registry_builds_from_the_sr_section():
    cfg = load(None, ["sr.reward=accuracy", "sr.distractors=hard", "sr.hard_k=3", "sr.duplicate_threshold=0.9"])
    r = get_reward("retrieval", cfg)
    assert isinstance(r, RetrievalReward)
    assert r.sr is cfg.sr and (r.sr.reward, r.sr.hard_k) == ("accuracy", 3)


@pytest.mark.parametrize(
    "override, key",
    [("sr.reward=clip", "sr.reward"), ("sr.hard_k=0", "sr.hard_k"), ("sr.distractors=random", "sr.distractors"),
     ("sr.duplicate_threshold=2", "sr.duplicate_threshold")],
)  # fmt: skip
def test_config_checks_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load(None, [override])


def test_sr_plus_lambda_cider():
    # NDLB Sec. 4.8 / App. C.4: R = SR + lambda * CIDEr, lambda = 0.5, no normalisation of either term.
    # CIDEr-D corpus: a -> "1 0", b -> "0 1" (N = 2). Both words occur in both references: df 2, idf log(2/2) = 0, so
    # the unigram term is 0; each bigram has df 1, idf log 2; no 3- or 4-grams (zero vectors -> 0).
    cider = CiderReward({"a": ["1 0"], "b": ["0 1"]})
    joint = WeightedSum({"retrieval": (1.0, reward()), "cider": (0.5, cider)})
    out = joint(["1 0", "0 1 0"], {"image_ids": ["a", "b"]})
    # SR (the stand-in embeds the first two words; candidates a, b; scale 2):
    #   "1 0" -> a: logits (2, 0);  "0 1 0" -> b: logits (0, 2);  log p = 2 - log(e^2 + 1) = -0.126928 for both
    assert close(out.parts["retrieval"], [-0.126928, -0.126928])
    # CIDEr-D:
    #   "1 0" vs "1 0": bigram cosine 1, equal bigram counts (penalty 1): 10 * (0 + 1 + 0 + 0) / 4 = 2.5
    #   "0 1 0" vs "0 1": bigrams {01, 10} vs {01}: cosine log2^2 / (sqrt(2) log2 * log2) = 1/sqrt(2); bigram
    #   counts 2 vs 1: penalty exp(-1 / (2 * 6^2)) = exp(-1/72) -> 10 / 4 * 0.707107 * 0.986207 = 1.743375
    assert close(out.parts["cider"], [2.5, 1.743375])
    # R = SR + 0.5 * CIDEr: -0.126928 + 1.25 = 1.123072;  -0.126928 + 0.871688 = 0.744760
    assert close(out.total, [1.123072, 0.744760])
    assert set(out.parts) >= {"retrieval", "cider", "retrieval/accuracy", "retrieval/candidates"}


def test_an_image_id_written_as_an_int_or_as_its_string_is_one_image():
    # a table keyed "1" (a JSONL data set) looked up with 1 (a weighted sum's other component, COCO's instances) was
    # a KeyError; a weighted sum passes the ids as its first component writes them
    keyed = RetrievalReward(VectorRetriever(), SRConfig(), image_ids=["1", "2", "3", "4", "5"], embeddings=TABLE)
    captions = ["1 0", "0.6 0.8", "0 1"]
    as_strings = keyed(captions, {"image_ids": ["1", "2", "3"]})
    assert close(as_strings.total, [-0.460373, -1.151251, -0.990924])  # test_in_batch_distractors's values
    assert keyed(captions, {"image_ids": [1, 2, "3"]}).total.tolist() == as_strings.total.tolist()
    with pytest.raises(KeyError, match="image id 6 has no retriever embedding"):
        keyed(captions, {"image_ids": [1, 2, 6]})


@pytest.mark.parametrize(("ids", "shown"), [([1, "1", 2], "1 and '1'"), (["a", "a", "b"], "'a' and 'a'")])
def test_an_image_keyed_twice_in_the_table_is_refused_not_mined_as_its_own_distractor(ids, shown):
    # the table kept both rows of the one image: a caption of it met its twin (the other row, one embedding) as its
    # hard distractor, a tie, paid -log 2 at best and never a hit, without a word
    table = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=rf"^retrieval image table: 1 image\(s\) keyed twice, e\.g\. {shown} \("):
        RetrievalReward(VectorRetriever(), SRConfig(distractors="hard", hard_k=1), image_ids=ids, embeddings=table)
    embeddings = {1: table[0], "1": table[1], 2: table[2]}  # an adapter's embeddings= (reward_of, setup)
    with pytest.raises(ValueError, match=r"^retrieval image table: 1 image\(s\) keyed twice, e\.g\. 1 and '1'"):
        reward_of("retrieval", retriever=VectorRetriever(), embeddings=embeddings)
