"""``data.format=messages``: chat data as LLaMA-Factory and ms-swift users have it, one image and one caption a
record.

One JSON object per line of a ``.jsonl`` file (streamed, each line read within :data:`~finecap.utils.reading.LINE`), or
a ``.json`` file holding a list of them (read whole within :data:`~finecap.utils.reading.DATA_FILE`, as LLaMA-Factory's
``mllm_demo.json``)::

    {"messages": [{"role": "user", "content": "<image>Describe the image."},
                  {"role": "assistant", "content": "A black dog on a wooden deck."}],
     "images": ["images/dog.jpg"]}

- the turns: ``messages`` (ms-swift, LLaMA-Factory's OpenAI-style sharegpt) or ``conversations`` (LLaMA-Factory's
  sharegpt), each turn ``role`` / ``content`` or ``from`` / ``value``; roles ``user`` (or ``human``), ``assistant``
  (or ``gpt``) and an optional leading ``system`` (not read). A record is one exchange: one user turn, then one
  assistant turn (:data:`ROLES`).
- ``content``: a string, or a list of parts (``{"type": "text", "text": ...}``, ``{"type": "image"}``: the chat
  templates' and TRL's form). ``<image>`` (:data:`IMAGE_TOKEN`) in a string and an image part are placeholders for
  the image: at most one, in the user turn (none: the image goes first, as ms-swift places it).
- the **caption** is the assistant turn; the **prompt** (:attr:`~finecap.data.records.Record.prompt`) the user turn's
  text without its placeholder.
- ``images``: the one image's path (a list of one, or a string), relative to ``data.images`` (default the data file's
  folder) and inside it (:class:`~finecap.data.containment.ImageFolder`); a URL is refused (finecap reads local files
  only).
- ``split`` (optional, finecap's own key): ``train``, ``val`` or ``test``; without it the commands split the records
  (:mod:`finecap.data.splits`). A split in another case, in another word or with spaces around it (``"TRAIN"``,
  ``"validation"``, ``" val"``) is read as that split and said in one log line per file; another name (``"dev"``) is
  kept as a split of its own and said as a warning (:class:`~finecap.data.records.SplitKeys`).
- ``questions`` (optional, as a JSONL line's): the image's multiple-choice questions for the ``qa_utility`` reward,
  CapRL's layout (:attr:`~finecap.data.records.Record.questions`); a value that is not a list is refused, naming the
  line.
- the caption and the prompt are one line of text each: a line break, tab or separator in them is a space; another
  control character (NUL, ESC, ...) is refused, naming the line (:func:`~finecap.data.records.clean_text`).

Several lines naming one image file are one record with a reference caption per line, in file order, and the first
line's prompt (COCO converted to chat data has five lines per image) and the questions of the first line giving any (a
later line giving other questions for the image is refused, naming both lines); the image id is the path as the first
line writes it. What is refused, naming the line: a record with no image or several (multi-image chat), no assistant
turn, several exchanges (multi-turn chat), another role (tools, observations), an image given as bytes or a URL, image
parts carrying their own path, a record holding both ``messages`` and ``conversations`` (which one is meant cannot be
told), a key twice in one object (``{"role": "user", "role": "assistant"}``: JSON readers keep one of the two silently)
and nesting deeper than Python's parser goes (:func:`~finecap.utils.reading.parse_json`).

Detected: a ``.jsonl`` file whose first record holds ``messages`` or ``conversations``, or a ``.json`` file holding a
list whose first item does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finecap.data.containment import ImageFolder
from finecap.data.formats import DataSource, Format
from finecap.data.json_files import first_json_line, json_lines, load_json, peek_json
from finecap.data.records import (
    DataError,
    Record,
    SplitKeys,
    check_image_files,
    check_image_path,
    clean_captions,
    clean_text,
    read_questions_field,
    require,
    type_name,
)
from finecap.utils.text import short_repr

TURN_LISTS = ("messages", "conversations")
"""The key of a record's list of turns (ms-swift's and OpenAI's; LLaMA-Factory's sharegpt)."""
TURN_KEYS = (("role", "content"), ("from", "value"))
"""The keys of a turn's speaker and text (OpenAI's; sharegpt's), in either list."""
ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system"}
"""Speaker names read (ms-swift's and LLaMA-Factory's), and the role each stands for."""
IMAGE_TOKEN = "<image>"
"""The image placeholder in a turn's text (LLaMA-Factory's and ms-swift's default)."""


