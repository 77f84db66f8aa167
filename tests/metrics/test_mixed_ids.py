"""An image id written as an int on one side and as its string on the other (a COCO results file's ``391895``
against a JSONL data set's ``"391895"``, a bags file's ``"3"`` against a world's ``3``) names one image in every
metric, as the data readers read ``1`` and ``"1"`` as one id (:func:`finecap.data.records.id_key`); the per-image
scores keep the references' ids as written; ids that differ are named with some of the other side's."""

from __future__ import annotations

import numpy as np
import pytest

from finecap.config import load
from finecap.data.bags_file import read_bags
from finecap.data.records import DataError
from finecap.metrics.hallucination import lookup_objects
from finecap.metrics.listener import listener_retrieval
from finecap.metrics.retrieval import bag_columns
from finecap.metrics.suite import evaluate_items
from finecap.world.scene import Obj, Scene
from helpers.fake_retriever import PREDS, FakeRetriever, Rec


def test_the_ngram_groups_match_an_int_id_with_its_string_and_keep_the_references_ids():
    refs = {"391895": ["a red circle on grass"], 7: ["two dogs on a deck", "dogs on a deck"]}
    same = {"391895": "a red circle", 7: "two dogs on the deck"}
    mixed = {391895: same["391895"], "7": same[7]}
    want, want_items = evaluate_items(same, refs, metrics="bleu,rouge,cider,length")
    got, items = evaluate_items(mixed, refs, metrics="bleu,rouge,cider,length")
    assert got == want and items == want_items
    assert list(items) == ["391895", 7]  # the references' ids, as written


def test_two_predicted_ids_naming_one_image_are_refused():
    with pytest.raises(ValueError, match=r"^predictions: 1 image\(s\) keyed twice, e\.g\. 1 and '1' \(an int id"):
        evaluate_items({1: "a", "1": "b"}, {1: ["a"]}, metrics="length")


def test_retrieval_bags_and_clipscore_match_ids_across_predictions_references_images_and_bags():
    images = [Rec(i) for i in range(4)]  # the images' ids are ints
    refs = {str(i): [c] for i, c in PREDS.items()}  # the references' ids are strings
    mixed = {"0": "zero", 1: "one", "2": "two", 3: "three"}
    metrics = "retrieval,bags,clipscore"
    kw = dict(metrics=metrics, retriever=FakeRetriever(), images=images)
    cfg = load(None, ["eval.n_distractors=2", "eval.draws=2"])
    want, want_items = evaluate_items(PREDS, {i: [c] for i, c in PREDS.items()}, bags={2: [[0, 1], [2, 3]]}, cfg=cfg,
                                      **kw)  # fmt: skip
    got, items = evaluate_items(mixed, refs, bags={2: [["0", 1], [2, "3"]]}, cfg=cfg, **kw)
    assert got == want
    assert list(items) == ["0", "1", "2", "3"]  # one row per image, keyed by the references' ids
    assert items == {str(i): row for i, row in want_items.items()}
    assert got["bag2/n"] == 4.0 and got["pool/R@1"] == 0.75


def test_ids_naming_no_retrieval_image_are_named_with_some_of_the_images_ids():
    with pytest.raises(KeyError, match=r"retrieval images: \['x'\]; their ids are e\.g\. \[0, 1, 2, 3\]"):
        evaluate_items({"x": "zero"}, None, metrics="retrieval", retriever=FakeRetriever(),
                       images=[Rec(i) for i in range(4)])  # fmt: skip


def test_bag_columns_match_ids_written_either_way_and_refuse_one_image_twice():
    column = {0: 0, 1: 1, 2: 2, 3: 3}
    assert {c: v.tolist() for c, v in bag_columns([["0", 1], [2, "3"]], column).items()} == {
        0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}  # fmt: skip
    with pytest.raises(ValueError, match=r"^bag 0 names image\(s\) \[1, '1'\] more than once"):
        bag_columns([[1, "1"]], column)
    with pytest.raises(ValueError, match=r"^bag 1 holds image '1', already in bag 0"):
        bag_columns([[0, 1], ["1", 2]], column)
    with pytest.raises(ValueError, match=r"^bag 0 names images not among the scored images: \['9'\]; their ids"):
        bag_columns([["9", 1]], column)


