"""CHAIR (the ``hallucination`` metric group) on hand-built COCO instance files, its ``--instances`` errors, and
``finecap eval --metrics hallucination --instances FILE`` end to end. The expected values are counted by hand in the
comments."""

from __future__ import annotations

import json
import re

import pytest

from finecap.data.records import DataError
from finecap.metrics.hallucination import chair, coco_vocabulary, read_instances, read_vocabulary
from finecap.metrics.suite import evaluate_items
from helpers.cli import refused, run_cli
from helpers.coco_instances import CATEGORIES, instances_file

CAPTIONS = {
    # men -> person, bikes -> bicycle, puppies -> dog, bus: hallucinated. 4 mentions, 1 hallucinated; recall 3/3
    1: "Two men ride bikes while their puppies run beside a bus.",
    # kitten -> cat (twice: two mentions), teddy bear (one object, no bear). 3 mentions, none hallucinated; recall:
    # cat, teddy bear of cat, teddy bear, dining table = 2/3
    2: "A kitten hugs a teddy bear; the kitten sleeps.",
    # hot dogs -> hot dog (no dog), dog: hallucinated, table -> dining table. 3 mentions, 1 hallucinated; recall 2/2
    3: "Hot dogs and a dog on a table.",
}


def test_mentions_read_synonyms_plurals_two_word_names_and_the_reference_rules():
    vocab = coco_vocabulary()
    assert len(vocab.categories) == 80
    mentions = vocab.mentions
    assert mentions("Two men with their puppies") == [("man", "person"), ("puppy", "dog")]  # plurals lemmatised
    assert mentions("hot dogs beside a teddy bear") == [("hot dog", "hot dog"), ("teddy bear", "teddy bear")]
    assert mentions("a dog chasing another dog") == [("dog", "dog"), ("dog", "dog")]  # a repeated word: twice
    assert mentions("a baby elephant and a passenger jet") == [("elephant", "elephant"), ("jet", "airplane")]
    assert mentions("the seat of the toilet") == [("toilet", "toilet")]  # no chair beside a toilet
    found = mentions("people on skis, wine glasses and mice")
    assert found == [("people", "person"), ("skis", "skis"), ("wine glass", "wine glass"), ("mouse", "mouse")]
    assert mentions("A dog's bowl.") == [("dog", "dog"), ("bowl", "bowl")]
    # a vocabulary word is not lemmatised (LemmInflect's rules for words it does not know make corgi "corgus")
    assert mentions("a corgi and two corgis") == [("corgi", "dog"), ("corgi", "dog")]
    assert mentions("a view of the sky") == []


def test_a_name_of_three_words_is_one_mention(tmp_path):
    # the reference lists "stove top oven" among its double words but looks them up two words at a time, so it read
    # "stove" and "oven": two ovens. Image 1 holds a person, a dog and a bicycle: man (person) and the oven, which is
    # hallucinated, 1 of 2 mentions -> CHAIRi 1/2 (read as two ovens: 2 of 3)
    vocab = coco_vocabulary()
    assert vocab.mentions("a stove top oven") == [("stove top oven", "oven")]
    assert vocab.mentions("two stove top ovens and a stove") == [("stove top oven", "oven"), ("stove", "oven")]
    assert vocab.mentions("a stove top") == [("stove", "oven")]  # no third word: the stove alone
    corpus, items = chair({1: "A man cooks at a stove top oven."}, read_instances(instances_file(tmp_path)))
    assert items[1].hallucinated == (("stove top oven", "oven"),)
    assert corpus["CHAIRi"] == 0.5 and corpus["chair/objects"] == 2.0


def test_the_longest_phrase_is_read_first_and_a_phrase_has_two_words():
    # "big  teddy bear": the words of a phrase are matched one space apart, however the file spaces them
    phrases = "teddy bear = teddy bear\nbig  teddy bear = big teddy bear\n"
    text = "[synonyms]\nbear, teddy bear, big teddy bear\n[phrases]\n" + phrases
    vocab = read_vocabulary(text)
    assert vocab.mentions("a big teddy bear and a teddy bear") == [("big teddy bear", "bear"), ("teddy bear", "bear")]
    with pytest.raises(ValueError, match=r"\[phrases\] line 'bear = bear': a phrase has two or more words"):
        read_vocabulary("[synonyms]\nbear\n[phrases]\nbear = bear\n", "vocab.txt")


