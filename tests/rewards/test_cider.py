"""CIDEr-D reward: hand-computed scores, training-reference document frequencies, caption -> image mapping."""

import math
from pathlib import Path

import pytest
import torch

from finecap.data.records import Record
from finecap.rewards import RewardInputs
from finecap.rewards.cider import CiderReward
from finecap.rewards.inputs import references_of

# Two training images, one reference each: N = 2, every n-gram has df = 1, so idf = log 2 for all of them.
REFS = {1: ["a b"], 2: ["c d"]}

# "a b" for image 1: the unigram and bigram tf-idf vectors equal the reference's (cosine 1 each), there are no 3- and
# 4-grams (zero norms -> 0), equal lengths (penalty 1): 10 * (1 + 1 + 0 + 0) / 4 / (1 reference) = 5.0
EXACT = 5.0
# "a" for image 1: unigrams {a: log2} vs {a: log2, b: log2}: cosine = log2^2 / (log2 * sqrt(2) log2) = 1/sqrt(2);
# no bigram (0); length penalty on bigram counts: delta = 0 - 1 -> exp(-1 / (2 * 6^2)) = exp(-1/72)
PARTIAL = 10 / 4 * (1 / math.sqrt(2)) * math.exp(-1 / 72)  # = 1.74338


def test_hand_computed_scores_with_caption_to_image_mapping():
    reward = CiderReward(REFS)
    batch = {"image_ids": [1, 2], "image_index": torch.tensor([0, 0, 1])}
    out = reward(["a b", "a", "a b"], batch)
    # third caption describes image 2 ("c d"): no shared n-gram -> 0
    assert out.total.tolist() == pytest.approx([EXACT, PARTIAL, 0.0], abs=1e-5)
    assert torch.equal(out.parts["cider"], out.total)
    assert out.total.dtype == torch.float32


def test_without_image_index_captions_align_with_rows():
    out = CiderReward(REFS)(["c d", "a b"], {"image_ids": [2, 1]})
    assert out.total.tolist() == pytest.approx([EXACT, EXACT], abs=1e-5)


def test_ptb_tokenisation_of_captions_and_references():
    # upper case and punctuation are removed on both sides, so the scores equal the clean case above
    # (same structure as REFS: two images of two distinct words each)
    refs = {1: ["A cat."], 2: ["the, dog"]}
    out = CiderReward(refs)(["a CAT .", "A"], {"image_ids": [1, 1]})
    assert out.total.tolist() == pytest.approx([EXACT, PARTIAL], abs=1e-5)
    raw = CiderReward(refs, tokenize_text=False)
    assert raw(["a cat"], {"image_ids": [1]}).total.item() == 0.0  # "a", "cat" vs "A", "cat.": no shared word


def test_setup_reads_training_records_once():
    records = [
        Record(1, Path("1.png"), "train", ["a b"]),
        Record(2, Path("2.png"), "train", ["c d"]),
    ]
    reward = CiderReward()
    with pytest.raises(RuntimeError, match="setup"):
        reward(["a b"], {"image_ids": [1]})
    reward.setup(RewardInputs(references=references_of(records)))
    scorer = reward.scorer
    reward.setup(RewardInputs(references={}))  # second call: statistics are kept
    assert reward.scorer is scorer
    assert reward(["a b"], {"image_ids": [1]}).total.item() == pytest.approx(EXACT, abs=1e-5)


def test_document_frequencies_come_from_the_whole_training_corpus():
    # A third training image also containing "a": df(a) = 2 of N = 3, so "a" weighs log(3/2) and "b" log 3.
    # Scoring "a" against image 1 ("a b"): unigram cosine = log1.5^2 / (log1.5 * sqrt(log1.5^2 + log3^2))
    refs = {1: ["a b"], 2: ["c d"], 3: ["a e"]}
    la, lb = math.log(1.5), math.log(3)
    expected = 10 / 4 * (la / math.sqrt(la**2 + lb**2)) * math.exp(-1 / 72)
    assert CiderReward(refs)(["a"], {"image_ids": [1]}).total.item() == pytest.approx(expected, abs=1e-5)


def test_unknown_image_is_named():
    with pytest.raises(KeyError, match="99"):
        CiderReward(REFS)(["a"], {"image_ids": [99]})


def test_image_index_shape_is_checked():
    with pytest.raises(ValueError, match="image_index"):
        CiderReward(REFS)(["a", "b"], {"image_ids": [1], "image_index": torch.tensor([0])})


def test_configure_after_the_references_applies_wholly_or_refuses():
    # configure(sigma=) after the references were given set the attribute only: captions scored against their
    # image's references kept the constructor's sigma (the scorer's), those scored against a call's own references took
    # the new one; tokenize_text=False left the references tokenised and the captions not
    from finecap.rewards import call_batch

    refs = {1: ["a red circle on grass", "a red circle"], 2: ["a blue square", "a big blue square on sand"]}
    caption = ["a red circle on grass on grass on grass"]  # 9 words against 5 and 3: the length penalty bites
    built = CiderReward(refs, sigma=1.0)
    configured = CiderReward(refs)
    configured.configure(sigma=1.0)
    want = built(caption, call_batch([1])).total.tolist()
    assert want != CiderReward(refs)(caption, call_batch([1])).total.tolist()  # sigma matters here
    assert configured(caption, call_batch([1])).total.tolist() == want
    assert configured(caption, call_batch([1], [refs[1]])).total.tolist() == want
    with pytest.raises(ValueError, match=r"configure\(tokenize_text=False\) after the references .* constructor"):
        configured.configure(tokenize_text=False)
    configured.configure(tokenize_text=True)  # what it is already: nothing to refuse
    late = CiderReward()
    late.configure(tokenize_text=False, sigma=1.0)  # before the references: both apply when they come
    late.setup(RewardInputs(references=refs))
    assert (
        late(caption, call_batch([1])).total.tolist()
        == CiderReward(refs, tokenize_text=False, sigma=1.0)(caption, call_batch([1])).total.tolist()
    )


def test_references_keyed_by_an_int_and_its_string_are_refused():
    """{1: [...], "1": [...]} made image 1 two documents of CIDEr-D's corpus (its n-grams' document frequencies
    counted twice) and scored a caption against the list keyed as its id was written; refused as finecap eval refuses
    such references."""
    for build in (lambda refs: CiderReward(refs), lambda refs: CiderReward().setup(RewardInputs(references=refs))):
        with pytest.raises(ValueError, match=r"^cider references: 1 image\(s\) keyed twice, e\.g\. 1 and '1'"):
            build({1: ["a red circle"], "1": ["a blue square"], 2: ["two dogs"]})
