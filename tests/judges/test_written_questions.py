"""Questions written by an LLM judge from references (issue 66: ``finecap questions make`` on data without scene
graphs): the strict parser, and the command end to end against a fake OpenAI-compatible judge on 127.0.0.1, whose
questions go through the blind filter into a questions file ``qa_utility`` reads."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from finecap.app.cli import main
from finecap.judges.base import CANNOT_ANSWER
from finecap.judges.openai import parse_questions
from finecap.judges.questions import read_questions
from helpers.chat_server import ChatServer, completion

WRITTEN = [
    {"question": "What colour is the cat?", "options": ["black", "white", "grey"], "answer": "black"},
    {"question": "Is it day or night?", "options": ["day", "night"], "answer": "day"},
]


def test_parse_questions_is_strict():
    (first, second) = parse_questions(json.dumps(WRITTEN), 7, 8)
    assert (first.id, first.text, first.options, first.answer) == ("7/q0", "What colour is the cat?",
                                                                    ("black", "white", "grey"), "black")  # fmt: skip
    assert second.options == ("day", "night")
    bad = [
        "not json",
        json.dumps([]),  # no question
        json.dumps(WRITTEN * 5),  # more than n
        json.dumps([{**WRITTEN[0], "answer": "purple"}]),  # the answer is no option
        json.dumps([{**WRITTEN[0], "options": ["black"]}]),  # one option
        json.dumps([{**WRITTEN[0], "extra": 1}]),  # another key
        json.dumps([{**WRITTEN[0], "options": ["black", "black"]}]),  # options not distinct
    ]
    for text in bad:
        with pytest.raises(ValueError):
            parse_questions(text, 7, 8)


def judge_answers(payload, n):
    """Writes WRITTEN for every image; blind, answers the day/night question right (dropped) and cannot answer the
    colour one (kept)."""
    user = payload["messages"][-1]["content"]
    if "Reference captions:" in user and "Write up to" in user:
        return 200, completion(json.dumps(WRITTEN))
    options = {line[0]: line[3:] for line in user.splitlines() if len(line) > 3 and line[1:3] == ". "}
    wanted = "day" if "day or night" in user else CANNOT_ANSWER
    return 200, completion(next(k for k, v in options.items() if v == wanted))


def test_questions_make_writes_judged_questions_for_jsonl_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = []
    for i in range(3):
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / f"img{i}.png")
        rows.append({"image": f"img{i}.png", "captions": [f"a black cat on a sofa {i}", "a cat in the day"],
                     "id": i, "split": "train"})  # fmt: skip
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ChatServer(judge_answers) as server:
        code = main(["questions", "make", "--out", "questions.jsonl", "--data", "data.jsonl", "--judge", "openai",
                     "--per-image", "2", f"judge.urls=[{server.url}]", "judge.model=judge-model", "judge.shuffles=2",
                     "judge.cache=false", "data.format=jsonl"])  # fmt: skip
    assert code in (0, None)
    kept = read_questions(tmp_path / "questions.jsonl")
    assert sorted(kept) == [0, 1, 2]
    assert all([q.text for q in qs] == ["What colour is the cat?"] for qs in kept.values())  # day/night dropped
    assert kept[0][0].answer == "black" and kept[0][0].options == ("black", "white", "grey")
