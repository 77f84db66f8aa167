"""The adapters check what a trainer hands them exactly as the reward server checks a request, with the same message:
ids that are no image id, references that are no list, completions without an assistant turn, a call of one image for a
reward that compares a call's images; and ``17`` and ``"17"`` are one image in process as on the server."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import httpx
import numpy as np
import pytest

from finecap.integrations.openrlhf import reward_function as openrlhf_function
from finecap.integrations.scoring import Scorer
from finecap.integrations.swift import orm
from finecap.integrations.trl import TrlReward
from finecap.integrations.verl import VerlReward
from finecap.rewards.cider import CiderReward
from finecap.serve.service import ImageTable, RewardService
from helpers.served import small_mixture

NAME = "mix"  # the server's and the adapters' name of the reward: their messages name it alike


def server_refusal(url: str, body: dict) -> str:
    """The server's refusal of ``body`` as an adapter raises it: ``field: message``."""
    response = httpx.post(f"{url}/reward", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    return f"{error['field']}: {error['message']}"


BAD_CALLS = [  # (captions, image ids, references): each refused by the server with a 400
    (["1 0", "0 1"], [None, "a"], None),
    (["1 0", "0 1"], ["a", True], None),
    (["1 0", "0 1"], ["a", 1.5], None),
    (["1 0", "0 1"], ["a", "c"], None),  # an image the reward does not know
    (["1 0", "0 1"], ["a", "a"], None),  # one distinct image, for a reward that compares a call's images
    (["1 0", None], ["a", "b"], None),
    (["1 0", 7], ["a", "b"], None),
    (["1 0", "0 1"], ["a", "b"], ["1 0", "0 1"]),  # references as strings: never split into characters
    (["1 0", "0 1"], ["a", "b"], [["1 0"], []]),
    (["1 0", "0 1"], ["a", "b"], [["1 0"], [None]]),
    (["1 0", "0 1"], ["a", "b"], [["1 0"]]),  # one list for two captions
    (["1 0", "0 1"], ["a"], None),  # one id for two captions
]


def test_scorer_in_process_refuses_what_the_server_refuses_in_the_same_words():
    from helpers.served import serving

    reward = small_mixture()
    scorer = Scorer(reward, name=NAME)
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0, name=NAME)) as url:
        for captions, ids, refs in BAD_CALLS:
            body = {"captions": captions, "image_ids": ids}
            if refs is not None:
                body["references"] = refs
            expected = server_refusal(url, body)
            with pytest.raises(ValueError) as refused:
                scorer.score(captions, ids, refs)
            assert str(refused.value) == expected, (captions, ids, refs)


def test_nan_and_unhashable_ids_are_refused_by_name():
    scorer = Scorer(small_mixture(), name=NAME)
    for bad, kind in ((float("nan"), "a number"), (["a"], "an array"), ({"id": "a"}, "an object"), (None, "null")):
        with pytest.raises(ValueError, match=rf"^image_ids\[1\]: expected an image id \(a string or an integer\), "
                                             rf"got {kind}$"):  # fmt: skip
            scorer.score(["1 0", "0 1"], ["a", bad])


def cider() -> CiderReward:
    return CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]})


def test_an_id_and_its_string_are_one_image_in_every_front_end():
    captions = ["a red circle", "a square"]
    expected = Scorer(cider()).score(captions, [1, 2]).total.tolist()
    for ids in (["1", "2"], [1, "2"], [np.int64(1), np.int32(2)], np.array([1, 2])):
        assert Scorer(cider()).score(captions, ids).total.tolist() == expected
        assert TrlReward("cider", cider())(prompts=["", ""], completions=captions, image_id=list(ids)) == expected
        infos = [{"image_id": i} for i in ids]
        assert [r["score"] for r in VerlReward(cider()).batch(["d", "d"], captions, ["", ""], infos)] == expected
        assert orm(cider())()(captions, image_id=list(ids), trainer_state=None) == expected
        labels = [json.dumps({"image_id": int(i) if not isinstance(i, str) else i}) for i in ids]
        got = openrlhf_function(cider())([f"Q:{c}" for c in captions], ["Q:", "Q:"], labels)["rewards"].tolist()
        assert [float(np.float32(v)) for v in got] == [float(np.float32(v)) for v in expected]


