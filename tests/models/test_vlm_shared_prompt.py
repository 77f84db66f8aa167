"""One prompt pass per image in the VLM's scoring forward (issue 33): the S sampled captions of an image are scored
after a single language-model pass over its prompt (the KV cache repeated to the image's rows), and the log-probs,
entropies and gradients equal those of the per-sequence computation that repeats the prompt for every caption.

Every family (LLaVA, Idefics3, Qwen2-VL with multimodal rope), prompts of different lengths (left padding), sampled
captions of different lengths (masks), with the language model trained fully and with LoRA adapters over a frozen
one. Tolerances: float32 arithmetic in another order (a cached attention against a full one), so agreement to a few
units in the 6th significant digit; an error in positions, masks or row mapping moves log-probs by whole units.

Under gradient checkpointing (issue 65) the prompt is still shared: for every tiny family
(:data:`finecap.models.tiny.BUILDERS`), with LoRA on the language model, the log-probs, entropies and gradients of the
shared prompt under checkpointing equal (1e-5 relative, in norm) those of the prompt repeated per caption without
checkpointing, as do the shared prompt without checkpointing and the repeated one with it; checkpointing is seen to
run (the first layer runs again in the backward pass), and the language model reads fewer positions when sharing.
"""

from __future__ import annotations

import pytest
import torch

from finecap.config import load
from finecap.models import lora, memory
from finecap.models.base import module_path
from finecap.models.tiny import BUILDERS
from finecap.models.vlm import Vlm
from helpers.vlm import batch_of
from helpers.vlm_families import family_id, tiny_family

S = 3  # samples per image
L = 6  # sampled caption length (stop token included, padded after it)


