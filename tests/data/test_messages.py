"""data.format=messages (finecap.data.formats.messages): chat JSONL as LLaMA-Factory and ms-swift write it, read
into one record per image, its faults named by file and line, its images kept inside the data set's folder."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest

from finecap.app.cli import main
from finecap.config import load
from finecap.data.datasets import load_records
from finecap.data.formats import detect_format, read_dataset
from finecap.data.formats.messages import read_messages
from finecap.data.records import NO_SPLIT, DataError, Record
from finecap.data.references import load_references


def chat(image, prompt="<image>Describe the image.", caption="a dog on a deck", **extra):
    """One ms-swift record: a user turn with the image, the assistant's caption."""
    turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": caption}]
    return {"messages": turns, "images": [image] if isinstance(image, str) else image, **extra}


def write_lines(path: Path, *records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.fixture()
def folder(tmp_path) -> Path:
    for name in ("images/dog.jpg", "images/cat.jpg", "images/owl.jpg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")  # existence is checked here; decoding is the image reader's
    return tmp_path


def test_chat_records_read_one_record_per_image(folder):
    path = write_lines(
        folder / "train.jsonl",
        chat("images/dog.jpg", split="train"),
        # the same image again: a second reference caption (COCO as chat data has five lines per image)
        chat("images/dog.jpg", "<image>What is in the picture?", "a black dog lying on wood", split="train"),
        # TRL / chat-template content parts, and a system turn (not read)
        {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                      {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Caption this."}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "  a grey cat asleep "}]}],
         "images": "images/cat.jpg"},  # a string, as ms-swift accepts
        # LLaMA-Factory's sharegpt: conversations of from / value, the placeholder anywhere in the text
        {"conversations": [{"from": "human", "value": "Describe <image> briefly."},
                           {"from": "gpt", "value": "an owl on a branch"}], "images": ["images/owl.jpg"]},
    )  # fmt: skip
    records = read_messages(path)
    assert records == [
        Record("images/dog.jpg", folder / "images/dog.jpg", "train", ["a dog on a deck", "a black dog lying on wood"],
               prompt="Describe the image."),  # the first line's prompt
        Record("images/cat.jpg", folder / "images/cat.jpg", NO_SPLIT, ["a grey cat asleep"], prompt="Caption this."),
        Record("images/owl.jpg", folder / "images/owl.jpg", NO_SPLIT, ["an owl on a branch"],
               prompt="Describe briefly."),
    ]  # fmt: skip
    assert read_dataset("messages", path) == records
    assert detect_format(path) == ("messages", path)  # a .jsonl of chat records, not the jsonl format
    plain = write_lines(folder / "plain.jsonl", {"image": "images/dog.jpg", "captions": ["a dog"]})
    assert detect_format(plain) == ("jsonl", plain)


def test_a_json_list_of_chat_records_is_read_and_detected(folder):
    path = folder / "mllm_demo.json"  # LLaMA-Factory's demo data set is one JSON list
    cat = chat("images/cat.jpg", caption="a cat")
    cat["conversations"] = cat.pop("messages")  # LLaMA-Factory's sharegpt list, with OpenAI-style turns
    path.write_text(json.dumps([chat("images/dog.jpg"), cat]))
    assert detect_format(path) == ("messages", path)
    assert [(r.image_id, r.captions) for r in read_dataset("messages", path)] == [
        ("images/dog.jpg", ["a dog on a deck"]),
        ("images/cat.jpg", ["a cat"]),
    ]
    path.write_text(json.dumps({"messages": []}))
    with pytest.raises(DataError, match=r"mllm_demo.json: a chat .json file holds a list of records, got dict"):
        read_messages(path)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (chat(["images/dog.jpg", "images/cat.jpg"]), r"line 2: 2 images; a caption record names one image"),
        (chat([]), r"line 2: 0 images; a caption record names one image"),
        ({"messages": chat("x")["messages"]}, r"line 2: no 'images'"),
        ({"messages": [{"role": "user", "content": "<image>Describe."}], "images": ["images/dog.jpg"]},
         r"line 2: no assistant turn; the caption is the assistant's reply"),
        ({"messages": [*chat("x")["messages"], *chat("x")["messages"]], "images": ["images/dog.jpg"]},
         r"line 2: turns user -> assistant -> user -> assistant; a caption record is one user turn"),
        ({"messages": chat("x")["messages"][::-1], "images": ["images/dog.jpg"]}, r"line 2: turns assistant -> user"),
        ({"messages": [{"role": "tool", "content": "{}"}], "images": ["images/dog.jpg"]},
         r"line 2: messages\[0\]: role 'tool' is not read"),
        (chat("images/dog.jpg", caption="   "), r"line 2: the assistant turn: caption 0 is empty"),
        (chat("images/dog.jpg", "<image><image>Compare."), r"line 2: 2 image placeholders"),
        (chat("images/dog.jpg", caption="<image> a dog"), r"line 2: 2 image placeholders .* keep one, in the user"),
        (chat([{"bytes": "iVBOR", "path": None}]), r"line 2: the image must be a path string, got dict"),
        (chat("https://example.com/dog.jpg"), r"line 2: image 'https://example.com/dog.jpg' is a URL"),
        (chat("images/dog.jpg", [{"type": "image", "image": "images/cat.jpg"}]),
         r"line 2: messages\[0\], part 0: an image part naming its own file"),
        (chat("images/dog.jpg", [{"type": "video"}]), r"messages\[0\], part 0: a content part must be"),
        ({"text": "a dog", "images": ["images/dog.jpg"]}, r"line 2: no 'messages' \(or 'conversations'\)"),
        ('{"messages": [', r"line 2: invalid JSON at column 15"),
        ("[1, 2]", r"line 2: expected an object, got list"),
    ],
    ids=["two-images", "no-image", "no-images-key", "no-assistant", "multi-turn", "order", "tool-role",
         "empty-caption", "two-placeholders", "placeholder-in-caption", "image-bytes", "url", "image-part-path",
         "video-part", "not-chat", "bad-json", "not-an-object"],
)  # fmt: skip
def test_bad_chat_records_are_named_by_file_and_line(folder, record, message):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg"), record)
    with pytest.raises(DataError, match=message) as e:
        read_messages(path)
    assert str(e.value).startswith(f"{path}, line 2: ")


