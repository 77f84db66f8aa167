"""``finecap eval`` matches predicted ids to reference images by id, by path relative to the data set, or by file name
when only one image has it (issue 64): ``finecap caption --images photos/`` writes ``img000.jpg`` where a chat JSONL's
id is ``photos/img000.jpg``; its mismatch error shows both sides' first ids. Ids written as integral floats
(``42.0``) are the integers pycocotools reads them as."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from pycocotools.coco import COCO

from finecap.app.eval import file_numbers, match_ids
from finecap.data.records import Record, file_number
from finecap.data.references import LoadedReferences
from helpers.cli import refused, run_cli
from helpers.scripts import benchmark

CAPTIONS = {"photos/img000.jpg": "a dog on a deck", "photos/img001.jpg": "a cat on a red mat",
            "more/img000.png": "an owl in a tree"}  # fmt: skip


@pytest.fixture()
def chat(tmp_path) -> Path:
    """A chat JSONL (ms-swift's messages) over three images, two of them named img000."""
    lines = []
    for image, caption in CAPTIONS.items():
        (tmp_path / image).parent.mkdir(exist_ok=True)
        (tmp_path / image).write_bytes(b"")
        turns = [{"role": "user", "content": "<image>Describe the image."}, {"role": "assistant", "content": caption}]
        lines.append(json.dumps({"messages": turns, "images": [image]}))
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def predictions(path: Path, ids: dict[str, str]) -> Path:
    path.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in ids.items()]))
    return path


def scores(chat: Path, preds: Path) -> dict:
    code, out, err = run_cli(["eval", "--predictions", str(preds), "--references", str(chat), "--metrics",
                              "bleu,length", "--format", "json"])  # fmt: skip
    assert code == 0, err
    return json.loads(out)


def test_file_names_and_relative_paths_match_the_chat_jsonls_ids(chat, tmp_path):
    # img001.jpg is one image's file name; ./more/img000.png is a path relative to the data set's folder
    preds = predictions(tmp_path / "p.json", {"img001.jpg": CAPTIONS["photos/img001.jpg"],
                                              "./more/img000.png": CAPTIONS["more/img000.png"]})  # fmt: skip
    got = scores(chat, preds)
    assert got["BLEU-1"] == pytest.approx(1.0)  # each caption scored against its own image's reference
    assert got["Length"] == pytest.approx((6 + 5) / 2)  # both images scored


def test_an_ambiguous_file_name_is_refused_showing_both_sides_ids(chat, tmp_path):
    # img000.* are two images' stems, but img000.jpg only one's file name: it matches; img002.jpg names none
    preds = predictions(tmp_path / "p.json", {"img000.jpg": "a dog", "img002.jpg": "a cat"})
    theirs = "the references' ids are e.g. ['photos/img000.jpg', 'photos/img001.jpg', 'more/img000.png']"
    line = refused(["eval", "--predictions", str(preds), "--references", str(chat), "--metrics", "length"],
                   "1 predicted image id(s) are not in the references", "['img002.jpg']", theirs)  # fmt: skip
    assert "img000.jpg'" not in line.split("e.g.")[1]  # the predicted img000.jpg matched
    (tmp_path / "twin").mkdir()
    (tmp_path / "twin" / "img001.jpg").write_bytes(b"")
    with chat.open("a") as f:  # a second img001.jpg: the file name no longer says which image
        turns = [{"role": "user", "content": "<image>Describe."}, {"role": "assistant", "content": "a cat"}]
        f.write(json.dumps({"messages": turns, "images": ["twin/img001.jpg"]}) + "\n")
    refused(["eval", "--predictions", str(predictions(tmp_path / "q.json", {"img001.jpg": "a cat"})), "--references",
             str(chat), "--metrics", "length"], "e.g. ['img001.jpg']")  # fmt: skip