def sampled(model: Vlm, n_images: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random caption token ids ``(n_images * S, L)``, masks with different lengths, and the image of each row."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.model.get_output_embeddings().weight.shape[0]
    sequences = torch.randint(0, vocab, (n_images * S, L), generator=g)
    lengths = torch.randint(1, L + 1, (n_images * S,), generator=g)
    mask = torch.arange(L)[None] < lengths[:, None]  # (N, L)
    image_index = torch.arange(n_images).repeat_interleave(S)  # (N,)
    return sequences, mask, image_index


def scores_and_grads(model: Vlm, batch: dict, share: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    model.share_prompt = share
    model.zero_grad(set_to_none=True)
    sequences, mask, image_index = sampled(model, len(batch["input_ids"]), seed)
    out = model(batch, sequences=sequences, mask=mask, image_index=image_index, temperature=0.7, with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, out.logprobs.numel()).view_as(out.logprobs)  # an advantage per token
    ((out.logprobs * weights).sum() + 0.1 * out.entropy.sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logprobs.detach(), out.entropy.detach(), grads


@pytest.mark.parametrize("adapters", [False, True], ids=["full", "lora"])
def test_shared_prompt_scores_equal_the_per_sequence_computation(vlm_dirs, family, adapters):  # noqa: F811
    torch.manual_seed(0)
    model = Vlm.from_pretrained(vlm_dirs[family])
    if adapters:
        cfg = load(None, ["model.kind=vlm", f"vlm.name={vlm_dirs[family]}", "lora.lm=true", "lora.rank=4",
                          "lora.alpha=8"])  # fmt: skip
        model = lora.configure_training(model, cfg)
        with torch.no_grad():  # fresh adapters output zero: move them so their gradient path is exercised
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    model.train()
    model.model.config.use_cache = True
    for m in model.modules():  # dropout off: both computations must see the same function
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    batch = batch_of(model)
    assert batch["prompt_mask"].float().mean() < 1 or family != "qwen2_vl"  # Qwen2-VL prompts differ in length
    shared = scores_and_grads(model, batch, share=True)
    repeated = scores_and_grads(model, batch, share=False)
    torch.testing.assert_close(shared[0], repeated[0], rtol=1e-5, atol=2e-5)  # log-probs (N, L)
    torch.testing.assert_close(shared[1], repeated[1], rtol=1e-5, atol=2e-5)  # entropies
    assert shared[2].keys() == repeated[2].keys() and shared[2]
    if adapters:  # only adapters and the projector train (Qwen2-VL's merger is inside its vision tower: frozen)
        projector = f"model.{model.family.projector}."
        assert all("lora_" in n or n.startswith(projector) for n in shared[2]), list(shared[2])[:5]
    for name in shared[2]:
        # an entry summed over many positions keeps the rounding of its terms when they cancel (an embedding row of
        # 0.0037 from terms near 10 differed by 1.4e-6 on an Intel Xeon): the absolute tolerance is the 6th digit of
        # the tensor's largest entry, not of the entry itself
        atol = 1e-6 * max(1.0, repeated[2][name].abs().max().item())
        torch.testing.assert_close(shared[2][name], repeated[2][name], rtol=1e-4, atol=atol, msg=name)
    nonzero = [n for n, g in shared[2].items() if g.abs().sum() > 0]
    assert nonzero, "no gradient reached the trained parameters"


def first_layer(model: Vlm) -> torch.nn.Module:
    """The language model's first decoder layer."""
    lm = module_path(model.model, model.family.language_model)
    return next(m for n, m in lm.named_modules() if n.endswith("layers.0"))


def lora_family(family: str) -> Vlm:
    """A tiny ``family`` VLM (float32) with LoRA on its language model (B drawn at random so the adapters matter) and
    its projector training; dropout off, so that every computation sees the same function."""
    model, processor = tiny_family(family)
    cfg = load(None, ["model.kind=vlm", "lora.lm=true", "lora.rank=4", "lora.alpha=8"])
    vlm = lora.configure_training(Vlm(model, processor, source=family), cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in vlm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    for m in vlm.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return vlm.train()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in the Frobenius norm."""
    return float((a - b).norm() / b.norm())


def scored(model: Vlm, batch: dict, share: bool, checkpointing: bool) -> tuple[tuple, tuple[int, int]]:
    """:func:`scores_and_grads` with checkpointing on or off, and how often the first layer ran in the forward and in
    the backward pass (counted at one of its linear layers)."""
    if checkpointing:
        memory.enable_gradient_checkpointing(model)
    else:
        memory.disable_gradient_checkpointing(model)
    layer = first_layer(model)
    linear = next(m for m in layer.modules() if isinstance(m, torch.nn.Linear))
    calls: list[int] = []
    handle = linear.register_forward_hook(lambda *_: calls.append(1))
    try:
        model.share_prompt = share
        model.zero_grad(set_to_none=True)
        sequences, mask, image_index = sampled(model, len(batch["input_ids"]))
        # no image token in a caption: the repeated prompt is then the model's own forward over prompt and caption,
        # a reference independent of the shared pass (which scores a caption holding one: Vlm.caption_logits)
        image = sequences == model.image_token_id
        sequences = sequences.masked_fill(image, (model.image_token_id + 1) % model.tokenizer.vocab_size)
        out = model(batch, sequences=sequences, mask=mask, image_index=image_index, temperature=0.7,
                    with_entropy=True)  # fmt: skip
        forward = len(calls)
        weights = torch.linspace(-1.0, 1.0, out.logprobs.numel()).view_as(out.logprobs)
        ((out.logprobs * weights).sum() + 0.1 * out.entropy.sum()).backward()
    finally:
        handle.remove()
        memory.disable_gradient_checkpointing(model)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return (out.logprobs.detach(), out.entropy.detach(), grads), (forward, len(calls) - forward)


@pytest.mark.parametrize("family", sorted(BUILDERS), ids=[family_id(f) for f in sorted(BUILDERS)])
def test_under_checkpointing_the_shared_prompt_gives_the_repeated_prompts_scores_and_gradients(family):
    """The prompt repeated per caption without checkpointing is the reference; the shared prompt, checkpointed or
    not, and the repeated prompt checkpointed give its log-probs, entropies and LoRA / projector gradients (1e-5
    relative); a sharing model under checkpointing says so (``shares_prompt``), runs two passes (the prompt's, the
    captions') and recomputes the first layer of each in the backward pass; the repeated prompt is one own forward
    (:meth:`Vlm.caption_logits`), recomputed under checkpointing."""
    torch.manual_seed(0)
    model = lora_family(family)
    batch = batch_of(model)
    reference, (_, again) = scored(model, batch, share=False, checkpointing=False)
    assert again == 0
    model.share_prompt = True
    memory.enable_gradient_checkpointing(model)
    assert model.shares_prompt()
    memory.disable_gradient_checkpointing(model)
    projectors = tuple(f"model.{p}." for p in model.family.projectors)  # Qwen3-VL's DeepStack mergers too
    grads = reference[2]
    assert grads and all("lora_" in n or n.startswith(projectors) for n in grads), list(grads)[:5]
    assert all(any(n.startswith(p) for n in grads) for p in projectors) and any("lora_" in n for n in grads)
    # every adapter and projector gets a gradient, but a DeepStack merger whose features join after the last decoder
    # layer (the tiny Qwen3-VL's second of 2): they change only the image positions' outputs, which no caption reads
    config = model.model.config
    layers, deep = config.text_config.num_hidden_layers, len(getattr(config.vision_config, "deepstack_visual_indexes",
                                                                     None) or ())  # fmt: skip
    late = tuple(f"model.model.visual.deepstack_merger_list.{k}." for k in range(layers - 1, deep))
    assert all(g.norm() > 0 for n, g in grads.items() if not (late and n.startswith(late)))
    for share, checkpointing in ((True, True), (False, True), (True, False)):
        (logprobs, entropy, other), (forward, again) = scored(model, batch, share, checkpointing)
        where = f"share={share}, checkpointing={checkpointing}"
        assert forward == (2 if share else 1), where
        assert again == (forward if checkpointing else 0), where
        assert relative(logprobs, reference[0]) <= 1e-5, where
        assert relative(entropy, reference[1]) <= 1e-5, where
        assert other.keys() == grads.keys(), where
        for name, grad in grads.items():
            if late and name.startswith(late):  # zero in both (see above)
                assert not other[name].any() and not grad.any(), (where, name)
                continue
            assert relative(other[name], grad) <= 1e-5, (where, name, relative(other[name], grad))


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_the_shared_pass_runs_the_prompt_once_per_image(vlm_dirs, checkpointing):  # noqa: F811
    """What is saved, with and without gradient checkpointing: the language model reads every prompt position once
    per image, not once per sample (positions counted at its first decoder layer's forward calls)."""
    model = Vlm.from_pretrained(vlm_dirs["llava"]).train()
    if checkpointing:
        memory.enable_gradient_checkpointing(model)
    batch = batch_of(model)
    layer = first_layer(model)
    seen: list[int] = []
    handle = layer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"]).shape[:2].numel()),
        with_kwargs=True,
    )
    try:
        sequences, mask, image_index = sampled(model, len(batch["input_ids"]))
        for share in (True, False):
            model.share_prompt = share
            assert model.shares_prompt() == share
            model(batch, sequences=sequences, mask=mask, image_index=image_index).logprobs.sum().backward()
    finally:
        handle.remove()
    B, P = batch["prompt_ids"].shape
    N = B * S
    assert seen[:2] == [B * P, N * (L - 1)]  # shared: the prompts once, then only the caption tokens
    # repeated: every prompt S times, in one own forward with the captions (or, where a random caption holds the image
    # token, a pass over the repeated prompts and one over the captions)
    assert sum(seen[2:]) == N * (P + L - 1)
