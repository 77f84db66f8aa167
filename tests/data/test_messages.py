"""data.format=messages (finecap.data.formats.messages): chat JSONL as LLaMA-Factory and ms-swift write it, read
into one record per image, its faults named by file and line, its images kept inside the data set's folder."""

from __future__ import annotations

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
