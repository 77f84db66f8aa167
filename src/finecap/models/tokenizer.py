"""The world's word-level tokenizer and the CLIP text tower's encoding helper.

:func:`world_tokenizer` builds a ``PreTrainedTokenizerFast`` (``tokenizers`` ``WordLevel`` model, lower-casing,
whitespace/punctuation pre-tokenizer) over :func:`finecap.world.captions.vocabulary`. It saves with
``save_pretrained`` and reloads with ``AutoTokenizer.from_pretrained`` like any Hub tokenizer.

Special tokens and ids (fixed, so checkpoints and configs can rely on them)::

    <pad> = 0   <unk> = 1   <mask> = 2 (reserved, never produced)   <bos> = 3   <eos> = 4   words from 5 on

EOS is deliberately not id 2: ``transformers``' CLIP text tower falls back to a legacy argmax pooling when
``eos_token_id == 2``. Calling the tokenizer with ``add_special_tokens=True`` (the default) appends ``<eos>``, as a
CLIP tokenizer does, so the world's tiny CLIP text tower pools at the right position; the captioner encodes with
:func:`finecap.data.targets.encode_captions`, which works for any tokenizer (GPT-2's does not append EOS by
itself).

Example::

    >>> tok = world_tokenizer(["a", "red", "circle"])
    >>> tok("a red circle")["input_ids"]
    [5, 6, 7, 4]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from finecap.data.targets import as_text, eos_and_pad, pad_rows
from finecap.world.captions import vocabulary

PAD, UNK, MASK, BOS, EOS = "<pad>", "<unk>", "<mask>", "<bos>", "<eos>"
SPECIAL_TOKENS: list[str] = [PAD, UNK, MASK, BOS, EOS]
"""Special tokens in id order: ``<pad>``=0, ``<unk>``=1, ``<mask>``=2 (reserved), ``<bos>``=3, ``<eos>``=4."""
PAD_ID, UNK_ID, MASK_ID, BOS_ID, EOS_ID = range(5)
MODEL_MAX_LENGTH = 64
"""``model_max_length`` recorded in the world tokenizer (the tiny models' position limit)."""


def world_tokenizer(vocab: Sequence[str] | None = None) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over ``vocab`` (default: every word of the world's captions) plus the special tokens.

    Words are looked up after lower-casing; punctuation is split off (``"red."`` -> ``red .``) and, like any
    unknown word, becomes ``<unk>``. Decoding joins words with single spaces.
    """
    if vocab is None:
        vocab = vocabulary()
    words = list(dict.fromkeys(vocab))  # stable de-duplication
    clash = [w for w in words if w in SPECIAL_TOKENS]
    if clash:
        raise ValueError(f"world vocabulary contains special tokens {clash}")
    bad = [w for w in words if not w or any(c.isspace() for c in w)]
    if bad:
        raise ValueError(f"world vocabulary entries must be single words without spaces, got {bad[:5]}")
    table = {w: i for i, w in enumerate(SPECIAL_TOKENS + words)}
    backend = Tokenizer(models.WordLevel(vocab=table, unk_token=UNK))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, EOS_ID)]
    )
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces (no word ever starts with ##)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        mask_token=MASK,
        bos_token=BOS,
        eos_token=EOS,
        model_max_length=MODEL_MAX_LENGTH,
        padding_side="right",
    )
    ids = (tok.pad_token_id, tok.unk_token_id, tok.mask_token_id, tok.bos_token_id, tok.eos_token_id)
    assert ids == (PAD_ID, UNK_ID, MASK_ID, BOS_ID, EOS_ID), ids
    return tok


def caption_vocabulary(texts: Iterable[str], max_words: int = 30_000) -> list[str]:
    """The words of ``texts`` as :func:`world_tokenizer` splits them (lower-cased, punctuation apart), most frequent
    first (ties in alphabetical order), at most ``max_words``: the vocabulary of a word-level LM made for one's own
    captions (``clipcap.lm=data-tiny``). Deterministic, so every process of a run builds the same one.

    Example::

        >>> caption_vocabulary(["A dog.", "a red dog", "a cat"])
        ['a', 'dog', '.', 'cat', 'red']
    """
    split = pre_tokenizers.Whitespace()
    counts = Counter(w for t in texts for w, _ in split.pre_tokenize_str(t.lower()))
    for special in SPECIAL_TOKENS:
        counts.pop(special, None)
    return [w for w, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[:max_words]]


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token when it has none (GPT-2's convention: pad = EOS). Returns the tokenizer."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '')}) has neither a pad "
                "nor an EOS token; the captioner needs an EOS token to end captions"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_for_clip(tokenizer: Any, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    """CLIP text-tower inputs: the tokenizer's own special tokens, with EOS guaranteed as the last real token.

    A CLIP tokenizer already writes ``<bos> ... <eos>`` and the world tokenizer ``... <eos>``; EOS is appended when
    missing. Texts are read as text (:func:`~finecap.data.targets.as_text`: ``<eos>`` written in one is not EOS).
    Texts longer than ``max_length`` keep their first ``max_length - 1`` tokens and end with EOS, so the
    text tower (which pools at the first ``eos_token_id``) always pools at the end of the text.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    eos, pad = eos_and_pad(tokenizer, "CLIP pooling needs one")
    rows = []
    for r in tokenizer(list(texts), add_special_tokens=True, **as_text(tokenizer))["input_ids"]:
        r = list(r)
        if not r or r[-1] != eos:
            r.append(eos)
        if len(r) > max_length:
            r = r[: max_length - 1] + [eos]
        rows.append(r)
    return pad_rows(rows, pad)
