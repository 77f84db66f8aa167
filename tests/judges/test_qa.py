"""QA utility's rules (finecap.judges.qa, finecap.judges.questions.presentations) on judges whose answers the test
decides: a caption with any failed ask fails; a question is dropped only when a blind judge answers it right in every
one of its ``k`` orders; the ``k`` orders differ from one another while the options allow (rotations of shuffles:
within ``n`` orders each option stands at ``n`` positions, so a judge preferring a position is paid by chance alone)
and follow the seed; the reward asks in the orders the blind filter used."""

from __future__ import annotations

import math
import re

import pytest

from finecap.judges.base import CANNOT_ANSWER, JudgeFailed, Question
from finecap.judges.qa import QAScore, drop_blind, qa_scores
from finecap.judges.questions import presentations
from finecap.judges.world import WorldJudge
from finecap.rewards.qa_utility import QAUtilityReward

Q = Question("0/color/circle", "What colour is the circle?", ("red", "blue", "green", "pink", "grey"), "red",
             ("color", "circle"))  # fmt: skip


class Scripted(WorldJudge):
    """The world judge, but every ask whose options stand first in ``fail_orders`` fails, and a blind ask is
    answered right when its options are among ``blind_right``; every ask it is given is kept."""

    def __init__(self, fail_orders=(), blind_right=()):
        super().__init__()
        self.fail_orders, self.blind_right, self.asked = set(fail_orders), set(blind_right), []

    def answer(self, asks):
        self.asked += asks
        out = []
        for ask in asks:
            if ask.options in self.fail_orders:
                out.append(JudgeFailed("scripted failure"))
            elif ask.caption is None:
                out.append(ask.question.answer if ask.options in self.blind_right else CANNOT_ANSWER)
            else:
                out += super().answer([ask])
        return out


def test_a_caption_with_one_failed_ask_of_several_fails_whole():
    orders = presentations(Q, 2)
    (one_failed, none_failed) = (Scripted(fail_orders=[orders[1]]), Scripted())
    assert isinstance(qa_scores(one_failed, ["a red circle"], [[Q]], 2)[0], JudgeFailed)
    assert qa_scores(none_failed, ["a red circle"], [[Q]], 2) == [QAScore(2, 2, 0, 0)]


def test_a_question_is_dropped_only_when_a_blind_judge_is_right_in_every_order():
    orders = presentations(Q, 2)
    for right_in, dropped in (((), False), ((orders[0],), False), ((orders[1],), False), (tuple(orders), True)):
        kept, report = drop_blind(Scripted(blind_right=right_in), {0: [Q]}, 2)
        assert (kept[0] == [], report["dropped"]) == (dropped, int(dropped)), right_in


def test_the_k_orders_differ_from_one_another_and_follow_the_seed():
    orders = presentations(Q, 6, seed=0)
    assert len(set(orders)) > 1  # five options: six identical shuffles would be chance 1 in 120**5
    assert all(o[-1] == CANNOT_ANSWER and sorted(o[:-1]) == sorted(Q.options) for o in orders)
    firsts = {presentations(Q, 1, seed=s)[0] for s in range(10)}
    assert len(firsts) > 1  # the seed changes the orders
    assert presentations(Q, 6, seed=3)[:2] == presentations(Q, 2, seed=3)  # order j is the same for any k


def options_question(qid: str, n: int) -> Question:
    options = tuple(f"o{i}" for i in range(n))
    return Question(qid, "Which?", options, options[0])


def test_the_k_orders_are_distinct_up_to_all_n_factorial_of_them():
    # drawn independently, the 2 orders of a 2-option question (the world's size and pattern) were the same one
    # time in 2: asked twice in one order, neither de-biased nor blind-filtered in two
    for n, k in ((2, 2), (3, 6), (4, 4), (4, 24), (5, 64)):
        for i in range(50):
            orders = presentations(options_question(f"{i}/{n}", n), k)
            assert len(set(orders)) == k == min(k, math.factorial(n)), (n, i, orders)


def test_within_n_orders_every_option_stands_at_a_different_position_in_each():
    for n in range(2, 7):
        for i in range(30):
            q = options_question(f"{i}/{n}", n)
            orders = presentations(q, n, seed=i)
            for option in q.options:
                assert sorted(o.index(option) for o in orders) == list(range(n)), (n, i, option, orders)


def test_past_n_factorial_orders_they_repeat_from_the_first():
    for i in range(20):
        q = options_question(str(i), 2)
        first, second = presentations(q, 2)
        assert first != second and presentations(q, 5) == [first, second, first, second, first]
        orders = presentations(options_question(str(i), 3), 8)
        assert len(set(orders[:6])) == 6 and orders[6:] == orders[:2]


class FirstOption(WorldJudge):
    """A judge preferring the first position: it answers every ask, blind or not, with the option shown first."""

    def answer(self, asks):
        return [ask.options[0] for ask in asks]


