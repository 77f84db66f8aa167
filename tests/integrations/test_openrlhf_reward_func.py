"""OpenRLHF's ``reward_func`` over a finecap reward in this process (:func:`finecap.integrations.openrlhf.
reward_function`), without OpenRLHF: its refusals of a call's images name the call's own field, ``labels[i]``, as the
server's ``/get_reward`` does (tests/serve/test_service.py), never ``image_ids[i]``, a field OpenRLHF never sent; over
a reward server on 127.0.0.1 (``url=``) too, whose refusal of the ``/reward`` request it sends names
``image_ids[i]``, ``captions[i]`` and ``references[i][j]``: read as ``labels[i]``, ``query[i]`` and
``labels[i].references[j]``, what ``/get_reward`` says of the same call. :meth:`Scorer.ascore` names them as
:meth:`Scorer.score` does."""

from __future__ import annotations

import asyncio

import pytest

from finecap.integrations.openrlhf import reward_function
from finecap.integrations.scoring import Scorer
from finecap.rewards.cider import CiderReward
from finecap.serve.client import RewardServerError
from finecap.serve.protocol import GET_REWARD_FIELDS, Limits, RequestError
from finecap.serve.service import ImageTable, RewardService
from helpers.served import serving

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


def test_a_servers_refusal_of_a_calls_image_names_its_label(tmp_path):
    # reward_function(url=) asks the server's /reward, whose refusals name that request's image_ids[i] or images[i]:
    # the caller sent labels[i], and reads them so, as from /get_reward and in process
    image = tmp_path / "1.png"
    image.write_bytes(b"")
    known = ImageTable([1, 2], {str(image): 1})
    with serving(RewardService(CiderReward(REFERENCES), known, log_every=0)) as url:
        fn = reward_function(url=url)
        try:
            for labels, unknown in (
                ([1, 99], "id 99"),
                ([1, '{"image_id": 99}'], "id 99"),
                ([{"image_id": 1, "references": ["a"]}, {"image_id": 99, "references": ["a"]}], "id 99"),
                ([{"image": str(image)}, {"image": str(tmp_path / "none.png")}], "file '"),
            ):
                refused = rf"^reward server \(labels\[1\]\): unknown image {unknown}"
                with pytest.raises(RewardServerError, match=refused):
                    fn(QUERIES, ["Q:", "Q:"], labels)
            with pytest.raises(RewardServerError) as caught:
                fn(QUERIES, ["Q:", "Q:"], [1, 99])
            assert (caught.value.status, caught.value.field) == (400, "labels[1]")
            rewards = fn(QUERIES, ["Q:", "Q:"], [1, '{"image_id": 2}'])["rewards"].tolist()
            assert [round(r, 3) for r in rewards] == [5.26, 1.743]  # the in-process values
        finally:
            fn.close()
    with serving(RewardService(ComparingCider(REFERENCES), known, log_every=0)) as url:
        fn = reward_function(url=url)
        try:
            with pytest.raises(RewardServerError, match=r"^reward server \(labels\): names one distinct image"):
                fn(QUERIES, ["Q:", "Q:"], [1, '{"image_id": 1}'])
        finally:
            fn.close()


def test_a_servers_refusal_of_a_calls_captions_and_references_names_openrlhfs_fields():
    # reward_function(url=) asks /reward, whose limits named its own captions[i] and references[i][j]: the caller sent
    # query[i] and labels[i] (the references inside a label), and now reads what /get_reward says of the same call
    import httpx

    limits = Limits(max_captions=2, max_caption_chars=30, max_references=3)
    long = "x" * 40
    cases = [
        (["Q: a red circle</s>", f"Q: {long}</s>"], [1, 2], "query[1]", 413),  # --max-caption-chars
        (QUERIES * 2, [1, 2, 1, 2], "query", 413),  # --max-captions
        (QUERIES, [{"image_id": 1, "references": ["a"]}, {"image_id": 2, "references": ["a", long]}],
         "labels[1].references[1]", 413),  # a reference beyond --max-caption-chars
        (QUERIES, [{"image_id": 1, "references": ["a", "b"]}, {"image_id": 2, "references": ["a", "b"]}], "labels",
         413),  # --max-references
        (QUERIES, [1, 99], "labels[1]", 400),  # an unknown image, as before
    ]  # fmt: skip
    with serving(RewardService(CiderReward(REFERENCES), ImageTable([1, 2]), limits=limits, log_every=0)) as url:
        fn = reward_function(url=url)
        try:
            for queries, labels, field, status in cases:
                said = httpx.post(f"{url}/get_reward", json={"query": queries, "prompts": ["Q:"] * len(queries),
                                                               "labels": labels}).json()["error"]  # fmt: skip
                assert said["field"] == field, said
                with pytest.raises(RewardServerError) as caught:
                    fn(queries, ["Q:"] * len(queries), labels)
                assert (caught.value.field, caught.value.status) == (field, status)
                assert str(caught.value).startswith(f"reward server ({field}): ")
        finally:
            fn.close()


def test_scorer_ascore_names_the_callers_fields_as_score_does():
    # Scorer.ascore (verl's awaited compute_score) took no fields where score did: its refusals named image_ids[i]
    scorer = Scorer.of(CiderReward(REFERENCES))
    refs = [["a red circle"], ["a blue square"]]
    for call in (scorer.score, lambda *a, **k: asyncio.run(scorer.ascore(*a, **k))):
        with pytest.raises(RequestError, match=r"^labels\[1\]: unknown image id 99: "):
            call(["a", "b"], [1, 99], refs, fields=GET_REWARD_FIELDS)
        with pytest.raises(RequestError, match=r"^labels\[1\]\.references\[0\]: expected a string, got a number"):
            call(["a", "b"], [1, 2], [["a"], [7]], fields=GET_REWARD_FIELDS)
        with pytest.raises(RequestError, match=r"^image_ids\[1\]: unknown image id 99: "):
            call(["a", "b"], [1, 99], refs)  # without fields: the /reward request's names
        out = call(["a red circle", "a square"], [1, 2], fields=GET_REWARD_FIELDS)
        assert [round(v, 3) for v in out.total.tolist()] == [5.26, 1.743]
    service = RewardService(CiderReward(REFERENCES), ImageTable([1, 2]), log_every=0)
    with serving(service) as url, Scorer.of(url=url) as remote:
        for call in (remote.score, lambda *a, **k: asyncio.run(remote.ascore(*a, **k))):
            with pytest.raises(RewardServerError, match=r"^reward server \(labels\[1\]\): unknown image id 99"):
                call(["a", "b"], [1, 99], refs, fields=GET_REWARD_FIELDS)
            with pytest.raises(
                RewardServerError, match=r"^reward server \(labels\[1\]\.references\[0\]\): expected a s"
            ):
                call(["a", "b"], [1, 2], [["a"], [7]], fields=GET_REWARD_FIELDS)
