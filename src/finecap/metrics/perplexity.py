"""Perplexity of captions under a causal language model (any ``AutoModelForCausalLM`` name or local path).

Definition (corpus level)::

    perplexity = exp( total NLL / total predicted tokens )

summed over every caption, i.e. the token-weighted mean negative log-likelihood, exponentiated (not the mean of
per-caption perplexities). SMILE (Sec. 3.1, Table 1) reports "the language modeling perplexity of the captions with
GPT-2" and points at Hugging Face's perplexity guide, which scores one long text through a sliding window; how captions
are joined, and whether each sees the others as context, it leaves open. finecap's choice: each caption is scored as
one sequence on its own (no caption is context for another), GPT-2 style:

- The caption is tokenised with the model's own tokenizer and ``add_special_tokens=False`` (so tokenizers whose
  post-processor already adds BOS/EOS, like the world tokenizer or BERT-style ones, are not doubled up), as text: a
  special token's text in a caption (``<|endoftext|>``) is its characters (:func:`finecap.data.targets.text_ids`).
- A start token is prepended and **not** predicted: the tokenizer's ``bos_token_id``, else its ``eos_token_id``
  (GPT-2 has ``bos == eos == <|endoftext|>``, so this is the usual ``<|endoftext|> caption``). A tokenizer with
  neither gets no start token and its first caption token is not predicted (it is still context).
- An end token is appended and **predicted**: ``eos_token_id`` (GPT-2: ``<|endoftext|>``), so a model that would
  continue the caption is penalised. ``add_eos=False`` scores the caption tokens only.
- So a caption of ``n`` tokens contributes ``n + 1`` predicted tokens (``n`` without EOS; ``n`` again when there is
  no start token). An empty caption contributes just the EOS prediction.
- Sequences longer than the model's position limit (``n_positions`` / ``max_position_embeddings``) are truncated at
  the end (the EOS is then dropped with the tail); this is counted in ``perplexity/truncated``.
- Text is scored as given (no lower-casing or stripping of punctuation): perplexity depends on the tokenizer, so
  compare captioners under the same language model only.

Example (``lm_dir``: a folder saved like a Hub checkpoint, where a user would name ``"gpt2"``; here a tiny GPT-2
whose weights are all zero, so it gives each of the V tokens of its vocabulary the same probability and its
perplexity is V)::

    >>> ppl = Perplexity(lm_dir)
    >>> scores = ppl({1: "a red circle", 2: "a blue star"})
    >>> scores["perplexity/tokens"]  # 3 words + EOS per caption
    8.0
    >>> round(scores["perplexity"], 3), len(ppl.tokenizer)
    (74.0, 74)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from finecap.data.targets import text_ids

__all__ = ["Perplexity", "perplexity"]


class Perplexity:
    """Perplexity of captions under a causal LM; the model and tokenizer are loaded once.

    Args:
        model: an ``AutoModelForCausalLM`` name or path, or an already loaded model.
        tokenizer: the model's tokenizer (default: loaded from ``model`` when that is a name or path).
        batch_size: captions per forward pass.
        device: torch device (default: CPU, or the loaded model's device); a model named by its path is read straight
            onto a CUDA device (:func:`finecap.models.memory.loading_onto`).
        add_eos: predict an end-of-sequence token after each caption (module docstring).
    """

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        *,
        batch_size: int = 32,
        device: str | torch.device | None = None,
        add_eos: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"perplexity batch_size must be >= 1, got {batch_size}")
        if isinstance(model, str | Path):
            from finecap.models.memory import loading_onto, placement

            name = str(model)
            try:
                with loading_onto(device):  # a CUDA device's weights read straight onto it, not into host memory
                    loaded = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=False, **placement())
            except (OSError, ValueError) as e:
                raise ValueError(f"perplexity language model {name!r} (eval.lm) cannot be loaded: {e}") from None
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
            model = loaded
        elif tokenizer is None:
            raise ValueError("Perplexity: a tokenizer is needed when the model is passed as an object")
        self.model = model.eval()
        if device is not None:
            self.model.to(device)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.add_eos = add_eos
        self.start_id = _first_int(tokenizer.bos_token_id, tokenizer.eos_token_id)
        self.eos_id = _first_int(tokenizer.eos_token_id) if add_eos else None
        if add_eos and self.eos_id is None:
            raise ValueError("Perplexity: the tokenizer has no eos_token_id; pass add_eos=False")
        pad = _first_int(tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        self.pad_id = int(pad)  # padding positions are masked out; the id only has to exist in the vocabulary
        cfg = self.model.config
        self.max_length = int(
            getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None) or 1_000_000
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, captions: Sequence[str]) -> list[list[int]]:
        """Token ids of each caption: ``[start] + caption tokens + [eos]`` (see the module docstring)."""
        enc = text_ids(self.tokenizer, captions)  # a special token's text in a caption is text
        out = []
        for ids in enc:
            seq = ([self.start_id] if self.start_id is not None else []) + list(ids)
            if self.eos_id is not None:
                seq.append(self.eos_id)
            out.append(seq)
        return out

    @torch.no_grad()
    def nll(self, captions: Sequence[str]) -> tuple[list[float], list[int], int]:
        """Per caption: summed NLL (nats) and number of predicted tokens; plus the number of truncated captions."""
        seqs = self.encode(captions)
        truncated = sum(len(s) > self.max_length for s in seqs)
        seqs = [s[: self.max_length] for s in seqs]
        # Sort by length so batches pad little; results are put back in the input order.
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        sums, counts = [0.0] * len(seqs), [0] * len(seqs)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            length = max(len(seqs[i]) for i in idx)
            if length == 0:  # empty captions without a start or end token: nothing to predict, no forward pass
                continue
            ids = torch.full((len(idx), length), self.pad_id, dtype=torch.long)  # (B, T)
            mask = torch.zeros((len(idx), length), dtype=torch.long)  # (B, T)
            for row, i in enumerate(idx):
                ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[row, : len(seqs[i])] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            logits = self.model(input_ids=ids, attention_mask=mask).logits.float()  # (B, T, V)
            logp = F.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V): position t predicts token t+1
            target = ids[:, 1:]  # (B, T-1)
            token_nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
            predicted = mask[:, 1:].float()  # (B, T-1): every real token after the first is predicted
            per_seq = (token_nll * predicted).sum(dim=1)  # (B,)
            n_pred = predicted.sum(dim=1)  # (B,)
            for row, i in enumerate(idx):
                sums[i] = float(per_seq[row])
                counts[i] = int(n_pred[row])
        return sums, counts, truncated

    def per_item(self, predictions: Mapping[Hashable, str]) -> dict[Hashable, float]:
        """Perplexity of each caption on its own: ``exp(NLL / predicted tokens)`` (``nan`` with no token)."""
        ids = list(predictions)
        sums, counts, _ = self.nll([predictions[i] for i in ids])
        return {i: math.exp(s / c) if c else math.nan for i, s, c in zip(ids, sums, counts)}

    def __call__(
        self, predictions: Mapping[Hashable, str] | Sequence[str], references: Any = None
    ) -> dict[str, float]:
        """``perplexity`` (corpus, token-weighted), ``perplexity/nll`` (nats per token), ``perplexity/tokens``
        (predicted tokens) and ``perplexity/truncated`` (captions cut at the position limit)."""
        captions = list(predictions.values()) if isinstance(predictions, Mapping) else list(predictions)
        if not captions:
            raise ValueError("perplexity: no captions to score")
        bad = [c for c in captions if not isinstance(c, str)]
        if bad:
            raise ValueError(f"perplexity: captions must be strings, got {bad[0]!r}")
        sums, counts, truncated = self.nll(captions)
        total = sum(counts)
        if total == 0:
            raise ValueError("perplexity: no token to predict (empty captions without EOS)")
        nll = sum(sums) / total
        return {
            "perplexity": math.exp(nll),
            "perplexity/nll": nll,
            "perplexity/tokens": float(total),
            "perplexity/truncated": float(truncated),
        }


def perplexity(
    predictions: Mapping[Hashable, str] | Sequence[str],
    model: str | Path | Any,
    tokenizer: Any = None,
    *,
    batch_size: int = 32,
    device: str | torch.device | None = None,
    add_eos: bool = True,
) -> dict[str, float]:
    """One-shot :class:`Perplexity` (loads the model each call; keep a :class:`Perplexity` to score repeatedly)."""
    return Perplexity(model, tokenizer, batch_size=batch_size, device=device, add_eos=add_eos)(predictions)


def _first_int(*values: Any) -> int | None:
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None