def test_an_image_outside_the_data_sets_folder_is_refused(folder, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "secret.jpg"
    elsewhere.write_bytes(b"")
    data = folder / "data"
    data.mkdir()
    for written in ("../images/dog.jpg", str(elsewhere)):  # up and out of data/, and an absolute path
        path = write_lines(data / "chat.jsonl", chat(written))
        with pytest.raises(DataError, match=r"outside the data set's image folder .*data.allow_outside_paths=true"):
            read_messages(path)
        assert [r.path for r in read_messages(path, allow_outside=True)] == [data / written]  # the user's call
    # the image root is data.images: relative paths start there and stay inside it
    path = write_lines(data / "chat.jsonl", chat("dog.jpg"))
    assert read_messages(path, images=folder / "images")[0].path == folder / "images/dog.jpg"


def test_one_image_has_one_split_and_images_must_exist(folder):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg", split="train"), chat("images/dog.jpg"))
    with pytest.raises(DataError, match=r"line 2: image 'images/dog.jpg' has split '' here but 'train' at .*line 1"):
        read_messages(path)
    path = write_lines(folder / "chat.jsonl", chat("images/gone.jpg"))
    with pytest.raises(DataError, match=r"chat.jsonl: 1 of 1 image files do not exist"):
        read_messages(path)
    assert read_messages(path, check_images=False)[0].image_id == "images/gone.jpg"
    with pytest.raises(DataError, match=r"chat.jsonl: no records"):
        read_messages(write_lines(folder / "chat.jsonl", ""))


def test_finecap_eval_reads_chat_references(folder, capsys):
    refs = write_lines(folder / "refs.jsonl", chat("images/dog.jpg", split="test"),
                       chat("images/dog.jpg", caption="a black dog", split="test"))  # fmt: skip
    results = folder / "results.json"
    results.write_text(json.dumps([{"image_id": "images/dog.jpg", "caption": "a black dog"}]))
    assert main(["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "bleu",
                 "--format", "json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["BLEU-1"] == pytest.approx(1.0)  # a reference word for word
    loaded = load_references(load(), refs, split="test")
    assert (loaded.format, loaded.captions()) == ("messages", {"images/dog.jpg": ["a dog on a deck", "a black dog"]})


def test_a_vlm_is_told_when_the_datas_prompts_are_not_its_own(folder, caplog):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg", "<image>Caption this photo."),
                       chat("images/cat.jpg", "<image>Caption this photo."))  # fmt: skip
    data = ["data.format=messages", f"data.path={path}", "model.kind=vlm"]
    with caplog.at_level(logging.INFO, logger="finecap.data.datasets"):
        assert [r.prompt for r in load_records(load(None, data), "train")] == ["Caption this photo."] * 2
        assert load_records(load(None, [*data, "vlm.prompt=Caption this photo."]), "train")  # its own: no word
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"data: 2 of 2 records of {path} carry a prompt other than vlm.prompt='Describe the image.' (1 distinct; "
        "'Caption this photo.' in 2); every image is captioned after the one prompt vlm.prompt: set "
        "vlm.prompt='Caption this photo.' to train with the data's"
    ]


# --------------------------------------------------------------------------------------------------------------------
# Lenient chat JSONL (issue 61, class 10): what a record does not say plainly is an error naming the file and the line,
# or read and said
# --------------------------------------------------------------------------------------------------------------------

TURNS = chat("x")["messages"]
SHAREGPT = [{"from": "human", "value": "<image>Describe."}, {"from": "gpt", "value": "an owl"}]


@pytest.mark.parametrize(
    "record",
    [
        {"messages": TURNS, "conversations": SHAREGPT, "images": ["images/dog.jpg"]},
        {"conversations": SHAREGPT, "messages": TURNS, "images": ["images/dog.jpg"]},  # the other order
        {"conversations": SHAREGPT, "messages": [], "images": ["images/dog.jpg"]},  # one of them empty
        {"messages": TURNS, "conversations": None, "images": ["images/dog.jpg"]},  # one of them null
    ],
    ids=["messages-first", "conversations-first", "empty-messages", "null-conversations"],
)
def test_a_record_with_both_lists_of_turns_is_refused(folder, record):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg"), record)
    with pytest.raises(DataError, match=r"line 2: both 'messages' and 'conversations'; .* keep one$") as e:
        read_messages(path)
    assert str(e.value).startswith(f"{path}, line 2: ") and "\n" not in str(e.value)
    listed = folder / "chat.json"  # a .json list of records: named by its index
    listed.write_text(json.dumps([chat("images/dog.jpg"), record]))
    with pytest.raises(DataError, match=rf"^{listed}: \[1\]: both 'messages' and 'conversations'"):
        read_messages(listed)


DUPLICATES = {  # a line whose JSON holds a key twice in one object -> the key, and where that object starts
    "images": ('{"messages": %s, "images": ["images/dog.jpg"], "images": ["images/cat.jpg"]}', "images", '{"messages'),
    "split": ('{"split": "test", "messages": %s, "images": ["images/dog.jpg"], "split": "train"}', "split", '{"split'),
    "role": ('{"images": ["images/dog.jpg"], "messages": [{"role": "user", "role": "assistant", "content": "hi"}]}',
             "role", '{"role": "user"'),
    "content": ('{"images": ["images/dog.jpg"], "messages": [{"role": "user", "content": "<image>Describe."}, '
                '{"role": "assistant", "content": "a cat", "content": "a dog"}]}', "content", '{"role": "assistant"'),
    "text-part": ('{"images": ["images/dog.jpg"], "messages": [{"role": "user", "content": [{"type": "image"}]}, '
                  '{"role": "assistant", "content": [{"type": "text", "text": "a", "text": "b"}]}]}', "text",
                  '{"type": "text"'),
    "escaped-spelling": ('{"messages": %s, "images": ["images/dog.jpg"], "im\\u0061ges": ["images/cat.jpg"]}',
                         "images", '{"messages'),
}  # fmt: skip


@pytest.mark.parametrize("case", list(DUPLICATES))
def test_a_key_given_twice_is_refused_naming_the_line_and_column(folder, case):
    text, key, start = DUPLICATES[case]
    line = text % json.dumps(TURNS) if "%s" in text else text
    column = line.index(start) + 1  # the column of the object holding the key twice
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg"), line)
    with pytest.raises(DataError) as e:
        read_messages(path)
    assert str(e.value).startswith(f"{path}, line 2: duplicate key '{key}' in the object at column {column}; ")
    # the same record in a .json list: the line and the column in the file
    listed = folder / "chat.json"
    listed.write_text("[\n" + json.dumps(chat("images/dog.jpg")) + ",\n" + line + "\n]\n")
    with pytest.raises(DataError) as e:
        read_messages(listed)
    assert str(e.value).startswith(f"{listed}: duplicate key '{key}' in the object at line 3, column {column}; ")
    with pytest.raises(DataError, match=rf"^{listed}: duplicate key"):  # detection names it too
        detect_format(listed)


@pytest.mark.parametrize(
    ("written", "read"),
    [("TRAIN", "train"), ("Train", "train"), (" val ", "val"), ("VAL", "val"), ("Test", "test"), ("test\t", "test"),
     ("RESTVAL", "restval")],
)  # fmt: skip
def test_a_split_in_another_case_is_read_as_that_split_and_said(folder, caplog, written, read):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg", split=read),
                       chat("images/dog.jpg", caption="a black dog", split=written),  # the same image: one split
                       chat("images/cat.jpg", split=written), chat("images/owl.jpg", split=written))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="finecap.data.records"):
        records = read_messages(path)
    assert [(r.image_id, r.split) for r in records] == [("images/dog.jpg", read), ("images/cat.jpg", read),
                                                        ("images/owl.jpg", read)]  # fmt: skip
    notes = [r.getMessage() for r in caplog.records if r.name == "finecap.data.records"]
    assert notes == [f"data: {path}: 3 records write their split in another case or word, or with spaces; read "
                     f"{written!r} as {read!r} (3)"]  # fmt: skip
    assert len(load_records(load(None, ["data.format=messages", f"data.path={path}"]), "train" if read in (
        "train", "restval") else read)) == 3  # fmt: skip