def numbered(tmp_path: Path, ids: dict[str, int | None]) -> Path:
    """A JSONL data set of numbered image files (empty: nothing reads their pixels), each file's reference the
    caption ``image <file name>``, with the ids given (None: none, the path is the id)."""
    lines = []
    for name, image_id in ids.items():
        (tmp_path / "photos").mkdir(exist_ok=True)
        (tmp_path / "photos" / name).write_bytes(b"")
        line = {"image": f"photos/{name}", "captions": [f"image {name}"], "split": "test"}
        lines.append(json.dumps(line | ({"id": image_id} if image_id is not None else {})))
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_integer_id_names_the_file_of_that_number_as_caption_images_writes_it(tmp_path):
    # `finecap caption --images photos/` names 1000092795.jpg 1000092795 (Flickr30k's files; its Karpathy ids are
    # other numbers): it was "not in the references" of a data set whose ids are paths or other numbers
    data = numbered(tmp_path, {"1000092795.jpg": None, "COCO_val2014_000000000042.jpg": 7})
    preds = predictions(tmp_path / "p.json", {1000092795: "image 1000092795.jpg",
                                              42: "image COCO_val2014_000000000042.jpg"})  # fmt: skip
    got = scores(data, preds)
    assert got["BLEU-1"] == pytest.approx(1.0)  # both matched, each against its own file's reference


def test_an_integer_read_as_an_id_that_numbers_another_file_is_warned(tmp_path):
    # ids 0 and 1 given crosswise to the files 1.jpg and 0.jpg: 0 is an id (of 1.jpg) and 0.jpg's number
    data = numbered(tmp_path, {"0.jpg": 1, "1.jpg": 0})
    preds = predictions(tmp_path / "p.json", {0: "image 1.jpg", 1: "image 0.jpg"})
    code, out, err = run_cli(["eval", "--predictions", str(preds), "--references", str(data), "--metrics", "bleu",
                              "--format", "json"])  # fmt: skip
    assert code == 0 and json.loads(out)["BLEU-1"] == pytest.approx(1.0)  # scored by id, as `caption --data` writes
    assert "warning: 2 predicted id(s) are ids of the references and numbers of other images' file names" in err
    assert "e.g. 0: image 0 by id, image 1 by its file name" in err


def test_two_ids_naming_one_image_are_refused_as_such(tmp_path):
    # 1000 and "1000" both name image 1000: the second was refused as "not in the references", which it is
    data = numbered(tmp_path, {"1000.jpg": 1000, "1001.jpg": 1001})
    preds = predictions(tmp_path / "p.json", {1000: "image 1000.jpg", "1000": "image 1000.jpg"})
    line = refused(["eval", "--predictions", str(preds), "--references", str(data), "--metrics", "length"],
                   "1 predicted image id(s) name an image that another predicted id names too",
                   "e.g. '1000' and 1000 both name image 1000")  # fmt: skip
    assert "not in the references" not in line


def test_an_id_naming_another_folder_never_takes_an_image_of_the_same_file_name(chat, tmp_path):
    # more/img001.jpg shares its file name with photos/img001.jpg only: its folder names no reference image
    preds = predictions(tmp_path / "p.json", {"more/img001.jpg": CAPTIONS["photos/img001.jpg"]})
    refused(["eval", "--predictions", str(preds), "--references", str(chat), "--metrics", "length"],
            "1 predicted image id(s) are not in the references", "['more/img001.jpg']")  # fmt: skip
    # a longer path whose folders agree with the image's as far as both go still names it
    longer = predictions(tmp_path / "q.json", {str(tmp_path / "photos/img001.jpg"): CAPTIONS["photos/img001.jpg"]})
    assert scores(chat, longer)["BLEU-1"] == pytest.approx(1.0)


def test_an_image_coco_lists_without_a_caption_is_named_so(tmp_path):
    # pycocotools reads an image without annotations; finecap leaves it out, and a caption of it was called
    # "not in the references" of a file that plainly lists it
    refs = tmp_path / "captions_val2014.json"
    refs.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
        "annotations": [{"id": 10, "image_id": 1, "caption": "a dog on a deck"}],
    }))  # fmt: skip
    preds = predictions(tmp_path / "p.json", {1: "a dog", 2: "a cat"})
    refused(["eval", "--predictions", str(preds), "--references", str(refs), "--metrics", "length"],
            "1 predicted image id(s) are not in the references", "1 of them ([2]) are in its 'images' list without a "
            "caption annotation")  # fmt: skip