def test_verl_says_once_that_it_does_not_read_references_put_in_ground_truth(caplog):
    # verl's natural place for references is ground_truth, which the adapter does not read: the reward's own
    # references scored the call without a word
    captions = ["a red circle", "a square"]
    infos = [{"image_id": 1}, {"image_id": 2}]
    reward = VerlReward(cider())
    with caplog.at_level(logging.WARNING, logger="finecap.integrations.verl"):
        reward.batch(["d", "d"], captions, ["", ""], infos)  # verl's required field, empty: nothing to say
        assert not caplog.records
        reward.batch(["d", "d"], captions, [["a red ball"], ["a blue box"]], infos)
        reward.batch(["d", "d"], captions, [["a red ball"], ["a blue box"]], infos)
        with_refs = [{**info, "references": ["a red circle"]} for info in infos]
        VerlReward(cider()).batch(["d", "d"], captions, [["x"], ["y"]], with_refs)  # references given: read
    (record,) = caplog.records
    assert "ground_truth holds text, which it does not read" in record.getMessage()
    assert "put them in extra_info['references']" in record.getMessage()


def test_verl_and_swift_refuse_references_given_as_a_string():
    captions = ["a red circle", "a square"]
    infos = [{"image_id": 1, "references": "a red circle"}, {"image_id": 2, "references": "a blue square"}]
    with pytest.raises(ValueError, match=r"^extra_infos\[0\]\.references: expected a non-empty array of reference "
                                         r"captions$"):  # fmt: skip
        VerlReward(cider()).batch(["d", "d"], captions, ["", ""], infos)
    with pytest.raises(ValueError, match=r"^refs\[0\]: expected a non-empty array of reference captions$"):
        orm(cider(), references_column="refs")()(captions, image_id=[1, 2], refs=["a red circle", "a blue square"])
    # lists read from Parquet as NumPy arrays are lists
    infos = [{"image_id": 1, "references": np.array(["a red circle"])}, {"image_id": 2, "references": ("a square",)}]
    got = VerlReward(cider()).batch(["d", "d"], captions, ["", ""], infos)
    assert got[1]["score"] > 0 and all(math.isfinite(r["score"]) for r in got)


def test_trl_refuses_a_conversational_completion_without_an_assistant_turn_and_odd_items():
    fn = TrlReward("cider", cider())
    user_only = [[{"role": "user", "content": "Describe the image."}], [{"role": "assistant", "content": "a square"}]]
    with pytest.raises(ValueError, match=r"^completions\[0\]: no assistant message \(roles: user\)"):
        fn(prompts=["", ""], completions=user_only, image_id=[1, 2])
    for bad, kind in ((None, "NoneType"), ([], "an empty list"), (3.5, "float")):
        with pytest.raises(ValueError, match=rf"^completions\[1\]: expected a string or a list of messages, "
                                             rf"got {kind}"):  # fmt: skip
            fn(prompts=["", ""], completions=["a red circle", bad], image_id=[1, 2])
    with pytest.raises(ValueError, match=r"the 'image_id' column must hold one value per completion, got str"):
        fn(prompts=["", ""], completions=["a", "b"], image_id="12")


def test_swift_refuses_none_completions_by_index():
    with pytest.raises(ValueError, match=r"^completions\[0\]: expected a string or a list of messages, got NoneType"):
        orm(cider())()([None, "a square"], image_id=[1, 2])


def test_trl_one_prompt_generation_batch_on_a_reward_comparing_images_is_refused_as_the_server_refuses_it():
    """TRL's default generation batch (one prompt x 8 generations) hands the reward one image: the self-retrieval
    reward would rank it among itself (every value the same, std 0); refused with the server's words."""
    from helpers.served import serving

    reward = small_mixture()
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0, name=NAME)) as url:
        expected = server_refusal(url, {"captions": ["1 0"] * 8, "image_ids": ["a"] * 8})
    assert expected.startswith("image_ids: names one distinct image")
    with pytest.raises(ValueError) as refused:
        TrlReward(NAME, reward)(prompts=[""] * 8, completions=["1 0"] * 8, image_id=["a"] * 8)
    assert str(refused.value) == expected.replace("image_ids", "image_id", 1)  # TRL's column, the server's words
    with pytest.raises(ValueError, match="names one distinct image"):
        VerlReward(reward).batch(["d"] * 2, ["1 0", "0 1"], ["", ""], [{"image_id": "a"}] * 2)


def test_a_non_finite_value_in_process_names_the_reward():
    class Broken:
        def __call__(self, captions, batch):
            import torch

            from finecap.rewards import RewardOutput

            return RewardOutput(torch.tensor([1.0, float("inf")]), {})

    with pytest.raises(ValueError, match=r"^reward 'broken': total is inf at caption 1"):
        TrlReward("broken", Broken())(prompts=["", ""], completions=["a", "b"], image_id=[1, 2])
    with pytest.raises(ValueError, match=r"^reward 'the reward': total is inf"):
        asyncio.run(Scorer(Broken()).ascore(["a", "b"], [1, 2]))


