"""``finecap eval --metrics qa,claims,clair --judge world`` scores captions of a world: the claims metric equals the
world's faithfulness, per-image rows name the judge and its prompt version, clair keeps the judge's reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from finecap.app.cli import main as cli
from finecap.config import WorldConfig, load
from finecap.data.references import load_references
from finecap.data.results import write_results
from finecap.judges.base import JudgeFailed
from finecap.judges.qa import drop_blind, qa_scores
from finecap.judges.questions import read_questions, scene_questions
from finecap.judges.world import WorldJudge
from finecap.world.make import make_world


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    make_world(WorldConfig(n_train=8, n_val=2, n_test=6, image_size=32), out, progress=False)
    return out


def test_eval_scores_a_world_with_the_world_judge(world, tmp_path):
    refs = load_references(load(), world, split="test")
    # a caption per image: its first reference, with the main object's colour word swapped for "pink" on image 0
    predictions = {r.image_id: r.captions[0] for r in refs.records}
    first = refs.records[0]
    predictions[first.image_id] = f"a pink {refs.scenes[first.image_id].main.shape}"
    write_results(tmp_path / "results.json", predictions)
    args = ["eval", "--predictions", str(tmp_path / "results.json"), "--references", str(world), "--metrics",
            "qa,claims,clair,faithfulness", "--judge", "world", "--out", str(tmp_path / "out.json"),
            "--per-image", str(tmp_path / "items.json")]  # fmt: skip
    assert cli(args) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["claims/precision"] == pytest.approx(out["faith/precision"]) and out["faith/precision"] < 1.0
    assert out["claims/recall"] == pytest.approx(out["faith/recall"])
    assert out["qa/judge_failed"] == out["claims/judge_failed"] == 0.0 and out["qa/blind_dropped"] == 0.0
    # qa/accuracy: the world judge's share of right answers over every image's scene questions (2 shuffles each)
    judge = WorldJudge()
    questions = {r.image_id: scene_questions(r.image_id, refs.scenes[r.image_id]) for r in refs.records}
    kept, _ = drop_blind(judge, questions, 2)
    scores = qa_scores(judge, [predictions[i] for i in kept], list(kept.values()), 2)
    assert out["qa/accuracy"] == pytest.approx(sum(s.accuracy for s in scores) / len(scores))
    wrong, cannot = (sum(getattr(s, k) / s.asks for s in scores) / len(scores) for k in ("wrong", "cannot"))
    assert (out["qa/wrong"], out["qa/cannot_answer"]) == (pytest.approx(wrong), pytest.approx(cannot))
    assert cannot > 0 and wrong != cannot  # the pink circle and the references' silences: the two are told apart
    rows = {row["image_id"]: row for row in json.loads((tmp_path / "items.json").read_text())}
    row = rows[first.image_id]
    assert row["judge"] == "world" and row["judge/prompt_version"] == "world-1"
    assert "false: color(" in row["clair/reason"] and row["clair/score"] < 100
    assert row["qa/accuracy"] == pytest.approx(scores[list(kept).index(first.image_id)].accuracy)


def test_a_judge_that_does_not_exist_is_named(world, tmp_path, capsys):
    write_results(tmp_path / "r.json", {0: "a red circle"})
    code = cli(["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--metrics",
                "claims", "--judge", "nope"])  # fmt: skip
    assert code == 2 and "judge.name: unknown judge 'nope'" in capsys.readouterr().err


def test_questions_make_writes_a_worlds_questions_that_the_qa_metric_reads(world, tmp_path, capsys):
    out = tmp_path / "questions.jsonl"
    assert cli(["questions", "make", "--data", str(world), "--split", "test", "--out", str(out)]) == 0
    refs = load_references(load(), world, split="test")
    questions = read_questions(out)
    assert set(questions) == {r.image_id for r in refs.records}
    assert questions == {i: scene_questions(i, refs.scenes[i]) for i in questions}  # the world judge drops none
    said = capsys.readouterr()
    assert said.out == "" and f"wrote {out}: " in said.err and "0 of" in said.err  # a status line: finecap's logger
    # its own output is replaced on a rerun, as every command's; a file finecap did not make needs --force
    assert cli(["-q", "questions", "make", "--data", str(world), "--split", "test", "--out", str(out)]) == 0
    assert f"wrote {out}" not in capsys.readouterr().err  # -q drops the status line
    mine = tmp_path / "mine.jsonl"
    mine.write_text("my notes\n")
    assert cli(["questions", "make", "--data", str(world), "--out", str(mine)]) == 2
    assert mine.read_text() == "my notes\n"
    predictions = {r.image_id: r.captions[0] for r in refs.records}
    write_results(tmp_path / "r.json", predictions)
    args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--metrics", "qa",
            "--format", "json"]  # fmt: skip
    assert cli([*args, f"judge.questions={out}"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert cli(args) == 0
    assert from_file == json.loads(capsys.readouterr().out)  # the file holds what the scenes give


def test_questions_make_with_a_judge_that_never_answered_writes_nothing_and_fails(world, tmp_path, capsys):
    # every blind ask failed, every question was kept as though filtered: exit 0 and "0 dropped"
    out = tmp_path / "questions.jsonl"
    args = ["questions", "make", "--data", str(world), "--split", "test", "--out", str(out)]
    assert cli([*args, f"judge.name={__name__}:down_judge"]) == 2
    err = capsys.readouterr().err
    assert "could not answer the blind asks of" in err and "nothing written" in err and not out.exists()


CLOSED: list[str] = []


class CountedWorldJudge(WorldJudge):
    """The world judge, counting its closes into :data:`CLOSED`."""

    def close(self) -> None:
        CLOSED.append(self.name)


def counted_world_judge(cfg, **options):
    return CountedWorldJudge()


@pytest.mark.parametrize("metrics", ["claims,clair", "claims,bags"])
def test_the_evaluation_closes_its_judge_once_however_it_ends(world, metrics):
    # a judge behind a server holds connections and an answer cache, an in-process one an engine: the evaluation that
    # opened it closes it, once for the groups sharing it, also when a later group fails ("bags" has no bags here)
    from finecap.metrics.suite import evaluate

    refs = load_references(load(), world, split="test")
    predictions = {r.image_id: r.captions[0] for r in refs.records}
    cfg = load(None, [f"judge.name={__name__}:counted_world_judge"])
    CLOSED.clear()
    if metrics.endswith("bags"):
        with pytest.raises(ValueError, match="metric 'bags' needs bags"):
            evaluate(predictions, None, scenes=refs.scenes, metrics=metrics, cfg=cfg)
    else:
        out = evaluate(predictions, None, scenes=refs.scenes, metrics=metrics, cfg=cfg)
        assert out["claims/precision"] == 1.0  # each caption is one of its image's references
    assert CLOSED == ["world"]


class DownJudge(WorldJudge):
    """A judge whose every call fails (its server is down)."""

    def rate(self, pairs):
        return [JudgeFailed("down") for _ in pairs]

    def claims(self, texts):
        return [JudgeFailed("down") for _ in texts]

    def answer(self, asks):
        return [JudgeFailed("down") for _ in asks]


def down_judge(cfg, **options):
    return DownJudge()


class RatingTalliedJudge(WorldJudge):
    """The world judge, whose tallies gain a key of its own, ``rated``, once it has rated a caption."""

    def __init__(self) -> None:
        super().__init__()
        self.rated = 0

    def rate(self, pairs):
        self.rated += len(pairs)
        return super().rate(pairs)

    def tallies(self):
        return {**super().tallies(), **({"rated": self.rated} if self.rated else {})}


def rating_tallied_judge(cfg, **options):
    return RatingTalliedJudge()


def test_each_groups_counts_hold_a_tally_the_judge_gained_meanwhile(world):
    # a judge of one's own whose tallies() named a key in the second judged group that the first did not have: the
    # group's counts (now minus the tallies after the group before) raised KeyError ('rated'), the evaluation lost
    from finecap.metrics.suite import evaluate

    refs = load_references(load(), world, split="test")
    predictions = {r.image_id: r.captions[0] for r in refs.records}
    cfg = load(None, [f"judge.name={__name__}:rating_tallied_judge"])
    about: dict = {}
    out = evaluate(predictions, None, scenes=refs.scenes, metrics="claims,clair", cfg=cfg, about=about)
    assert out["clair/judge_failed"] == 0
    by_group, counts = about["judge"]["group_counts"], about["judge"]["counts"]
    assert "rated" not in by_group["claims"]  # claims rates nothing: the key was not there yet
    assert by_group["clair"]["rated"] == counts["rated"] == len(predictions)  # one rating per image, counted from 0
    assert by_group["clair"]["calls"] + by_group["claims"]["calls"] == counts["calls"] > 0


def test_a_judge_failing_on_every_image_gives_no_score_not_zero(world):
    # the corpus value was 0.0 when no image was left to average, as if every caption were worthless
    import math

    from finecap.metrics.suite import evaluate

    refs = load_references(load(), world, split="test")
    predictions = {r.image_id: r.captions[0] for r in refs.records}
    cfg = load(None, [f"judge.name={__name__}:down_judge"])
    out = evaluate(predictions, None, scenes=refs.scenes, metrics="claims,clair", cfg=cfg)
    assert math.isnan(out["clair/score"]) and math.isnan(out["claims/f1"])
    assert out["clair/judge_failed"] == out["claims/judge_failed"] == len(predictions)


class KnowAllJudge(WorldJudge):
    """A judge that answers every question right, with a caption or without."""

    def answer(self, asks):
        return [a.question.answer for a in asks]


def know_all_judge(cfg, **options):
    return KnowAllJudge()


def test_eval_qa_with_every_question_answered_blind_fails_and_writes_nothing(world, tmp_path, capsys):
    # the blind filter dropped every image's questions: qa/accuracy NaN written, exit 0 (no judge call had failed)
    refs = load_references(load(), world, split="test")
    write_results(tmp_path / "r.json", {r.image_id: r.captions[0] for r in refs.records})
    args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--metrics", "qa",
            "--out", str(tmp_path / "scores.json"), f"judge.name={__name__}:know_all_judge"]  # fmt: skip
    assert cli(args) == 2
    assert "no image keeps a question to score" in capsys.readouterr().err and not (tmp_path / "scores.json").exists()


def test_eval_with_a_judge_failing_on_every_image_fails_and_writes_nothing(world, tmp_path, capsys):
    # `finecap eval --metrics claims,bleu` wrote "claims/precision": NaN (no JSON a strict parser reads) and exit 0
    refs = load_references(load(), world, split="test")
    write_results(tmp_path / "r.json", {r.image_id: r.captions[0] for r in refs.records})
    args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--metrics",
            "claims,bleu", "--out", str(tmp_path / "scores.json"), f"judge.name={__name__}:down_judge"]  # fmt: skip
    assert cli(args) == 2
    assert "metric(s) claims: the" in capsys.readouterr().err and not (tmp_path / "scores.json").exists()
    assert cli([*args[:6], "qa,bleu", *args[7:]]) == 2  # qa: its blind filter could not ask (the judge is down)
    assert "could not answer the blind asks" in capsys.readouterr().err and not (tmp_path / "scores.json").exists()


def _questions_data(folder: Path) -> Path:
    """A JSONL data set of two images whose lines give their own questions (a world judge's: each with a ``fact``)."""
    from PIL import Image

    asked = {
        "a.png": [{"question": "What colour is the circle?", "options": ["red", "blue", "green"], "answer": "red",
                   "fact": ["color", "circle"]}],
        "b.png": [{"question": "What size is the square?", "options": ["small", "large"], "answer": "large",
                   "fact": ["size", "square"]}],
    }  # fmt: skip
    lines = []
    for name, questions in asked.items():
        Image.new("RGB", (4, 4)).save(folder / name)
        lines.append({"image": name, "id": name, "captions": ["a shape"], "questions": questions})
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_eval_qa_reads_the_data_sets_own_questions_as_the_qa_utility_reward_does(tmp_path, capsys):
    """The qa metric read only judge.questions or a world's scenes: on a data set giving its images questions (which
    the qa_utility reward asks first) it stopped, wanting scenes. Now it asks the same questions: image a's caption
    names the circle's colour (2 of 2 shuffles right), b's the square's wrong size (2 of 2 wrong)."""
    data = _questions_data(tmp_path)
    write_results(tmp_path / "r.json", {"a.png": "a red circle", "b.png": "a small square"})
    args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(data), "--metrics", "qa",
            "--judge", "world", "--format", "json"]  # fmt: skip
    assert cli(args) == 0
    out = json.loads(capsys.readouterr().out)
    # per image: a 1.0 right, b 1.0 wrong; means over the 2 images; the world judge answers no question blind
    assert out["qa/accuracy"] == out["qa/wrong"] == 0.5 and out["qa/cannot_answer"] == 0.0
    assert out["qa/blind_dropped"] == 0.0
    # the reward, given the same records, asks the same questions (one order of resolution: pick_questions)
    from finecap.judges.questions import questions_of
    from finecap.rewards.qa_utility import QAUtilityReward

    reward = QAUtilityReward(judge=WorldJudge(), questions=questions_of(load_references(load(), data).records))
    total = reward(["a red circle", "a small square"], {"image_ids": ["a.png", "b.png"]}).total.tolist()
    assert total == [1.0, 0.0]
    # the data set's questions and a questions file together: which scores is no silent choice
    (tmp_path / "q.jsonl").write_text(json.dumps({"image_id": "a.png", "questions": []}) + "\n")
    assert cli([*args, f"judge.questions={tmp_path / 'q.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "metric 'qa': the images have questions of their own" in err and "judge.questions" in err


def test_eval_out_records_the_judge_that_scored(world, tmp_path, capsys):
    """The scores file said nothing of the judge behind qa/claims (only --per-image rows named it, and only its name
    and prompt version): two runs with a noisy and a clean world judge wrote files telling nothing apart. The JSON
    now holds ``judge``: the judge's identity with the QA settings."""
    refs = load_references(load(), world, split="test")
    write_results(tmp_path / "r.json", {r.image_id: r.captions[0] for r in refs.records})
    base = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world)]
    args = [*base, "--metrics", "qa,claims", "--judge", "world", "--format", "json", "--out", str(tmp_path / "s.json"),
            "judge.noise=0.25", "judge.seed=5", "judge.shuffles=3"]  # fmt: skip
    assert cli(args) == 0
    printed, written = json.loads(capsys.readouterr().out), json.loads((tmp_path / "s.json").read_text())
    expected = {"judge": "world", "prompt_version": "world-1", "noise": 0.25, "seed": 5, "shuffles": 3}
    # and what the judge did (counted exactly of a served judge in test_eval_says_over_how_many_images_...): the
    # world judge asks no server, caches nothing, parses nothing and fails no call of these captions
    counts = written["judge"].pop("counts")
    assert counts == {"calls": counts["calls"], "cache_hits": 0, "unparsable": 0, "failed": 0, "rate_limited": 0}
    assert counts["calls"] > 0 and printed["judge"].pop("counts") == counts
    by_group = written["judge"].pop("group_counts")  # each group's calls, qa's blind asks in qa's: their sum
    assert list(by_group) == ["qa", "claims"] and all(c["calls"] > 0 for c in by_group.values())
    assert {k: by_group["qa"][k] + by_group["claims"][k] for k in counts} == counts
    assert printed["judge"].pop("group_counts") == by_group
    assert written["judge"] == printed["judge"] == expected
    assert written == printed and 0 <= written["qa/accuracy"] <= 1
    # no judge-backed group: no judge key, the scores alone
    assert cli([*base, "--metrics", "length", "--out", str(tmp_path / "t.json")]) == 0
    assert set(json.loads((tmp_path / "t.json").read_text())) == {"Length"}


