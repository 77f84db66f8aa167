"""OpenRLHF's ``reward_func`` over a finecap reward in this process (:func:`finecap.integrations.openrlhf.
reward_function`), without OpenRLHF: its refusals of a call's images name the call's own field, ``labels[i]``, as the
server's ``/get_reward`` does (tests/serve/test_service.py), never ``image_ids[i]``, a field OpenRLHF never sent."""

from __future__ import annotations

import pytest

from finecap.integrations.openrlhf import reward_function
from finecap.rewards.cider import CiderReward
from finecap.serve.protocol import RequestError

REFERENCES = {1: ["a red circle", "a small red circle"], 2: ["a blue square"]}
QUERIES = ["Q: a red circle</s>", "Q: a square</s>"]


class ComparingCider(CiderReward):
    """CIDEr-D that says it ranks each caption's image among the call's (as self-retrieval with in-batch
    distractors does): a call of one distinct image is refused before it is called."""

    compares_images = True


def test_an_in_process_calls_unknown_image_is_refused_naming_its_label():
    fn = reward_function(CiderReward(REFERENCES))
    for labels in (
        [1, 99],
        [1, '{"image_id": 99}'],
        [{"image_id": 1, "references": ["a"]}, {"image_id": 99, "references": ["a"]}],
    ):
        with pytest.raises(RequestError, match=r"^labels\[1\]: unknown image id 99: ") as caught:
            fn(QUERIES, ["Q:", "Q:"], labels)
        assert caught.value.field == "labels[1]"
    assert [round(r, 3) for r in fn(QUERIES, ["Q:", "Q:"], [1, '{"image_id": 2}'])["rewards"].tolist()] == [
        5.26,
        1.743,
    ]


def test_an_in_process_call_of_one_image_to_a_reward_comparing_them_is_refused_naming_the_labels():
    fn = reward_function(ComparingCider(REFERENCES))
    with pytest.raises(RequestError, match=r"^labels: names one distinct image; the reward ranks") as caught:
        fn(QUERIES, ["Q:", "Q:"], [1, '{"image_id": 1}'])  # 1 and {"image_id": 1}: one image
    assert caught.value.field == "labels"
    assert fn(QUERIES, ["Q:", "Q:"], [1, 2])["rewards"].shape == (2,)