def test_chair_counts_per_caption_and_corpus(tmp_path):
    objects = read_instances(instances_file(tmp_path))
    assert objects[1] == {"person", "dog", "bicycle"} and objects[4] == frozenset()  # an image without objects
    corpus, items = chair(CAPTIONS, objects)
    assert [len(items[i].mentions) for i in (1, 2, 3)] == [4, 3, 3]
    assert items[1].hallucinated == (("bus", "bus"),) and items[3].hallucinated == (("dog", "dog"),)
    assert {i: items[i].scores() for i in items} == {
        1: {"CHAIRs": 1.0, "CHAIRi": 0.25, "chair/objects": 4.0, "chair/recall": 1.0},  # 1 of 4; 3 of 3
        2: {"CHAIRs": 0.0, "CHAIRi": 0.0, "chair/objects": 3.0, "chair/recall": pytest.approx(2 / 3)},
        3: {"CHAIRs": 1.0, "CHAIRi": pytest.approx(1 / 3), "chair/objects": 3.0, "chair/recall": 1.0},
    }
    assert corpus == {
        "CHAIRs": pytest.approx(2 / 3),  # captions 1 and 3 of 3
        "CHAIRi": pytest.approx(0.2),  # (1 + 0 + 1) hallucinated of (4 + 3 + 3) mentions: pooled, not the mean 0.194
        "chair/objects": pytest.approx(10 / 3),
        "chair/recall": pytest.approx(8 / 9),  # (1 + 2/3 + 1) / 3
    }


def test_reference_captions_add_ground_truth_and_images_without_objects_have_no_recall(tmp_path):
    objects = read_instances(instances_file(tmp_path))
    # image 3's reference names a dog: the caption's dog is no hallucination (CHAIR's ground truth is the instance
    # annotations and the references' objects); recall still counts the annotated objects only (2 of 2)
    corpus, items = chair({3: CAPTIONS[3], 4: "a bus on the street"}, objects,
                          references={3: ["A dog sniffs hot dogs on a table."]})  # fmt: skip
    assert items[3].scores() == {"CHAIRs": 0.0, "CHAIRi": 0.0, "chair/objects": 3.0, "chair/recall": 1.0}
    # image 4 has no annotated object: its bus is hallucinated, and it has no recall
    assert items[4].scores() == {"CHAIRs": 1.0, "CHAIRi": 1.0, "chair/objects": 1.0}
    assert corpus["CHAIRi"] == pytest.approx(1 / 4) and corpus["chair/recall"] == 1.0  # recall: image 3 alone


def test_chair_i_counts_mentions_as_the_reference_code_does_not_distinct_objects(tmp_path):
    objects = read_instances(instances_file(tmp_path))  # image 1: person, dog, bicycle
    # cat, cat, dog: 3 mentions, the cat hallucinated twice -> CHAIRi 2/3 (over distinct objects it would be 1/2)
    corpus, items = chair({1: "a cat chasing another cat and a dog"}, objects)
    assert items[1].hallucinated == (("cat", "cat"), ("cat", "cat"))
    assert corpus["CHAIRi"] == pytest.approx(2 / 3) and corpus["CHAIRs"] == 1.0
    assert corpus["chair/recall"] == pytest.approx(1 / 3)  # dog of person, dog, bicycle


def test_references_are_found_whichever_way_the_ids_are_written(tmp_path):
    objects = read_instances(instances_file(tmp_path))  # COCO's ids: ints
    refs = {3: ["A dog sniffs hot dogs on a table."]}  # COCO's captions file: ints too
    # a results file's ids are strings: "3" finds image 3's objects (hot dog, dining table) and its references' dog,
    # so the caption's dog is no hallucination: 3 mentions, none hallucinated (with refs={"3": ...} alike)
    for predictions, references in (({"3": CAPTIONS[3]}, refs), ({3: CAPTIONS[3]}, {"3": refs[3]})):
        corpus, _ = chair(predictions, objects, references=references)
        assert (corpus["CHAIRs"], corpus["CHAIRi"], corpus["chair/objects"]) == (0.0, 0.0, 3.0)