def test_eval_out_records_the_model_a_served_judge_named(world, tmp_path, capsys, monkeypatch):
    """The judge record named ``judge.model`` alone, made before any call: a server answering as a dated version of
    it (or as another model, warned of) was nowhere in the results file. The model its replies named is now there as
    ``served_model``, once one came (:attr:`finecap.judges.base.Judge.served_model`)."""
    from finecap.judges.world import WorldJudge

    refs = load_references(load(), world, split="test")
    write_results(tmp_path / "r.json", {r.image_id: r.captions[0] for r in refs.records})
    args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--metrics", "qa",
            "--judge", "world", "--format", "json", "--out", str(tmp_path / "s.json")]  # fmt: skip
    monkeypatch.setattr(WorldJudge, "served_model", "world-2026-11-29")  # as a served judge's first reply sets it
    assert cli(args) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "s.json").read_text())["judge"]["served_model"] == "world-2026-11-29"


def test_eval_says_over_how_many_images_a_judged_mean_is_and_what_the_judge_did(world, tmp_path, capsys):
    """The results file of an evaluation whose judge failed on some images said how many failed, but neither over
    how many images the mean was nor anything of the judge's work: its calls, unparsable answers, failed calls and
    its server's HTTP 429s (Judge.counts, OpenAIBackend.rate_limited) were reported nowhere. Now the file and the
    table hold ``clair/judge_scored`` beside the mean and the judge's record its ``counts``; a partial score still
    exits 0 (every image failed: exit 2, test_eval_with_a_judge_failing_on_every_image_fails_and_writes_nothing)."""
    from helpers.chat_server import ChatServer, completion

    def rate_limited_once(payload, n):  # each call's first request: HTTP 429; then a rating, "nonsense" none
        if n == 0:
            return 429, {"error": "rate limited"}, {"Retry-After": "0"}
        if "nonsense" in payload["messages"][-1]["content"]:
            return 200, completion("no idea")
        return 200, completion(json.dumps({"score": 70, "reason": "mostly right"}))

    refs = load_references(load(), world, split="test")
    predictions = {r.image_id: r.captions[0] for r in refs.records}
    predictions[refs.records[0].image_id] = "nonsense"
    write_results(tmp_path / "r.json", predictions)
    with ChatServer(rate_limited_once) as server:
        args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--metrics", "clair",
                "--judge", "openai", "--out", str(tmp_path / "s.json"), f"judge.urls=[{server.url}]",
                "judge.model=test-model", "judge.retries=1", "judge.cache=false"]  # fmt: skip
        assert cli(args) == 0
    n = len(predictions)
    out = json.loads((tmp_path / "s.json").read_text())
    assert out["clair/score"] == 70.0 and (out["clair/judge_scored"], out["clair/judge_failed"]) == (n - 1, 1)
    # one call per image; "nonsense" answered twice unparsably (asked once more: judge.retries=1), then failed;
    # every call's first request rate-limited
    counts = {"calls": n, "cache_hits": 0, "unparsable": 2, "failed": 1, "rate_limited": n}
    assert out["judge"]["counts"] == counts
    said = capsys.readouterr()
    assert re.search(rf"^\| clair/judge_scored +\| {n - 1} +\|$", said.out, re.MULTILINE), said.out
    assert f"the judge failed on 1 of {n} images; the means are over the other {n - 1}" in said.err