@pytest.mark.parametrize(
    ("bags", "error"),
    [('[{"images": [1, "1"]}]', r"bags\['2'\]\[0\] names image\(s\) \[1\] more than once"),
     ('[{"images": [1, 2]}, {"images": ["2", 3]}]', r"bags\['2'\]\[1\] holds image '2', already in bags\['2'\]\[0\]")],
)  # fmt: skip
def test_a_bags_file_reads_an_int_and_its_string_as_one_image(tmp_path, bags, error):
    path = tmp_path / "bags.json"
    path.write_text(f'{{"bags": {{"2": {bags}}}}}')
    with pytest.raises(DataError, match=error):
        read_bags(path)


def test_a_bags_file_keeps_its_ids_as_written(tmp_path):
    path = tmp_path / "bags.json"
    path.write_text('{"bags": {"2": [{"images": ["1", "2"]}, {"images": [3, 4]}]}}')
    assert read_bags(path) == {2: [["1", "2"], [3, 4]]}


SCENES = {
    0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
    1: Scene(1, "sand", [Obj("circle", "red", "large", 1, 1)]),
    2: Scene(2, "sand", [Obj("square", "blue", "large", 1, 1)]),
    3: Scene(3, "water", [Obj("star", "green", "large", 0, 0)]),
}


def test_the_listener_matches_predicted_ids_with_the_pools_either_way():
    captions = ["a red circle on grass", "a blue square", "a green star on water"]
    kw = dict(n_distractors=2, draws=2)
    want = listener_retrieval(dict(zip([0, 2, 3], captions, strict=True)), SCENES, [0, 1, 2, 3],
                              bags={2: [[0, 1], [2, 3]]}, **kw)  # fmt: skip
    got = listener_retrieval(dict(zip(["0", 2, "3"], captions, strict=True)), SCENES, [0, 1, 2, 3],
                             bags={2: [["0", "1"], [2, "3"]]}, **kw)  # fmt: skip
    assert got == want
    with pytest.raises(KeyError, match=r"not in the retrieval pool, e.g. \['9'\]; its ids are e.g. \[0, 1, 2, 3\]"):
        listener_retrieval({"9": "a red circle"}, SCENES, [0, 1, 2, 3], n_distractors=2)


def test_instances_are_looked_up_as_the_data_readers_read_ids():
    objects = {7: frozenset({"dog"}), "8": frozenset({"cat"})}
    assert lookup_objects(["7", 8], objects, "instances") == [frozenset({"dog"}), frozenset({"cat"})]
    for odd in ("--7", "²"):  # no integer: named as an id it lacks (it was int()'s ValueError)
        with pytest.raises(DataError, match=rf"^instances: no objects for 1 predicted image\(s\), e.g. \['{odd}'\]; "
                                            r"its ids are e.g. \[7, '8'\]"):  # fmt: skip
            lookup_objects([odd], objects, "instances")


def test_per_image_rows_stay_one_per_image_when_a_group_writes_the_other_spelling():
    # references "0".."3", images 0..3: retrieval scores by the images' ids, the rows keep the references'
    _, items = evaluate_items({str(i): c for i, c in PREDS.items()}, {str(i): [c] for i, c in PREDS.items()},
                              metrics="retrieval,rouge", retriever=FakeRetriever(), images=[Rec(i) for i in range(4)],
                              cfg=load(None, ["eval.n_distractors=2"]))  # fmt: skip
    assert list(items) == ["0", "1", "2", "3"]
    assert set(items["1"]) >= {"ROUGE-L", "pool/R@1"} and items["1"]["pool/R@1"] == 0.0
    assert np.isclose(items["0"]["ROUGE-L"], 1.0)


def test_clipscore_matches_the_images_and_the_references_ids_either_way():
    images = [Rec(i) for i in range(4)]
    want, want_items = evaluate_items(PREDS, {i: [c] for i, c in PREDS.items()}, metrics="clipscore",
                                      retriever=FakeRetriever(), images=images)  # fmt: skip
    got, items = evaluate_items({str(i): c for i, c in PREDS.items()}, {str(i): [c] for i, c in PREDS.items()},
                                metrics="clipscore", retriever=FakeRetriever(), images=images)  # fmt: skip
    assert got == want and items == {str(i): row for i, row in want_items.items()}
    with pytest.raises(KeyError, match=r"CLIPScore images: \['x'\]; their ids are e\.g\. \[0, 1, 2, 3\]"):
        evaluate_items({"x": "zero"}, None, metrics="clipscore", retriever=FakeRetriever(), images=images)


