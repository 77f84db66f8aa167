"""The vLLM engine's memory options without vLLM (tests/engines/test_vllm_memory.py runs them on vLLM's CPU build):
the dtype ``vllm.dtype=auto`` picks from a configuration, the order of sleep, wake, weight sync and generation with
``vllm.enable_sleep_mode`` (a stand-in ``vllm.LLM`` recording its calls), the refusal of sleep mode on a platform
where vLLM cannot sleep, and ``train.strategy=fsdp`` with a quantized captioner refused in one line."""

from __future__ import annotations

import contextlib
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from finecap.config import ConfigError, load
from finecap.engines import vllm as engines_vllm
from finecap.engines.rollouts import RolloutEngine
from finecap.engines.vllm import VllmEngine, engine_dtype, sleep_refusal, weights_dtype


def chosen(overrides: list[str], weights: torch.dtype, cuda: bool = False) -> str:
    """The engine dtype of the configuration ``overrides`` for a captioner whose weights are in ``weights``."""
    cfg = load(None, overrides)
    return engine_dtype(cfg.vllm.dtype, weights, cfg.train.mixed_precision, cuda)


@pytest.mark.parametrize(
    ("overrides", "weights", "cuda", "expected"),
    [
        ([], torch.float32, False, "float32"),  # a float32 recipe without autocast computes in float32
        ([], torch.bfloat16, False, "bfloat16"),  # bf16 weights
        (["train.mixed_precision=bf16"], torch.float32, False, "bfloat16"),  # float32 master weights, bf16 autocast
        (["train.mixed_precision=fp16"], torch.float32, True, "float16"),  # fp16 autocast on a GPU
        (["train.mixed_precision=fp16"], torch.float32, False, "float32"),  # on the CPU fp16 autocast is float32
        (["vllm.dtype=float32", "train.mixed_precision=bf16"], torch.bfloat16, False, "float32"),  # explicit wins
        (["vllm.dtype=bfloat16"], torch.float32, False, "bfloat16"),
        (["vllm.dtype=float16"], torch.float32, False, "float16"),
    ],
)
def test_the_engine_dtype_chosen_from_a_configuration(overrides, weights, cuda, expected):
    assert chosen(overrides, weights, cuda) == expected


def test_the_weights_dtype_is_the_one_most_elements_are_in():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8).to(torch.bfloat16), torch.nn.Linear(2, 2))  # 72 bf16, 6 fp32
    assert weights_dtype(model) == torch.bfloat16
    model[1] = torch.nn.Linear(16, 16)  # 272 float32 elements
    assert weights_dtype(model) == torch.float32
    assert weights_dtype(torch.nn.Module()) == torch.float32


def test_an_unknown_vllm_dtype_is_refused_naming_the_option():
    with pytest.raises(ConfigError) as e:
        load(None, ["vllm.dtype=half"])
    assert "vllm.dtype" in str(e.value) and "bfloat16" in str(e.value)


