"""RL rollouts on vLLM (``decode.engine=vllm``, :mod:`finecap.engines.rollouts`): SCST on a tiny Idefics3 captioner
in float32, 3 optimizer steps, with full weights and with LoRA adapters on the language model. At each step the
rollout's own weight sync leaves the engine's greedy captions and log-probs equal to the policy's (and an optimizer
step makes them differ until the next rollout syncs); TRL's importance ratio of every sampled token is 1 within 1e-4;
the losses are finite. Then ``finecap train``'s path: GRPO (group advantages, the clipped surrogate over 2 iterations
per rollout) with tempered log-probs (``rl.scaled_logprob``, vLLM's ``processed_logprobs``) on a tiny world, logged
mismatch and weight-sync times. And an engine start leaves the process's random generators as they were.

One engine at a time in this process (each closed before the next starts)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.vllm_engines import NOT_HERE, tiny_captioner

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import DecodeConfig, RLConfig, VllmConfig, WorldConfig, load  # noqa: E402
from finecap.contract import StepInfo  # noqa: E402
from finecap.data.datasets import model_collator  # noqa: E402
from finecap.models import lora  # noqa: E402
from finecap.objectives.baselines import build_baseline  # noqa: E402
from finecap.objectives.reinforce import Reinforce  # noqa: E402
from finecap.rewards.base import RewardOutput, WeightedSum  # noqa: E402
from helpers.contexts import training_context  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

VLLM = VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28)
GREEDY = DecodeConfig(max_length=10)
IMAGES = images(4)
STEPS = 3


def words(captions, batch):
    """A reward that differs between an image's samples (their number of words), so every step moves the policy."""
    return RewardOutput(torch.tensor([float(len(c.split())) for c in captions]))


def batch_at(captioner, step):
    """The 4 images as a training micro-batch of optimizer step ``step`` (seeded sampling, the PIL images kept)."""
    items = [{"caption": "a b", "image": im, "image_id": i, "references": ["a b"], "index": i}
             for i, im in enumerate(IMAGES)]  # fmt: skip
    batch = model_collator(captioner, 12, keep_images=True)(items)
    batch["step_info"] = StepInfo(step, list(range(len(IMAGES))), {})
    return batch


def greedy_of(captioner, engine):
    with torch.no_grad():
        return captioner.generate(captioner.encoder.preprocess(IMAGES), GREEDY), engine.generate_images(IMAGES, GREEDY)


def engine_is_stale(moved, stale) -> bool:
    """Whether the engine's greedy captions (``stale``) are not the moved policy's (``moved``): other captions (of
    another length too: the comparison of their log-probs crashed on a step whose greedy captions the update had
    made shorter, one run in two on the AMD EPYC of 2026-11-29), or the same ones with log-probs apart by more than
    1e-3. A synced engine gives the policy's captions and log-probs (the equality checks before the step)."""
    if moved.sequences.shape != stale.sequences.shape or not torch.equal(moved.sequences, stale.sequences):
        return True
    return bool((moved.token_logprobs - stale.token_logprobs).abs().max() > 1e-3)


