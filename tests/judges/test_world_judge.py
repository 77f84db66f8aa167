"""The world judge: exact answers on constructed captions (a fact stated, contradicted, absent; blind), its seeded
noise, its claims and support against the scene, and the questions made from a scene graph."""

from __future__ import annotations

import json

import pytest

from finecap.boost.world_facts import render_facts
from finecap.judges import get_judge
from finecap.judges.base import CANNOT_ANSWER, Ask, JudgeFailed, Question, Subject
from finecap.judges.claims import claim_scores
from finecap.judges.questions import presentations, read_questions, scene_questions, write_questions
from finecap.judges.world import WorldJudge
from finecap.world.facts import faithfulness, scene_facts
from finecap.world.scene import Obj, Scene

SCENE = Scene(0, "grass", [Obj("circle", "red", "large", 0, 0), Obj("square", "blue", "small", 2, 2, "striped")])
COLOR = Question("0/color/circle", "What colour is the circle?", ("red", "blue", "green"), "red", ("color", "circle"))
ORDER = ("green", "red", "blue", CANNOT_ANSWER)


def ask(caption, question=COLOR, options=ORDER):
    return Ask(question, options, caption)


def test_answers_a_stated_a_contradicted_and_an_absent_fact():
    judge = WorldJudge()
    answers = judge.answer([ask("a red circle on grass"), ask("a blue circle"), ask("a red square"), ask(None),
                            ask("a purple circle")])  # fmt: skip
    # stated: red; contradicted: blue (the caption's value, wrong); absent: the square's colour is not the circle's;
    # blind: no caption; a value that is not an option: nothing to choose
    assert answers == ["red", "blue", CANNOT_ANSWER, CANNOT_ANSWER, CANNOT_ANSWER]


def test_a_caption_stating_two_values_of_a_fact_settles_nothing_in_any_order():
    judge = WorldJudge()
    for options in (("blue", "red", "green", CANNOT_ANSWER), ("red", "blue", "green", CANNOT_ANSWER)):
        assert judge.answer([ask("a red blue circle", options=options)]) == [CANNOT_ANSWER]
    # the second value need not be an option: the caption still contradicts itself
    assert judge.answer([ask("a red circle. a purple circle")]) == [CANNOT_ANSWER]


def test_a_caption_listing_every_value_is_paid_nothing_by_qa_utility():
    """A hedge (every colour, size, cell, background and count of the circle, no information) answered by the first
    stated option in the presented order was paid about 1 / options a question: 0.3 on this scene, where "a circle"
    gets 0; the reward of a caption contradicting itself on every fact is 0, and stating the truth stays paid."""
    from finecap.judges.questions import QUESTION_VALUES
    from finecap.rewards.qa_utility import QAUtilityReward
    from finecap.world.captions import BACKGROUND_PHRASES, NUMBER_WORDS

    scene = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
    reward = QAUtilityReward(WorldJudge(), scenes={0: scene}, shuffles=4)
    hedge = ". ".join([*(f"a {v} circle" for k in ("color", "size") for v in QUESTION_VALUES[k]),
                       *(f"a circle at the {v}" for v in QUESTION_VALUES["position"]),
                       *(BACKGROUND_PHRASES[b][0] for b in QUESTION_VALUES["background"]),
                       "one shape", *(f"{w} shapes" for w in NUMBER_WORDS.values())])  # fmt: skip
    out = reward([hedge, "a circle", "one large red circle in the middle on grass"], {"image_ids": [0, 0, 0]})
    assert out.total.tolist() == [0.0, 0.0, 1.0]
    assert out.parts["cannot_answer"].tolist() == [1.0, 1.0, 0.0]


def test_background_and_count_questions_and_a_question_without_a_fact():
    bg = Question("0/bg", "What is the background?", ("sand", "grass"), "grass", ("background", None))
    count = Question("0/n", "How many shapes?", ("1", "2", "3"), "2", ("count", None))
    free = Question("0/free", "Is it sunny?", ("yes", "no"), "yes")
    judge = WorldJudge()
    out = judge.answer([ask("two shapes on sand", bg, ("grass", "sand", CANNOT_ANSWER)),
                        ask("two shapes on sand", count, ("1", "2", "3", CANNOT_ANSWER)),
                        ask("a circle", free, ("yes", "no", CANNOT_ANSWER))])  # fmt: skip
    assert out[:2] == ["sand", "2"]
    assert isinstance(out[2], JudgeFailed) and "fact" in str(out[2])
    assert judge.counts["failed"] == 1 and judge.counts["calls"] == 3