def test_empty_predicted_captions_are_said_and_scored_as_they_are(chat, tmp_path):
    """A caption that decoded to no text (a real VLM's ``finecap caption`` can write ``""``) is scored as it is, and
    the command says how many there are and which: before, nothing was said."""
    preds = predictions(tmp_path / "p.json", {"photos/img000.jpg": "", "photos/img001.jpg": "a cat on a red mat",
                                              "more/img000.png": " "})  # fmt: skip
    code, out, err = run_cli(["eval", "--predictions", str(preds), "--references", str(chat), "--metrics", "length",
                              "--format", "json"])  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["Length"] == pytest.approx(6 / 3)
    assert ("2 of the predicted captions (of 3) are empty, e.g. image ids ['photos/img000.jpg', 'more/img000.png'], "
            "scored as they are") in err  # fmt: skip


@pytest.mark.parametrize(("theirs", "ours"), [("391895", 391895), (391895, "391895")])
def test_an_int_id_and_its_string_name_one_image_and_per_image_rows_keep_the_references_ids(tmp_path, theirs, ours):
    # a COCO results file's 391895 against a JSONL data set's "391895" (or the other way): one image, scored as the
    # same-typed ids are, and the per-image file writes the references' ids as they write them
    data = numbered(tmp_path, {"a.jpg": theirs, "b.jpg": 7})
    argv = ["eval", "--references", str(data), "--metrics", "bleu,rouge,cider,length", "--format", "json"]
    same = predictions(tmp_path / "same.json", {theirs: "image a.jpg", 7: "image b a"})
    mixed = predictions(tmp_path / "mixed.json", {ours: "image a.jpg", "7": "image b a"})
    code, want, err = run_cli([*argv, "--predictions", str(same), "--per-image", str(tmp_path / "want.json")])
    assert code == 0, err
    code, got, err = run_cli([*argv, "--predictions", str(mixed), "--per-image", str(tmp_path / "got.json")])
    assert code == 0, err
    assert json.loads(got) == json.loads(want) and json.loads(got)["ROUGE-L"] < 1  # b's caption is not its reference
    rows = json.loads((tmp_path / "got.json").read_text())
    assert [r["image_id"] for r in rows] == [theirs, 7]
    assert rows == json.loads((tmp_path / "want.json").read_text())


class _Unread:
    """A path that fails the test when anything reads it."""

    def __getattr__(self, name: str):
        raise AssertionError(f"a path was read (.{name})")


def test_ids_that_are_all_reference_ids_are_matched_without_reading_a_path():
    # a COCO results file's ids against COCO references: the path maps (by relative path, file name, file number)
    # serve only ids that are no reference id, and built for every image they were 0.14 s of a 0.5 s evaluation of
    # 8,000 images (benchmarks/eval_end_to_end.py)
    refs = LoadedReferences([Record(i, _Unread(), "test", ["a dog"]) for i in (1, 2, 3)], _Unread(), "coco")
    assert match_ids([3, 1], refs) == {3: 3, 1: 1}


def test_file_numbers_read_each_paths_stem_as_file_number_reads_its_name():
    # file_numbers reads Path.stem (parsed already) where file_number parses the name again: the same numbers
    names = ["7.jpg", "8.", ".9", "10", "COCO_val2014_000000000042.jpg", "11.tar.gz", "12..jpg", "x13.jpg", "014.png"]
    refs = LoadedReferences([Record(n, Path("/d/photos") / n, "test", ["a dog"]) for n in names], Path("/d"), "jsonl")
    want = {file_number(n): n for n in names if file_number(n) is not None}
    assert file_numbers(refs) == want == {7: "7.jpg", 10: "10", 42: "COCO_val2014_000000000042.jpg", 14: "014.png"}


def _float_id_coco(tmp_path: Path, n: int = 30) -> tuple[Path, Path, Path, Path]:
    """COCO-like references and results with integer ids (the images carry only an id), and the same two files with
    every other id written as a float (``17.0``, as pandas writes an id column): ``(refs, res, float refs, float
    res)``."""
    refs, res = benchmark("coco_like").write_coco(tmp_path / "coco", n, seed=11)
    data = json.loads(refs.read_text())
    data["images"] = [{"id": img["id"]} for img in data["images"]]
    refs.write_text(json.dumps(data))
    data["annotations"] = [{**a, "image_id": float(a["image_id"]) if k % 2 else a["image_id"]}
                           for k, a in enumerate(data["annotations"])]  # fmt: skip
    float_refs = tmp_path / "captions_test_floats.json"
    float_refs.write_text(json.dumps(data))
    rows = json.loads(res.read_text())
    float_res = tmp_path / "results_floats.json"
    float_res.write_text(json.dumps([{**r, "image_id": float(r["image_id"]) if k % 2 else r["image_id"]}
                                     for k, r in enumerate(rows)]))  # fmt: skip
    return refs, res, float_refs, float_res