def test_eval_records_what_the_judge_did_for_each_judged_group(world, tmp_path, capsys):
    """The judge record's ``counts`` summed every judged group's calls: with ``clair`` and ``claims`` together, a
    file saying ``"failed": 1`` did not say which group's call it was. Each group's tallies are now in
    ``group_counts`` (the calls made while it ran), ``counts`` their sum, as before."""
    from helpers.chat_server import ChatServer, judging

    refs = load_references(load(), world, split="test")
    predictions = {r.image_id: r.captions[0] for r in refs.records}
    predictions[refs.records[0].image_id] = "nonsense"
    write_results(tmp_path / "r.json", predictions)
    with ChatServer(judging("nonsense")) as server:  # a rating for every caption; claims' split of "nonsense" fails
        args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--metrics",
                "clair,claims", "--judge", "openai", "--format", "json", "--out", str(tmp_path / "s.json"),
                f"judge.urls=[{server.url}]", "judge.model=test-model", "judge.retries=1",
                "judge.cache=false"]  # fmt: skip
        assert cli(args) == 0
    n = len(predictions)
    out = json.loads((tmp_path / "s.json").read_text())
    assert (out["clair/judge_failed"], out["claims/judge_failed"]) == (0, 1)
    by_group = out["judge"]["group_counts"]
    # clair: one rating per image, none failed; claims: each image's reference claims and each caption's split (the
    # "nonsense" split unparsable twice, then failed), then, for the n - 1 others, the check of the caption's claims
    # against the evidence and of the reference claims against the caption: 4n - 2
    assert by_group["clair"] == {"calls": n, "cache_hits": 0, "unparsable": 0, "failed": 0, "rate_limited": 0}
    assert by_group["claims"] == {"calls": 4 * n - 2, "cache_hits": 0, "unparsable": 2, "failed": 1, "rate_limited": 0}
    assert out["judge"]["counts"] == {k: by_group["clair"][k] + by_group["claims"][k] for k in by_group["clair"]}
    assert json.loads(capsys.readouterr().out) == out  # printed as written