@dataclass(frozen=True)
class ChatRecord:
    """What one chat record says: its image as written, the prompt, the caption, the split (if any) and the image's
    questions (if any)."""

    image: str
    prompt: str
    caption: str
    split: str
    questions: list[Any] | None = None


def _text(content: Any, where: str) -> tuple[str, int]:
    """The text of a turn's ``content`` and its number of image placeholders."""
    if isinstance(content, str):
        return content, content.count(IMAGE_TOKEN)
    if not isinstance(content, list):
        raise DataError(f"{where}: content must be a string or a list of parts, got {type_name(content)}")
    texts, images = [], 0
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = require(part, "text", str, f"{where}, part {k}")
            texts.append(text)
            images += text.count(IMAGE_TOKEN)
        elif kind == "image":
            if any(part.get(key) for key in ("image", "url", "path")):
                raise DataError(f"{where}, part {k}: an image part naming its own file; name the image in the "
                                "record's 'images' list and keep {'type': 'image'} as its placeholder")  # fmt: skip
            images += 1
        else:
            raise DataError(f"{where}, part {k}: a content part must be {{'type': 'text', 'text': ...}} or "
                            f"{{'type': 'image'}}, got {short_repr(part)}")  # fmt: skip
    return "".join(texts), images


def _image(rec: dict[str, Any], where: str) -> str:
    """The one image path a record names."""
    if "images" not in rec:
        raise DataError(f'{where}: no \'images\': a caption record names its image ("images": ["path.jpg"])')
    images = rec["images"]
    images = [images] if isinstance(images, str) else images
    if not isinstance(images, list):
        raise DataError(f"{where}: 'images' must be a list of paths, got {type_name(images)}")
    if len(images) != 1:
        raise DataError(f"{where}: {len(images)} images; a caption record names one image (a chat about several "
                        "images, or none, is not caption data)")  # fmt: skip
    image = images[0]
    if not isinstance(image, str) or not image:
        raise DataError(f"{where}: the image must be a path string, got {type_name(image)} {short_repr(image)} "
                        "(images given as bytes are not read: save them as files)")  # fmt: skip
    check_image_path(image, where, "the image")  # ".", "cats/": a folder, not an image file
    if "://" in image:
        raise DataError(f"{where}: image {short_repr(image)} is a URL; finecap reads local files only (download the "
                        "images and name their paths)")  # fmt: skip
    return image


def parse_chat(rec: Any, where: str, splits: SplitKeys | None = None) -> ChatRecord:
    """The image, prompt, caption and split of one chat record (module docstring); a :class:`DataError` naming
    ``where`` (the file and line) and what is wrong otherwise. ``splits`` reads the ``"split"`` key (and keeps what
    it read in another spelling, for the file's note); default: a reader of its own."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object, got {type_name(rec)}")
    keys = [k for k in TURN_LISTS if k in rec]
    if len(keys) > 1:
        raise DataError(f"{where}: both 'messages' and 'conversations'; a record holds one list of turns (which one "
                        "is meant cannot be told): keep one")  # fmt: skip
    key = keys[0] if keys else None
    if key is None:
        raise DataError(f"{where}: no 'messages' (or 'conversations') list of turns (keys present: "
                        f"{', '.join(sorted(map(str, rec))) or 'none'})")  # fmt: skip
    turns = require(rec, key, list, where)
    said: dict[str, list[tuple[str, int]]] = {"system": [], "user": [], "assistant": []}
    order = []
    for k, turn in enumerate(turns):
        twhere = f"{where}: {key}[{k}]"
        speaker, text_key = next(((s, t) for s, t in TURN_KEYS if isinstance(turn, dict) and s in turn), TURN_KEYS[0])
        name = require(turn, speaker, str, twhere)
        role = ROLES.get(name)
        if role is None:
            raise DataError(f"{twhere}: role {short_repr(name)} is not read; a caption record has a user turn and an "
                            f"assistant turn (roles: {', '.join(ROLES)})")  # fmt: skip
        if text_key not in turn:
            raise DataError(f"{twhere}: missing key {text_key!r}")
        said[role].append(_text(turn[text_key], twhere))
        order.append(role)
    if order and order[0] == "system":
        order = order[1:]
    if not said["assistant"]:
        raise DataError(f"{where}: no assistant turn; the caption is the assistant's reply to the user turn holding "
                        "the image")  # fmt: skip
    if order != ["user", "assistant"]:
        raise DataError(
            f"{where}: turns {' -> '.join(order)}; a caption record is one user turn (the image and the prompt), then "
            "one assistant turn (the caption), after an optional system turn (a multi-turn chat is not caption data)"
        )
    (prompt, placeholders), (caption, in_caption) = said["user"][0], said["assistant"][0]
    if in_caption or placeholders > 1:
        raise DataError(f"{where}: {in_caption + placeholders} image placeholders ({IMAGE_TOKEN} or an image part) "
                        "for one image; keep one, in the user turn")  # fmt: skip
    split = (splits or SplitKeys(where)).read(rec, where)
    prompt = " ".join(clean_text(prompt.replace(IMAGE_TOKEN, " "), f"{where}: the user turn", "the prompt").split())
    caption = clean_captions([caption], f"{where}: the assistant turn")[0]
    return ChatRecord(_image(rec, where), prompt, caption, split, read_questions_field(rec.get("questions"), where))


def _chat_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` of a ``.json`` list or a JSONL file."""
    if path.suffix == ".json":
        data = load_json(path)
        if not isinstance(data, list):
            raise DataError(f"{path}: a chat .json file holds a list of records, got {type_name(data)}")
        return ((f"{path}: [{i}]", rec) for i, rec in enumerate(data))
    return json_lines(path)


