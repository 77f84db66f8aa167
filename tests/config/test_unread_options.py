"""The warnings of options a configuration sets but never reads, for the sections whose readers depend on another
setting: the objective's own sections (``sle``, ``smile``, ``grpo``, ``rl``), the self-retrieval reward's (``sr``),
the judge's and the caption booster's (:meth:`finecap.config.fields.Section.unread_options`,
:func:`finecap.config.loading.warn_unread`). A review found ``train.objective=reinforce sle.alpha=0.5`` accepted
silently: it trains plain SCST. Set under a setting that ignores it, an option is named with the setting that would
read it and the configuration's own; under one that reads it, nothing is said."""

from __future__ import annotations

import logging

import pytest

from finecap.config import load
from finecap.config.secrets import looks_secret


def warned(caplog, overrides: list[str]) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finecap.config"):
        load(None, overrides)
    return [r.getMessage() for r in caplog.records if "changes nothing" in r.getMessage()]


def said(key: str, needs: str, have: str, override: str) -> str:
    """The warning about ``key``, set by ``override`` (shown as its key and value, or ``***`` for a value whose
    key reads as a secret: ``smile.shift_token_id``)."""
    shown = f"{key}=***" if looks_secret(key) else override
    return f"override {shown!r}: {key} changes nothing: it is read with {needs} (this configuration has {have})"


@pytest.mark.parametrize(
    ("overrides", "key", "needs", "have"),
    [
        (["train.objective=reinforce", "sle.alpha=0.5"], "sle.alpha", "train.objective=sle",
         "train.objective=reinforce"),
        (["sle.distance=overlap34"], "sle.distance", "train.objective=sle", "train.objective=mle"),
        (["train.objective=mle", "smile.mle_weight=0.1"], "smile.mle_weight", "train.objective=smile",
         "train.objective=mle"),
        (["train.objective=grpo", "smile.subset=random"], "smile.subset", "train.objective=smile",
         "train.objective=grpo"),
        (["train.objective=smile", "smile.random_k=3"], "smile.random_k", "smile.subset=random",
         "smile.subset=sequence"),
        (["train.objective=smile", "smile.subset=full", "smile.include_eos=false"], "smile.include_eos",
         "smile.subset=sequence or reverse", "smile.subset=full"),
        (["train.objective=smile", "smile.shift_token_id=5"], "smile.shift_token_id", "smile.first_token=shift",
         "smile.first_token=mle"),
        (["train.objective=smile", "smile.shift_form=subword"], "smile.shift_form", "smile.first_token=shift",
         "smile.first_token=mle"),
        (["train.objective=mle", "rl.entropy_coef=0.01"], "rl.entropy_coef",
         "train.objective=reinforce, grpo, scst_me or sle", "train.objective=mle"),
        (["train.objective=smile", "rl.samples=8"], "rl.samples", "train.objective=reinforce, grpo, scst_me or sle",
         "train.objective=smile"),
        (["train.objective=reinforce", "rl.mean_momentum=0.9"], "rl.mean_momentum", "rl.baseline=mean",
         "rl.baseline=greedy"),
        (["train.objective=reinforce", "rl.strategy=beam", "rl.samples=1", "rl.baseline=mean",
          "rl.scaled_logprob=true"], "rl.scaled_logprob", "rl.strategy=sample", "rl.strategy=beam"),
        (["train.objective=grpo", "rl.vllm_is_cap=2"], "rl.vllm_is_cap", "decode.engine=vllm",
         "decode.engine=finecap"),
        (["sr.distractors=hard"], "sr.distractors", "rl.rewards.retrieval", "rl.rewards={cider}"),
        (["train.objective=grpo", "rl.rewards={cider: 1, length: 0.5}", "sr.reward=accuracy"], "sr.reward",
         "rl.rewards.retrieval", "rl.rewards={cider, length}"),
        (["rl.rewards={retrieval: 1}", "sr.hard_k=10"], "sr.hard_k", "sr.distractors=hard", "sr.distractors=batch"),
        (["judge.urls=[http://localhost:8000/v1]"], "judge.urls", "judge.name=openai", "judge.name=world"),
        (["judge.name=vllm", "judge.model=m", "judge.concurrency=4"], "judge.concurrency", "judge.name=openai",
         "judge.name=vllm"),
        (["judge.name=vllm", "judge.model=m", "judge.retries=1"], "judge.retries", "judge.name=openai",
         "judge.name=vllm"),
        (["judge.name=openai", "judge.noise=0.2"], "judge.noise", "judge.name=world", "judge.name=openai"),
        (["judge.max_tokens=64"], "judge.max_tokens", "judge.name=openai or vllm", "judge.name=world"),
        (["boost.mode=visual", "boost.llm_backend=openai"], "boost.llm_backend", "boost.mode=blend or holistic",
         "boost.mode=visual"),
        (["boost.mode=blend", "boost.vlm_model=m"], "boost.vlm_model", "boost.mode=visual or holistic",
         "boost.mode=blend"),
        (["boost.llm_backend=transformers", "boost.llm_base_url=http://localhost:8000/v1"], "boost.llm_base_url",
         "boost.llm_backend=openai", "boost.llm_backend=transformers"),
        (["boost.llm_model=q"], "boost.llm_model", "boost.llm_backend=openai or transformers or vllm",
         "boost.llm_backend=world"),
        (["boost.mode=blend", "boost.llm_backend=openai", "boost.llm_model=q", "boost.batch_size=4"],
         "boost.batch_size", "a backend transformers or vllm", "boost.llm_backend=openai"),
        (["boost.temperature=0.7"], "boost.temperature", "a backend openai or transformers or vllm",
         "boost.llm_backend=world, boost.vlm_backend=world"),
    ],
)  # fmt: skip
def test_an_option_no_reader_of_the_configuration_reads_is_named(caplog, overrides, key, needs, have):
    """``sle`` and ``smile`` under other objectives or settings, ``rl`` where no rollout reads it, ``sr`` without the
    retrieval reward, ``judge`` options the named judge does not read, ``boost`` options no asked backend reads (the
    ``grpo`` section's below: its options come with other warnings)."""
    assert warned(caplog, overrides) == [said(key, needs, have, overrides[-1])]