def test_a_split_of_another_name_is_kept_and_warned_about(folder, caplog):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg", split="train"),
                       chat("images/cat.jpg", split="testA"), chat("images/owl.jpg", split="dev"))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="finecap.data.records"):
        assert [r.split for r in read_messages(path)] == ["train", "testA", "dev"]
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "finecap.data.records"] == [
        (logging.WARNING, f"data: {path}: 2 records name a split that is none of train, val, test: 'testA' (1), "
                          "'dev' (1); only --split NAME reads them (training reads train and val)")]  # fmt: skip
    caplog.clear()
    write_lines(path, chat("images/dog.jpg", split="train"), chat("images/cat.jpg", split="test"))
    with caplog.at_level(logging.INFO, logger="finecap.data.records"):
        read_messages(path)
    assert not [r for r in caplog.records if r.name == "finecap.data.records"]  # plain splits: no word


@pytest.mark.parametrize(
    "control",
    ["\x00", "\x07", "\x08", "\x1b", "\x1b[2J", "\x7f", "\x9b", "\x0e"],
    ids=["nul", "bell", "backspace", "escape", "ansi-clear", "delete", "c1-csi", "shift-out"],
)
def test_a_control_character_in_a_caption_or_prompt_is_refused_naming_the_line(folder, control):
    caption, prompt = "the assistant turn: caption 0", "the user turn: the prompt"
    for record, what in [(chat("images/cat.jpg", caption=f"a cat{control} asleep"), caption),
                         (chat("images/cat.jpg", caption=f"{control}"), caption),
                         (chat("images/cat.jpg", f"<image>Describe{control}."), prompt)]:  # fmt: skip
        path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg"), record)
        with pytest.raises(DataError) as e:
            read_messages(path)
        message = str(e.value)
        assert message.startswith(f"{path}, line 2: {what} holds control character U+{ord(control[0]):04X} at ")
        assert control[0] not in message  # shown escaped


