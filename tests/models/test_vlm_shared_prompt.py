"""One prompt pass per image in the VLM's scoring forward (issue 33): the S sampled captions of an image are scored
after a single language-model pass over its prompt (the KV cache repeated to the image's rows), and the log-probs,
entropies and gradients equal those of the per-sequence computation that repeats the prompt for every caption.

Every family (LLaVA, Idefics3, Qwen2-VL with multimodal rope), prompts of different lengths (left padding), sampled
captions of different lengths (masks), with the language model trained fully and with LoRA adapters over a frozen
one. Tolerances: float32 arithmetic in another order (a cached attention against a full one), so agreement to a few
units in the 6th significant digit; an error in positions, masks or row mapping moves log-probs by whole units.
"""

from __future__ import annotations

import pytest
import torch

from finecap.config import load
from finecap.models import lora
from finecap.models.vlm import Vlm
from helpers.vlm import batch_of

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
        torch.testing.assert_close(shared[2][name], repeated[2][name], rtol=1e-4, atol=1e-6, msg=name)
    nonzero = [n for n, g in shared[2].items() if g.abs().sum() > 0]
    assert nonzero, "no gradient reached the trained parameters"


def test_the_shared_pass_runs_the_prompt_once_per_image(vlm_dirs):  # noqa: F811
    """What is saved: the language model reads every prompt position once per image, not once per sample."""
    model = Vlm.from_pretrained(vlm_dirs["llava"]).train()
    batch = batch_of(model)
    seen: list[int] = []
    hook = model.model.get_input_embeddings().register_forward_hook(lambda m, i, o: None)
    lm = model.model.model.language_model if hasattr(model.model.model, "language_model") else model.model
    handle = lm.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["inputs_embeds"].shape[0] * kwargs["inputs_embeds"].shape[1]),
        with_kwargs=True,
    )
    try:
        sequences, mask, image_index = sampled(model, len(batch["input_ids"]))
        for share in (True, False):
            model.share_prompt = share
            model(batch, sequences=sequences, mask=mask, image_index=image_index)
    finally:
        handle.remove()
        hook.remove()
    B, P = batch["prompt_ids"].shape
    N = B * S
    assert seen[:2] == [B * P, N * (L - 1)]  # shared: the prompts once, then only the caption tokens
    assert seen[2:] == [
        N * P,
        N * (L - 1),
    ]  # repeated: every prompt S times (the model's own forward), then the captions


def test_with_gradient_checkpointing_the_prompt_is_repeated_and_scores_agree(vlm_dirs):  # noqa: F811
    """Checkpointed layers drop the KV cache in training mode, so the shared pass steps aside (``shares_prompt``);
    the scores and gradients are those of the plain model."""
    from finecap.models.memory import disable_gradient_checkpointing, enable_gradient_checkpointing

    torch.manual_seed(0)
    model = Vlm.from_pretrained(vlm_dirs["qwen2_vl"]).train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    batch = batch_of(model)
    plain = scores_and_grads(model, batch, share=True)
    enable_gradient_checkpointing(model)
    assert not model.shares_prompt()
    checkpointed = scores_and_grads(model, batch, share=True)
    disable_gradient_checkpointing(model)
    assert model.shares_prompt()
    torch.testing.assert_close(checkpointed[0], plain[0], rtol=1e-5, atol=2e-5)
    for name in plain[2]:
        torch.testing.assert_close(checkpointed[2][name], plain[2][name], rtol=1e-4, atol=1e-6, msg=name)
