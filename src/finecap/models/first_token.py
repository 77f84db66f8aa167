"""SMILE's first-token shifting as the weights carry it (:mod:`finecap.objectives.smile` trains it): what a
captioner whose weights were shifted puts first in every caption (:func:`shift_of`, the record its
``captioner.json`` keeps: :attr:`~finecap.models.base.CaptionerBase.first_token_shift`), and how the first token of
its decoded captions is written in their text (:func:`unshift_table`, set on a captioner by :func:`unshift_as` and
:func:`decode_unshifted`). Here, beneath the objectives, because every loader of a checkpoint needs it (captioning,
the demo's stages, boost's visual expert), not only training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate.utils import extract_model_from_parallel

SUBWORD_PREFIX = "##"
"""The prefix of a WordPiece continuation token (BERT's, BLIP's): ``##a`` is ``a`` inside a word."""


def subword_alternatives(tokenizer: Any) -> torch.Tensor:
    """``(V,)`` long: each token id's first-token alternative under ``smile.shift_form=subword``, the id of its
    WordPiece form ``'##' + token`` ("a" to "##a", SMILE Sec. 3.3), as the released code shifts
    (``convert_tokens_to_ids('##' + token)``): the unknown token where the vocabulary has no such form, as there;
    a token that already is a ``##`` form stays itself, so shifting twice changes nothing. ``ValueError`` (naming
    ``smile.shift_form``) for a vocabulary with no ``##`` forms (GPT-2's byte-level BPE, the world's): use
    ``shift_form=token`` and a ``shift_token_id`` there.

    >>> from finecap.models.tokenizer import world_tokenizer
    >>> tok = world_tokenizer(["a", "two", "##a"])  # ids 5, 6, 7; "two" has no "##two"
    >>> subword_alternatives(tok)[5:8].tolist(), tok.unk_token_id
    ([7, 1, 7], 1)
    """
    vocab = tokenizer.get_vocab()  # {token: id}
    if not any(token.startswith(SUBWORD_PREFIX) for token in vocab):
        raise ValueError(
            f"smile.shift_form=subword: the tokenizer ({type(tokenizer).__name__}) has no '{SUBWORD_PREFIX}' sub-word "
            "forms; use smile.shift_form=token with a smile.shift_token_id"
        )
    unk = getattr(tokenizer, "unk_token_id", None)
    table = torch.full((max(vocab.values()) + 1,), -1 if unk is None else unk, dtype=torch.long)  # (V,)
    for token, i in vocab.items():
        if token.startswith(SUBWORD_PREFIX):
            table[i] = i
        elif SUBWORD_PREFIX + token in vocab:
            table[i] = vocab[SUBWORD_PREFIX + token]
    return table


def shift_of(cfg) -> dict[str, Any] | None:
    """What a run trained under ``cfg`` puts first in every caption, as a captioner records it
    (:attr:`~finecap.models.base.CaptionerBase.first_token_shift`): ``{"form": "token", "token_id":
    smile.shift_token_id}`` or ``{"form": "subword"}`` for ``train.objective=smile`` with ``smile.first_token=shift``,
    else ``None``.

    >>> from finecap.config import Config, SmileConfig, TrainConfig
    >>> smile = SmileConfig(first_token="shift", shift_token_id=2)
    >>> shift_of(Config(train=TrainConfig(objective="smile"), smile=smile))
    {'form': 'token', 'token_id': 2}
    >>> shift_of(Config(smile=SmileConfig(first_token="shift", shift_form="subword"))) is None  # objective mle
    True
    """
    if cfg.train.objective != "smile" or cfg.smile.first_token != "shift":
        return None
    if cfg.smile.shift_form == "token":
        return {"form": "token", "token_id": int(cfg.smile.shift_token_id)}
    return {"form": "subword"}