def test_the_questions_of_a_scene_are_all_answered_from_a_caption_stating_every_fact():
    questions = scene_questions(0, SCENE)
    # circle: colour, size, position; square: the same and its pattern; background; count
    assert len(questions) == 9 and len({q.id for q in questions}) == 9
    caption = render_facts(scene_facts(SCENE))
    judge = WorldJudge()
    for q in questions:
        for options in presentations(q, 3):
            assert options[-1] == CANNOT_ANSWER and sorted(options[:-1]) == sorted(q.options)
            assert judge.answer([Ask(q, options, caption)]) == [q.answer], q
            assert judge.answer([Ask(q, options, "")]) == [CANNOT_ANSWER]
    assert scene_questions(0, SCENE) == questions  # the wrong options are seeded by the question


def test_presentations_shuffle_and_are_seeded():
    q = scene_questions(0, SCENE)[0]
    assert presentations(q, 4, seed=1) == presentations(q, 4, seed=1)
    orders = {o for seed in range(20) for o in presentations(q, 2, seed)}
    assert len(orders) > 1


def test_noise_flips_the_set_share_of_answers_the_same_way_every_time():
    questions = scene_questions(0, SCENE)
    captions = ("a red circle", "a blue circle at the top left", "two shapes on grass", "a striped square", "x")
    asks = [Ask(q, o, c) for q in questions for o in presentations(q, 4) for c in captions]
    exact = WorldJudge().answer(asks)
    always = WorldJudge(noise=1.0).answer(asks)
    assert all(a != e for a, e in zip(always, exact, strict=True))
    some = WorldJudge(noise=0.3, seed=5).answer(asks)
    flipped = sum(a != e for a, e in zip(some, exact, strict=True)) / len(asks)
    assert 0.22 < flipped < 0.38  # 180 draws of p = 0.3
    assert WorldJudge(noise=0.3, seed=5).answer(asks) == some
    assert WorldJudge(noise=0.3, seed=6).answer(asks) != some
    with pytest.raises(ValueError, match="judge.noise"):
        WorldJudge(noise=1.5)


def test_noise_draws_apart_for_each_caption_and_each_order_and_may_answer_cannot():
    # one draw per (caption, question, options as presented): a GRPO group's captions and a question's k orders get
    # flips of their own; the flip is to any other option, "cannot answer" included
    judge, exact = WorldJudge(noise=0.5, seed=1), "red"
    by_caption = judge.answer([ask(f"a red circle {'and a square ' * n}") for n in range(40)])
    assert {a == exact for a in by_caption} == {True, False}
    orders = [o for seed in range(40) for o in presentations(COLOR, 1, seed)]
    by_order = judge.answer([ask("a red circle", options=o) for o in orders])
    assert {a == exact for a in by_order} == {True, False}
    flips = WorldJudge(noise=1.0).answer([ask("a red circle", options=o) for s in range(200) for o in
                                          presentations(COLOR, 1, s)])  # fmt: skip
    assert exact not in flips and set(flips) == {"green", "blue", CANNOT_ANSWER}
    assert 40 <= flips.count(CANNOT_ANSWER) <= 93  # 200 draws of p = 1/3: mean 66.7, 4 sigma 26.7