def test_a_value_beyond_float32s_range_in_process_names_the_reward():
    # 1e39 is finite in float64 and inf as float32, the values every front end answers: it passed the check and the
    # trainer got inf
    import torch

    from finecap.rewards import RewardOutput

    def huge(captions, batch):
        total = torch.tensor([1.0, 1e39], dtype=torch.float64)
        return RewardOutput(total, {"part": torch.tensor([2.0, 3.0], dtype=torch.float64)})

    with pytest.raises(ValueError, match=r"^reward 'huge': total is inf at caption 1 .*beyond float32's range"):
        Scorer(huge, name="huge").score(["a", "b"], [1, 2])
    with pytest.raises(ValueError, match=r"^reward 'the reward': total is inf at caption 1"):
        VerlReward(huge).batch(["d"] * 2, ["a", "b"], ["", ""], [{"image_id": 1}, {"image_id": 2}])


def test_every_adapter_takes_a_registry_name_with_its_options_as_trl_does():
    """One entry shape (``Scorer.of``): each framework's adapter built from ``"cider"`` and its references gives the
    values of the CIDEr-D reward built by hand on the same references (its own doctest: 5.26, 1.743), and refuses
    options it does not know with the reward's settings named."""
    from finecap.integrations.swift import async_orm
    from finecap.integrations.trl import reward_function as trl_function

    refs = {1: ["a red circle", "a small red circle"], 2: ["a blue square"]}
    captions, ids = ["a red circle", "a square"], [1, 2]
    expected = CiderReward(refs)(captions, {"image_ids": ids}).total.tolist()
    infos = [{"image_id": i} for i in ids]
    got = {
        "TRL": trl_function("cider", references=refs)(prompts=["", ""], completions=captions, image_id=ids),
        "verl": [r["score"] for r in VerlReward("cider", references=refs).batch(["d"] * 2, captions, ["", ""], infos)],
        "ms-swift": orm("cider", references=refs)()(captions, image_id=ids),
        "ms-swift async": asyncio.run(async_orm("cider", references=refs)()(captions, image_id=ids)),
        "OpenRLHF": openrlhf_function("cider", references=refs)(captions, ["", ""], ids)["rewards"].tolist(),
    }
    for who, values in got.items():
        assert values == expected, who
    assert [round(v, 3) for v in expected] == [5.26, 1.743]
    for make in (VerlReward, orm, openrlhf_function):
        with pytest.raises(TypeError, match="unexpected keyword argument 'sigmaa' \\(settings: tokenize_text, sigma"):
            make("cider", references=refs, sigmaa=6.0)
    with pytest.raises(ValueError, match="give a finecap reward .* or a reward server's URL \\(url=\\), one of them"):
        VerlReward()


def test_images_given_as_one_string_are_refused_not_split_into_characters():
    from finecap.serve.client import RewardClient

    with pytest.raises(ValueError, match=r"^images: expected an array of paths, got a string$"):
        RewardClient.payload(["a red circle"], images="x.png")
    assert RewardClient.payload(["a red circle"], images=("x.png",))["images"] == ["x.png"]


def test_the_openrlhf_function_in_process_applies_no_server_limit():
    """OpenRLHF's reward function over a reward in process parsed its batch with the server's default limits: 9,000
    queries (past --max-captions) or 70,000 references (past --max-references, nocaps has 10 an image) were refused
    in process, naming a server option that does not apply there."""
    n = 9000
    labels = [json.dumps({"image_id": 1 + i % 2, "references": ["a red circle"] * 8}) for i in range(n)]
    out = openrlhf_function(cider())(["Q:a red circle"] * n, ["Q:"] * n, labels)["rewards"]
    assert out.shape == (n,) and bool((out > 0).all())


def swift_reward_kwargs(image_ids: list) -> dict:
    """The keywords ms-swift's GRPO passes every reward function besides the completions (strings: each sample's
    ``messages[-1]['content']``): ``trainer_state`` and every column of the samples' reward rows, one value per
    completion (ms-swift 4.6.0, ``swift/rl_core/grpo_algorithm.py`` ``compute_rewards_per_func`` and
    ``swift/rl_core/data.py`` ``to_reward_row``; modelscope/ms-swift at 3602360a562313afbf2ef6065fdf61f271a2c5b9)."""
    n = len(image_ids)
    return {"trainer_state": None, "messages": [[{"role": "user", "content": "Describe."}]] * n,
            "prompt_id": [f"p{i}" for i in range(n)], "request_id": [f"r{i}" for i in range(n)],
            "finish_reason": ["stop"] * n, "is_truncated": [False] * n, "rollout_infos": [{}] * n,
            "response_token_ids": [[1, 2]] * n, "images": [None] * n, "image_id": image_ids}  # fmt: skip