@pytest.mark.parametrize(
    ("overrides", "key", "needs", "have"),
    [
        (["grpo.advantage=group"], "grpo.advantage", "train.objective=grpo", "train.objective=mle"),
        (["train.objective=smile", "grpo.policy_loss=clipped", "grpo.kl_coef=0.1"], "grpo.kl_coef",
         "train.objective=grpo", "train.objective=smile"),
    ],
)  # fmt: skip
def test_a_grpo_option_under_an_objective_outside_the_family_is_named(caplog, overrides, key, needs, have):
    assert said(key, needs, have, overrides[-1]) in warned(caplog, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.objective=sle", "sle.alpha=0.5", "sle.distance=overlap34"],
        ["train.objective=helpers.toy_objective:build", "sle.alpha=0.5", "smile.random_k=3", "grpo.kl_coef=0.1",
         "grpo.policy_loss=clipped", "rl.samples=3"],  # one's own objective may read any section
        ["train.objective=smile", "smile.subset=random", "smile.random_k=3", "smile.mle_weight=0.1"],
        ["train.objective=smile", "smile.subset=reverse", "smile.include_eos=false"],
        ["train.objective=smile", "smile.first_token=shift", "smile.shift_token_id=5"],
        ["train.objective=smile", "smile.first_token=shift", "smile.shift_form=subword"],
        ["train.objective=scst_me", "rl.entropy_coef=0.01", "grpo.advantage=baseline"],
        ["train.objective=sle", "rl.samples=5", "grpo.policy_loss=reinforce"],  # sle checks the family's options
        ["train.objective=grpo", "grpo.policy_loss=clipped", "grpo.kl_coef=0.1", "rl.baseline=mean",
         "rl.mean_momentum=0.9"],
        ["train.objective=mle", "rl.rewards={retrieval: 1}", "sr.distractors=hard", "sr.hard_k=3"],  # serve-reward
        ["rl.rewards={'helpers.shaped_rewards:qa_shaped': 1.0}", "sr.reward=accuracy"],  # one's own reward
        ["judge.name=openai", "judge.urls=[http://localhost:8000/v1]", "judge.model=m", "judge.timeout=5"],
        ["judge.name=vllm", "judge.model=m", "judge.max_tokens=64", "judge.seed=3", "judge.shuffles=3"],
        ["judge.name=helpers.toy_judge:build", "judge.noise=0.1", "judge.urls=[http://localhost:8000/v1]"],
        ["judge.noise=0.1", "judge.seed=2"],
        ["boost.mode=holistic", "boost.llm_backend=world", "boost.vlm_backend=world", "boost.vlm_model=expert"],
        ["boost.mode=visual", "boost.vlm_backend=openai", "boost.vlm_model=m", "boost.timeout=5",
         "boost.temperature=0.2"],
        ["boost.mode=blend", "boost.llm_backend=vllm", "boost.llm_model=m", "boost.batch_size=4"],
    ],
)  # fmt: skip
def test_an_option_its_setting_reads_is_not_warned_about(caplog, overrides):
    assert warned(caplog, overrides) == []