def run_scst(captioner):
    """``STEPS`` SCST steps with rollouts on vLLM, checking the engine against the policy at each one; returns the
    per-step metrics."""
    rl = RLConfig(samples=3)
    objective = Reinforce(WeightedSum({"words": (1.0, words)}), build_baseline(rl), rl=rl,
                          decode=DecodeConfig(engine="vllm", max_length=10), vllm=VLLM)  # fmt: skip
    objective.setup(training_context([]))
    optimizer = torch.optim.Adam([p for p in captioner.parameters() if p.requires_grad], lr=1e-2)
    logged = []
    try:
        for step in range(STEPS):
            captioner.train()
            out = objective(captioner, batch_at(captioner, step))  # the rollout syncs the engine first (step >= 1)
            engine = objective.rollouts.engine
            captioner.eval()
            ours, theirs = greedy_of(captioner, engine)
            assert torch.equal(theirs.sequences, ours.sequences), step
            torch.testing.assert_close(theirs.token_logprobs, ours.token_logprobs, atol=1e-5, rtol=0)
            m = out.metrics
            assert 1 - 1e-4 <= m["vllm/is_ratio/min"] <= m["vllm/is_ratio/max"] <= 1 + 1e-4, m
            assert m["vllm/logp_diff/max"] < 1e-4
            loss = sum(out.losses.values())
            assert math.isfinite(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            objective.end_step()
            moved, stale = greedy_of(captioner, engine)  # the policy moved; the engine waits for the next rollout
            assert engine_is_stale(moved, stale), step
            logged.append(m)
        synced = objective.rollouts.generator(captioner)  # what the next rollout would decode with
        assert synced is engine  # synced in place, never rebuilt
        ours, theirs = greedy_of(captioner, synced)
        assert torch.equal(theirs.sequences, ours.sequences)
        torch.testing.assert_close(theirs.token_logprobs, ours.token_logprobs, atol=1e-5, rtol=0)
    finally:
        objective.close()
    assert objective.rollouts.engine is None
    return logged


def test_scst_on_vllm_rollouts_keeps_the_engine_in_step_with_the_policy(tmp_path):
    logged = run_scst(tiny_captioner(tmp_path / "vlm"))
    assert logged[0]["time/sync"] > 0  # the engine is built at the first rollout
    assert all(m["time/sync"] > 0 for m in logged[1:])  # and sent the policy's weights at the next ones


def test_scst_on_vllm_rollouts_with_lora_adapters(tmp_path):
    captioner = tiny_captioner(tmp_path / "vlm")
    lora.apply_lora(captioner, "lm", lora.LoraSpec(rank=4, alpha=8.0))
    run_scst(captioner)  # the adapters' update reaches the engine merged into the weights
    assert lora.has_adapters(captioner) and not lora.adapters_are_identity(captioner)  # kept, unmerged, trained


def test_an_engine_start_leaves_the_random_generators_as_they_were(tmp_path):
    from finecap.engines.vllm import VllmEngine

    captioner = tiny_captioner(tmp_path / "vlm")
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    VllmEngine.from_captioner(captioner, VLLM).close()  # vLLM reseeds torch when it starts
    assert torch.equal(torch.rand(3), expected)


def test_grpo_trains_with_vllm_rollouts_and_tempered_log_probs(tmp_path):
    from finecap.models.presets import save_tiny_vlm
    from finecap.train.run import train
    from finecap.world.make import make_world

    world = make_world(WorldConfig(n_train=8, n_val=4, n_test=4, image_size=32, seed=0), out=tmp_path / "world",
                       progress=False)  # fmt: skip
    folder = save_tiny_vlm(tmp_path / "vlm", "idefics3", std=0.1, hidden=64, heads=2, kv_heads=1)
    cfg = load(None, [
        f"world.out={world}", "world.n_train=8", "world.n_val=4", "world.n_test=4", "world.image_size=32",
        "model.kind=vlm", f"vlm.name={folder}", f"run.dir={tmp_path / 'run'}", f"run.cache_dir={tmp_path / 'cache'}",
        "train.objective=reinforce", "grpo.advantage=group", "grpo.policy_loss=clipped", "rl.samples=3",
        "grpo.iterations=2", "rl.temperature=0.7", "rl.scaled_logprob=true", "grpo.kl_coef=0.05",
        "decode.engine=vllm", "decode.max_length=8", "vllm.max_model_len=128", "vllm.kv_cache_memory_bytes=268435456",
        "train.max_steps=4", "train.batch_size=4", "train.lr=1e-2", "train.warmup_steps=0", "train.log_every=1",
        "train.eval_samples=4", "train.log_captions=0",
    ])  # fmt: skip
    run_dir = train(cfg)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [e["values"] for e in events if e["split"] == "train"]
    assert len(values) == 4
    for v in values:
        assert math.isfinite(v["loss"])
        assert 1 - 1e-4 <= v["vllm/is_ratio/min"] <= v["vllm/is_ratio/max"] <= 1 + 1e-4, v
        assert v["vllm/logp_diff/mean"] < 1e-4
    # steps 1 and 3 roll out (engine built, then synced), steps 2 and 4 reuse the rollout (grpo.iterations=2)
    assert values[0]["time/sync"] > 0 and values[2]["time/sync"] > 0
    assert values[1]["time/sync"] == values[3]["time/sync"] == 0.0
    assert values[0]["ratio/min"] == values[0]["ratio/max"] == 1.0
    assert values[1]["ratio/min"] < 1.0 or values[1]["ratio/max"] > 1.0  # the policy moved; the rollout is kept


def test_the_packaged_grpo_vlm_vllm_recipe_trains_from_a_fresh_home(tmp_path, monkeypatch):
    """``finecap train demo/grpo_vlm_vllm`` as a fresh clone runs it (an empty finecap home, nothing downloaded: the
    tiny Idefics3 ``vlm.name=tiny:idefics3`` is built here), for 2 steps on a smaller world: vLLM's rollouts in step
    with the policy (ratios of 1), a CIDEr-D reward and a KL logged, the run where the recipe's ``run.name`` puts
    it."""
    from finecap.train.run import train

    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    cfg = load("demo/grpo_vlm_vllm", ["train.max_steps=2", "train.eval_every=2", "train.log_every=1",
                                      "world.n_train=16", "world.n_val=8", "world.n_test=8"])  # fmt: skip
    assert cfg.vlm.name == "tiny:idefics3" and cfg.decode.engine == "vllm" and cfg.grpo.kl_coef > 0
    run_dir = train(cfg)
    assert run_dir == tmp_path / "home" / "runs" / "demo" / "grpo_vlm_vllm"
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [e["values"] for e in events if e["split"] == "train"]
    assert len(values) == 2
    for v in values:
        assert math.isfinite(v["loss"]) and v["reward/cider"] >= 0 and "kl" in v
        assert 1 - 1e-4 <= v["vllm/is_ratio/min"] <= v["vllm/is_ratio/max"] <= 1 + 1e-4, v
    assert values[0]["time/sync"] > 0 and values[1]["time/sync"] == 0.0  # one rollout, used for 2 steps
    assert (run_dir / "checkpoints" / "best").is_dir()