def test_a_judge_preferring_a_position_is_right_by_chance_alone():
    # n options asked in n orders: the answer stands first in exactly one, so such a judge is right in 1 of n asks of
    # every question and no question is answered right blind in all its orders
    for n in (2, 4):
        questions = {i: [options_question(f"{i}/{j}", n) for j in range(5)] for i in range(40)}
        kept, report = drop_blind(FirstOption(), questions, n)
        assert report["dropped"] == 0 and kept == questions
        scores = qa_scores(FirstOption(), ["any caption"] * 40, [questions[i] for i in range(40)], n)
        assert {(s.asks, s.right) for s in scores} == {(5 * n, 5)}


def test_the_reward_asks_in_the_orders_the_blind_filter_used():
    judge = Scripted()
    reward = QAUtilityReward(judge, questions={0: [Q]}, shuffles=3, seed=7)
    reward(["a red circle"], {"image_ids": [0], "image_index": [0]})
    blind = [a.options for a in judge.asked if a.caption is None]
    captioned = [a.options for a in judge.asked if a.caption is not None]
    assert blind == captioned == presentations(Q, 3, seed=7)
    assert presentations(Q, 3, seed=7) != presentations(Q, 3, seed=0)


def test_a_blind_filter_that_could_not_ask_is_refused_naming_the_first_failure():
    # a questions file's free-text question (no fact) given to the world judge: every blind ask fails, and the
    # refusal says why (the judge's own words), not only that the judge may be unreachable
    free = Question("0/q0", "Is the picture pleasant?", ("yes", "no"), "yes")
    kept, report = drop_blind(WorldJudge(), {0: [free]}, 2)  # without refuse=: kept unfiltered and counted
    assert kept == {0: [free]} and report["failed"] == 1
    with pytest.raises(ValueError) as refused:
        QAUtilityReward(WorldJudge(), questions={0: [free]}, shuffles=2)(["a red circle"], {"image_ids": [0]})
    assert str(refused.value).startswith("qa_utility: the world judge could not answer the blind asks of 1 of 1")
    assert "the world judge answers only questions with a 'fact'; '0/q0' has none" in str(refused.value)


def test_two_questions_of_an_image_given_with_one_id_are_refused_naming_it():
    # a data set's or a file's questions were checked for repeated ids, a caller's questions= were not: the blind
    # filter counted two questions of one id as one, and a judge answering the first option shown, right blind in one
    # of two orders of each, had both dropped though neither was right in every order
    from finecap.judges.questions import pick_questions

    colour = Question("7/q", "What colour is the circle?", ("red", "blue"), "red", ("color", "circle"))
    size = Question("7/q", "What size is the square?", ("small", "large"), "large", ("size", "square"))
    first = Scripted(blind_right={o for q in (colour, size) for o in presentations(q, 2) if o[0] == q.answer})
    assert [drop_blind(first, {7: [q]}, 2)[1]["dropped"] for q in (colour, size)] == [0, 0]  # apart: both kept
    said = "image 7 has two questions with id '7/q' (ids must differ)"
    with pytest.raises(ValueError, match=f"^qa_utility: {re.escape(said)}$"):
        QAUtilityReward(first, questions={7: [colour, size]}, shuffles=2)
    with pytest.raises(ValueError, match=f"^metric 'qa': {re.escape(said)}$"):
        pick_questions({7: [colour, size]}, "", None, "metric 'qa'")
    renamed = Question("7/q2", size.text, size.options, size.answer, size.fact)
    reward = QAUtilityReward(first, questions={7: [colour, renamed]}, shuffles=2)
    assert reward.blind["dropped"] == 0 and reward.known_images() == [7]


def test_an_image_keyed_by_an_int_and_its_string_is_refused_naming_the_source():
    # questions={7: [...], "7": [...]} from Python were neither merged (as read_questions merges a file's lines of 7
    # and "7") nor refused: the reward asked a caption of image 7 the one set or the other as the batch wrote its id,
    # so one caption scored 1.0 or 0.0. Scenes keyed so made two sets of questions for one image the same way
    from finecap.judges.questions import pick_questions
    from finecap.world.scene import Obj, Scene

    colour = Question("7/0", "What colour is the circle?", ("red", "blue"), "red", ("color", "circle"))
    size = Question("7/1", "What size is the circle?", ("small", "large"), "large", ("size", "circle"))
    twice = r" 1 image\(s\) keyed twice, e\.g\. 7 and '7' \(an int id and its string are one id"
    with pytest.raises(ValueError, match="^qa_utility questions:" + twice):
        QAUtilityReward(WorldJudge(), questions={7: [colour], "7": [size]}, shuffles=1)
    with pytest.raises(ValueError, match="^metric 'qa' questions:" + twice):
        pick_questions({7: [colour], "7": [size]}, "", None, "metric 'qa'")
    scene = Scene(7, "grass", [Obj("circle", "red", "large", 0, 0)])
    other = Scene(7, "sand", [Obj("circle", "blue", "small", 1, 1)])
    with pytest.raises(ValueError, match="^qa_utility scenes:" + twice):
        QAUtilityReward(WorldJudge(), scenes={7: scene, "7": other}, shuffles=1)
    reward = QAUtilityReward(WorldJudge(), questions={"7": [colour, size]}, shuffles=1)  # one key: asked either way
    assert [reward(["a red large circle"], {"image_ids": [i]}).total.item() for i in (7, "7")] == [1.0, 1.0]
