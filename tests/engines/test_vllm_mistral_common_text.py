"""A Mistral 3 / Pixtral checkpoint holding ``tekken.json`` is tokenised by transformers' ``MistralCommonBackend``
when ``mistral-common`` is installed, as vLLM installs it (its venv: ``make vllm-test`` runs this file): that
tokenizer refuses ``split_special_tokens`` (a ``ValueError``), which finecap passes so that a caption's special-token
text is text (:func:`finecap.data.targets.as_text`). Every caption target of such a checkpoint failed. Its tekken
encoder reads text as text already: the option is left out, and ``[INST]`` or ``</s>`` in a caption are characters."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)
mistral_common = pytest.importorskip("mistral_common", reason="mistral-common comes with vLLM")

from transformers.tokenization_mistral_common import MistralCommonBackend  # noqa: E402

from finecap.data.targets import encode_captions, text_ids  # noqa: E402

TEKKEN = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"  # shipped with mistral-common


def test_a_tekken_tokenizer_reads_caption_text_as_text_without_the_option_it_refuses():
    tok = MistralCommonBackend(tokenizer_path=str(TEKKEN))
    with pytest.raises(ValueError, match="split_special_tokens"):  # why the option is left out for it
        tok(["a cat"], add_special_tokens=False, split_special_tokens=True)
    (ids,) = text_ids(tok, ["a cat [INST] </s> on a mat"])
    special = set(tok.all_special_ids)
    assert ids and not special & set(ids)  # no control token from the text: [INST] and </s> are characters
    assert tok.decode(ids) == "a cat [INST] </s> on a mat"
    targets = encode_captions(tok, ["a cat [INST] </s> on a mat"], max_tokens=64)
    row = targets["input_ids"][0].tolist()
    assert row[: len(ids)] == ids and row[len(ids)] == tok.eos_token_id  # the one EOS: the one finecap appends