ONE_OR_TWO = [(42, "42", True), (-3, "-3", True), ("42", "42", True), (391895, "000000391895", False),
              (42, " 42", False), (42, "42 ", False), (42, "+42", False), (0, "-0", False), ("042", "42", False),
              (2**60, str(2**60), True)]  # fmt: skip


@pytest.mark.parametrize(("a", "b", "one"), ONE_OR_TWO)
def test_the_lookup_and_the_readers_duplicate_check_read_one_id_alike(tmp_path, a, b, one):
    """id_key read "000000391895" as 391895 and " 42" as 42, where check_unique_ids kept them apart: a data set may
    hold both as two images, which the metrics then scored as one. One rule now: one id when they read the same as
    text."""
    from pathlib import Path

    from finecap.data.records import Record, check_unique_ids, id_key

    assert (id_key(a, {b}), id_key(b, {a})) == ((b, a) if one else (None, None))
    records = [Record(a, Path("a.jpg"), "test"), Record(b, Path("b.jpg"), "test")]
    if one:
        with pytest.raises(DataError, match="appear in several records"):
            check_unique_ids(records, tmp_path / "data.jsonl")
    else:
        check_unique_ids(records, tmp_path / "data.jsonl")  # two images


def test_a_zero_padded_predicted_id_is_not_scored_as_the_integer_images():
    refs = {391895: ["a red circle on grass"], "0042": ["two dogs"]}
    with pytest.raises(ValueError, match=r"no references for 1 image\(s\), e\.g\. \['000000391895'\]"):
        evaluate_items({"000000391895": "a red circle"}, refs, metrics="bleu")
    with pytest.raises(ValueError, match=r"no references for 1 image\(s\), e\.g\. \[42\]"):
        evaluate_items({42: "two dogs"}, refs, metrics="bleu")


def _asked(image_id, answer="red"):
    from finecap.judges.questions import question_of

    raw = {"question": "What colour is the circle?", "options": ["red", "blue", "green"], "answer": answer,
           "fact": ["color", "circle"]}  # fmt: skip
    return [question_of(raw, image_id, 0, "test")]


def test_the_qa_and_judge_groups_match_questions_scenes_and_references_either_way():
    """qa looks an image's questions up by its id, claims and clair its references and scene: written as an int on
    one side and as its string on another, the scores and rows are those of one spelling throughout."""
    cfg = load(None, ["judge.name=world"])
    refs = {"0": ["a red circle on grass"], 2: ["a blue square on sand"]}
    captions = ["a red circle", "a red circle on sand"]
    same = dict(questions={"0": _asked("0"), 2: _asked(2, "blue")}, scenes={"0": SCENES[0], 2: SCENES[2]})
    mixed = dict(questions={0: _asked(0), "2": _asked(2, "blue")}, scenes=SCENES)
    kw = dict(metrics="qa,claims,clair", cfg=cfg)
    want, want_items = evaluate_items(dict(zip(["0", 2], captions, strict=True)), refs, **kw, **same)
    got, items = evaluate_items(dict(zip([0, "2"], captions, strict=True)), refs, **kw, **mixed)
    assert got == want and items == want_items
    assert list(items) == ["0", 2]  # the references' ids, as written
    assert (items["0"]["qa/accuracy"], items[2]["qa/accuracy"]) == (1.0, 0.0)  # image 2: answered red, not blue
    assert items[2]["claims/precision"] < 1.0  # its scene (keyed 2, predicted as "2") is the evidence


def test_a_questions_file_reads_an_int_and_its_string_as_one_image(tmp_path):
    """Lines of image 7 written as 7 and as "7" were two images' questions, both numbered from 0 ("7/0" twice): the
    qa metric asked image 7 those of one line alone. Now they are one image's, numbered on; an id that is no int or
    string (a bool, a float) is refused naming the line."""
    import json

    from finecap.judges.questions import read_questions

    line = {"question": "What colour is the circle?", "options": ["red", "blue"], "answer": "red"}
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"image_id": i, "questions": [line]}) + "\n" for i in (7, "7", 8)))
    read = read_questions(path)
    assert list(read) == [7, 8] and [q.id for q in read[7]] == ["7/0", "7/1"]
    for odd in (True, 7.0):
        path.write_text(json.dumps({"image_id": odd, "questions": [line]}) + "\n")
        with pytest.raises(DataError, match=rf"q\.jsonl:1: 'image_id' {odd!r} must be an int or a string"):
            read_questions(path)