def test_instances_errors_are_one_line_and_name_the_option(tmp_path):
    def fails(path, *texts, option="--instances"):
        with pytest.raises(DataError) as e:
            read_instances(path, option)
        message = str(e.value)
        assert "\n" not in message and message.startswith(f"{option}: {path}"), message
        for text in texts:
            assert text in message, message

    fails(tmp_path / "nope.json", "no such file")
    fails(tmp_path, "is a directory")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    fails(bad, "not a JSON file")
    captions = tmp_path / "captions_val2014.json"
    captions.write_text(json.dumps({"images": [], "annotations": [{"image_id": 1, "caption": "a dog"}]}))
    fails(captions, "no 'categories' list", option="eval.instances")
    lvis = instances_file(tmp_path, {1: [5]}, [{"id": 5, "name": "aardvark"}], name="lvis.json")
    fails(lvis, "['aardvark'] are not COCO's 80 object categories")
    stray = instances_file(tmp_path, {1: [99]}, name="stray.json")
    fails(stray, "category_id 99, not in 'categories'")
    # a predicted image the file does not hold (another split's file)
    with pytest.raises(DataError, match=r"^instances: no objects for 1 predicted image\(s\), e.g. \[7\]"):
        chair({7: "a dog"}, read_instances(instances_file(tmp_path)))


def _instances_by_ids(path, images, annotations):
    """An instances file at ``path`` listing ``images`` (ids as written) and one box per ``(image_id, category_id)``
    of ``annotations``, in COCO's categories."""
    path.write_text(json.dumps({
        "images": [{"id": i} for i in images],
        "annotations": [{"id": n, "image_id": i, "category_id": c} for n, (i, c) in enumerate(annotations)],
        "categories": CATEGORIES,
    }))  # fmt: skip
    return path


def test_an_instances_file_naming_one_image_by_two_ids_is_refused_naming_the_file(tmp_path):
    # read_instances kept 1 and "1" (or a pandas file's 1.0 and "1") as two images, each with its own objects: chair()
    # refused them later as "chair objects", the chair reward as "chair objects (eval.instances)", neither naming the
    # file, and any other caller got both keys (id_key finds an image's objects by the spelling a prediction gives).
    # One image, two entries: the reader refuses the file, naming it
    def refused_file(name, images, annotations):
        path = _instances_by_ids(tmp_path / name, images, annotations)
        with pytest.raises(ValueError, match=rf"^--instances: {re.escape(str(path))}: 1 image\(s\) keyed twice") as e:
            read_instances(path, "--instances")
        return str(e.value)

    assert "1 and '1'" in refused_file("both.json", [1, "1"], [(1, 18), ("1", 17)])  # two entries in 'images'
    assert "1 and '1'" in refused_file("spelled.json", [1], [("1", 17)])  # an annotation spells image 1 "1"
    assert "1 and '1'" in refused_file("pandas.json", [1.0, 2.0], [(1.0, 18), ("1", 17)])  # 1.0: read as 1
    # the suite, given the file by path, stops on the reader's error (naming the file), for any spelling predicted
    for predictions in ({1: "a dog"}, {"1": "a dog"}):
        with pytest.raises(ValueError, match=r"both\.json: 1 image\(s\) keyed twice"):
            evaluate_items(predictions, None, metrics="hallucination", instances=tmp_path / "both.json")
    # one image written alike (ints, or integral floats as pandas writes them) is read
    assert read_instances(instances_file(tmp_path, {1: [18], 2: [17]}, name="ints.json")) == {
        1: frozenset({"dog"}), 2: frozenset({"cat"})}  # fmt: skip
    assert read_instances(instances_file(tmp_path, {1.0: [18], 2.0: [17]}, name="floats.json")) == {
        1: frozenset({"dog"}), 2: frozenset({"cat"})}  # fmt: skip


def test_instances_ids_are_ints_or_strings_and_an_integral_float_is_its_integer(tmp_path, caplog):
    # read_instances kept any JSON value as an image id: an annotation's "image_id": true was image 1 (True == 1 in a
    # dict), so a cat annotated on no image made image 1's "a cat" no hallucination; a list id was a TypeError
    # traceback; 1.5 an image no prediction names. It reads ids as the COCO captions reader does (records.require_id)
    def fails(name, images, annotations, *texts):
        path = _instances_by_ids(tmp_path / name, images, annotations)
        with pytest.raises(DataError) as e:
            read_instances(path, "--instances")
        message = str(e.value)
        assert "\n" not in message and message.startswith(f"--instances: {path}: "), message
        for text in texts:
            assert text in message, message

    fails("bool.json", [1], [(1, 18), (True, 17)], "annotation 1: 'image_id' must be int or str, got bool True")
    fails("list.json", [1], [([1], 17)], "annotation 0: 'image_id' must be int or str, got list [1]")
    fails("half.json", [1.5], [], "images[0]: 'id' 1.5 names no image")
    fails("image_bool.json", [False], [], "images[0]: 'id' must be int or str, got bool False")
    # pandas' floats: the integers they are (as pycocotools reads them), keyed as ints, with one warning
    path = _instances_by_ids(tmp_path / "floats.json", [1.0, 2.0], [(1.0, 18), (2, 17)])
    with caplog.at_level("WARNING", logger="finecap.metrics.hallucination"):
        objects = read_instances(path)
    assert objects == {1: frozenset({"dog"}), 2: frozenset({"cat"})}
    assert [type(i) for i in objects] == [int, int]
    assert "3 image id(s) are written as floats (e.g. 1.0)" in caplog.text  # two images, one annotation