def test_noise_flips_blind_answers_too_so_the_blind_filter_drops_some_questions():
    # noise models a wrong judge, and a blind ask is an ask of the judge: its exact "cannot answer" is flipped like any
    # answer, to one of the question's n options (docs/methods/judges.md#what-the-world-judge-answers-exactly), so
    # with k distinct orders the blind filter drops a question with probability (p / n) ** k
    from finecap.judges.qa import drop_blind

    blind = WorldJudge(noise=1.0).answer([ask(None, options=o) for o in presentations(COLOR, 6)])  # all 3! orders
    assert CANNOT_ANSWER not in blind and set(blind) <= {"red", "green", "blue"}
    size = {i: [Question(f"{i}/size/circle", "What size?", ("small", "large"), "small", ("size", "circle"))]
            for i in range(4000)}  # fmt: skip
    assert drop_blind(WorldJudge(), size, 2)[1]["dropped"] == 0  # an exact blind judge is never right
    share = drop_blind(WorldJudge(noise=1.0), size, 2)[1]["share"]
    assert abs(share - (1.0 / 2) ** 2) < 0.03, share  # 4000 draws of p = 0.25: 4 sigma 0.027
    share = drop_blind(WorldJudge(noise=0.3), size, 2)[1]["share"]
    assert abs(share - (0.3 / 2) ** 2) < 0.012, share  # p = 0.0225: 4 sigma 0.0094


def test_recall_is_zero_when_the_references_state_no_claim():
    (score,) = claim_scores(WorldJudge(), ["a red circle"], [Subject(0, ("nothing to see",))])
    assert (score.recall, score.n_reference, score.f1) == (0.0, 0, 0.0)


def test_claims_against_the_scene_are_the_faithfulness_metrics():
    judge = get_judge("world", None)
    captions = ["a red circle at the top left", "a blue circle on sand", "two squares", "", "a striped square"]
    scores = claim_scores(judge, captions, [Subject(0, (), SCENE)] * len(captions))
    for caption, s in zip(captions, scores, strict=True):
        want = faithfulness(caption, SCENE)
        assert (s.precision, s.recall) == (want.precision, want.recall), caption
        assert (s.n_claims, s.n_supported, s.n_covered) == (want.n_stated, want.n_correct, want.n_recalled)


def test_claims_against_references_without_a_scene():
    judge = WorldJudge()
    # reference facts: object(circle), color(circle)=red, background=grass; the caption states 2, one of them false
    s = claim_scores(judge, ["a blue circle"], [Subject(0, ("a red circle on grass",))])[0]
    assert (s.precision, s.recall) == (0.5, pytest.approx(1 / 3))
    score, reason = judge.rate([("a blue circle", Subject(0, (), SCENE))])[0]
    assert "false: color(circle)=blue" in reason and score == pytest.approx(100 * 2 * 0.5 * (1 / 11) / (0.5 + 1 / 11))


def test_claims_against_references_read_the_worlds_other_wordings_of_a_fact():
    # the circle above the square, as the world's relation template words it either way round and with a vague
    # noun: each true claim here was refuted (the references state it otherwise), and the recall missed the same way
    judge = WorldJudge()
    references = ("a red circle above a small blue square", "a blue shape below a circle on grass")
    captions = ["a square below a circle", "a circle above a blue shape", "a blue square under a red circle"]
    scores = claim_scores(judge, captions, [Subject(0, references)] * 3)
    # claims: object x2 + relation(square below circle); object(circle) + color(*)=blue + relation(circle above *);
    # objects, both colours, relation(square below circle): every one implied by the references
    assert [(s.n_supported, s.n_claims) for s in scores] == [(3, 3), (3, 3), (5, 5)]
    # reference claims (9): objects (2), color(circle)=red, color(square)=blue, size(square)=small, background=grass,
    # relation(circle above square), color(*)=blue, relation(* below circle); the third caption states or implies
    # all but the size and the background: 9 - 2 = 7 (the two relations and color(*)=blue by implication)
    assert (scores[2].n_reference, scores[2].n_covered) == (9, 7)
    score, reason = judge.rate([(captions[2], Subject(0, references))])[0]
    assert "false: none" in reason and "missing: background=grass, size(square)=small" in reason, reason
    assert score == pytest.approx(100 * 2 * 1 * (7 / 9) / (1 + 7 / 9))