def test_questions_keyed_by_an_int_and_its_string_are_refused():
    """``questions={7: ..., "7": ...}`` gave image 7 the questions keyed as its predicted id is written, the others
    left unasked: which of two an image is scored by is no silent choice."""
    with pytest.raises(ValueError, match=r"^questions: 1 image\(s\) keyed twice, e\.g\. 7 and '7' \(an int id"):
        evaluate_items({7: "a red circle"}, None, metrics="qa", questions={7: _asked(7), "7": _asked("7", "blue")},
                       cfg=load(None, ["judge.name=world"]))  # fmt: skip


def _family_items(predictions):
    from finecap.metrics.families import family_self_retrieval_items

    return family_self_retrieval_items(predictions, FakeRetriever(), [Rec(i) for i in range(4)],
                                       {0: "a", 1: "a", 2: "b", 3: "b"}, size=2)  # fmt: skip


def _every_metric_called_from_python():
    """Each metric that reads ``{image_id: caption}`` predictions, called as a notebook calls it: ``(name, call)``."""
    from finecap.metrics.clipscore import CLIPScore
    from finecap.metrics.faithfulness import faithfulness_per_item
    from finecap.metrics.hallucination import chair
    from finecap.metrics.meteor.inputs import check_inputs
    from finecap.metrics.ngram import ngram_metrics
    from finecap.metrics.retrieval import SelfRetrieval

    images = [Rec(i) for i in range(4)]
    objects = {i: frozenset({"dog"}) for i in range(4)}
    refs = {i: [c] for i, c in PREDS.items()}
    retrieval = SelfRetrieval(FakeRetriever(), images, n_distractors=2, draws=1)
    return [
        ("CLIPScore predictions", lambda p: CLIPScore(FakeRetriever(), images).per_item(p)),
        ("self-retrieval predictions", retrieval.scores),
        ("chair predictions", lambda p: chair(p, objects)),
        ("family predictions", _family_items),
        ("faithfulness predictions", lambda p: faithfulness_per_item(p, SCENES)),
        ("listener predictions", lambda p: listener_retrieval(p, SCENES, [0, 1, 2, 3], n_distractors=2, draws=1)),
        ("predictions", lambda p: ngram_metrics(p, refs, ["cider_d"])),
        ("predictions", lambda p: check_inputs(p, refs)),  # METEOR's and SPICE's inputs
        ("predictions", lambda p: evaluate_items(p, None, metrics="length")),  # no references or images to key by
    ]


@pytest.mark.parametrize("case", range(9))
def test_every_metric_refuses_two_predicted_ids_of_one_image(case):
    """``{1: ..., "1": ...}`` is one image twice, as finecap eval refuses it ("keep one caption entry per image").
    Called from Python, CLIPScore, self-retrieval, CHAIR and the faithfulness and listener metrics scored both
    captions (two rows, two queries: the image counted twice in every mean), family retrieval refused "1" beside a
    record 1, and evaluate_items without references counted both captions."""
    metrics = _every_metric_called_from_python()
    assert len(metrics) == 9
    what, call = metrics[case]
    with pytest.raises(ValueError, match=rf"^{what}: 1 image\(s\) keyed twice, e\.g\. 1 and '1' \(an int id"):
        call({1: "a red circle", "1": "a blue square", 2: "a green star"})


def test_family_retrieval_finds_records_and_families_written_either_way():
    """family_self_retrieval_items looked the predicted ids up among the records exactly ("1" beside a record 1 was
    a KeyError), and family_retrieval_items and the hard RD kept only the families keyed as the columns write their
    ids (families {"0": ...} with images 0..3 dropped family "a": its captions went unranked)."""
    from finecap.metrics.families import family_retrieval_items, hard_rd_retrieval

    want = _family_items(PREDS)
    corpus, items = _family_items({str(i): c for i, c in PREDS.items()})
    assert corpus == want[0] and items == {str(i): row for i, row in want[1].items()}
    assert want[0]["family/n"] == 4.0 and want[0]["family/R@1"] == 0.75  # "one" ranks image 0 above image 1
    scores = np.eye(4)  # caption q scores 1 on image q
    ints = family_retrieval_items(scores, [0, 1, 2, 3], {0: "a", 1: "a", 2: "b", 3: "b"}, size=2)
    texts = family_retrieval_items(scores, [0, 1, 2, 3], {"0": "a", "1": "a", 2: "b", 3: "b"}, size=2)
    assert texts == ints and ints[0]["family/n"] == 4.0
    kw = dict(size=2, n_distractors=2, draws=1)
    assert hard_rd_retrieval(scores, [0, 1, 2, 3], {"0": "a", "1": "a", 2: "b", 3: "b"}, **kw) == hard_rd_retrieval(
        scores, [0, 1, 2, 3], {0: "a", 1: "a", 2: "b", 3: "b"}, **kw)  # fmt: skip
    with pytest.raises(ValueError, match=r"^families: 1 image\(s\) keyed twice, e\.g\. 1 and '1'"):
        family_retrieval_items(scores, [0, 1, 2, 3], {0: "a", 1: "a", "1": "b", 3: "b"}, size=2)