def _eval_files(tmp_path):
    refs = {"images": [{"id": i, "file_name": f"{i}.jpg"} for i in (1, 2, 3)],
            "annotations": [{"image_id": 1, "id": 11, "caption": "Two people and a dog with a bicycle."},
                            {"image_id": 2, "id": 12, "caption": "A cat and a stuffed animal on a table."},
                            {"image_id": 3, "id": 13, "caption": "A dog sniffs hot dogs on a table."}]}  # fmt: skip
    (tmp_path / "captions_val2014.json").write_text(json.dumps(refs))
    results = [{"image_id": i, "caption": c} for i, c in CAPTIONS.items()]
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path / "results.json", tmp_path / "captions_val2014.json", instances_file(tmp_path)


def test_finecap_eval_hallucination_end_to_end(tmp_path):
    results, refs, instances = _eval_files(tmp_path)
    code, out, err = run_cli(["eval", "--predictions", str(results), "--references", str(refs), "--metrics",
                              "hallucination", "--instances", str(instances), "--format", "json",
                              "--per-image", str(tmp_path / "items.json")])  # fmt: skip
    assert code == 0, err
    # the references add image 3's dog (and image 2's table, annotated already): caption 3 hallucinates nothing;
    # caption 1's bus is the only hallucination. CHAIRs 1/3; CHAIRi 1 of 10 mentions; recall (1 + 2/3 + 1) / 3
    expected = {"CHAIRs": 1 / 3, "CHAIRi": 0.1, "chair/objects": 10 / 3, "chair/recall": 8 / 9}
    assert json.loads(out) == pytest.approx(expected)
    items = {row["image_id"]: row for row in json.loads((tmp_path / "items.json").read_text())}
    assert items[1]["CHAIRi"] == 0.25 and items[3]["CHAIRs"] == 0.0
    assert items[2]["chair/recall"] == pytest.approx(2 / 3)
    # the same through the library, the file named by path: the same numbers
    corpus, _ = evaluate_items({1: CAPTIONS[1], 2: CAPTIONS[2], 3: CAPTIONS[3]},
                               {1: ["Two people and a dog with a bicycle."], 2: ["A cat on a table."],
                                3: ["A dog sniffs hot dogs on a table."]},
                               metrics="hallucination", instances=instances, per_image=False)  # fmt: skip
    assert corpus == json.loads(out)


def test_finecap_eval_refuses_missing_or_malformed_instances(tmp_path):
    results, refs, _ = _eval_files(tmp_path)
    argv = ["eval", "--predictions", str(results), "--references", str(refs), "--metrics", "hallucination"]
    refused(argv, "--metrics: metric 'hallucination' cannot run here", "pass --instances")
    refused([*argv, "--instances", str(tmp_path / "missing.json")], "--instances:", "missing.json", "no such file")
    refused([*argv, "--instances", str(refs)], "--instances:", "no 'categories' list")
    twice = _instances_by_ids(tmp_path / "twice.json", [1, "1", 2, 3], [(1, 18), ("1", 17), (2, 17), (3, 58)])
    refused([*argv, "--instances", str(twice)], f"--instances: {twice}: 1 image(s) keyed twice, e.g. 1 and '1'")
    refused([*argv, f"eval.instances={tmp_path / 'gone.json'}"], "eval.instances:", "gone.json", "no such file")


def test_eval_instances_is_read_only_by_a_metric_that_reads_it(tmp_path):
    # a malformed eval.instances once failed an evaluation of BLEU alone (and a valid one was parsed every time)
    from finecap.config import load
    from finecap.metrics.suite import evaluate

    cfg = load(None, [f"eval.instances={tmp_path / 'missing.json'}"])
    assert evaluate({1: "a dog"}, {1: ["a dog"]}, metrics="rouge", cfg=cfg) == {"ROUGE-L": 1.0}
    with pytest.raises(DataError, match="eval.instances"):
        evaluate({1: "a dog"}, {1: ["a dog"]}, metrics="hallucination", cfg=cfg)