def unshift_table(shift: dict[str, Any] | None, tokenizer: Any) -> dict[int, int | None] | None:
    """How the first token of a caption decoded by a captioner whose weights were shifted by ``shift``
    (:func:`shift_of`; ``None``: not shifted, captions as decoded) is written in the caption's text
    (:func:`finecap.decode.texts_of`). Such a captioner learned to start every caption with the shift token (input
    and label, :func:`~finecap.objectives.smile.shift_first_tokens`), so it does so at inference too:

    - ``{"form": "subword"}``: each ``##`` form is written as the word it was shifted from (``"##a"`` as
      ``"a"``: :func:`subword_alternatives` inverted), so ``"##a dog runs"`` reads ``"a dog runs"``; the unknown
      token, which stood for every first word without a ``##`` form, is left out (those words were never learned);
    - ``{"form": "token", ...}``: ``token_id`` is left out: it stood for every first word alike, so no word can be
      restored, and a word's id chosen as the shift token ("a") would otherwise be shown as if the model had said it.

    The released code (``BLIP/models/model.py``, ``generate``) decodes the prompt ``"a picture of "`` and the caption
    together and cuts the prompt's 13 characters off the text: BERT glues the ``##`` form to the prompt (``"a picture
    ofa dog"``), so a one-letter first word goes with the prompt and a longer one leaves its tail (``"##two dogs"``:
    ``"wo dogs"``). finecap restores the word where the shifted form names it and leaves out what names none
    (docs/methods/smile.md).

    >>> from finecap.models.tokenizer import world_tokenizer
    >>> tok = world_tokenizer(["a", "two", "##a"])  # ids 5, 6, 7; <unk> 1, <mask> 2
    >>> unshift_table({"form": "subword"}, tok), unshift_table({"form": "token", "token_id": 2}, tok)
    ({7: 5, 1: None}, {2: None})
    """
    if shift is None:
        return None
    if shift["form"] == "token":
        return {int(shift["token_id"]): None}
    table = subword_alternatives(tokenizer).tolist()  # (V,): each token's shifted form
    unk = getattr(tokenizer, "unk_token_id", None)
    written: dict[int, int | None] = {}
    for word, form in enumerate(table):
        if form not in (word, unk, -1):  # a word and its ## form (each ## form is the form of one word)
            written[form] = word
    if unk is not None:
        written[int(unk)] = None
    return written


def unshift_first_tokens(cfg, tokenizer: Any) -> dict[int, int | None] | None:
    """:func:`unshift_table` of the shift a run trained under ``cfg`` (its run's configuration) makes
    (:func:`shift_of`): ``None`` (as decoded) unless the run trained with ``train.objective=smile`` and
    ``smile.first_token=shift``.

    >>> from finecap.config import Config, SmileConfig, TrainConfig
    >>> from finecap.models.tokenizer import world_tokenizer
    >>> tok = world_tokenizer(["a", "two", "##a"])  # ids 5, 6, 7; <unk> 1, <mask> 2
    >>> unshift_first_tokens(Config(train=TrainConfig(objective="smile"),
    ...                             smile=SmileConfig(first_token="shift", shift_form="subword")), tok)
    {7: 5, 1: None}
    """
    return unshift_table(shift_of(cfg), tokenizer)


def unshift_as(model: Any, shift: dict[str, Any] | None) -> Any:
    """``model`` (a captioner, or a wrapper of one) recorded as shifted by ``shift`` (:func:`shift_of`; ``None``:
    not shifted), which its saves write into ``captioner.json``, with its captions' first tokens written as
    :func:`unshift_table` says (:attr:`~finecap.models.base.CaptionerBase.first_token_unshift`)."""
    captioner = extract_model_from_parallel(model)
    captioner.first_token_shift = None if shift is None else dict(shift)
    captioner.first_token_unshift = unshift_table(shift, captioner.tokenizer)
    return model


def decode_unshifted(model: Any, cfg=None) -> Any:
    """``model`` (a captioner, or a wrapper of one) loaded from a checkpoint, with its captions' first tokens written
    without the shift token its weights emit first (:func:`unshift_as`): the shift ``cfg`` (its run's configuration;
    ``None``: none known, an export or bare model folder) trains with (:func:`shift_of`), else the one its
    ``captioner.json`` records (:attr:`~finecap.models.base.CaptionerBase.first_token_shift`: a run started from
    shifted weights, an export of one). What every entry point that decodes a checkpoint's captioner calls
    (``finecap caption``, the Python API, the demo's stages, boost's world visual expert); training sets its own with
    :func:`~finecap.objectives.smile.training_shift`. A checkpoint written before the record (2026-11-28) is unshifted
    only when ``cfg`` says it trained shifted, as before."""
    own = None if cfg is None else shift_of(cfg)
    return unshift_as(model, own if own is not None else extract_model_from_parallel(model).first_token_shift)


def start_shift(start: str | Path) -> dict[str, Any] | None:
    """The shift the weights of the checkpoint ``start`` (a checkpoint or model folder) emit: what their
    ``captioner.json`` records, else (a checkpoint written before the record, 2026-11-28) what its stored run
    configuration trained with (:func:`shift_of`), else ``None``."""
    from finecap.config import load_stored
    from finecap.models.base import read_meta, recorded_shift
    from finecap.runs import model_dir, stored_config
    from finecap.utils.reading import read_yaml_mapping

    folder = model_dir(start)
    recorded = recorded_shift(read_meta(folder), folder)
    stored = stored_config(start)
    if recorded is not None or stored is None:
        return recorded
    data = read_yaml_mapping(stored, "a stored configuration must be a mapping of sections")
    sections = {key: data.get(key) if isinstance(data.get(key), dict) else {} for key in ("train", "smile")}
    if sections["train"].get("objective") != "smile" or sections["smile"].get("first_token") != "shift":
        return None  # read whole (and checked) only when it shifted: any other start's configuration is not read
    return shift_of(load_stored(stored))