class StandInLLM:
    """A ``vllm.LLM`` recording the calls an engine makes to it, and generating one token (EOS) per request."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.autocast: list[bool] = []  # whether an autocast was on at each weight load
        self.llm_engine = SimpleNamespace(reset_encoder_cache=lambda: self.calls.append(("reset_encoder_cache",)))

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tuple(tags) if tags is not None else None))

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))
        self.autocast.append(torch.is_autocast_enabled("cpu"))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", len(prompts)))
        logprob = {2: SimpleNamespace(logprob=-0.5)}
        caption = SimpleNamespace(token_ids=[2], logprobs=[logprob], finish_reason="stop")  # ended at EOS
        return [SimpleNamespace(outputs=[caption]) for _ in prompts]


TOKENIZER = SimpleNamespace(eos_token_id=2, pad_token_id=0, decode=lambda ids, skip_special_tokens: "")


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """``decode.engine=vllm`` opening an engine on a :class:`StandInLLM` (sending it the weights at once, as
    :meth:`VllmEngine.from_captioner` does), with ``vllm.SamplingParams`` a stand-in too and the policy's weights
    one named tensor."""
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    monkeypatch.setattr(engines_vllm, "streamed_weights",
                        lambda policy: contextlib.nullcontext(iter([("lm_head.weight", torch.zeros(1))])))  # fmt: skip
    llm = StandInLLM()

    def open_on_stand_in(cls, policy, cfg, *, tempered=False):
        engine = cls(llm, TOKENIZER, "prompt", tmp_path, owns_folder=False, sleep_mode=cfg.vllm.enable_sleep_mode)
        engine.sync(policy)
        return engine

    monkeypatch.setattr(VllmEngine, "open", classmethod(open_on_stand_in))
    return llm


def rollout_calls(llm: StandInLLM, sleep_mode: bool) -> list[tuple]:
    """The stand-in's calls over three rollouts of two decodings each (samples, greedy), the policy changing
    between rollouts, then the engine closed."""
    from finecap.config import DecodeConfig

    cfg = load(None, ["decode.engine=vllm", f"vllm.enable_sleep_mode={str(sleep_mode).lower()}"])
    rollouts = RolloutEngine(cfg)
    policy = SimpleNamespace(device=torch.device("cpu"))
    batch = {"images": ["image"]}
    for _ in range(3):
        rollouts.generate(policy, batch, DecodeConfig(strategy="sample", num_return_sequences=1))
        rollouts.generate(policy, batch, DecodeConfig())
        rollouts.policy_changed()
    rollouts.engine.llm = None  # closing shuts nothing down on the stand-in
    rollouts.close()
    return llm.calls


SYNC = [("reload_weights", ["lm_head.weight"]), ("reset_encoder_cache",), ("reset_prefix_cache",)]


def test_sleep_mode_sleeps_after_each_generation_and_wakes_before_sync_and_generation(stand_in):
    calls = rollout_calls(stand_in, sleep_mode=True)
    weights, kv_cache = ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))
    both, generate, sleep = ("wake_up", ("weights", "kv_cache")), ("generate", 1), ("sleep", 1)
    first = [*SYNC, generate, sleep, both, generate, sleep]  # built awake, weights sent, then asleep after each
    # a sync wakes the weights, loads them, then wakes the KV cache
    later = [weights, SYNC[0], kv_cache, *SYNC[1:], generate, sleep, both, generate, sleep]
    assert calls == first + later + later


def test_without_sleep_mode_the_engine_never_sleeps(stand_in):
    calls = rollout_calls(stand_in, sleep_mode=False)
    generate = ("generate", 1)
    assert calls == [*SYNC, generate, generate] + [*SYNC, generate, generate] * 2


def test_sleep_mode_is_refused_where_vllm_cannot_sleep():
    cpu = SimpleNamespace(is_sleep_mode_available=lambda: False, device_name="cpu")
    message = sleep_refusal(cpu, "0.32.0")
    assert message == ("vllm.enable_sleep_mode=true: vLLM 0.32.0 sleeps only on a GPU (CUDA, ROCm, XPU), not on the "
                       "cpu platform; set vllm.enable_sleep_mode=false")  # fmt: skip
    assert sleep_refusal(SimpleNamespace(is_sleep_mode_available=lambda: True, device_name="cuda")) is None


@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_fsdp_with_a_quantized_captioner_is_refused_in_one_line(bits):
    with pytest.raises(ConfigError) as e:
        load(None, ["train.strategy=fsdp", f"model.quantization={bits}"])
    message = str(e.value)
    assert f"train.strategy: fsdp cannot shard a model.quantization={bits} base" in message
    assert "\n" not in message and e.value.key == "train.strategy"
    assert load(None, ["train.strategy=ddp", f"model.quantization={bits}"]).model.quantization == bits
    assert load(None, ["train.strategy=fsdp"]).train.strategy == "fsdp"


class Shard:
    """A stand-in for FSDP2's ``DTensor`` shard: ``full_tensor()`` (a collective every process calls) is recorded."""

    def __init__(self, name: str, gathered: list[str]) -> None:
        self.name, self.gathered = name, gathered

    def full_tensor(self) -> torch.Tensor:
        self.gathered.append(self.name)
        return torch.zeros(2)


def stand_in_captioner(state: dict) -> SimpleNamespace:
    return SimpleNamespace(lora_module=lambda part: None, state_dict=lambda: state)


def test_weights_are_streamed_from_the_parameters_without_a_copy():
    weight = torch.nn.Parameter(torch.randn(3, 3))
    captioner = stand_in_captioner({"model.lm_head.weight": weight, "encoder.x": torch.zeros(1)})
    with engines_vllm.streamed_weights(captioner) as tensors:
        (name, tensor), *rest = list(tensors)
    assert name == "lm_head.weight" and rest == []  # the transformers model's names, the captioner's own dropped
    assert tensor.data_ptr() == weight.data_ptr() and not tensor.requires_grad  # the parameter itself, detached


