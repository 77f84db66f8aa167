"""Batched decoding: greedy, beam search and sampling (temperature, top-k, top-p) over any incremental model.

The decoders drive a :class:`Stepper`, a small protocol that any autoregressive model with a cache can implement
(:class:`finecap.models.clipcap.ClipCap` implements it with the language model's KV cache):

- ``start(features) -> (logits (B, V), state)``: logits of the first token given the conditioning of B images
  (a tensor ``(B, ...)``, or any object with ``len()`` = B, e.g. a decoder-only VLM's prompt),
- ``step(tokens (N,), state) -> (logits (N, V), state)``: feed one token per row, get the next logits,
- ``select(state, index (M,)) -> state``: keep/repeat/reorder rows of the state (beam reordering, repeats).

Every decoder returns a :class:`Generation`: ``sequences (N, L)`` with the stop token included and padded with the
pad id after it, ``token_logprobs (N, L)`` (0 at padding), ``lengths (N,)``, ``image_index (N,)`` (rows of one image
are contiguous: image ``i`` owns rows ``i*n ... i*n+n-1``) and ``scores (N,)``.

Conventions chosen here (the papers leave them open):

- **Log-probs are of the model's own distribution** (temperature 1, before top-k/top-p truncation), whatever the
  decoding strategy, so they equal the captioner's ``forward(batch, sequences=..., temperature=1.0).logprobs``. The
  sampling distribution's log-probs (temperature-scaled, NDLB-style) come from ``forward(..., temperature=T)``, with
  gradient.
- **Seeded sampling**: with per-image ``seeds``, a draw is ``argmax(logits / T + G)`` with Gumbel noise ``G`` that is
  a pure function of (image seed, sample number, position, token id) (:func:`seeded_gumbel`, a counter-based hash),
  i.e. a draw from the same distribution that does not depend on which other images share the batch.
- **Greedy ignores temperature/top-k/top-p** (argmax is invariant to temperature); beam search uses the model's
  log-probs at temperature 1.
- **Beam search** ranks hypotheses by ``sum(logprob) / length ** length_penalty`` (length counts the stop token;
  hypotheses still alive at ``max_length`` end there without one) and returns the best ones with these scores, best
  first per image. What happens to a hypothesis that ends is ``decode.finished_beams``:

  - ``keep`` (default; ClipCap's reference ``generate_beam``, which the papers' ClipCap numbers come from): a
    finished beam stays in its slot with exactly one continuation, itself (pad token, log-prob 0, length and score
    unchanged), and competes for the ``beam_size`` slots with the extensions of live beams; live beams all have the
    same length at a step, so the penalty only matters when a finished beam competes with live ones. Decoding ends
    when every beam has finished or at ``max_length``. It stays the default so that existing recipes, the demo's
    numbers and the reproductions do not change.
  - ``set_aside`` (transformers' ``generate(num_beams=K)``, :func:`_beam_set_aside`, tested token for token against
    it on ClipCap, BLIP and the VLM families): a hypothesis that ends among the step's K best candidates moves to a
    set of K finished ones and K live beams go on; ``decode.early_stopping`` is ``generate``'s (``false``: stop an
    image when its best live beam, scored at its current length, cannot beat its worst finished one; ``true``: as
    soon as K hypotheses finished; ``never``: when it cannot even at ``max_length``). Choose it to get what
    ``generate`` (and the ``generation_config.json`` finecap saves) gives, e.g. for a Hub VLM.

  The two agree while no hypothesis ends before the last step; once one does they can choose different captions
  (on the tiny ClipCap of ``tests/app/test_caption_command.py``, 0 of 8 beam-3 captions under ``keep`` equal
  ``generate``'s, 8 of 8 under ``set_aside``).
- **Stopping**: a row stops at EOS, and with ``stop_at_period`` also at a period token (kept in the caption, no EOS
  added after it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from finecap.config import DecodeConfig

Conditioning = Any
"""What a :class:`Stepper` starts from: the conditioning of B images, a tensor ``(B, ...)`` (ClipCap's features, BLIP's
image tokens) or any object with ``len()`` = B whose rows ``x[index]`` select images (a VLM's prompt)."""


class Stepper(Protocol):
    def start(self, features: Conditioning) -> tuple[torch.Tensor, Any]: ...

    def step(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]: ...

    def select(self, state: Any, index: torch.Tensor) -> Any: ...


@dataclass
class Generation:
    """Decoded captions, ``N = B * num_return_sequences`` rows, rows of one image contiguous."""

    sequences: torch.Tensor  # (N, L) long, stop token included, pad id after it
    token_logprobs: torch.Tensor  # (N, L) float, model log-prob of each token (temperature 1), 0 at padding
    lengths: torch.Tensor  # (N,) long, tokens up to and including the stop token
    image_index: torch.Tensor  # (N,) long, row -> image of the decoded batch
    scores: torch.Tensor  # (N,) float: summed log-probs (greedy/sample) or length-penalised beam score
    texts: list[str] = field(default_factory=list)  # (N,) decoded captions without special tokens

    @property
    def mask(self) -> torch.Tensor:
        """``(N, L)`` bool, True on real tokens (stop token included)."""
        return torch.arange(self.sequences.shape[1], device=self.lengths.device)[None, :] < self.lengths[:, None]

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def to(self, device: torch.device | str) -> Generation:
        """The same captions with every tensor on ``device``."""
        move = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.name != "texts"}
        return Generation(**move, texts=list(self.texts))