def test_the_ngram_and_meteor_inputs_match_ids_either_way_and_refuse_references_keyed_twice():
    """ngram_metrics and METEOR's (and SPICE's) inputs looked references up exactly: {"1": ...} against references
    {1: ...} was "no entry", where finecap eval scores it; references {1: ..., "1": ...} with predictions for both
    were two images (two CIDEr documents)."""
    from finecap.metrics.meteor.inputs import check_inputs
    from finecap.metrics.ngram import ngram_metrics

    refs = {1: ["a red circle"], "2": ["two dogs on a deck"]}
    same = ngram_metrics({1: "a red circle", "2": "two dogs"}, refs, ["cider_d", "bleu"])
    assert ngram_metrics({"1": "a red circle", 2: "two dogs"}, refs, ["cider_d", "bleu"])[0] == same[0]
    assert check_inputs({"1": "a dog", 2: "a cat"}, refs) == (["1", 2], ["a dog", "a cat"], [refs[1], refs["2"]])
    for call in (lambda r: ngram_metrics({1: "a", "1": "b"}, r, ["cider_d"]), lambda r: check_inputs({1: "a"}, r)):
        with pytest.raises(ValueError, match=r"references: 1 image\(s\) keyed twice|predictions: 1 image"):
            call({1: ["a"], "1": ["b"]})
    with pytest.raises(ValueError, match=r"^references: 1 image\(s\) keyed twice, e\.g\. 1 and '1'"):
        ngram_metrics({1: "a"}, {1: ["a"], "1": ["b"]}, ["cider_d"])


def test_clipscore_self_retrieval_and_chair_refuse_records_references_or_objects_keyed_twice():
    """Images, references or objects keyed 1 and "1": which one an image is scored by was a silent choice (the
    spelling of its predicted id), and self-retrieval's uniqueness check compared ids exactly (image 1 and "1" were
    two columns, one the other's distractor)."""
    from finecap.metrics.clipscore import CLIPScore
    from finecap.metrics.hallucination import chair
    from finecap.metrics.retrieval import SelfRetrieval

    twice = [Rec(0), Rec(1), Rec("1")]
    for build, what in ((CLIPScore, "CLIPScore records"),
                        (SelfRetrieval, r"self-retrieval images \(records \+ extra_records\)")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{what}: 1 image\(s\) keyed twice, e\.g\. 1 and '1'"):
            build(FakeRetriever(), twice)
    with pytest.raises(ValueError, match=r"^CLIPScore references: 1 image\(s\) keyed twice"):
        CLIPScore(FakeRetriever(), [Rec(i) for i in range(4)]).per_item({1: "one"}, {1: ["one"], "1": ["zero"]})
    with pytest.raises(ValueError, match=r"^chair objects: 1 image\(s\) keyed twice"):
        chair({1: "a dog"}, {1: frozenset({"dog"}), "1": frozenset({"cat"})})


def test_an_integral_float_id_is_its_integers_image():
    """COCO's readers read 42.0 as 42 (pycocotools' dicts do); from Python, evaluate({42.0: ...}) against
    references {"42": ...} found none, and {1.0: ..., "1": ...} was not seen as one image twice."""
    from finecap.data.records import id_key, repeated_ids

    assert id_key(42.0, {"42"}) == "42" and id_key(42.5, {"42"}) is None
    assert repeated_ids([1.0, "1", 2]) == [(1.0, "1")]
    refs = {"42": ["a red circle"]}
    assert evaluate_items({42.0: "a red circle"}, refs, metrics="rouge") == evaluate_items(
        {42: "a red circle"}, refs, metrics="rouge")  # fmt: skip
    with pytest.raises(ValueError, match=r"^predictions: 1 image\(s\) keyed twice, e\.g\. 1\.0 and '1'"):
        evaluate_items({1.0: "a", "1": "b"}, None, metrics="length")