def test_questions_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "questions.jsonl"
    write_questions({0: scene_questions(0, SCENE)}, path)
    assert read_questions(path) == {0: scene_questions(0, SCENE)}
    path.write_text('{"image_id": "a.jpg", "questions": [{"question": "Colour?", "options": ["red", "blue"], '
                    '"answer": "B"}]}\n')  # fmt: skip
    (q,) = read_questions(path)["a.jpg"]
    assert q.answer == "blue" and q.fact is None
    path.write_text('{"image_id": 1, "questions": [{"question": "Colour?", "options": ["red"], "answer": "pink"}]}\n')
    with pytest.raises(ValueError, match=r"questions.jsonl:1: .*'pink' is not one of"):
        read_questions(path)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match=r"questions.jsonl:1: not JSON"):
        read_questions(path)
    # a misspelt fact was answered "cannot answer" whatever the caption said, silently
    for fact in ('["colour", "circle"]', '["color", "circel"]', '["count", "circle"]', '"color"'):
        path.write_text('{"image_id": 1, "questions": [{"question": "Colour?", "options": ["red", "blue"], '
                        f'"answer": "red", "fact": {fact}}}]}}\n')  # fmt: skip
        with pytest.raises(ValueError, match=r"questions.jsonl:1: question 0 of image 1: 'fact' .* is no fact the "
                                             "world judge answers"):  # fmt: skip
            read_questions(path)


def test_a_questions_file_fact_with_options_the_world_never_states_is_refused(tmp_path):
    # options not written as the world's facts write their values ("Red", "center", "one") were never chosen by the
    # world judge: a caption stating every fact scored 0 right, 3 "cannot answer", silently
    path = tmp_path / "questions.jsonl"
    for fact, options, foreign in ((["color", "circle"], ["Red", "blue"], "'Red'"),
                                   (["position", "circle"], ["top left", "center"], "'center'"),
                                   (["count", None], ["one", "2"], "'one'")):  # fmt: skip
        question = {"question": "?", "options": options, "answer": options[1], "fact": fact}
        path.write_text(json.dumps({"image_id": 1, "questions": [question]}) + "\n")
        with pytest.raises(ValueError, match=rf"questions.jsonl:1: question 0 of image 1: option\(s\) {foreign} of a "
                                             f"'{fact[0]}' question are no value the world states"):  # fmt: skip
            read_questions(path)
    good = {"question": "?", "options": ["red", "blue"], "answer": "red", "fact": ["color", "circle"]}
    path.write_text(json.dumps({"image_id": 1, "questions": [good]}) + "\n")
    (q,) = read_questions(path)[1]
    assert WorldJudge().answer([ask("a red circle", q, ("blue", "red", CANNOT_ANSWER))]) == ["red"]


def test_caprls_layout_with_the_options_in_the_question_text(tmp_path):
    path = tmp_path / "caprl.jsonl"
    question = "What colour is the circle?\n   - A) red\n   - B) blue\n   - C) Can not answer based on the caption"
    path.write_text(json.dumps({"image_id": 3, "questions": [{"question": question, "answer": "B"}]}) + "\n")
    (q,) = read_questions(path)[3]
    assert (q.text, q.options, q.answer) == ("What colour is the circle?", ("red", "blue"), "blue")


def test_an_images_questions_on_several_lines_get_distinct_ids_and_a_repeated_id_is_refused(tmp_path):
    # the default id numbers an image's questions across its lines (it restarted at each line, so two questions
    # shared "1/0" and the blind filter summed their answers as one question's)
    path = tmp_path / "questions.jsonl"
    line = {"image_id": 1, "questions": [{"question": "Colour?", "options": ["red", "blue"], "answer": "red"}]}
    path.write_text(json.dumps(line) + "\n" + json.dumps(line) + "\n")
    assert [q.id for q in read_questions(path)[1]] == ["1/0", "1/1"]
    named = {**line, "questions": [{**line["questions"][0], "id": "colour"}]}
    path.write_text(json.dumps(named) + "\n" + json.dumps(named) + "\n")
    with pytest.raises(ValueError, match=r"questions.jsonl:2: image 1 has two questions with id 'colour'"):
        read_questions(path)


class AlwaysRed(WorldJudge):
    """A judge of one's own: the world judge, but every question is answered "red" when that is an option."""

    name = "always_red"

    def answer(self, asks):
        return ["red" if "red" in a.options else CANNOT_ANSWER for a in asks]


def always_red(cfg, **options):
    return AlwaysRed()


def not_a_judge(cfg, **options):
    return object()