# --------------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------------


def stop_token_ids(tokenizer: Any, stop_at_period: bool = False, ends: Sequence[int] | None = None) -> list[int]:
    """The tokens decoding stops at: ``ends``, the tokens that end a caption, the caption's own end token first
    (a captioner's :attr:`~finecap.models.base.CaptionerBase.end_token_ids`; default the tokenizer's EOS), plus with
    ``stop_at_period`` every single-token spelling of a period the tokenizer has: alone (``"."``, ``" ."``) and right
    after a word (``"dog."`` less ``"dog"``: a SentencePiece tokenizer, Llama's, encodes ``"."`` alone as the
    word-start ``"▁."``, while a caption's period after a word is the plain ``"."``); none for the world tokenizer,
    which has no punctuation."""
    if ends is None and tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no EOS token; decoding needs one to stop")
    ids = [int(tokenizer.eos_token_id)] if ends is None else list(dict.fromkeys(int(t) for t in ends))
    if stop_at_period:
        found = []
        for text in (".", " ."):
            enc = tokenizer.encode(text, add_special_tokens=False)
            found += enc if len(enc) == 1 else []
        word = tokenizer.encode("dog", add_special_tokens=False)
        after = tokenizer.encode("dog.", add_special_tokens=False)
        if len(after) == len(word) + 1 and after[: len(word)] == word:
            found.append(after[-1])
        for token in found:
            if token != tokenizer.unk_token_id and int(token) not in ids:
                ids.append(int(token))
    return ids


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k and outside the nucleus to -inf. ``logits (N, V)``.

    top-k keeps the k largest logits (ties with the k-th are kept); top-p keeps the smallest set of most likely
    tokens whose probability mass reaches ``top_p`` (the most likely token is always kept). Both are transformers'
    ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (``min_tokens_to_keep=1``, what ``generate(do_sample=True)``
    applies after the temperature) operation for operation, so that the nucleus is ``generate``'s also where
    tokens tie at its edge (common with bfloat16 logits) or the mass reaches ``top_p`` exactly: top-p sorts the
    logits ascending and drops the tokens whose cumulative mass, theirs and that of every less likely token, is at
    most ``1 - top_p``.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=False)  # (N, V) least likely first
        mass_up_to = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (N, V) mass of a token and the less likely ones
        remove_sorted = mass_up_to <= (1 - top_p)
        remove_sorted[..., -1:] = False  # the most likely token stays
        remove = remove_sorted.scatter(-1, order, remove_sorted)  # (N, V) back to token order
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def _check_ids(pad_id: int, stop_ids: Sequence[int], vocab: int) -> None:
    if not 0 <= pad_id < vocab:
        raise ValueError(f"pad id {pad_id} is outside the vocabulary of size {vocab}")
    if not stop_ids:
        raise ValueError("decoding needs at least one stop token id (EOS)")
    bad = [i for i in stop_ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"stop token ids {bad} are outside the vocabulary of size {vocab}")


