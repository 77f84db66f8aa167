"""Questions written by an LLM judge from references (issue 66: ``finecap questions make`` on data without scene
graphs): the strict parser, and the command end to end against a fake OpenAI-compatible judge on 127.0.0.1, whose
questions go through the blind filter into a questions file ``qa_utility`` reads."""

from __future__ import annotations

import json

import pytest
import yaml
from PIL import Image

from finecap.app.cli import main
from finecap.judges.base import CANNOT_ANSWER, Subject
from finecap.judges.cache import AnswerCache
from finecap.judges.openai import OpenAIJudge, parse_questions
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


def test_written_questions_go_through_the_answer_cache(tmp_path):
    # the cache keeps the written rows; a hit gives the asking image's own question ids (the key holds only the
    # references), and asks the server nothing (once, a cached judge crashed: a Question is no JSON)
    asked = []

    def writes(payload, n):
        asked.append(payload)
        return 200, completion(json.dumps(WRITTEN))

    with ChatServer(writes) as server:
        judge = OpenAIJudge([server.url], "judge-model", cache=AnswerCache(tmp_path / "answers.sqlite"))
        (first,) = judge.make_questions([Subject(7, ("a black cat",))], 8)
        (again,) = judge.make_questions([Subject(9, ("a black cat",))], 8)
        judge.close()
    assert [q.id for q in first] == ["7/q0", "7/q1"] and [q.id for q in again] == ["9/q0", "9/q1"]
    assert [(q.text, q.options, q.answer) for q in again] == [(q.text, q.options, q.answer) for q in first]
    assert len(asked) == 1 and judge.counts["cache_hits"] == 1


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
    # run again on its own output: replaced without --force (it was refused as a file finecap did not make)
    args = ["questions", "make", "--out", "questions.jsonl", "--data", "data.jsonl", "--judge", "openai",
            "--per-image", "2", "judge.model=judge-model", "judge.shuffles=2", "judge.cache=false",
            "data.format=jsonl"]  # fmt: skip
    with ChatServer(judge_answers) as server:
        assert main([*args, f"judge.urls=[{server.url}]"]) in (0, None)
    # a judge that writes nothing (unreachable): an error, and no empty file that reads as a result
    before = (tmp_path / "questions.jsonl").read_bytes()
    assert main([*args, "judge.urls=[http://127.0.0.1:9/v1]", "judge.retries=0", "--out", "none.jsonl"]) == 2
    assert not (tmp_path / "none.jsonl").exists() and (tmp_path / "questions.jsonl").read_bytes() == before


def test_a_prompts_file_without_a_questions_prompt_is_refused_naming_it(tmp_path):
    # the questions prompt is optional (only `finecap questions make` asks for it): left out, the file loads; asked
    # for, a ValueError names the file (it was a bare KeyError); given malformed, the file is refused at load
    from finecap.judges.openai import load_prompts

    packaged = load_prompts()
    mine = {k: v for k, v in packaged.items() if k not in ("questions", "file")}
    path = tmp_path / "my_prompts.yaml"
    path.write_text(yaml.safe_dump(mine))
    judge = OpenAIJudge(["http://127.0.0.1:9/v1"], "judge-model", prompts=path)
    with pytest.raises(ValueError, match=r"my_prompts\.yaml: has no 'questions' prompt"):
        judge.make_questions([Subject(7, ("a black cat",))], 4)
    path.write_text(yaml.safe_dump({**mine, "questions": {"system": "write questions"}}))
    with pytest.raises(ValueError, match=r"my_prompts\.yaml: needs 'questions' with 'system' and 'user'"):
        load_prompts(path)


def test_images_the_judge_wrote_no_questions_for_are_a_warning(tmp_path, monkeypatch, capsys):
    # the count of images left without questions was a bare print on stderr: no `warning:`, not a log record
    monkeypatch.chdir(tmp_path)
    rows = []
    for i in range(3):
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / f"img{i}.png")
        rows.append({"image": f"img{i}.png", "captions": [f"a black cat on a sofa {i}"], "id": i, "split": "train"})
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def one_unwritten(payload, n):  # the questions of the image of "sofa 1" are never valid JSON
        if "sofa 1" in payload["messages"][-1]["content"]:
            return 200, completion("not json")
        return judge_answers(payload, n)

    with ChatServer(one_unwritten) as server:
        code = main(["-q", "questions", "make", "--out", "questions.jsonl", "--data", "data.jsonl", "--judge",
                     "openai", "--per-image", "2", f"judge.urls=[{server.url}]", "judge.model=judge-model",
                     "judge.shuffles=2", "judge.cache=false", "data.format=jsonl"])  # fmt: skip
    assert code in (0, None)
    assert sorted(read_questions(tmp_path / "questions.jsonl")) == [0, 2]
    err = capsys.readouterr().err
    assert "warning: questions: the openai judge wrote no usable questions for 1 of 3 images (left out)\n" in err


@pytest.mark.parametrize("per_image", ["0", "-5"])
def test_a_per_image_below_one_is_refused_before_the_judge_is_asked(tmp_path, monkeypatch, capsys, per_image):
    # `--per-image 0` (or below) was taken: the judge was asked for "up to 0 questions" for every image, each reply
    # refused as more than 0, re-asked and paid for, before a late "no image got a question"
    monkeypatch.chdir(tmp_path)
    Image.new("RGB", (8, 8)).save(tmp_path / "img0.png")
    row = {"image": "img0.png", "captions": ["a black cat on a sofa"], "id": 0, "split": "train"}
    (tmp_path / "data.jsonl").write_text(json.dumps(row) + "\n")
    asked = []

    def counts(payload, n):
        asked.append(payload)
        return judge_answers(payload, n)

    with ChatServer(counts) as server, pytest.raises(SystemExit) as stopped:
        main(["questions", "make", "--out", "questions.jsonl", "--data", "data.jsonl", "--judge", "openai",
              "--per-image", per_image, f"judge.urls=[{server.url}]", "judge.model=judge-model", "judge.cache=false",
              "data.format=jsonl"])  # fmt: skip
    assert stopped.value.code == 2
    assert f"argument --per-image: must be from 1 to 100, got {per_image}" in capsys.readouterr().err
    assert asked == [] and not (tmp_path / "questions.jsonl").exists()