def test_a_judge_of_ones_own_by_dotted_path():
    from finecap.config import load

    judge = get_judge(f"{__name__}:always_red", load(None, [f"judge.name={__name__}:always_red"]))
    assert judge.name == "always_red" and judge.answer([ask("a blue circle")]) == ["red"]
    with pytest.raises(ValueError, match="not a finecap.judges.base.Judge"):
        get_judge(f"{__name__}:not_a_judge", None)
    with pytest.raises(ValueError, match="judge.name: unknown judge 'nope'; valid names: openai, vllm, world"):
        get_judge("nope", None)


def test_the_answer_cache_opens_while_another_process_holds_it_locked(tmp_path, monkeypatch):
    """Two processes opening a new cache at once: switching to the write-ahead log answered "database is locked" at
    once, without SQLite's busy wait (15 of 100 pairs of judged evals on a fresh home died there); the opening is
    retried within the busy time-out."""
    import sqlite3

    from finecap.judges import cache as cache_mod

    real = sqlite3.connect
    refusals = []

    class Busy:  # the connection as another process's opening leaves it for a moment
        def __init__(self, db):
            self.db = db

        def execute(self, statement, *args):
            if statement.startswith("PRAGMA") and len(refusals) < 3:
                refusals.append(statement)
                raise sqlite3.OperationalError("database is locked")
            return self.db.execute(statement, *args)

        def close(self):
            self.db.close()

    monkeypatch.setattr(cache_mod.sqlite3, "connect", lambda *a, **k: Busy(real(*a, **k)))
    cache = cache_mod.AnswerCache(tmp_path / "answers.sqlite")
    cache.put("k", {"a": 1})
    assert cache.get("k") == {"a": 1} and len(refusals) == 3
    cache.close()
    monkeypatch.setattr(cache_mod, "BUSY_SECONDS", 0)  # past the time-out, the error is raised
    refusals.clear()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        cache_mod.AnswerCache(tmp_path / "other.sqlite")


def test_what_the_world_judge_does_not_read_is_as_its_docs_say():
    """docs/methods/judges.md, 'What it does not read': a negated or digit-counted caption is scored as stated."""
    from finecap.rewards.claims import ClaimsReward

    out = ClaimsReward(WorldJudge(), scenes={0: SCENE}, score="precision")(
        ["there is no red circle", "no triangle", "3 shapes"], {"image_ids": [0, 0, 0]}
    )
    # the false caption's precision is 1, the true one's 0; "3 shapes" states nothing: the reward's 0 of 0 claims
    assert out.total.tolist() == [1.0, 0.0, 0.0]


def test_an_option_of_another_judge_is_refused_saying_whose_it_is():
    # WorldJudge(retries=3) and get_judge("world", cfg, retries=3) were Python's bare "unexpected keyword argument"
    # (the factory's: "build() got ..."), though judge.retries is a judge option (the openai judge's): now the error
    # says what the configuration says of it, as the vllm judge's does (finecap.judges.base.refuse_unread)
    from finecap.config import load

    said = ("WorldJudge: retries= is judge.retries, read with judge.name=openai, not by the world judge. "
            "judge.retries: openai: retries of a failed request, and re-asks of an unparsable answer until one "
            "repeats, before the call counts as failed (vllm asks once: its greedy engine repeats its "
            "answers).")  # fmt: skip
    for make in (lambda: WorldJudge(retries=3), lambda: get_judge("world", load(None, []), retries=3),
                 lambda: get_judge("world", None, noise=0.1, retries=3)):  # fmt: skip
        with pytest.raises(TypeError) as refused:
            make()
        assert str(refused.value) == said
    model = r"^WorldJudge: model= is judge.model, read with judge.name=openai or vllm, not by the world judge\. "
    with pytest.raises(TypeError, match=model + "judge.model: openai: the served model name"):
        get_judge("world", None, model="my-chat-lm")
    with pytest.raises(TypeError, match=r"^WorldJudge.__init__\(\) got an unexpected keyword argument 'retry'$"):
        get_judge("world", None, retry=3)  # a name of no judge's option: Python's own words
    judge = get_judge("world", None, noise=0.1, seed=4)  # the world judge's own options still taken
    assert (judge.noise, judge.seed) == (0.1, 4)
