"""The reward server's requests: plain JSON read into :class:`RewardRequest`, or a :class:`RequestError` naming the
field at fault (HTTP 400, or 413 for a limit). Nothing in a request is ever run or imported: bodies are read with
:func:`finecap.utils.reading.parse_json` (strict: no key twice, no ``NaN``) and every field is checked for its type,
length and size (:class:`Limits`).

Two shapes:

- finecap's own (``POST /reward``)::

      {"id": "step-17/3",                          # optional, any JSON scalar: echoed
       "captions": ["a red circle on sand", ...],   # N strings
       "image_ids": [17, 4, ...],                   # N ids of the served data set (or "images": N image paths)
       "references": [["a red circle", ...], ...]}  # optional: N lists, instead of the images' (cider, claims, chair)

  Unknown fields are refused (a misspelt ``"image_id"`` must not pass for a request without images). A caption is
  scored without its surrounding white space, as finecap's decoder gives its captions to its rewards in training (and
  as :func:`caption_of_query` reads OpenRLHF's): every adapter and the server score ``" a cat\\n"`` as ``"a cat"``.

- OpenRLHF's remote reward model and CapRL's reward server (``POST /get_reward``)::

      {"query": [...], "prompts": [...], "labels": [...]}

  ``query[i]`` is the decoded prompt and response (OpenRLHF decodes with special tokens): the caption is what
  follows ``prompts[i]`` in it (:func:`caption_of_query`: an image placeholder expanded in the query is allowed for;
  a prompt the query does not hold is refused). ``labels[i]`` (OpenRLHF's ``--label_key`` column) carries the image:
  its id (a string or an integer), or a JSON object (or its text) ``{"image_id": 17}`` (or ``{"image": "path"}``),
  optionally with ``"references": [...]``. Other fields (``datasources``, token ids) are ignored, as OpenRLHF versions
  send different ones.

Example::

    >>> parse_reward({"captions": ["a red circle"], "image_ids": [7]}, Limits()).image_ids
    [7]
    >>> caption_of_query("<|im_start|>user\\nDescribe.<|im_end|>\\n<|im_start|>assistant\\nA red circle.<|im_end|>",
    ...                  "<|im_start|>user\\nDescribe.<|im_end|>\\n<|im_start|>assistant\\n")
    'A red circle.'
    >>> parse_get_reward({"query": ["a red circle"], "labels": ['{"image_id": 7}']}, Limits()).image_ids
    [7]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from finecap.utils.reading import JSONRefused, parse_json

if TYPE_CHECKING:
    from finecap.rewards import RewardOutput

END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "</s>",
               "<eos>", "<|end▁of▁sentence|>", "<pad>", "<|pad|>")  # fmt: skip
"""End-of-turn, end-of-text and padding tokens stripped from the end of an OpenRLHF query's response (it decodes
with special tokens); the common chat templates' (ChatML/Qwen, Llama 3, Gemma, Phi, Mistral, DeepSeek)."""

REWARD_FIELDS = ("id", "captions", "image_ids", "images", "references")


@dataclass(frozen=True)
class Limits:
    """What one request may hold; beyond it the server answers 413 naming the field.

    Attributes:
        max_request_bytes: the body's size.
        max_captions: captions (queries) per request.
        max_caption_chars: characters of one caption (or query), and of one reference.
        max_references: reference captions of all the request's captions together (CIDEr-D's cost and memory grow
            with them: 3 million two-letter references fit in 16 MiB and took a gigabyte to score).
    """

    max_request_bytes: int = 16 * 2**20
    max_captions: int = 8192
    max_caption_chars: int = 20_000
    max_references: int = 65_536

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_captions", "max_caption_chars", "max_references"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(self, name)}")