# --------------------------------------------------------------------------------------------------------------------
# Counter-based random numbers (seeded sampling)
# --------------------------------------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing function (int64 tensor in, values in ``[0, 2**32)`` out): two xor-shift-multiply
    rounds with the constant 0x45d9f3b. Products stay below 2**58, so int64 arithmetic is exact.

    >>> hash32(torch.tensor([0, 1, 2])).tolist()
    [0, 824515495, 1722258072]
    """
    x = x.long() & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


def step_seeds(seed: int, step: int, index: torch.Tensor) -> torch.Tensor:
    """Per-example seeds ``(B,)`` from ``(seed, step, dataset index)``: what a training step draws for an example
    depends on nothing else, so not on how the global batch is split over processes and accumulation steps (each
    process's generator would otherwise replay the same stream: equal draws on every process).

    Any integer ``seed`` (``run.seed`` up to 2**64 - 1: ``$(date +%s%N)``): :func:`hash32` reads 32 bits, so the
    mix is taken modulo 2**32 before it becomes a tensor (an int64 overflowed from seeds of about 9.2e12 on).

    >>> torch.equal(step_seeds(0, 3, torch.tensor([5, 9]))[1:], step_seeds(0, 3, torch.tensor([9])))
    True
    """
    first = hash32(torch.tensor([(seed * 1_000_003 + int(step)) % 2**32]))  # (1,): the bits hash32 reads
    return hash32(first ^ hash32(torch.as_tensor(index).long().cpu()))  # (B,)


def sample_keys(seeds: torch.Tensor, n: int) -> torch.Tensor:
    """Keys ``(B*n,)`` of the ``n`` samples of each image (rows of one image contiguous, as decoders order them)."""
    j = torch.arange(n, device=seeds.device).repeat(seeds.shape[0])  # (B*n,)
    return hash32(hash32(seeds.repeat_interleave(n)) ^ hash32(j + 0x9E3779B9))


@functools.lru_cache(maxsize=8)
def token_keys(vocab: int, device: torch.device) -> torch.Tensor:
    """Keys ``(V,)`` of the token ids, computed once per vocabulary size and device (every decoding step uses them)."""
    return hash32(torch.arange(vocab, device=device) + 0x632BE5AB)


def seeded_gumbel(keys: torch.Tensor, t: int, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise ``(N, V)`` (float64) for position ``t``, a pure function of ``(keys[n], t, v)``."""
    step = hash32(keys ^ hash32(torch.full_like(keys, t + 1)))  # (N,)
    v = token_keys(vocab, keys.device)  # (V,)
    u = (hash32(step[:, None] ^ v[None, :]).double() + 0.5) / 2.0**32  # (N, V) uniform in (0, 1)
    return -torch.log(-torch.log(u))


# --------------------------------------------------------------------------------------------------------------------
# Greedy and sampling
# --------------------------------------------------------------------------------------------------------------------


def _token_loop(
    stepper: Stepper,
    features: Conditioning,
    max_length: int,
    stop_ids: Sequence[int],
    pad_id: int,
    choose: Callable[[torch.Tensor, int], torch.Tensor],
    n: int,
) -> Generation:
    """One token per row and step; ``choose(logits (N, V), t) -> tokens (N,)``."""
    logits, state = stepper.start(features)  # (B, V)
    B, V = logits.shape
    _check_ids(pad_id, stop_ids, V)
    device = logits.device
    if n > 1:
        rows = torch.arange(B, device=device).repeat_interleave(n)  # (B*n,)
        state = stepper.select(state, rows)
        logits = logits[rows]  # (B*n, V)
    N = B * n
    stop = torch.tensor(list(stop_ids), device=device)
    finished = torch.zeros(N, dtype=torch.bool, device=device)
    lengths = torch.zeros(N, dtype=torch.long, device=device)
    tokens, logprobs = [], []
    for t in range(max_length):
        if t > 0:
            logits, state = stepper.step(tokens[-1], state)  # (N, V)
        logp = F.log_softmax(logits.float(), dim=-1)  # (N, V) model distribution, temperature 1
        tok = choose(logits, t).masked_fill(finished, pad_id)  # (N,)
        lp = logp.gather(1, tok[:, None]).squeeze(1).masked_fill(finished, 0.0)  # (N,)
        tokens.append(tok)
        logprobs.append(lp)
        lengths += (~finished).long()
        finished |= torch.isin(tok, stop)
        if bool(finished.all()):
            break
    sequences = torch.stack(tokens, dim=1)  # (N, L)
    token_logprobs = torch.stack(logprobs, dim=1)  # (N, L)
    return Generation(
        sequences=sequences,
        token_logprobs=token_logprobs,
        lengths=lengths,
        image_index=torch.arange(B, device=device).repeat_interleave(n),
        scores=token_logprobs.sum(dim=1),
    )


def greedy(stepper: Stepper, features: Conditioning, cfg: DecodeConfig, stop_ids: Sequence[int],
           pad_id: int) -> Generation:  # fmt: skip
    """Arg-max decoding, one caption per image (``cfg``: a ``greedy`` section; reads ``max_length``)."""
    _expect_strategy(cfg, "greedy")
    return _token_loop(stepper, features, cfg.max_length, stop_ids, pad_id, lambda logits, t: logits.argmax(-1), 1)


def sample(
    stepper: Stepper,
    features: Conditioning,
    cfg: DecodeConfig,
    stop_ids: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
) -> Generation:
    """Ancestral sampling from ``softmax(logits / temperature)`` restricted to top-k / top-p, n captions per image
    (``cfg``: a ``sample`` section; reads ``max_length``, ``temperature``, ``top_k``, ``top_p`` and
    ``num_return_sequences``).

    Uses ``generator`` (or torch's global RNG); with ``seeds (B,)`` (one integer per image) the draws are instead a
    function of (image seed, sample number, position) only (:func:`seeded_gumbel`), so an image's samples do not
    depend on the batch it is decoded in. Returned log-probs are of the untempered model (module docstring).
    ``generator`` must be on the device of the stepper's logits (``torch.Generator(device="cuda")`` for a model on a
    GPU; ``torch.multinomial`` draws with it there): another device is a ``ValueError`` naming both.
    """
    _expect_strategy(cfg, "sample")
    n, temperature, top_k, top_p = cfg.num_return_sequences, cfg.temperature, cfg.top_k, cfg.top_p
    keys = None
    if seeds is not None:
        if seeds.shape != (len(features),):
            raise ValueError(f"sampling seeds must be one per image, (B,) = ({len(features)},)")
        keys = sample_keys(seeds, n)  # (B*n,)

    def choose(logits: torch.Tensor, t: int) -> torch.Tensor:
        scaled = filter_logits(logits.float() / temperature, top_k, top_p)  # (N, V)
        if keys is not None:  # Gumbel-max: argmax(log p + G) is a draw from p
            noise = seeded_gumbel(keys.to(scaled.device), t, scaled.shape[1])  # (N, V)
            return (scaled.double() + noise).argmax(dim=-1)  # (N,)
        if generator is not None and generator.device != scaled.device:  # torch.multinomial's own error is CUDA's
            raise ValueError(
                f"sample: the generator is on {generator.device}, the logits on {scaled.device}; make it on theirs "
                f"(torch.Generator(device={str(scaled.device)!r})), or pass seeds"
            )
        return torch.multinomial(scaled.softmax(dim=-1), 1, generator=generator).squeeze(1)  # (N,)

    return _token_loop(stepper, features, cfg.max_length, stop_ids, pad_id, choose, n)


# --------------------------------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------------------------------


def beam_search(stepper: Stepper, features: Conditioning, cfg: DecodeConfig, stop_ids: Sequence[int],
                pad_id: int) -> Generation:  # fmt: skip
    """Batched beam search; returns the ``num_return_sequences`` best hypotheses per image, best first (``cfg``: a
    ``beam`` section; reads ``max_length``, ``beam_size``, ``length_penalty``, ``num_return_sequences``,
    ``finished_beams`` and ``early_stopping``, whose rules the section checked when it was built).

    Score of a hypothesis: ``sum(logprob) / length ** length_penalty``. ``finished_beams`` picks what happens to a
    hypothesis that ends: ``"keep"`` (ClipCap's reference) or ``"set_aside"`` (transformers' ``generate``, with its
    ``early_stopping``); see the module docstring.
    """
    _expect_strategy(cfg, "beam")
    search = _beam_set_aside if cfg.finished_beams == "set_aside" else _beam_keep
    return search(stepper, features, cfg, stop_ids, pad_id)


def _beam_start(stepper: Stepper, features: Conditioning, K: int, stop_ids: Sequence[int],
                pad_id: int) -> tuple[Any, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The first step of both beam searches: the state with ``K`` rows per image, the first token's log-probs
    ``(B*K, V)`` and the stop ids as a tensor."""
    logits, state = stepper.start(features)  # (B, V)
    B, V = logits.shape
    _check_ids(pad_id, stop_ids, V)
    stop = torch.tensor(list(stop_ids), device=logits.device)
    state = stepper.select(state, torch.arange(B, device=logits.device).repeat_interleave(K))  # B*K rows
    return state, F.log_softmax(logits.float(), dim=-1).repeat_interleave(K, dim=0), stop


def _best(tokens: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor, scores: torch.Tensor,
          n: int) -> Generation:  # fmt: skip
    """The first ``n`` of the ``K`` hypotheses of each image (``tokens``, ``logprobs`` ``(B, K, L)``, ``lengths``,
    ``scores`` ``(B, K)``, best first), as a :class:`Generation` of ``B * n`` rows."""
    B, _, L = tokens.shape
    return Generation(
        sequences=tokens[:, :n].reshape(B * n, L),
        token_logprobs=logprobs[:, :n].reshape(B * n, L),
        lengths=lengths[:, :n].reshape(-1),
        image_index=torch.arange(B, device=tokens.device).repeat_interleave(n),
        scores=scores[:, :n].reshape(-1),
    )


def _beam_keep(stepper: Stepper, features: Conditioning, cfg: DecodeConfig, stop_ids: Sequence[int],
               pad_id: int) -> Generation:  # fmt: skip
    """``finished_beams="keep"``: a finished beam competes for its slot with its final score (module docstring)."""
    K, length_penalty, max_length = cfg.beam_size, cfg.length_penalty, cfg.max_length
    state, logp, stop = _beam_start(stepper, features, K, stop_ids, pad_id)  # logp (B*K, V)
    B, V, device = logp.shape[0] // K, logp.shape[1], logp.device
    sums = torch.full((B, K), float("-inf"), device=device)
    sums[:, 0] = 0.0  # one live beam per image at the start; the others are empty slots
    lengths = torch.zeros((B, K), dtype=torch.long, device=device)
    finished = torch.zeros((B, K), dtype=torch.bool, device=device)
    scores = sums.clone()
    hist_tok = torch.zeros((B * K, 0), dtype=torch.long, device=device)
    hist_lp = torch.zeros((B * K, 0), device=device)
    offsets = (torch.arange(B, device=device) * K)[:, None]  # (B, 1)
    for t in range(max_length):
        if t > 0:
            logits, state = stepper.step(hist_tok[:, -1], state)  # (B*K, V)
            logp = F.log_softmax(logits.float(), dim=-1)
        logp3 = logp.view(B, K, V)
        cand = (sums[..., None] + logp3) / (lengths[..., None] + 1).float() ** length_penalty  # (B, K, V)
        cand = cand.masked_fill(finished[..., None], float("-inf"))
        # a finished beam's single continuation: itself, scored as before (pad token, nothing added)
        kept = sums / lengths.clamp(min=1).float() ** length_penalty  # (B, K)
        cand[..., pad_id] = torch.where(finished, kept, cand[..., pad_id])
        scores, flat_idx = cand.view(B, K * V).topk(K, dim=1)  # (B, K), sorted best first
        parent, token = flat_idx // V, flat_idx % V  # (B, K)
        parent_done = finished.gather(1, parent)  # (B, K)
        tok_lp = logp3.reshape(B, K * V).gather(1, flat_idx).masked_fill(parent_done, 0.0)  # (B, K)
        token = token.masked_fill(parent_done, pad_id)
        sums = sums.gather(1, parent) + tok_lp
        lengths = lengths.gather(1, parent) + (~parent_done).long()
        finished = parent_done | torch.isin(token, stop)
        rows = (parent + offsets).view(-1)  # (B*K,) flat parent rows
        hist_tok = torch.cat([hist_tok[rows], token.view(-1, 1)], dim=1)  # (B*K, t+1)
        hist_lp = torch.cat([hist_lp[rows], tok_lp.view(-1, 1)], dim=1)
        if bool(finished.all()) or t == max_length - 1:
            break
        state = stepper.select(state, rows)
    L = hist_tok.shape[1]
    return _best(hist_tok.view(B, K, L), hist_lp.view(B, K, L), lengths, scores, cfg.num_return_sequences)


_HUGE = 1.0e9
"""What transformers adds to a score to rule a candidate out (``-1e9``, not ``-inf``: the same float32 values)."""


def _beam_set_aside(stepper: Stepper, features: Conditioning, cfg: DecodeConfig, stop_ids: Sequence[int],
                    pad_id: int) -> Generation:  # fmt: skip
    """``finished_beams="set_aside"``: transformers' ``GenerationMixin._beam_search`` (5.x), step for step.

    Hand-rolled rather than calling ``generate``: finecap's decoders drive any :class:`Stepper` (ClipCap's prefix,
    BLIP, a VLM's prompt, toy tables) through its own cache contract and also return per-token log-probs. The tensor
    operations are transformers' own, in the same order (float32 sums, ``topk`` over the same shapes, ``-1e9``
    penalties), so ties break alike:

    1. every step takes the ``max(2, 1 + len(stop_ids)) * K`` best extensions of the K live beams (summed log-probs);
    2. the next live beams are the K best of those that did not stop (stopped ones get -1e9 and can only fill up);
    3. a candidate that stopped (stop token, or ``max_length`` reached) among the first K of step 1 joins the
       finished set, scored ``sum / length ** length_penalty``; the finished set keeps the K best;
    4. an image is done when its K finished hypotheses cannot be beaten: ``early_stopping=False`` compares the best
       live sum divided by the current length ** length_penalty with the worst finished score, ``"never"`` (with
       ``length_penalty > 0``) divides by ``max_length ** length_penalty`` instead, ``True`` stops as soon as K
       hypotheses finished. Decoding ends when every image is done, every candidate stopped, or at ``max_length``;
    5. the returned captions are the ``n`` best finished hypotheses, best first, with their scores.
    """
    K, length_penalty, max_length = cfg.beam_size, cfg.length_penalty, cfg.max_length
    early_stopping = cfg.early_stopping
    state, logp, stop = _beam_start(stepper, features, K, stop_ids, pad_id)  # logp (B*K, V)
    B, V, device = logp.shape[0] // K, logp.shape[1], logp.device
    wide = max(2, 1 + len(stop_ids)) * K  # candidates kept per step, so that K of them can stay live
    in_top_k = torch.arange(wide, device=device) < K  # (wide,)
    live = torch.zeros((B, K), dtype=torch.float32, device=device)  # summed log-probs of the live beams
    live[:, 1:] = -_HUGE  # one real beam at the start; the others only fill up
    live_tok = torch.zeros((B, K, 0), dtype=torch.long, device=device)
    live_lp = torch.zeros((B, K, 0), dtype=torch.float32, device=device)
    done_tok = torch.full((B, K, max_length), pad_id, dtype=torch.long, device=device)  # the finished set
    done_lp = torch.zeros((B, K, max_length), dtype=torch.float32, device=device)
    done_len = torch.zeros((B, K), dtype=torch.long, device=device)
    done_score = torch.full((B, K), -_HUGE, dtype=torch.float32, device=device)
    done = torch.zeros((B, K), dtype=torch.bool, device=device)  # slot holds a finished hypothesis
    improvable = torch.ones((B, 1), dtype=torch.bool, device=device)  # transformers' early-stop heuristic
    offsets = (torch.arange(B, device=device) * K)[:, None]  # (B, 1)
    for t in range(max_length):
        if t > 0:
            logits, state = stepper.step(live_tok[:, :, -1].reshape(-1), state)  # (B*K, V)
            logp = F.log_softmax(logits.float(), dim=-1)
        # 1. the `wide` best extensions
        summed = (logp.view(B, K, V) + live[:, :, None]).view(B, K * V)
        cand_sum, flat_idx = torch.topk(summed, k=wide)  # (B, wide), sorted best first
        parent, token = flat_idx // V, flat_idx % V
        cand_tok = torch.cat([live_tok.gather(1, parent[..., None].expand(-1, -1, t)), token[..., None]], dim=2)
        tok_lp = logp.view(B, K * V).gather(1, flat_idx)  # (B, wide) log-prob of the new token
        cand_lp = torch.cat([live_lp.gather(1, parent[..., None].expand(-1, -1, t)), tok_lp[..., None]], dim=2)
        stopped = torch.isin(token, stop) | (t == max_length - 1)  # (B, wide)
        # 2. the next live beams
        live_sum = cand_sum + stopped.to(torch.float32) * -_HUGE
        pick = torch.topk(live_sum, k=K)[1]  # (B, K)
        live = live_sum.gather(1, pick)
        live_tok = cand_tok.gather(1, pick[..., None].expand(-1, -1, t + 1))
        live_lp = cand_lp.gather(1, pick[..., None].expand(-1, -1, t + 1))
        rows = (parent.gather(1, pick) + offsets).view(-1)  # (B*K,) flat parent rows
        # 3. the finished set
        just_done = stopped & in_top_k[None, :]
        score = cand_sum / ((t + 1) ** length_penalty)
        if early_stopping is True:
            score += done.all(dim=1, keepdim=True).to(torch.float32) * -_HUGE
        score += (~improvable).to(torch.float32) * -_HUGE
        score += (~just_done) * -_HUGE
        merged = torch.cat([done_score, score], dim=1)  # (B, K + wide)
        keep = torch.topk(merged, k=K)[1]  # (B, K)
        done_score = merged.gather(1, keep)
        done = torch.cat([done, just_done], dim=1).gather(1, keep)
        new_tok = F.pad(cand_tok, (0, max_length - t - 1), value=pad_id)
        new_lp = F.pad(cand_lp, (0, max_length - t - 1), value=0.0)
        done_tok = torch.cat([done_tok, new_tok], dim=1).gather(1, keep[..., None].expand(-1, -1, max_length))
        done_lp = torch.cat([done_lp, new_lp], dim=1).gather(1, keep[..., None].expand(-1, -1, max_length))
        done_len = torch.cat([done_len, torch.full_like(token, t + 1)], dim=1).gather(1, keep)
        # 4. can an image's finished set still improve?
        length = max_length if (early_stopping == "never" and length_penalty > 0.0) else t + 1
        best_live = live[:, :1] / (length**length_penalty)  # (B, 1)
        worst_done = torch.where(done, done_score.min(dim=1, keepdim=True)[0], -_HUGE)  # (B, K)
        improvable = improvable & (best_live > worst_done).any(dim=-1, keepdim=True)
        all_full = bool(done.all()) and early_stopping is True
        if not bool(improvable.any()) or all_full or bool(stopped.all()):
            break
        state = stepper.select(state, rows)
    # 5. the n best finished hypotheses (at max_length every candidate stops, so K of them exist)
    n = cfg.num_return_sequences
    L = int(done_len[:, :n].max())
    return _best(done_tok[:, :, :L], done_lp[:, :, :L], done_len, done_score, n)


# --------------------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------------------


def _expect_strategy(cfg: DecodeConfig, strategy: str) -> None:
    """Refuse a ``decode`` section of another strategy than the decoder's: its options were checked for that one
    (``num_return_sequences <= beam_size`` holds for ``beam`` sections only, greedy sections return one caption)."""
    if cfg.strategy != strategy:
        raise ValueError(f"{strategy} decoding was given a decode section with strategy={cfg.strategy!r}")


def rows_per_image(cfg: DecodeConfig) -> int:
    """Sequences decoded side by side for each image: ``decode.beam_size`` beams for beam search (all of them live,
    whatever ``num_return_sequences`` returns), ``decode.num_return_sequences`` samples for sampling, 1 for greedy.

    >>> from finecap.config import DecodeConfig
    >>> rows_per_image(DecodeConfig(strategy="beam", beam_size=5, num_return_sequences=2))
    5
    """
    if cfg.strategy == "beam":
        return cfg.beam_size
    return cfg.num_return_sequences if cfg.strategy == "sample" else 1


def chunk_images(cfg: DecodeConfig) -> int:
    """Images decoded at once: as many as fit in ``decode.batch_size`` *sequences* (:func:`rows_per_image` each),
    at least one, so that beams and samples never multiply the memory of a decoding batch behind the user's back.

    >>> from finecap.config import DecodeConfig
    >>> chunk_images(DecodeConfig(strategy="beam", beam_size=5, batch_size=10))  # 2 images x 5 beams = 10 rows
    2
    >>> chunk_images(DecodeConfig(strategy="beam", beam_size=5, batch_size=3))  # one image's 5 beams, never fewer
    1
    """
    return max(1, cfg.batch_size // rows_per_image(cfg))


def texts_of(
    tokenizer: Any, generation: Generation, first_tokens: Mapping[int, int | None] | None = None
) -> list[str]:
    """Decode each row up to its length, dropping special tokens (EOS, pad): the one place where every decoding path
    (finecap's decoders through :func:`decode`, the vLLM engine) turns token ids into caption text.

    ``first_tokens``: how a row's *first* token is written, ``{id: id written instead, or None: left out}`` (ids not
    in it are written as they are): the captioner's
    :attr:`~finecap.models.base.CaptionerBase.first_token_unshift`, which undoes SMILE's first-token shifting for a
    captioner trained with it (:func:`finecap.models.first_token.unshift_first_tokens`). ``Generation.sequences``
    keep the ids decoded (their log-probs are of those).

    >>> from finecap.models.tokenizer import world_tokenizer
    >>> tok = world_tokenizer(["a", "dog", "##a"])  # ids 5, 6, 7; <eos> 4
    >>> gen = Generation(torch.tensor([[7, 6, 4], [5, 6, 4]]), torch.zeros(2, 3), torch.tensor([3, 3]),
    ...                  torch.arange(2), torch.zeros(2))
    >>> texts_of(tok, gen), texts_of(tok, gen, {7: 5})  # "##a" first is written "a"; elsewhere, as it is
    (['##a dog', 'a dog'], ['a dog', 'a dog'])
    """
    seqs = generation.sequences.tolist()
    lens = generation.lengths.tolist()
    rows = [s[:n] for s, n in zip(seqs, lens)]
    if first_tokens:
        rows = [_first_written(row, first_tokens) for row in rows]
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in rows]


def _first_written(row: list[int], first_tokens: Mapping[int, int | None]) -> list[int]:
    """``row`` with its first token written as ``first_tokens`` says (:func:`texts_of`)."""
    if not row or row[0] not in first_tokens:
        return row
    written = first_tokens[row[0]]
    return row[1:] if written is None else [written, *row[1:]]


def decode(
    stepper: Stepper,
    features: Conditioning,
    cfg: DecodeConfig,
    tokenizer: Any,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    stop_ids: Sequence[int] | None = None,
    first_tokens: Mapping[int, int | None] | None = None,
) -> Generation:
    """Decode ``features`` (the conditioning of B images: ClipCap features ``(B, D)``, BLIP image tokens
    ``(B, P, H)``, a VLM's prompt) with the strategy of ``cfg``; fills ``texts`` with ``tokenizer``. ``seeds (B,)``:
    per-image sampling seeds (see :func:`sample`; ignored by greedy and beam search). ``stop_ids``: the tokens that
    end a caption (a captioner's :meth:`~finecap.models.base.CaptionerBase.stop_token_ids`; default
    :func:`stop_token_ids` of ``tokenizer`` and ``decode.stop_at_period``). ``first_tokens``: how each caption's
    first token is written in its text (:func:`texts_of`).

    The images go in chunks of at most ``decode.batch_size`` *sequences* (images x beams or samples,
    :func:`chunk_images`), at least one image each, whose generations are concatenated."""
    stop_ids = stop_token_ids(tokenizer, cfg.stop_at_period) if stop_ids is None else list(stop_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    size = chunk_images(cfg)
    chunks = []
    for i in range(0, len(features), size):
        part, part_seeds = features[i : i + size], None if seeds is None else seeds[i : i + size]
        if cfg.strategy == "greedy":
            gen = greedy(stepper, part, cfg, stop_ids, pad_id)
        elif cfg.strategy == "beam":
            gen = beam_search(stepper, part, cfg, stop_ids, pad_id)
        else:
            gen = sample(stepper, part, cfg, stop_ids, pad_id, generator, part_seeds)
        gen.texts = texts_of(tokenizer, gen, first_tokens)
        chunks.append(gen)
    if not chunks:
        raise ValueError("decode: an empty batch (no images to caption)")
    return concat(chunks, pad_id)


def concat(generations: Sequence[Generation], pad_id: int) -> Generation:
    """Concatenate generations of consecutive image chunks (image indices are shifted, widths padded)."""
    if not generations:
        raise ValueError("nothing to concatenate")
    if len(generations) == 1:
        return generations[0]
    L = max(g.sequences.shape[1] for g in generations)
    seqs, lps, idx, offset = [], [], [], 0
    for g in generations:
        extra = L - g.sequences.shape[1]
        seqs.append(F.pad(g.sequences, (0, extra), value=pad_id))
        lps.append(F.pad(g.token_logprobs, (0, extra), value=0.0))
        idx.append(g.image_index + offset)
        offset += int(g.image_index.max()) + 1 if len(g) else 0
    return Generation(
        sequences=torch.cat(seqs),
        token_logprobs=torch.cat(lps),
        lengths=torch.cat([g.lengths for g in generations]),
        image_index=torch.cat(idx),
        scores=torch.cat([g.scores for g in generations]),
        texts=[t for g in generations for t in g.texts],
    )