def read_messages(
    path: str | Path, images: str | Path | None = None, check_images: bool = True, allow_outside: bool = False
) -> list[Record]:
    """Records of a chat data file (module docstring): one per image, in the order of their first line. Image paths,
    absolute ones too, must lie inside ``images`` (default: the file's folder) unless ``allow_outside``
    (``data.allow_outside_paths``)."""
    path = Path(path)
    root = Path(images) if images is not None else path.parent
    folder = ImageFolder(root, allow_outside)
    if not path.exists():  # a folder: IsADirectoryError, which read_dataset names
        raise DataError(f"{path}: file not found")
    by_file: dict[str, tuple[Record, str]] = {}  # the image file -> its record, and where it was first named
    asked: dict[str, str] = {}  # the image file -> where its questions were given
    splits = SplitKeys(path)
    for where, rec in _chat_records(path):
        chat = parse_chat(rec, where, splits)
        image_path = Path(chat.image) if os.path.isabs(chat.image) else root / chat.image
        key = os.path.normpath(image_path)
        if key in by_file:
            record, first = by_file[key]
            if chat.split != record.split:
                raise DataError(f"{where}: image {chat.image!r} has split {chat.split!r} here but {record.split!r} "
                                f"at {first}; give each image one split")  # fmt: skip
            record.captions.append(chat.caption)
            if chat.questions is not None and record.questions is None:
                record.questions, asked[key] = chat.questions, where
            elif chat.questions is not None and chat.questions != record.questions:
                raise DataError(f"{where}: image {chat.image!r} has other questions here than at {asked[key]}; give "
                                "an image's questions once (or the same on each of its lines)")  # fmt: skip
            continue
        folder.check(image_path, where, chat.image)
        by_file[key] = (Record(chat.image, image_path, chat.split, [chat.caption], prompt=chat.prompt,
                               questions=chat.questions), where)  # fmt: skip
        if chat.questions is not None:
            asked[key] = where
    splits.say()
    records = [record for record, _ in by_file.values()]
    if not records:
        raise DataError(f"{path}: no records (an empty chat data file)")
    if check_images:
        check_image_files(records, path, root)
    return records


def _read(source: DataSource) -> list[Record]:
    return read_messages(source.path, source.images, source.check_images, source.allow_outside)


def _is_chat(record: Any) -> bool:
    return isinstance(record, dict) and any(key in record for key in TURN_LISTS)


def _detect(path: Path) -> Path | None:
    if path.suffix == ".jsonl" and path.is_file():
        return path if _is_chat(first_json_line(path)) else None
    if path.suffix == ".json" and path.is_file():
        data = peek_json(path)
        return path if isinstance(data, list) and data and _is_chat(data[0]) else None
    return None


FORMAT = Format(
    "messages", _read, detect=_detect, split_hint='a "split" key on each record ("train", "val" or "test")'
)
