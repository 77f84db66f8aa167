"""A chat prompt's token ids with its messages' text read as text: the special tokens the chat template writes (turn
starts and ends, roles' headers) are tokens, and a special token's text inside a message (a caption, a reference, an
expert's or a model's answer holding ``<|im_end|>``, ``<|im_start|>assistant``, ``<end_of_turn>``, ``<image>``) is
its characters. Rendering a template and tokenising the whole string with special tokens read, as a chat model's
prompt usually is, would let such text end the user's turn early or forge another turn: a prompt injection from the
data (docs/boost.md#special-token-text-in-prompts).

How (:func:`chat_prompt_ids`): every special token's text in the messages is wrapped in a marker (a private-use
character around 64 random bits drawn per call, so no data can forge or hold one), the template renders the marked
messages (under :mod:`finecap.models.chat_templates`' bounds), and the rendering is cut at the marked tokens. The
text between them is tokenised as the tokenizer tokenises it, special tokens read (they are the template's own); each
marked token is tokenised as text (:func:`finecap.data.targets.as_text`) in its place. A piece after the first is
tokenised after a newline whose ids are then dropped (when they lead its ids), so that a SentencePiece tokenizer adds
no word-start mark there that it would not add inside the string: transformers' own way
(``apply_chat_template(..., sanitize_control_tokens=True)``, added in transformers 5.24). finecap does it itself
because the vLLM venv holds transformers 5.19, which lacks that option, and one rule must serve both backends. A
prompt whose messages hold no special token's text gets exactly the ids of the whole rendering tokenised at once.

Which tokens: those the tokenizer marks special, the ones :func:`~finecap.data.targets.as_text` reads as text in a
caption (one listed as an ordinary added token, Qwen3's ``<think>``, is a word of its vocabulary and stays whole, as
there). A template that cuts a message's text apart where a marker is (``content.split(...)`` at a special token's
text) leaves a lone marker, which is dropped: its pieces stay text.

A tokenizer that reads every text as text (:data:`~finecap.data.targets.TEXT_ONLY_TOKENIZERS`: transformers'
``MistralCommonBackend``) has no chat template: mistral-common encodes the chat itself, its control tokens (``[INST]``,
``[/INST]``) as tokens and the messages' text as text, and those ids are the prompt's. Its rendering as a string
(``tokenize=False``) would not do: tokenised again, its ``[INST]`` is characters. finecap's chat backends load the
folder's transformers tokenizer instead (:func:`finecap.boost.chat.load_chat_tokenizer`).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from finecap.data.targets import as_text, text_only
from finecap.models.chat_templates import apply_chat_template

MARK = "\U000f0000"
"""The private-use character around a marker's random digits (Supplementary Private Use Area-A)."""


def special_texts(tokenizer: Any) -> list[str]:
    """The texts of ``tokenizer``'s special tokens (its special added tokens and named special tokens), longest
    first (so that a token is matched before one it contains)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}).values()
    texts = {t.content for t in added if t.special} | set(getattr(tokenizer, "all_special_tokens", ()))
    return sorted((t for t in texts if t), key=lambda t: (-len(t), t))


def _marked(value: Any, specials: re.Pattern[str], marker: str) -> Any:
    """``value`` (a message, its content, a content part) with every special token's text in its strings wrapped in
    ``marker`` (dict keys left as they are; an image or any other value untouched)."""
    if isinstance(value, str):
        return specials.sub(lambda m: marker + m.group(0) + marker, value)
    if isinstance(value, dict):
        return {k: _marked(v, specials, marker) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_marked(v, specials, marker) for v in value]
    return value


def _piece_ids(tokenizer: Any, piece: str, *, text: bool, first: bool) -> list[int]:
    """Ids of ``piece`` of a rendered prompt (``text``: read as text, else special tokens read); a piece after the
    first is tokenised after a newline whose ids are then dropped (module docstring)."""
    options = {"add_special_tokens": False, **(as_text(tokenizer) if text else {})}
    if first:
        return list(tokenizer(piece, **options)["input_ids"])
    newline = list(tokenizer("\n", add_special_tokens=False)["input_ids"])
    ids = list(tokenizer("\n" + piece, **options)["input_ids"])
    if newline and ids[: len(newline)] == newline:
        return ids[len(newline) :]
    return list(tokenizer(piece, **options)["input_ids"])


def chat_prompt_ids(owner: Any, messages: Any, **options: Any) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template of ``owner`` (a tokenizer, or a processor with its
    ``tokenizer``), ``options`` passed to the template (``add_generation_prompt=True``), with the special tokens the
    template writes read as tokens and every special token's text in the messages read as text (module docstring).

    Example (the world tokenizer reads ``<eos>`` as text as ``<``, ``eos``, ``>``: three unknown words, id 1)::

        >>> from finecap.models.tokenizer import world_tokenizer
        >>> tok = world_tokenizer(["a", "red", "circle"])
        >>> tok.chat_template = "{% for m in messages %}{{ m['content'] }} <eos>{% endfor %}"
        >>> chat_prompt_ids(tok, [{"role": "user", "content": "a red <eos> circle"}])  # one EOS (4): the template's
        [5, 6, 1, 1, 1, 7, 4]
    """
    from transformers import PreTrainedTokenizerBase  # loaded already: ``owner`` is one, or a processor holding one

    # a processor's tokenizer; a tokenizer's own ``tokenizer`` attribute is not one (MistralCommonBackend's is
    # mistral-common's encoder)
    tokenizer = owner if isinstance(owner, PreTrainedTokenizerBase) else getattr(owner, "tokenizer", owner)
    if text_only(tokenizer):  # no chat template: mistral-common's ids (module docstring)
        return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **options))
    specials = special_texts(tokenizer)
    pattern = re.compile("|".join(map(re.escape, specials)) or "(?!)")  # (?!) matches nothing
    marker = MARK + str(secrets.randbits(64)) + MARK
    rendered = apply_chat_template(owner, _marked(messages, pattern, marker), tokenize=False, **options)
    cut = re.compile(f"{re.escape(marker)}({pattern.pattern}){re.escape(marker)}")
    pieces = cut.split(rendered)  # [template's text, message's special token, template's text, ...]
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        piece = piece.replace(marker, "")  # a lone marker: the template cut a message's text apart at it
        if piece:
            ids += _piece_ids(tokenizer, piece, text=i % 2 == 1, first=i == 0)
    return ids