class RequestError(ValueError):
    """A request the server refuses: ``field`` names what is wrong (``"captions[3]"``, ``"body"``), ``status`` is
    400 (malformed), 413 (beyond :class:`Limits`), or another 4xx of the server's policy (401, 403, 408, 415).
    ``str(error)`` is ``"<field>: <message>"``: what the adapters raise in process for the same input (a
    ``ValueError``), so that an adapter and the server refuse alike, in the same words."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.status = field, message, status

    def body(self) -> dict[str, Any]:
        """The JSON error the server answers with."""
        return {"error": {"field": self.field, "message": self.message}}


@dataclass
class RewardRequest:
    """One request, checked: ``captions[n]`` describes ``image_ids[n]`` (ids as the request gave them; image paths
    when ``by_path``), scored against ``references[n]`` when given; ``request_id`` is echoed. ``fields``: the
    caller's names for these fields (a field of ``/reward``'s request -> the name the caller sent it under,
    :func:`callers_field`), which a refusal of the request after its parsing names
    (:meth:`finecap.serve.service.CallCheck.job`: ``labels[1]: unknown image id 99``): ``/get_reward``'s
    :data:`GET_REWARD_FIELDS`; ``None``: the fields' own names (``image_ids[1]``), a ``/reward`` request's."""

    captions: list[str]
    image_ids: list[Any]
    by_path: bool = False
    references: list[list[str]] | None = None
    request_id: Any = None
    fields: Mapping[str, str] | None = None


def decode_json(raw: bytes, field: str = "body") -> Any:
    """The JSON value of a request body (or of a label's text, ``field``), read strictly
    (:func:`finecap.utils.reading.parse_json`): ``NaN`` and ``Infinity`` refused, as is an object holding a key twice
    (which of its two values a reader keeps depends on the reader) and nesting deeper than Python's parser goes; bytes
    that are no UTF-8 (nor UTF-16 or UTF-32, which JSON's readers detect) are refused as such."""
    try:
        return parse_json(raw, field, constants=False)
    except JSONRefused as e:
        if e.kind == "encoding":  # the decoder's reason alone ("invalid start byte") says nothing of UTF-8
            raise RequestError(field, f"not UTF-8 text ({e.detail}): send the JSON encoded as UTF-8") from None
        detail = e.detail.removeprefix("invalid JSON")
        raise RequestError(field, f"not valid JSON{detail if detail[:1] in (':', ' ') else ': ' + detail}") from None


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("body", f"expected a JSON object, got {_kind(body)}")
    return body


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
             int: "a number", float: "a number"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def _text_list(value: Any, field: str, limits: Limits, *, n: int | None = None, per: str = "captions") -> list[str]:
    """A JSON array of strings (``n`` of them when given, one per ``per``: ``"queries"``), each within
    :attr:`Limits.max_caption_chars`."""
    if not isinstance(value, list):
        raise RequestError(field, f"expected an array of strings, got {_kind(value)}")
    if n is None:
        if not value:
            raise RequestError(field, "is empty: give at least one caption")
        if len(value) > limits.max_captions:
            raise RequestError(field, f"{len(value)} entries exceed the server's limit of {limits.max_captions} per "
                               "request (--max-captions)", 413)  # fmt: skip
    elif len(value) != n:
        raise RequestError(field, f"has {len(value)} entries for {n} {per}")
    for i, text in enumerate(value):
        _text(text, f"{field}[{i}]", limits)
    return value


def _text(value: Any, field: str, limits: Limits) -> str:
    """A string within :attr:`Limits.max_caption_chars`, and Unicode text (:func:`unicode_text`)."""
    if not isinstance(value, str):
        raise RequestError(field, f"expected a string, got {_kind(value)}")
    if len(value) > limits.max_caption_chars:
        raise RequestError(field, f"{len(value)} characters exceed the server's limit of {limits.max_caption_chars} "
                           "(--max-caption-chars)", 413)  # fmt: skip
    return unicode_text(value, field)


def unicode_text(value: str, field: str) -> str:
    """``value``, refused (400 naming ``field``) when it holds a lone surrogate: JSON's ``"\\ud800"`` escape reads
    as one (valid JSON, but no Unicode text), which a reward's tokenizer fails on, a 500 blamed on the reward.

    >>> unicode_text("a caption", "captions[0]")
    'a caption'
    >>> unicode_text("a \\ud800 b", "captions[3]")
    Traceback (most recent call last):
    ...
    finecap.serve.protocol.RequestError: captions[3]: holds a lone surrogate (\\ud800 at character 2), which is no \
Unicode text: escape a character beyond U+FFFF as its surrogate pair, or send it as UTF-8
    """
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(field, f"holds a lone surrogate (\\u{ord(value[e.start]):04x} at character {e.start}), "
                           "which is no Unicode text: escape a character beyond U+FFFF as its surrogate pair, or "
                           "send it as UTF-8") from None  # fmt: skip
    return value


def image_id_of(value: Any, field: str) -> str | int:
    """An image id as a request carries it: a string as is, an integer of any integer type (NumPy's, torch's) as a
    Python ``int``; anything else (``None``, a boolean, a float, NaN, a list) is a :class:`RequestError` naming
    ``field``: what a client sends and what an adapter accepts in process, alike.

    >>> image_id_of(__import__("numpy").int64(17), "image_ids[0]")
    17
    >>> image_id_of(float("nan"), "image_ids[3]")
    Traceback (most recent call last):
    ...
    finecap.serve.protocol.RequestError: image_ids[3]: expected an image id (a string or an integer), got a number
    """
    if isinstance(value, str):
        return value
    if not isinstance(value, bool) and isinstance(value, numbers.Integral):
        return int(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a 0-d NumPy array or tensor
        return image_id_of(value.item(), field)
    raise RequestError(field, f"expected an image id (a string or an integer), got {_kind(value)}")


def _references(value: Any, field: str, n: int, limits: Limits) -> list[list[str]]:
    if not isinstance(value, list):
        raise RequestError(field, f"expected an array of {n} arrays of reference captions, got {_kind(value)}")
    if len(value) != n:
        raise RequestError(field, f"has {len(value)} entries for {n} captions")
    return [_reference_list(refs, f"{field}[{i}]", limits) for i, refs in enumerate(value)]


def _reference_list(refs: Any, field: str, limits: Limits) -> list[str]:
    """One caption's references: a non-empty array of strings (``field[j]`` each)."""
    if not isinstance(refs, list) or not refs:
        raise RequestError(field, "expected a non-empty array of reference captions")
    for j, ref in enumerate(refs):
        _text(ref, f"{field}[{j}]", limits)
    return refs


def as_array(value: Any) -> Any:
    """``value`` as a JSON array when it is a sequence a trainer may hand over (a tuple, a 1-d NumPy array: verl
    reads lists from Parquet as arrays), else ``value`` itself, which the request's checks then refuse by name (a
    string is never split into its characters)."""
    if isinstance(value, tuple):
        return list(value)
    if getattr(value, "ndim", None) == 1 and hasattr(value, "tolist"):
        return value.tolist()
    return value


def reward_body(captions: Any, image_ids: Any = None, *, images: Any = None, references: Any = None,
                request_id: Any = None) -> dict[str, Any]:  # fmt: skip
    """The JSON of a ``/reward`` request, as every front end builds it (the client over HTTP, the adapters in
    process): image ids as :func:`image_id_of` reads them, sequences as :func:`as_array`; :func:`parse_reward`
    then checks it alike in the server and in process."""
    if (image_ids is None) == (images is None):
        raise ValueError("give image_ids or images (paths), one of them")
    body: dict[str, Any] = {"captions": as_array(captions)}
    if image_ids is not None:
        image_ids = as_array(image_ids)
        if not isinstance(image_ids, list):
            raise RequestError("image_ids", f"expected an array, got {_kind(image_ids)}")
        body["image_ids"] = [image_id_of(v, f"image_ids[{i}]") for i, v in enumerate(image_ids)]
    else:
        images = as_array(images)
        if not isinstance(images, list):  # a string is never split into its characters
            raise RequestError("images", f"expected an array of paths, got {_kind(images)}")
        body["images"] = [str(p) for p in images]
    if references is not None:
        references = as_array(references)
        body["references"] = [as_array(r) for r in references] if isinstance(references, list) else references
    if request_id is not None:
        body["id"] = request_id
    return body


def parse_reward(body: Any, limits: Limits) -> RewardRequest:
    """finecap's request (``POST /reward``, module docstring)."""
    body = _object(body)
    unknown = sorted(set(body) - set(REWARD_FIELDS))
    if unknown:
        raise RequestError(unknown[0], f"unknown field; a request has {', '.join(REWARD_FIELDS)}")
    request_id = body.get("id")
    if isinstance(request_id, dict | list):
        raise RequestError("id", f"expected a JSON scalar (string, number, boolean or null), got {_kind(request_id)}")
    if isinstance(request_id, float) and not math.isfinite(request_id):  # 1e999 reads as inf: no JSON echoes it
        raise RequestError("id", "expected a finite number, got one beyond the range of a double")
    if "captions" not in body:
        raise RequestError("captions", "missing: give the captions to score")
    captions = _text_list(body["captions"], "captions", limits)
    if "image_ids" in body and "images" in body:
        raise RequestError("images", "give the captions' images as image_ids or as images (paths), not both")
    if "image_ids" not in body and "images" not in body:
        raise RequestError("image_ids", "missing: give the images the captions describe, image_ids (or images, "
                           "paths)")  # fmt: skip
    by_path = "images" in body
    field = "images" if by_path else "image_ids"
    given = body[field]
    if not isinstance(given, list):
        raise RequestError(field, f"expected an array, got {_kind(given)}")
    if len(given) != len(captions):
        raise RequestError(field, f"has {len(given)} entries for {len(captions)} captions")
    if by_path:
        ids = [_text(p, f"images[{i}]", limits) for i, p in enumerate(given)]
    else:
        ids = [image_id_of(v, f"image_ids[{i}]") for i, v in enumerate(given)]
    references = None
    if body.get("references") is not None:
        references = _references(body["references"], "references", len(captions), limits)
        _check_reference_count(references, "references", limits)
    return RewardRequest([c.strip() for c in captions], ids, by_path, references, request_id)


def _check_reference_count(references: list[list[str]], field: str, limits: Limits) -> None:
    total = sum(len(refs) for refs in references)
    if total > limits.max_references:
        raise RequestError(field, f"{total} reference captions, more than the {limits.max_references} a request may "
                           "hold (--max-references)", 413)  # fmt: skip


MIN_PROMPT_TAIL = 8
"""Characters at least of a prompt's end that must stand in the query when the whole prompt does not."""


def response_start(query: str, prompt: str | None) -> int:
    """Where the response starts in an OpenRLHF query: after ``prompt``'s first occurrence (0 without a prompt).

    A query need not hold its prompt verbatim: a multimodal prompt's image placeholder comes back expanded (Qwen-VL's
    one ``<|image_pad|>`` as one per image patch) and a tokenizer's decode may change the prompt's start. Then the
    response follows the longest end of the prompt that the query holds (its first occurrence; found by bisection,
    since every shorter end of a held end is held too), when that end is at least :data:`MIN_PROMPT_TAIL` characters
    (or the whole prompt). Otherwise a ``ValueError``: the prompt is not in the query, and scoring the whole query
    would score the prompt's text as the caption's."""
    if not prompt:
        return 0
    at = query.find(prompt)
    if at >= 0:
        return at + len(prompt)
    held, over = 0, len(prompt)  # the longest end known held, the shortest known not held
    while over - held > 1:
        mid = (held + over) // 2
        if prompt[-mid:] in query:
            held = mid
        else:
            over = mid
    if held < min(len(prompt), MIN_PROMPT_TAIL):
        raise ValueError(f"the prompt is not in the query (nor its last {MIN_PROMPT_TAIL} characters): send the "
                         "prompt the query was made from")  # fmt: skip
    return query.find(prompt[-held:]) + held


def caption_of_query(query: str, prompt: str | None) -> str:
    """The response in an OpenRLHF query: the text after ``prompt`` (:func:`response_start`; the whole query without
    a prompt), without trailing :data:`END_MARKERS` and surrounding white space.

    Linear in the query's length whatever it holds (the end is moved back over markers and white space without
    copying the text; a query of a million end markers costs one pass); finding a prompt the query does not hold
    verbatim costs a search of the query per halving of the prompt's length."""
    start = response_start(query, prompt)
    end = len(query)
    while True:
        while end > start and query[end - 1].isspace():
            end -= 1
        for marker in END_MARKERS:
            if end - start >= len(marker) and query.endswith(marker, start, end):
                end -= len(marker)
                break
        else:
            break
    while start < end and query[start].isspace():
        start += 1
    return query[start:end]


def _label(value: Any, field: str, limits: Limits) -> tuple[Any, bool, list[str] | None]:
    """(image id or path, whether a path, references or ``None``) of one OpenRLHF label."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = decode_json(value, field)
        except RequestError as e:
            raise RequestError(field, f"a label starting with '{{' must be a JSON object: {e.message}") from None
    if not isinstance(value, dict):
        return image_id_of(value, field), False, None
    unknown = sorted(set(value) - {"image_id", "image", "references"})
    if unknown:
        raise RequestError(f"{field}.{unknown[0]}", "unknown key; a label object has image_id (or image) and "
                           "optionally references")  # fmt: skip
    if ("image_id" in value) == ("image" in value):
        raise RequestError(field, "a label object names its image by image_id or image (a path), one of them")
    if "image" in value:
        image, by_path = _text(value["image"], f"{field}.image", limits), True
    else:
        image, by_path = image_id_of(value["image_id"], f"{field}.image_id"), False
    refs = None
    if value.get("references") is not None:
        refs = _reference_list(value["references"], f"{field}.references", limits)
    return image, by_path, refs


GET_REWARD_FIELDS = {
    "captions": "query",
    "image_ids": "labels",
    "images": "labels",
    "references": "labels[].references",
}
"""The fields of a ``/reward`` request as a ``/get_reward`` caller names what it sent (:func:`parse_get_reward`):
``captions[i]`` is read from ``query[i]``, the image and the references of caption ``i`` from ``labels[i]``
(``references[i][j]`` is ``labels[i].references[j]``). :func:`parse_get_reward` refuses what it reads by the
names it was sent under and gives its request this map (:attr:`RewardRequest.fields`), which the checks after it
name the request's fields by (:meth:`finecap.serve.service.CallCheck.job`: an unknown image is ``labels[i]``);
OpenRLHF's ``reward_func`` over a server asks ``/reward`` and names a refusal of that request by it
(:func:`callers_field`), as ``/get_reward`` names its own."""


def parse_get_reward(body: Any, limits: Limits) -> RewardRequest:
    """OpenRLHF's / CapRL's request (``POST /get_reward``, module docstring)."""
    body = _object(body)
    if "query" not in body:
        raise RequestError("query", "missing: OpenRLHF sends the decoded prompts and responses as query")
    queries = _text_list(body["query"], "query", limits)
    n = len(queries)
    prompts = body.get("prompts")
    if prompts is not None:
        prompts = _text_list(prompts, "prompts", limits, n=n, per="queries")
    if body.get("labels") is None:
        raise RequestError("labels", "missing: each label carries its caption's image (its id, or a JSON object "
                           '{"image_id": ...}); OpenRLHF sends the --label_key column')  # fmt: skip
    labels = body["labels"]
    if not isinstance(labels, list):
        raise RequestError("labels", f"expected an array, got {_kind(labels)}")
    if len(labels) != n:
        raise RequestError("labels", f"has {len(labels)} entries for {n} queries")
    parsed = [_label(v, f"labels[{i}]", limits) for i, v in enumerate(labels)]
    by_path = {p for _, p, _ in parsed}
    if len(by_path) > 1:
        raise RequestError("labels", "name every image by its id or every one by its path, not a mix")
    with_refs = [r is not None for _, _, r in parsed]
    if any(with_refs) and not all(with_refs):
        raise RequestError(f"labels[{with_refs.index(False)}]", "has no references where other labels have: give "
                           "them for every caption of a request or for none")  # fmt: skip
    captions = []
    for i, query in enumerate(queries):
        try:
            captions.append(caption_of_query(query, prompts[i] if prompts else None))
        except ValueError as e:
            raise RequestError(f"prompts[{i}]", str(e)) from None
    references = [r for _, _, r in parsed] if all(with_refs) else None
    if references is not None:
        _check_reference_count(references, "labels", limits)
    return RewardRequest(captions, [i for i, _, _ in parsed], by_path.pop(), references, fields=GET_REWARD_FIELDS)


def callers_field(field: str | None, fields: Mapping[str, str] | None) -> str | None:
    """The ``field`` a refusal of a ``/reward`` request named (:attr:`RequestError.field`), in the words of a caller
    that sent the request's fields under other names: ``fields`` maps a request field to the caller's name for it
    (``None``, or a field it does not hold: the name as it is). An entry's index follows the caller's name, or stands
    where the name holds ``[]`` (``labels[].references``: the references of caption ``i`` are in its label); the
    request holds one entry per caption, in the caller's order. A key may name one entry (``captions[0]``: a caller
    that sends one sample, verl's ``solution_str``), whose caller's name then stands for it, index and all.

    >>> callers_field("captions[3]", GET_REWARD_FIELDS), callers_field("image_ids", GET_REWARD_FIELDS)
    ('query[3]', 'labels')
    >>> callers_field("references[2][0]", GET_REWARD_FIELDS), callers_field("references", GET_REWARD_FIELDS)
    ('labels[2].references[0]', 'labels')
    >>> callers_field("body", GET_REWARD_FIELDS), callers_field("captions[1]", None)
    ('body', 'captions[1]')
    >>> callers_field("references[0][1]", {"references[0]": "extra_info.references"})
    'extra_info.references[1]'
    """
    if not isinstance(field, str) or not fields:
        return field
    head, bracket, rest = field.partition("[")
    if bracket:  # a key naming this one entry
        index, _, deeper = rest.partition("]")
        one = fields.get(f"{head}[{index}]")
        if one is not None:
            return one + deeper
    name = fields.get(head)
    if name is None:
        return field
    whole, hole, after = name.partition("[]")
    if not hole:
        return name + bracket + rest
    if not bracket:
        return whole
    index, _, deeper = rest.partition("]")
    return f"{whole}[{index}]{after}{deeper}"


def one_sample_fields(fields: Mapping[str, str]) -> dict[str, str]:
    """``fields`` (a request field -> the caller's name, :func:`callers_field`) of a caller that sends one sample a
    call: each field's entry 0 is the caller's name itself, without an index (verl's per-sample ``solution_str``).

    >>> callers_field("captions[0]", one_sample_fields({"captions": "solution_str"}))
    'solution_str'
    """
    return {**fields, **{f"{field}[0]": name for field, name in fields.items()}}


def in_callers_words(error: RequestError, fields: Mapping[str, str] | None) -> RequestError:
    """``error`` naming its field in the caller's words (:func:`callers_field`): what an adapter raises in process."""
    field = callers_field(error.field, fields)
    return error if field == error.field else RequestError(field, error.message, error.status)


class FailedCaptions(ValueError):
    """A call holding captions the reward could not score, for a trainer that would read their NaN as a number
    (:func:`refuse_failed`): OpenRLHF's (:func:`openrlhf_reply`: the server's ``/get_reward`` answers it 502 with this
    message, OpenRLHF's ``reward_func`` in process raises it) and ms-swift's (:mod:`finecap.integrations.swift`)."""


SHOWN_FAILED = 10
"""Failed captions a :class:`FailedCaptions` message names at most (then their count)."""


def openrlhf_reply(request: RewardRequest, out: RewardOutput) -> dict[str, Any]:
    """The answer of ``POST /get_reward``: ``rewards`` (OpenRLHF trains on them) and ``extra_logs`` (it logs them).

    A request holding a caption the reward could not score (:attr:`finecap.rewards.RewardOutput.failed`: a judge that
    failed) is refused whole, :class:`FailedCaptions` (the server's 502 naming the captions, ``query[i]``; OpenRLHF's
    ``reward_func`` in process raises it, ms-swift's adapter too), where ``/reward`` answers ``null``, TRL's adapter
    ``None`` and verl's NaN (docs/methods/judges.md, "Judge failures are counted, never paid"). OpenRLHF reads every
    reward of the reply as a number: ``torch.tensor(reply["rewards"])`` before 0.9, ``torch.tensor([reward])`` for each
    sample since, so a ``null`` stops the run with a ``TypeError`` that names nothing; and it has no NaN handling, so a
    NaN would spread through its group's mean and standard deviation to every sample of the prompt and into the loss.
    An HTTP error is what its client expects of a reward server that could not answer: it retries the request (5 times,
    a second apart: a judge's passing failure is scored then), and then stops (before 0.9 with its "Request error"
    exception; since, the sample has no reward, which stops the run when it gathers the batch's rewards); the server's
    log names the captions (docs/integrations.md)."""
    refuse_failed(out, "query", "OpenRLHF reads every reward as a number (a NaN would reach every sample of their "
                  "groups)")  # fmt: skip
    total, parts = out.values()
    return {"rewards": total, "extra_logs": parts}


def refuse_failed(out: RewardOutput, field: str, why: str, caller: str = "") -> None:
    """Raise :class:`FailedCaptions` when ``out`` holds captions the reward could not score
    (:attr:`finecap.rewards.RewardOutput.failed`), naming them as ``field[i]`` (at most :data:`SHOWN_FAILED`) and
    saying ``why`` the trainer cannot be given their NaN; ``caller`` (an adapter) opens the message
    (``"<caller>: the reward could not score ..."``)."""
    mask = out.failed_mask()
    if mask is not None:
        bad = mask.nonzero().flatten().tolist()
        named = ", ".join(f"{field}[{i}]" for i in bad[:SHOWN_FAILED]) + (", ..." if len(bad) > SHOWN_FAILED else "")
        said = f"could not score {len(bad)} of {mask.numel()} captions ({named}): its judge failed on them, and {why}"
        raise FailedCaptions(f"{caller}: the reward {said}" if caller else said)