def test_sharded_weights_are_gathered_one_at_a_time_and_all_of_them_in_every_process():
    gathered: list[str] = []
    names = ["model.a.weight", "model.b.weight", "model.c.weight"]
    captioner = stand_in_captioner({name: Shard(name, gathered) for name in names})
    with engines_vllm.streamed_weights(captioner) as tensors:
        assert gathered == []  # nothing gathered before the engine reads
        assert next(tensors)[0] == "a.weight" and gathered == names[:1]  # one tensor whole at a time
        assert next(tensors)[0] == "b.weight" and gathered == names[:2]
    assert gathered == names  # what the engine left unread is gathered too: every process calls every collective


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_weights_are_sent_merged_and_the_policys_own_weights_never_change(tmp_path, dtype):
    """The weights sent are those peft's merge_adapter writes (the merged model's), and the captioner's base weights
    stay bit for bit what they were: merging and unmerging in place, as peft does, rounds twice (``(w + d) - d``), so
    a policy synced at every step drifted from its frozen weights (measured in bfloat16: after 1,000 syncs 43% of a
    layer's frozen weights had moved)."""
    from finecap.models import lora
    from helpers.vllm_engines import tiny_captioner

    captioner = tiny_captioner(tmp_path).to(dtype)
    lora.apply_lora(captioner, "lm", lora.LoraSpec(rank=4, alpha=8.0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in captioner.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    before = {k: v.clone() for k, v in captioner.state_dict().items()}
    layers = lora.lora_layers(captioner)
    assert layers and all(k.endswith(".base_layer.weight") for k in layers)
    # what peft's merge writes, taken from a copy (the reference the streamed weights must equal)
    module = captioner.lora_module("lm")
    module.merge_adapter()
    merged = {k: v.clone() for k, v in captioner.state_dict().items()}
    module.unmerge_adapter()
    drifted = sum(int(not torch.equal(captioner.state_dict()[k], before[k])) for k in layers)
    captioner.load_state_dict(before)  # peft's unmerge did not give every weight back (asserted below)
    for _ in range(3):  # three syncs
        with engines_vllm.streamed_weights(captioner) as tensors:
            sent = {name: t.clone() for name, t in tensors}
    state = captioner.state_dict()
    assert all(torch.equal(state[k], before[k]) for k in before)  # the policy is untouched
    for key in layers:
        name = lora.plain_name(key.removeprefix("model."))
        assert torch.equal(sent[name], merged[key]) and not torch.equal(sent[name], before[key])
    plain = {lora.plain_name(k.removeprefix("model.")) for k in before if k.startswith("model.") and "lora_" not in k}
    assert set(sent) == plain
    assert drifted > 0  # what the in-place merge and unmerge did (in float32 too, by a rounding; bfloat16: far more)


def test_no_autocast_reaches_the_engine_when_it_starts_or_loads_weights(stand_in, monkeypatch):
    """A rollout of a training step runs under the step's bf16 autocast; vLLM's engine core runs in this process, so
    its construction (the profiling pass that sizes the KV cache) and its weight loading must not see that autocast."""
    seen = []

    class LLM:
        def __init__(self, **kwargs):
            seen.append(torch.is_autocast_enabled("cpu"))

    monkeypatch.setattr(engines_vllm, "import_vllm", lambda option="": SimpleNamespace(LLM=LLM))
    monkeypatch.setattr(engines_vllm, "external_launcher", lambda options: 0)
    cfg = load(None, ["decode.engine=vllm"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
        with contextlib.ExitStack() as environment:
            engines_vllm.start_llm("folder", cfg.vllm, dtype="float32", seed=0, environment=environment)
        engine = VllmEngine.open(SimpleNamespace(device=torch.device("cpu")), cfg)
        engine.sync(SimpleNamespace())
    assert seen == [False] and stand_in.autocast == [False, False]


def test_no_autocast_reaches_the_vllm_judge_when_it_answers(monkeypatch):
    """A judged reward (qa_utility, claims with judge.name=vllm) asks its in-process vLLM during a training step, under
    the step's bf16 autocast: the judge's generate runs without it, as the captioner engine's does."""
    from finecap.boost.vllm_backend import VllmBackend

    monkeypatch.setitem(sys.modules, "vllm.exceptions", types.SimpleNamespace(VLLMClientError=RuntimeError))
    seen = []

    def generate(prompts, params, use_tqdm=False):
        seen.append(torch.is_autocast_enabled("cpu"))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1], finish_reason="stop")]) for _ in prompts]

    backend = object.__new__(VllmBackend)  # its engine and tokenizer stood in for
    backend.llm = SimpleNamespace(generate=generate)
    backend.refuse_cut_off, backend.max_new_tokens = True, 8
    backend.tokenizer = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: ["B" for _ in ids])
    monkeypatch.setattr(VllmBackend, "sampling_params", lambda self, task=None: None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert backend._answers([{"prompt": "x"}], [None]) == ["B"]
    assert seen == [False]


def test_any_run_seed_starts_an_engine_with_a_seed_vllm_accepts(monkeypatch):
    # run.seed is any integer up to 2**64 - 1 ($(date +%s%N) is 1.7e18); vLLM seeds numpy with it, which refuses a
    # seed of 2**32 or more: the engine is given it modulo 2**32 (a seed below that unchanged, + the rank)
    seeds = []

    class LLM:
        def __init__(self, **kwargs):
            np.random.seed(kwargs["seed"])  # what vLLM's set_random_seed does with it
            seeds.append(kwargs["seed"])

    monkeypatch.setattr(engines_vllm, "import_vllm", lambda option="": SimpleNamespace(LLM=LLM))
    monkeypatch.setattr(engines_vllm, "external_launcher", lambda options: 1)  # rank 1 of a launch
    cfg = load(None, ["decode.engine=vllm"])
    for seed in (1_700_000_000_000_000_000, 2**64 - 1, 7):
        with contextlib.ExitStack() as environment:
            engines_vllm.start_llm("folder", cfg.vllm, dtype="float32", seed=seed, environment=environment)
    assert seeds == [(1_700_000_000_000_000_000 + 1) % 2**32, 0, 8]