@pytest.mark.parametrize(
    ("caption", "read"),
    [("a dog\non a deck", "a dog on a deck"), ("a dog \r\n on a deck", "a dog on a deck"),
     ("a dog\ton a deck", "a dog on a deck"), ("a dog\u2028on a deck", "a dog on a deck"),
     ("a dog\x85on\x0b\x0ca deck\n", "a dog on a deck"), ("a dog  on a deck", "a dog  on a deck")],
    ids=["newline", "crlf-with-spaces", "tab", "line-separator", "nel-vt-ff", "spaces-kept"],
)  # fmt: skip
def test_line_breaks_and_tabs_in_a_caption_are_one_space(folder, caption, read):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg", "<image>Describe\n\tit.", caption))
    assert [(r.captions, r.prompt) for r in read_messages(path)] == [([read], "Describe it.")]


@pytest.mark.parametrize(
    "deep",
    ['{"messages": ' + "[" * 50_000 + "]" * 50_000 + "}",
     '{"images": ["images/dog.jpg"], "messages": [' + '{"a": ' * 5_000 + "1" + "}" * 5_000 + "]}",
     '{"split": "train", "messages": [' + '{"b": [' * 600 + "]}" * 600 + "]}",  # mixed, just past Python's parser
     '{"messages": ' + "[" * 200_000],  # unclosed too
    ids=["arrays", "objects", "mixed", "unclosed"],
)  # fmt: skip
def test_deep_nesting_is_an_error_naming_the_line_not_a_recursion_error(folder, deep):
    path = write_lines(folder / "chat.jsonl", chat("images/dog.jpg"), deep)
    with pytest.raises(DataError) as e:
        read_messages(path)
    depth = itertools.accumulate(1 if c in "[{" else -1 if c in "]}" else 0 for c in deep)  # no bracket in a string
    column = next(k for k, d in enumerate(depth) if d > 500) + 1  # where the 501st level opens
    assert str(e.value).startswith(f"{path}, line 2: JSON nested too deeply to read (more than 500 levels at column "
                                   f"{column}); ")  # fmt: skip
