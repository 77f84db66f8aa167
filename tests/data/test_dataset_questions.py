"""An image's multiple-choice questions given by the data set itself (issue 66, CapRL's layout): a JSONL line's
``questions``, a chat record's ``questions`` and an ``hf`` column named by ``data.hf.questions_column`` are read
alike into ``Record.questions`` and reach the ``qa_utility`` reward as ``RewardInputs.questions``; a value that is
not a list is refused naming the line or row."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from finecap.config import load
from finecap.data.formats.jsonl import read_jsonl
from finecap.data.formats.messages import read_messages
from finecap.data.records import DataError
from finecap.judges.questions import questions_of

# One image with questions in both of CapRL's layouts (options embedded in the text, answer a letter; options listed,
# answer the text), one image with none.
ASKED = [
    {"question": "What colour is the cat?\n  - A) black\n  - B) white\n  - C) Can not answer based on the caption",
     "answer": "A"},
    {"question": "How many cats?", "options": ["one", "two"], "answer": "two"},
]  # fmt: skip


@pytest.fixture
def folder(tmp_path):
    for name in ("a.png", "b.png"):
        Image.new("RGB", (4, 4)).save(tmp_path / name)
    return tmp_path


def _jsonl(folder, rows):
    path = folder / "d.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _chat(image: str, caption: str, **extra) -> dict:
    turns = [{"role": "user", "content": "<image>Describe the image."}, {"role": "assistant", "content": caption}]
    return {"messages": turns, "images": [image], **extra}


def _reference(folder):
    """What the JSONL format reads from the same questions (issue 66's first reader)."""
    lines = [{"image": "a.png", "captions": ["a black cat"], "id": "a.png", "questions": ASKED},
             {"image": "b.png", "captions": ["a dog"], "id": "b.png"}]  # fmt: skip
    return read_jsonl(_jsonl(folder, lines))


def test_chat_records_questions_read_as_jsonl_reads_them(folder):
    expected = _reference(folder)
    path = folder / "chat.jsonl"
    rows = [_chat("a.png", "a black cat", questions=ASKED), _chat("b.png", "a dog")]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    records = read_messages(path)
    assert [r.questions for r in records] == [r.questions for r in expected] == [ASKED, None]
    parsed = questions_of(records)
    assert parsed == questions_of(expected) and sorted(parsed) == ["a.png"]
    first, second = parsed["a.png"]
    assert (first.text, first.options, first.answer) == ("What colour is the cat?", ("black", "white"), "black")
    assert (second.options, second.answer) == (("one", "two"), "two")


def test_chat_questions_are_given_once_per_image(folder):
    path = folder / "chat.jsonl"
    # an image's second line repeating its questions, or giving none, is fine
    rows = [_chat("a.png", "a black cat", questions=ASKED), _chat("a.png", "a cat", questions=ASKED),
            _chat("a.png", "a small cat")]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (record,) = read_messages(path)
    assert record.captions == ["a black cat", "a cat", "a small cat"] and record.questions == ASKED
    # questions given first on a later line are the image's
    rows = [_chat("a.png", "a black cat"), _chat("a.png", "a cat", questions=ASKED[1:])]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert read_messages(path)[0].questions == ASKED[1:]
    # other questions on a later line: which are meant cannot be told
    rows = [_chat("a.png", "a black cat", questions=ASKED), _chat("a.png", "a cat", questions=ASKED[:1])]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match=r"chat\.jsonl, line 2: image 'a\.png' has other questions here than at "
                                        r".*chat\.jsonl, line 1"):  # fmt: skip
        read_messages(path)


def test_a_chat_record_whose_questions_are_no_list_is_refused_naming_the_line(folder):
    path = folder / "chat.jsonl"
    rows = [_chat("b.png", "a dog"), _chat("a.png", "a black cat", questions="What colour is the cat?")]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match=r"chat\.jsonl, line 2: 'questions' must be a list of questions, got 'What "):
        read_messages(path)


# ---------------------------------------------------------------------------------------------------------------------
# hf: data.hf.questions_column
# ---------------------------------------------------------------------------------------------------------------------


def _saved(folder, questions, name="saved"):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"image": ["a.png", "b.png"], "captions": [["a black cat"], ["a dog"]],
                                     "id": ["a.png", "b.png"], "qa": questions})  # fmt: skip
    datasets.DatasetDict({"train": ds}).save_to_disk(str(folder / name))
    return folder / name


def test_an_hf_questions_column_reads_as_jsonl_reads_the_same_questions(folder):
    from finecap.data.datasets import load_records

    expected = _reference(folder)
    saved = _saved(folder, [ASKED, None])
    cfg = load(None, ["data.format=hf", f"data.path={saved}", "data.hf.questions_column=qa", "data.hf.id_column=id",
                      f"data.images={folder}", f"run.cache_dir={folder / 'cache'}"])  # fmt: skip
    records = load_records(cfg, "train")
    # Arrow stored both questions with the keys of either (the first without "options", the second with), the
    # missing ones null: read back, each is the object it was written as, and the JSONL reading of it
    assert [r.questions for r in records] == [r.questions for r in expected] == [ASKED, None]
    assert questions_of(records) == questions_of(expected) and sorted(questions_of(records)) == ["a.png"]
    # without the option no questions are read
    plain = load(
        None, ["data.format=hf", f"data.path={saved}", f"data.images={folder}", f"run.cache_dir={folder / 'cache'}"]
    )
    assert [r.questions for r in load_records(plain, "train")] == [None, None]
    assert questions_of(load_records(plain, "train")) is None


def test_an_hf_questions_cell_that_is_no_list_is_refused_naming_the_row(folder):
    from finecap.data.formats.hf import read_hf

    saved = _saved(folder, ["What colour is the cat?", None])
    with pytest.raises(DataError, match=r"saved: split 'train', row 0: column 'qa' \(data\.hf\.questions_column\) "
                                        r"must be a list of questions, got 'What colour"):  # fmt: skip
        read_hf(saved, questions_column="qa", cache_dir=folder / "cache")


def test_an_hf_questions_column_that_is_not_there_names_the_option_and_the_columns(folder):
    from finecap.data.formats.hf import read_hf

    saved = _saved(folder, [ASKED, None])
    with pytest.raises(DataError, match=r"no column 'questions' \(data\.hf\.questions_column\); columns: image, "
                                        r"captions, id, qa"):  # fmt: skip
        read_hf(saved, questions_column="questions", cache_dir=folder / "cache")


def test_two_questions_of_an_image_with_one_id_are_refused(folder):
    twice = [{**ASKED[1], "id": "count"}, {**ASKED[1], "options": ["three", "two"], "id": "count"}]
    line = {"image": "a.png", "captions": ["a cat"], "id": "a.png", "questions": twice}
    records = read_jsonl(_jsonl(folder, [line]))
    with pytest.raises(ValueError, match=r"data: image 'a.png' has two questions with id 'count'"):
        questions_of(records)
