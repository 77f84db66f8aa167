"""The ``openai`` judge held across runs to the model its cached answers came from (docs/methods/judges.md: the answer
cache records ``served_model``; the rule is boost's, :meth:`finecap.boost.served_model.ServedModel.expect`)."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from finecap.judges.base import CANNOT_ANSWER, Ask, JudgeUnavailable, Question
from finecap.judges.cache import AnswerCache
from finecap.judges.openai import OpenAIJudge
from helpers.chat_server import ChatServer, answering_as

Q = Question("0/color", "What colour is the circle?", ("red", "blue", "green"), "red")
OPTIONS = ("blue", "red", "green", CANNOT_ANSWER)  # "B" (every answer of answering_as): red
ASKS = [Ask(Q, OPTIONS, f"a red circle {i}") for i in range(6)]


def judge_of(server: ChatServer, path, **options) -> OpenAIJudge:
    options.setdefault("concurrency", 1)
    return OpenAIJudge([server.url], "judge-model", cache=AnswerCache(path), sleep=lambda s: None, **options)


def recorded(path) -> list[str | None]:
    """The ``served_model`` column of every row, as stored (JSON; ``None``: SQL NULL, an older finecap's row)."""
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT served_model FROM answers ORDER BY rowid")]


def first_run(path, model: str, n: int = 3) -> None:
    """An earlier run (finecap eval, a training run) whose server answered as ``model``: ``n`` answers cached."""
    with ChatServer(answering_as(model)) as server:
        judge = judge_of(server, path)
        assert judge.answer(ASKS[:n]) == ["red"] * n
        judge.close()
    assert recorded(path) == [json.dumps(model)] * n


def test_a_rerun_whose_server_answers_as_another_model_stops_at_its_first_reply_and_caches_nothing(tmp_path):
    # The cache recorded no model: a re-run (finecap eval again, a resumed training) against a server now answering as
    # another model (a redeployed alias, a proxy's fallback) scored with the cached answers and the new ones: two
    # judges in one score, under judge.model, exit 0.
    path = tmp_path / "answers.sqlite"
    first_run(path, "judge-model-2024-08-06")
    kept = recorded(path)
    with ChatServer(answering_as("cheap-fallback")) as server:
        judge = judge_of(server, path)
        with pytest.raises(JudgeUnavailable) as caught:
            judge.answer(ASKS)  # the 3 cached first, then the first new call
        assert str(caught.value) == (
            f"judge openai: a server answered as model 'cheap-fallback', but judge answers kept in {path} came from "
            "model 'judge-model-2024-08-06' (judge.model='judge-model'): a re-run or a resumed run would score with "
            "two judges' answers under judge.model; serve 'judge-model-2024-08-06' again to continue, or set "
            f"judge.cache=false to ask the judge afresh (or delete {path}, which holds every judge's answers)"
        )
        assert len(server.requests) == 1 and judge.counts["cache_hits"] == 3
        assert recorded(path) == kept  # the other model's answer is not kept
        with pytest.raises(JudgeUnavailable, match="cheap-fallback"):
            judge.answer(ASKS[:1])  # out: a cached answer is not served either, nothing asked
        assert len(server.requests) == 1
        judge.close()


def test_a_cached_answer_of_another_model_than_this_runs_replies_stops_the_judge_at_once(tmp_path):
    # The order reversed: this run's server answered first (its answer kept, recording its model), then a call found
    # an answer of the earlier model in the cache: using it would mix the two.
    path = tmp_path / "answers.sqlite"
    first_run(path, "judge-model", n=1)
    with ChatServer(answering_as("judge-model-2025-01-01")) as server:
        judge = judge_of(server, path)
        assert judge.answer(ASKS[1:2]) == ["red"]
        with pytest.raises(JudgeUnavailable) as caught:
            judge.answer(ASKS[:1])
        # the cache now holds both models' answers (this run's kept first): "serve 'judge-model' again to continue"
        # was untrue, as a run serving it stops at this run's answer; the advice says what the cache holds
        assert str(caught.value) == (
            f"judge openai: judge answers kept in {path} came from model 'judge-model', but a server answered as "
            "'judge-model-2025-01-01' (judge.model='judge-model'): a re-run or a resumed run would score with two "
            "judges' answers under judge.model; the cache now holds answers of 'judge-model-2025-01-01' and "
            "'judge-model': serving one stops at another's, so set judge.cache=false to ask the judge afresh (or "
            f"delete {path}, which holds every judge's answers)"
        )
        assert len(server.requests) == 1 and judge.counts["cache_hits"] == 0
        judge.close()
    assert recorded(path) == ['"judge-model"', '"judge-model-2025-01-01"']  # each answer with the model that gave it


def test_a_rerun_continues_with_the_model_its_cache_records_and_reports_it(tmp_path, caplog):
    # A dated version of judge.model recorded: the same name again continues (no warning) and is recorded; a run that
    # asked nothing new reports the model its cached answers came from (finecap eval's served_model), not nothing.
    path = tmp_path / "answers.sqlite"
    first_run(path, "judge-model-2024-08-06")
    caplog.clear()
    with ChatServer(answering_as("judge-model-2024-08-06")) as server:
        cached = judge_of(server, path)
        assert cached.answer(ASKS[:3]) == ["red"] * 3 and not server.requests
        assert cached.served_model == "judge-model-2024-08-06"
        cached.close()
        judge = judge_of(server, path, concurrency=4)
        assert judge.answer(ASKS) == ["red"] * 6 and len(server.requests) == 3
        assert judge.served_model == "judge-model-2024-08-06"
        judge.close()
    assert recorded(path) == ['"judge-model-2024-08-06"'] * 6
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_an_answer_cache_of_an_older_finecap_is_used_unchecked_and_said_once(tmp_path, caplog):
    # An older finecap's file: no served_model column. It gains the column; its answers are used as they are, said
    # once; the new answers record their model; an older finecap writing into the file after still can.
    path = tmp_path / "answers.sqlite"
    first_run(path, "judge-model", n=3)
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db, sqlite3.connect(old) as older:
        older.execute("CREATE TABLE answers (key TEXT PRIMARY KEY, value TEXT NOT NULL)")  # an older finecap's table
        older.executemany("INSERT INTO answers VALUES (?, ?)", db.execute("SELECT key, value FROM answers"))
    caplog.clear()
    with ChatServer(answering_as("other-model")) as server:
        judge = judge_of(server, old)
        assert judge.answer(ASKS[:5]) == ["red"] * 5 and len(server.requests) == 2
        assert judge.counts["cache_hits"] == 3 and judge.served_model == "other-model"
        judge.close()
    said = [r.getMessage() for r in caplog.records if r.name == "finecap.judges.openai"]
    assert said == [f"{old}: answers of judge.model='judge-model' there were cached by an earlier finecap, which did "
                    "not record the model that gave them; they are used unchecked against the model the server "
                    "answers as now (said once)"]  # fmt: skip
    assert recorded(old) == [None, None, None, '"other-model"', '"other-model"']
    with sqlite3.connect(old) as older:  # an older finecap sharing the home writes as it did: unrecorded
        older.execute("INSERT OR IGNORE INTO answers (key, value) VALUES (?, ?)", ("k", json.dumps(["x"])))
    cache = AnswerCache(old)
    assert cache.entry("k") == (["x"], None, False) and len(cache) == 6
    cache.close()


def test_an_answer_another_process_kept_first_as_another_model_stops_the_judge(tmp_path):
    # Two processes sharing the cache ask the same call; the other, whose server answers as another model, keeps its
    # answer first: the answer every writer then uses is the other model's.
    path = tmp_path / "answers.sqlite"

    class Raced(AnswerCache):
        def keep(self, key, value, served_model=None):
            other = AnswerCache(self.path)  # the other process, answering first
            other.keep(key, "blue", "other-model")
            other.close()
            return super().keep(key, value, served_model)

    with ChatServer(answering_as("judge-model")) as server:
        judge = OpenAIJudge([server.url], "judge-model", cache=Raced(path), sleep=lambda s: None)
        with pytest.raises(JudgeUnavailable, match=re.escape(
            f"judge answers kept in {path} came from model 'other-model', but a server answered as 'judge-model'"
        )):  # fmt: skip
            judge.answer(ASKS[:1])
        judge.close()
    assert recorded(path) == ['"other-model"']