def test_swift_refuses_a_call_holding_a_caption_the_reward_could_not_score_never_a_nan_it_would_pay_as_0():
    """ms-swift 4.6 turns a reward function's ``None`` into NaN and sums the functions with ``nansum``
    (``swift/rl_core/advantage.py`` ``compute_advantages``, same commit as :func:`swift_reward_kwargs`): a NaN is
    paid as 0, inside its group's mean and standard deviation. The adapter raises :class:`FailedCaptions` naming the
    completion, as OpenRLHF's does, in both classes."""
    import torch

    from finecap.integrations.swift import async_orm
    from finecap.rewards import RewardBase, RewardOutput
    from finecap.serve.protocol import FailedCaptions

    class Judge(RewardBase):  # a judge that failed on the second caption
        def __call__(self, captions, batch):
            return RewardOutput(torch.tensor([1.0, float("nan"), 2.0]), failed=torch.tensor([False, True, False]))

    completions, kwargs = ["a red circle", "a square", "a blue square"], swift_reward_kwargs([1, 2, 2])
    with pytest.raises(FailedCaptions, match=r"^finecap ms-swift reward FinecapReward: the reward could not score 1 "
                                             r"of 3 captions \(completions\[1\]\): its judge failed on them, and "
                                             r"ms-swift would pay a NaN as 0"):  # fmt: skip
        orm(Judge())()(completions, **kwargs)
    with pytest.raises(FailedCaptions, match=r"FinecapAsyncReward: the reward could not score 1 of 3 captions"):
        asyncio.run(async_orm(Judge())()(completions, **kwargs))
    assert orm(cider())()(completions, **kwargs)[1] > 0  # the same call, every caption scored: its values


def test_every_front_end_scores_a_caption_without_its_surrounding_white_space():
    """finecap's decoder gives its rewards stripped captions in training; a trainer's completion often keeps a
    newline or a leading space (verl's ``solution_str``, ms-swift's message content). Every front end scores
    ``" a red circle\\n"`` as ``"a red circle"``: TRL stripped before, OpenRLHF's query reading too, verl, ms-swift,
    the scorer and the server did not. The reward here is the caption's length in characters, which sees any space."""
    import torch

    from finecap.rewards import RewardBase, RewardOutput
    from helpers.served import serving

    class Length(RewardBase):
        def __call__(self, captions, batch):
            return RewardOutput(torch.tensor([float(len(c)) for c in captions]))

    padded, ids = [" a red circle\n", "\ta square  "], [1, 2]
    expected = [12.0, 8.0]
    assert Scorer(Length()).score(padded, ids).total.tolist() == expected
    assert TrlReward("length", Length())(prompts=["", ""], completions=padded, image_id=ids) == expected
    chat = [[{"role": "assistant", "content": c}] for c in padded]
    assert TrlReward("length", Length())(prompts=["", ""], completions=chat, image_id=ids) == expected
    infos = [{"image_id": i} for i in ids]
    assert [r["score"] for r in VerlReward(Length()).batch(["d", "d"], padded, ["", ""], infos)] == expected
    assert VerlReward(Length())("d", padded[0], "", infos[0])["score"] == expected[0]
    assert orm(Length())()(padded, image_id=ids) == expected
    queries = [f"Q:{c}" for c in padded]
    assert openrlhf_function(Length())(queries, ["Q:", "Q:"], ids)["rewards"].tolist() == expected
    with serving(RewardService(Length(), ImageTable(ids), log_every=0, name="length")) as url:
        response = httpx.post(f"{url}/reward", json={"captions": padded, "image_ids": ids})
        assert response.status_code == 200, response.text
        assert response.json()["total"] == expected
        assert Scorer(url=url).score(padded, ids).total.tolist() == expected


def test_openrlhfs_reward_function_logs_its_error_as_an_error_before_raising_it(caplog):
    """OpenRLHF 0.11 catches a reward function's error and logs it at INFO only (``openrlhf/utils/agent.py``,
    ``SingleTurnExecutor``: "Failed to fetch reward from remote RM"), then stops on a later error that names no reward
    (a sample without a reward): the function logs the cause at ERROR, then raises it as before."""
    import torch

    from finecap.rewards import RewardBase, RewardOutput
    from finecap.serve.protocol import FailedCaptions

    class Judge(RewardBase):  # a judge that failed on the caption
        def __call__(self, captions, batch):
            return RewardOutput(torch.tensor([float("nan")]), failed=torch.tensor([True]))

    fn = openrlhf_function(Judge())
    with caplog.at_level(logging.ERROR, logger="finecap.integrations.openrlhf"):
        with pytest.raises(FailedCaptions, match=r"could not score 1 of 1 captions \(query\[0\]\)") as raised:
            fn(["Q:a red circle"], ["Q:"], [1])
        with pytest.raises(ValueError, match="finecap OpenRLHF reward: ") as refused:
            fn(["Q:a red circle"], ["Q:"], [None])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [str(raised.value), str(refused.value)]
