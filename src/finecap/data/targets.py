"""Captions as the captioner's training targets: token ids ending in EOS (:func:`encode_captions`), right-padded
(:func:`pad_rows`), and :data:`IGNORE_INDEX`, the label of the positions a loss skips. A caption's text is text
(:data:`AS_TEXT`, :func:`text_ids`): a special token's text in it is never read as that token.

Why here, in ``data/``: the collator (:func:`finecap.data.datasets.model_collator`) writes these targets and the
objectives (:mod:`finecap.objectives.mle`, :mod:`finecap.objectives.smile`) and the validation loss read them, so the
one module both sides import sits below both. It knows no tokenizer class: any tokenizer with an EOS token works.

Example::

    >>> from finecap.models.tokenizer import world_tokenizer
    >>> tok = world_tokenizer(["a", "red", "circle"])
    >>> encode_captions(tok, ["a red circle", "a circle"], max_tokens=8)["input_ids"].tolist()
    [[5, 6, 7, 4], [5, 7, 4, 0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100
"""The label of padding positions, which losses skip (``torch.nn.CrossEntropyLoss``'s default ``ignore_index``)."""


AS_TEXT: dict[str, Any] = {"split_special_tokens": True}
"""The option of a tokenizer call that reads its texts as text: a special token's text in a caption (``<image>``,
``<|im_end|>``, ``<end_of_turn>``, ``<|endoftext|>``, ``</s>``: web alt texts and LLM-written captions hold such
strings) is tokenised as the characters it is, never as that token (an image slot, a turn end or an EOS inside a
training target or a scored text). transformers' ``split_special_tokens``; every call that tokenises caption or
reference text passes :func:`as_text`'s options (docs/data.md#special-token-text-in-captions)."""

TEXT_ONLY_TOKENIZERS = ("MistralCommonBackend",)
"""Tokenizer classes that read every text as text and refuse ``split_special_tokens`` (a ``ValueError``):
transformers' ``MistralCommonBackend``, which ``AutoTokenizer`` loads for a Mistral 3 / Pixtral checkpoint holding
``tekken.json`` when ``mistral-common`` is installed (vLLM installs it), whose tekken encoder has no special token in
its text vocabulary (``[INST]`` or ``</s>`` in a caption are their characters)."""


def text_only(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is of :data:`TEXT_ONLY_TOKENIZERS` (mistral-common's): it reads every text as text, has
    no chat template and refuses ``split_special_tokens``."""
    return type(tokenizer).__name__ in TEXT_ONLY_TOKENIZERS


def as_text(tokenizer: Any) -> dict[str, Any]:
    """The options of a call of ``tokenizer`` that reads caption text as text: :data:`AS_TEXT`, or none for a
    tokenizer that reads text so already and refuses the option (:func:`text_only`)."""
    return {} if text_only(tokenizer) else AS_TEXT


def text_ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text as ordinary text (:func:`as_text`), no special tokens added.

    Example::

        >>> from finecap.models.tokenizer import world_tokenizer
        >>> tok = world_tokenizer(["a", "red", "circle"])
        >>> text_ids(tok, ["a red <eos> circle"])  # <eos> as text: "<", "eos", ">", three unknown words
        [[5, 6, 1, 1, 1, 7]]
    """
    return [list(r) for r in tokenizer(list(texts), add_special_tokens=False, **as_text(tokenizer))["input_ids"]]


def pad_rows(rows: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids`` (right-padded with ``pad_id``) and ``attention_mask`` of token-id rows, each ``(B, T)`` with
    ``T`` the longest row."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def eos_and_pad(tokenizer: Any, needed_by: str) -> tuple[int, int]:
    """The tokenizer's EOS id, refused when it has none (``needed_by`` ends the message: what needs one), and its pad
    id (EOS when the tokenizer has no pad token, as GPT-2's)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no EOS token; {needed_by}")
    return eos, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos


def encode_captions(
    tokenizer: Any, texts: Sequence[str], max_tokens: int, eos_token_id: int | None = None, prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Captioner targets: tokens of each text (no BOS: the image prefix starts the sequence) followed by EOS.

    Works for any tokenizer with an EOS token: texts are tokenised as text (:func:`text_ids`: without special
    tokens, and a special token's text in a caption is its characters, not that token), cut to
    ``max_tokens - 1`` tokens, EOS is appended, rows are right-padded with the pad id (EOS when the tokenizer has no
    pad token, as for GPT-2). ``eos_token_id``: the token that ends a caption when it is not the tokenizer's EOS (a
    captioner's :attr:`~finecap.models.base.CaptionerBase.eos_token_id`: Gemma 3's ``<end_of_turn>``). ``prefix``:
    text each caption is tokenised after (a captioner's ``caption_prefix``: SmolVLM's space, which its byte-level
    BPE merges into the first word, ``Ġa``, as its chat format does). Returns
    ``input_ids`` and ``attention_mask`` ``(B, T)`` with ``T <= max_tokens``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (EOS needs a place), got {max_tokens}")
    eos, pad = eos_and_pad(tokenizer, "captions need one")
    eos = eos if eos_token_id is None else int(eos_token_id)
    rows = [r[: max_tokens - 1] + [eos] for r in text_ids(tokenizer, [prefix + t for t in texts])]
    return pad_rows(rows, pad)


@dataclass(frozen=True)
class UnknownTokens:
    """How much of some captions a tokenizer cannot represent (:func:`unknown_tokens`)."""

    share: float
    """Unknown tokens over all tokens."""
    example: str
    """The caption with the most unknown tokens ("" when there are none)."""
    tokenised: str
    """That caption as the tokenizer reads it (``a <unk> <unk> in an orange <unk>``)."""


def unknown_tokens(tokenizer: Any, texts: Sequence[str], rows: Sequence[Sequence[int]] | None = None) -> UnknownTokens:
    """The share of ``texts``' tokens that ``tokenizer`` maps to its unknown token, and the worst caption. A
    tokenizer with no unknown token (byte-level BPE: GPT-2, Llama 3) never has one: share 0. The texts are read as
    the training targets read them (:func:`text_ids`); ``rows``: their ids when the caller has read them so already
    (``text_ids(tokenizer, texts)``), so that they are not tokenised twice.

    Example::

        >>> from finecap.models.tokenizer import world_tokenizer
        >>> # 6 tokens, 2 of them unknown: 2 / 6
        >>> unknown_tokens(world_tokenizer(["a", "red", "circle"]), ["a red circle", "a woman astronaut"])
        UnknownTokens(share=0.3333333333333333, example='a woman astronaut', tokenised='a <unk> <unk>')
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not texts:
        return UnknownTokens(0.0, "", "")
    rows = text_ids(tokenizer, texts) if rows is None else rows
    counts = [sum(t == unk for t in row) for row in rows]
    total = sum(map(len, rows))
    worst = max(range(len(rows)), key=counts.__getitem__)
    if not counts[worst]:
        return UnknownTokens(0.0, "", "")
    return UnknownTokens(sum(counts) / max(total, 1), texts[worst],
                         " ".join(tokenizer.convert_ids_to_tokens(rows[worst])))  # fmt: skip


@dataclass(frozen=True)
class CutCaptions:
    """How many captions their training targets cut (:func:`cut_captions`)."""

    share: float
    """Captions longer than ``max_tokens - 1`` tokens over all captions (0 when there are none)."""
    longest: int
    """Tokens of the longest caption, EOS not counted."""
    fits: int
    """The smallest ``max_tokens`` that keeps ``keep`` of the captions whole (EOS included)."""


def cut_captions(lengths: Sequence[int], max_tokens: int, keep: float = 0.99) -> CutCaptions:
    """Of captions ``lengths`` tokens long (as :func:`text_ids` reads them, EOS not counted), the share that
    :func:`encode_captions` cuts at ``max_tokens`` (those longer than ``max_tokens - 1``: EOS takes a place), the
    longest, and the ``max_tokens`` that keeps the shortest ``keep`` of them whole (the ``ceil(keep * n)``-th
    shortest's length, plus EOS).

    Example::

        >>> # 4 captions, max_tokens=8 keeps 7 tokens and EOS: 9 and 12 are cut, 2 of 4; the shortest 99 % of 4
        >>> # captions is all 4 (ceil(3.96) = 4): the 12-token one needs max_tokens=13
        >>> cut_captions([3, 12, 5, 9], max_tokens=8)
        CutCaptions(share=0.5, longest=12, fits=13)
        >>> cut_captions([3, 12, 5, 9], max_tokens=8, keep=0.5)  # ceil(2.0) = 2: the second shortest, 5
        CutCaptions(share=0.5, longest=12, fits=6)
    """
    if not lengths:
        return CutCaptions(0.0, 0, 1)
    ordered = sorted(lengths)
    cut = sum(n > max_tokens - 1 for n in ordered)
    kept = ordered[max(0, math.ceil(keep * len(ordered)) - 1)]
    return CutCaptions(cut / len(ordered), ordered[-1], kept + 1)
