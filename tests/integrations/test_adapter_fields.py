"""The TRL, verl and ms-swift adapters name a refused call by the fields their trainer handed them, in process and
over a reward server on 127.0.0.1 (``url=``): verl's ``extra_infos[i].image_id`` and ``solution_strs[i]`` (a
per-sample call's ``extra_info.image_id`` and ``solution_str``), ms-swift's and TRL's data-set columns and
``completions[i]``. They named the ``image_ids[i]``, ``captions[i]`` and ``references[i][j]`` of finecap's own
``/reward`` request, which the trainer's user never wrote (as OpenRLHF's did before:
tests/integrations/test_openrlhf_reward_func.py)."""

from __future__ import annotations

import asyncio

import pytest

from finecap.integrations.swift import async_orm, orm
from finecap.integrations.trl import TrlReward, reward_function
from finecap.integrations.verl import VerlReward
from finecap.rewards.cider import CiderReward
from finecap.serve.protocol import Limits
from finecap.serve.service import ImageTable, RewardService
from helpers.served import serving

REFERENCES = {1: ["a red circle", "a small red circle"], 2: ["a blue square"]}
LONG = "x" * 40  # past the server's --max-caption-chars below
LIMITS = Limits(max_caption_chars=30)


def refused_field(call) -> str:
    """The field the refusal of ``call()`` names: a ``RequestError``'s in process, a ``RewardServerError``'s over a
    server (both say it first: ``field: message``, ``reward server (field): message``)."""
    with pytest.raises((ValueError, RuntimeError)) as caught:
        call()
    field = caught.value.field
    assert f"{field}: " in str(caught.value) or f"({field}): " in str(caught.value), str(caught.value)
    return field


def verl_cases(fn: VerlReward, refs: str = "references") -> list[tuple[str, object]]:
    """verl's calls (the batch form, the per-sample form and its coroutine), each refused: (field expected, call);
    ``refs``: the adapter's ``references_key``."""
    infos = [{"image_id": 1}, {"image_id": 99}]
    bad_refs = [{"image_id": 1, refs: ["a"]}, {"image_id": 2, refs: ["a", 7]}]
    return [
        ("extra_infos[1].image_id", lambda: fn.batch(["d"] * 2, ["a red circle", "a square"], ["", ""], infos)),
        (f"extra_infos[1].{refs}[1]", lambda: fn.batch(["d"] * 2, ["a", "b"], ["", ""], bad_refs)),
        ("extra_info.image_id", lambda: fn("d", "a red circle", "", {"image_id": 99})),
        (f"extra_info.{refs}[0]", lambda: fn("d", "a red circle", "", {"image_id": 1, refs: [7]})),
        ("extra_info.image_id", lambda: asyncio.run(fn.ascore("d", "a red circle", "", {"image_id": 99}))),
        (f"extra_info.{refs}[0]", lambda: asyncio.run(fn.ascore("d", "a", "", {"image_id": 1, refs: [7]}))),
    ]


def swift_call(make):
    """An instance of the ms-swift class ``make``, called as ms-swift calls it (an ``AsyncORM`` awaited)."""
    fn = make()

    def call(*args, **kwargs):
        out = fn(*args, **kwargs)
        return asyncio.run(out) if asyncio.iscoroutine(out) else out

    return call


def swift_cases(make) -> list[tuple[str, object]]:
    """ms-swift's calls of the class ``make``, each refused: (field expected, call)."""
    call, ids, refs = swift_call(make), make.image_id_column, make.references_column
    return [
        (f"{ids}[1]", lambda: call(["a red circle", "a square"], trainer_state=None, **{ids: [1, 99]})),
        (f"{refs}[1][0]", lambda: call(["a", "b"], **{ids: [1, 2], refs: [["a"], [7]]})),
    ]


def test_in_process_refusals_name_the_trainers_fields():
    cider = CiderReward(REFERENCES)
    for expected, call in [*verl_cases(VerlReward(cider)), *verl_cases(VerlReward(cider, references_key="r"), "r")]:
        assert refused_field(call) == expected
    for make in (orm(cider), async_orm(cider), orm(cider, image_id_column="img", references_column="refs")):
        for expected, call in swift_cases(make):
            assert refused_field(call) == expected
    trl = TrlReward("cider", cider, image_id_column="img")
    assert refused_field(lambda: trl(prompts=["", ""], completions=["a", "b"], img=[1, 99])) == "img[1]"
    assert refused_field(lambda: TrlReward("cider", cider)(prompts=[""], completions=["a"], image_id=[None])) == (
        "image_id[0]"
    )


def test_a_servers_refusals_name_the_trainers_fields():
    service = RewardService(CiderReward(REFERENCES), ImageTable([1, 2]), limits=LIMITS, log_every=0)
    with serving(service) as url:
        verl = VerlReward(url=url)
        swift, swift_async, trl = orm(url=url), async_orm(url=url), reward_function(url=url, name="cider")
        try:
            for expected, call in verl_cases(verl):
                assert refused_field(call) == expected
            assert refused_field(lambda: verl.batch(["d"] * 2, ["a", LONG], ["", ""], [{"image_id": 1}] * 2)) == (
                "solution_strs[1]"
            )
            assert refused_field(lambda: verl("d", LONG, "", {"image_id": 1})) == "solution_str"
            for make in (swift, swift_async):
                for expected, call in swift_cases(make):
                    assert refused_field(call) == expected
                call = swift_call(make)
                assert refused_field(lambda: call(["a", LONG], image_id=[1, 2])) == "completions[1]"  # noqa: B023
            assert refused_field(lambda: trl(prompts=["", ""], completions=["a", "b"], image_id=[1, 99])) == (
                "image_id[1]"
            )
            assert refused_field(lambda: trl(prompts=["", ""], completions=["a", LONG], image_id=[1, 2])) == (
                "completions[1]"
            )
            # and their values are as before
            scored = verl.batch(["d"] * 2, ["a red circle", "a square"], ["", ""], [{"image_id": 1}, {"image_id": 2}])
            assert [round(r["score"], 3) for r in scored] == [5.26, 1.743]
        finally:
            verl.close()
            trl.close()
            swift.scorer.close()
            swift_async.scorer.close()