def test_integral_float_ids_are_scored_as_the_integers_pycocotools_reads_them_as(tmp_path):
    # `"image_id": 17.0` (results written through pandas) was refused ("'image_id' must be int or str, got float
    # 17.0") where pycocotools and pycocoevalcap read it: their indexes are dicts, and 17.0 is the key 17. Now the
    # float files give the integer files' scores and per-image rows, with one warning for each file.
    refs, res, float_refs, float_res = _float_id_coco(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools reads both pairs into the same captions
        coco, float_coco = COCO(str(refs)), COCO(str(float_refs))
        loaded, float_loaded = coco.loadRes(str(res)), float_coco.loadRes(str(float_res))
    ids = loaded.getImgIds()
    assert float_loaded.getImgIds() == ids and len(ids) == 30
    for i in ids:
        assert [a["caption"] for a in float_coco.imgToAnns[i]] == [a["caption"] for a in coco.imgToAnns[i]]
        assert [a["caption"] for a in float_loaded.imgToAnns[i]] == [a["caption"] for a in loaded.imgToAnns[i]]
    argv = ["eval", "--metrics", "bleu,rouge,cider", "--format", "coco"]
    code, want, err = run_cli([*argv, "--references", str(refs), "--predictions", str(res),
                               "--per-image", str(tmp_path / "want.json")])  # fmt: skip
    assert code == 0 and "floats" not in err, err
    code, got, err = run_cli([*argv, "--references", str(float_refs), "--predictions", str(float_res),
                              "--per-image", str(tmp_path / "got.json")])  # fmt: skip
    assert code == 0, err
    assert json.loads(got) == json.loads(want) and 0.05 < json.loads(got)["CIDEr"] < 5
    rows = json.loads((tmp_path / "got.json").read_text())
    assert rows == json.loads((tmp_path / "want.json").read_text()) and [r["image_id"] for r in rows] == ids
    assert f"{float_res}: 15 image id(s) are written as floats (e.g. {float(ids[1])!r}), read as the integers" in err
    assert f"{float_refs}: 75 image id(s) are written as floats" in err  # 5 references an image, every other one


def test_a_float_id_that_is_no_integer_is_refused_naming_the_entry(tmp_path):
    # pycocotools' loadRes asserts a result's id is an image of the references: 17.5 never is, nor NaN
    refs, res, _, _ = _float_id_coco(tmp_path, n=3)
    rows = json.loads(res.read_text())
    for odd in ("17.5", "NaN", "Infinity"):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(rows[:2])[:-1] + f', {{"image_id": {odd}, "caption": "a dog"}}]')
        refused(["eval", "--references", str(refs), "--predictions", str(bad), "--metrics", "bleu"],
                f"{bad}: [2]: 'image_id' {float(odd)!r} names no image: an image id is an integer")  # fmt: skip


@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None, reason="java not on PATH: pycocoevalcap's PTBTokenizer needs Java")
def test_integral_float_ids_give_pycocoevalcaps_numbers(tmp_path):
    # pycocoevalcap's COCOEvalCap.evaluate for BLEU, ROUGE-L and CIDEr (its METEOR and SPICE left out: each a JVM of
    # seconds), on the files with float ids, against `finecap eval` on the same files: bit for bit
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    _, _, float_refs, float_res = _float_id_coco(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(float_refs))
        loaded = coco.loadRes(str(float_res))
        ids = loaded.getImgIds()
        tokenizer = PTBTokenizer()
        gts = tokenizer.tokenize({i: coco.imgToAnns[i] for i in ids})
        res = tokenizer.tokenize({i: loaded.imgToAnns[i] for i in ids})
        bleu, _ = Bleu(4).compute_score(gts, res)
    want = {**{f"Bleu_{n}": b for n, b in enumerate(bleu, 1)}, "ROUGE_L": Rouge().compute_score(gts, res)[0],
            "CIDEr": Cider().compute_score(gts, res)[0]}  # fmt: skip
    code, got, err = run_cli(["eval", "--references", str(float_refs), "--predictions", str(float_res), "--metrics",
                              "bleu,rouge,cider", "--format", "coco"])  # fmt: skip
    assert code == 0, err
    assert json.loads(got) == want
