"""Other toolkits' prediction files in `finecap eval` (finecap.data.predictions): a file of each format, written here
in the shape its tool writes, scores exactly what pycocoevalcap's scorers give on the same captions and references
(and what the COCO results file with those captions gives); stringified reference lists parsed, look-alikes warned
about; the length note."""

from __future__ import annotations

import codecs
import contextlib
import csv
import io
import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from finecap.app.cli import main as cli
from finecap.data.predictions import Predictions, jsonl, read_predictions
from finecap.data.records import DataError
from finecap.metrics.ptb_tokenize import ptb_tokenize
from finecap.utils.reading import FileTooLarge
from helpers.cli import run_cli
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]
METRICS = ["--metrics", "bleu,rouge,cider", "--format", "json"]


@pytest.fixture(scope="module")
def captions():
    """30 images of seeded COCO-like raw captions: ``(ids, predictions, references)`` (5 references each)."""
    refs, preds = benchmark("coco_like").generate(30, seed=4)
    ids = list(refs)
    return ids, [preds[i] for i in ids], [refs[i] for i in ids]


def pycocoevalcap_scores(preds: list[str], refs: list[list[str]]) -> dict[str, float]:
    """pycocoevalcap's own Bleu(4), Rouge(), Cider() on the captions tokenised as its PTBTokenizer does (finecap's
    Python equivalent; tests/metrics/test_ptb_tokenize.py compares it with the Java tokenizer)."""
    gts = ptb_tokenize(dict(enumerate(refs)))
    res = ptb_tokenize({k: [p] for k, p in enumerate(preds)})
    with contextlib.redirect_stdout(io.StringIO()):
        bleu, _ = Bleu(4).compute_score(gts, res)
    out = {f"BLEU-{k + 1}": bleu[k] for k in range(4)}
    out["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    out["CIDEr-D"] = float(Cider().compute_score(gts, res)[0])
    return out


def score(capsys, *argv: str) -> dict[str, float]:
    capsys.readouterr()
    assert cli(["eval", *argv, *METRICS]) == 0
    return json.loads(capsys.readouterr().out)


def write_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def lmms_eval_log(path: Path, ids, preds, refs) -> Path:
    """lmms-eval --log_samples of coco2017_cap_val as EvolvingLMMs-Lab/lmms-eval 75571cfe writes it (evaluator.py's
    example dict, loggers/evaluation_tracker.py save_results_samples: `filtered_resps` of one request flattened to
    its caption, `target` str() of the answer list, `doc` and `arguments` dropped, `input` added, json.dumps with
    ensure_ascii=False): per document the saved fields and one entry per metric (coco_process_result's data_dict)."""
    rows = []
    for k, (i, p, r) in enumerate(zip(ids, preds, refs, strict=True)):
        entry = {"answer": r, "pred": p, "image_id": i, "id": 1000 + k}
        rows.append({"doc_id": k, "target": str(r), "filtered_resps": p, "token_counts": [None],
                     "doc_hash": f"{k:064x}",
                     **{f"coco_{m}": entry for m in ("Bleu_4", "Bleu_3", "METEOR", "ROUGE_L", "CIDEr")},
                     "input": "Provide a one-sentence caption for the provided image."})  # fmt: skip
    return write_lines(path, rows)


def swift_infer_line(response: str, label: str | None, image: str = "/data/coco/1.jpg") -> dict:
    """A line of ms-swift's `swift infer --val_dataset ... --result_path` (modelscope/ms-swift 3602360a,
    swift/pipelines/infer/infer.py, SwiftInfer._batch_infer: `labels` is InferRequest.remove_response(messages), the
    data set's answer turn taken off `messages` or None; then `messages` gets the response as an assistant turn and
    the line is {"response", "labels", "logprobs", **data}, written by JsonlWriter with ensure_ascii=False)."""
    user = {"role": "user", "content": "<image>Describe the image."}
    return {"response": response, "labels": label, "logprobs": None,
            "messages": [user, {"role": "assistant", "content": response}], "images": [image]}  # fmt: skip


def swift2_infer_line(response: str, label: str | None) -> dict:
    """A line of ms-swift 2's infer result (modelscope/ms-swift d2b45ec8, 2.7.0.dev0, swift/llm/infer.py:
    {"system", "query", "response", "label", "history"} and the images)."""
    return {"system": None, "query": "<image>Describe the image.", "response": response, "label": label,
            "history": [], "images": ["/data/coco/1.jpg"]}  # fmt: skip


def test_each_toolkits_file_scores_like_pycocoevalcap_and_the_coco_results(tmp_path, capsys, captions):
    ids, preds, refs = captions
    five, one = pycocoevalcap_scores(preds, refs), pycocoevalcap_scores(preds, [r[:1] for r in refs])
    assert 0.1 < five["CIDEr-D"] < 5  # a non-trivial comparison
    # the COCO results file with the same captions, against COCO annotations
    anns = [{"image_id": i, "id": 10 * k + j, "caption": c} for k, i in enumerate(ids) for j, c in enumerate(refs[k])]
    (tmp_path / "captions.json").write_text(json.dumps({"images": [{"id": i} for i in ids], "annotations": anns}))
    (tmp_path / "results.json").write_text(
        json.dumps([{"image_id": i, "caption": p} for i, p in zip(ids, preds, strict=True)])
    )
    coco = score(
        capsys, "--predictions", str(tmp_path / "results.json"), "--references", str(tmp_path / "captions.json")
    )
    assert coco == five

    # lmms-eval: the metric entries; and a log without them (filtered_resps + stringified target, doc_id as id)
    log = lmms_eval_log(tmp_path / "20250101_samples_coco2017_cap_val.jsonl", ids, preds, refs)
    assert score(capsys, "--predictions", str(log)) == five
    bare = write_lines(
        tmp_path / "bare.jsonl",
        [
            {"doc_id": k, "target": str(r), "filtered_resps": [[p]]}
            for k, (p, r) in enumerate(zip(preds, refs, strict=True))
        ],
    )
    assert score(capsys, "--predictions", str(bare)) == five

    # VLMEvalKit: <model>_COCO_VAL.tsv, `answer` a stringified list (pandas writes the list's str())
    tsv = tmp_path / "Qwen2-VL-2B_COCO_VAL.tsv"
    with open(tsv, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["index", "question", "answer", "prediction"])
        w.writerows(
            [k, "Please describe this image in general.", str(r), p]
            for k, (p, r) in enumerate(zip(preds, refs, strict=True))
        )
    assert score(capsys, "--predictions", str(tsv)) == five

    # LLaMA-Factory's generated_predictions.jsonl: one label per line
    lf = write_lines(tmp_path / "generated_predictions.jsonl",
                     [{"prompt": "user\n<image>Describe the image.\nassistant\n", "predict": p, "label": r[0]}
                      for p, r in zip(preds, refs, strict=True)])  # fmt: skip
    assert score(capsys, "--predictions", str(lf)) == one

    # ms-swift infer --result_path (3 and 4, swift_infer_line): the answer in `labels`, the response appended to
    # `messages`; ms-swift 2 wrote `query` / `response` / `label`
    lines = [swift_infer_line(p, r[0], f"/data/coco/{i}.jpg") for i, p, r in zip(ids, preds, refs, strict=True)]
    sw = write_lines(tmp_path / "infer_result.jsonl", lines)
    assert score(capsys, "--predictions", str(sw)) == one
    sw2 = write_lines(
        tmp_path / "infer2.jsonl", [swift2_infer_line(p, r[0]) for p, r in zip(preds, refs, strict=True)]
    )
    assert score(capsys, "--predictions", str(sw2), "--predictions-format", "swift") == one

    found = {p.name: read_predictions(p)[0] for p in (tmp_path / "results.json", log, bare, tsv, lf, sw, sw2)}
    assert list(found.values()) == ["coco", "lmms-eval", "lmms-eval", "vlmevalkit", "llamafactory", "swift", "swift"]


def test_stringified_lists_are_parsed_and_look_alikes_named(tmp_path, capsys, captions):
    ids, preds, refs = captions
    tsv = tmp_path / "m_COCO_VAL.tsv"
    rows = [[k, str(r), p] for k, (p, r) in enumerate(zip(preds, refs, strict=True))]
    rows[1][1] = json.dumps(refs[1])  # JSON quoting parses too
    rows[2][1] = str(refs[2])[:40]  # a cut-off cell: looks like a list, is not one
    with open(tsv, "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([["index", "answer", "prediction"], *rows])
    assert cli(["eval", "--predictions", str(tsv), *METRICS]) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "column 'answer': 1 value(s) look like a stringified list" in err
    assert "rows 4" in err  # row 4 of the file: the header is row 1
    _, read = read_predictions(tsv)
    assert read.references[1] == refs[1] and read.references[0] == refs[0]
    assert read.references[2] == [str(refs[2])[:40]]  # kept as one caption, and warned about


def test_length_note_missing_references_and_xlsx_without_openpyxl(tmp_path, capsys, captions, monkeypatch):
    ids, preds, refs = captions
    long = [" ".join([p] * 3) for p in preds]  # three times the prediction: well over twice the references' length
    lf = write_lines(
        tmp_path / "generated_predictions.jsonl",
        [{"prompt": "", "predict": p, "label": r[0]} for p, r in zip(long, refs, strict=True)],
    )
    assert cli(["eval", "--predictions", str(lf), *METRICS]) == 0
    assert "over twice their references'" in capsys.readouterr().err
    assert cli(["eval", "--predictions", str(lf), "--metrics", "bleu", "--format", "json",
                "--predictions-format", "llamafactory"]) == 0  # fmt: skip
    capsys.readouterr()
    for chosen in (["--split", "test"], ["--images", str(tmp_path)]):  # nothing to choose from: said, not ignored
        assert cli(["eval", "--predictions", str(lf), *chosen, *METRICS]) == 2
        assert f"{chosen[0]}: {lf} carries its own references" in capsys.readouterr().err
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": 1, "caption": "a dog"}]))
    assert cli(["eval", "--predictions", str(tmp_path / "results.json"), *METRICS]) != 0
    assert "--references: required" in capsys.readouterr().err
    (tmp_path / "m_COCO_VAL.xlsx").write_bytes(b"PK\x03\x04")  # a cut-off workbook: said, no traceback
    assert cli(["eval", "--predictions", str(tmp_path / "m_COCO_VAL.xlsx"), *METRICS]) == 2
    assert "m_COCO_VAL.xlsx: not a readable .xlsx workbook (BadZipFile" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "openpyxl", None)  # openpyxl (the test extra installs it) missing: said so
    assert cli(["eval", "--predictions", str(tmp_path / "m_COCO_VAL.xlsx"), *METRICS]) == 2
    assert "reading .xlsx needs openpyxl: pip install 'finecap[xlsx]'" in capsys.readouterr().err


def test_a_jsonl_line_whose_caption_holds_a_unicode_line_separator_is_one_line(tmp_path):
    # json.dumps(..., ensure_ascii=False) leaves U+2028 / U+2029 / U+0085 unescaped; str.splitlines cut the line there
    # and the file was refused as "Unterminated string"
    rows = [{"prompt": "", "predict": "a dog\u2028on a deck\u0085at noon", "label": "a dog on a deck"},
            {"prompt": "", "predict": "a cat", "label": "a cat on a mat"}]  # fmt: skip
    path = tmp_path / "generated_predictions.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows), encoding="utf-8")
    name, predictions = read_predictions(path)
    assert name == "llamafactory" and len(predictions.captions) == 2
    assert ["a dog\u2028on a deck\u0085at noon"] in predictions.captions.values()


@pytest.mark.parametrize("name", ["llamafactory", "swift", "lmms-eval"])
def test_a_jsonl_file_saved_with_a_byte_order_mark_reads_as_without(tmp_path, name):
    # finecap's own JSONL readers skipped a BOM (a file saved by a Windows editor); these refused it as not JSON
    rows = {
        "llamafactory": [{"prompt": "", "predict": "a cat", "label": "a cat on a mat"}],
        "swift": [{"response": "a cat", "labels": "a cat on a mat"}],
    }
    plain = tmp_path / "plain" / "generated_predictions.jsonl"
    plain.parent.mkdir()
    if name == "lmms-eval":
        lmms_eval_log(plain, [1], ["a cat"], [["a cat on a mat"]])
    else:
        write_lines(plain, rows[name])
    marked = tmp_path / plain.name
    marked.write_bytes(codecs.BOM_UTF8 + plain.read_bytes())
    assert read_predictions(plain)[0] == name
    assert read_predictions(marked) == read_predictions(plain)


def test_an_lmms_eval_image_listed_again_with_other_references_is_refused(tmp_path):
    # its first caption was scored against the last line's references (BLEU-1 0.30 for "a dog" and "a dog on grass")
    entry = {"pred": "a dog", "answer": ["a dog on grass"], "image_id": 7}
    lines = [{"doc_id": 0, "coco_Bleu_4": entry}, {"doc_id": 1, "coco_Bleu_4": entry | {"pred": "a puppy"}}]
    path = tmp_path / "samples_coco2017_cap_val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    name, predictions = read_predictions(path)  # the same references on both lines: two samples of image 7
    assert name == "lmms-eval" and predictions.captions == {7: ["a dog", "a puppy"]}
    lines[1]["coco_Bleu_4"] = entry | {"answer": ["a red car"]}
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: image id 7 is listed again with other references"):
        read_predictions(path)


def test_a_file_carrying_references_that_names_one_image_by_two_ids_is_refused_naming_it(tmp_path):
    # lmms-eval lines of image_id 7 and "7" were read as two images, each with its reference list: finecap eval (no
    # --references, the file's own) then refused "references: 1 image(s) keyed twice", naming no file, and a caller
    # of read_predictions got both. The reader refuses the file, naming it
    log = lmms_eval_log(tmp_path / "samples_coco2017_cap_val.jsonl", [7, "7", 8], ["a dog", "a puppy", "a cat"],
                        [["a dog on grass"], ["a dog on grass"], ["a cat"]])  # fmt: skip
    with pytest.raises(ValueError, match=rf"^{re.escape(str(log))}: 1 image\(s\) keyed twice, e.g. 7 and '7'"):
        read_predictions(log)
    code, _, err = run_cli(["eval", "--predictions", str(log), "--metrics", "bleu"])
    assert code == 2 and f"finecap: error: {log}: 1 image(s) keyed twice" in err, err
    # one id per image reads (7 listed twice: two samples of image 7)
    again = lmms_eval_log(tmp_path / "samples_again.jsonl", [7, 7, 8], ["a dog", "a puppy", "a cat"],
                          [["a dog on grass"], ["a dog on grass"], ["a cat"]])  # fmt: skip
    assert read_predictions(again)[1].captions == {7: ["a dog", "a puppy"], 8: ["a cat"]}
    # captions alone (COCO results) are read as written: --references matches them (tests/app/test_eval_ids.py)
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 7, "caption": "a dog"}, {"image_id": "7", "caption": "a puppy"}]))
    assert read_predictions(results)[1].captions == {7: ["a dog"], "7": ["a puppy"]}


def test_coco_results_written_one_object_a_line_are_named_as_json_lines_with_the_fix(tmp_path):
    # the keys of COCO results, one object a line (as many tools write them): the error said only "invalid JSON at
    # line 2, column 1: Extra data"
    path = tmp_path / "my results.jsonl"
    rows = [{"image_id": 1, "caption": "a red circle"}, {"image_id": 2, "caption": "a square"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    error = str(read_error(path))
    assert "holds one JSON object a line (JSON Lines); COCO results are one JSON list" in error
    fix = error.split("e.g. ", 1)[1].split(" > ", 1)[0]
    out = subprocess.run(shlex.split(fix.replace("python", sys.executable, 1)), capture_output=True, text=True)
    assert json.loads(out.stdout) == rows  # the command it suggests makes the list
    (tmp_path / "results.json").write_text(out.stdout)
    assert read_predictions(tmp_path / "results.json")[1].captions == {1: ["a red circle"], 2: ["a square"]}


def test_coco_results_of_one_line_get_the_json_lines_hint_too(tmp_path):
    # a file of one such line parses as one object: the error said only "must be a list ... got dict"
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"image_id": 1, "caption": "a red circle"}) + "\n")
    error = str(read_error(path))
    assert "holds one JSON object a line (JSON Lines); COCO results are one JSON list" in error
    fix = error.split("e.g. ", 1)[1].split(" > ", 1)[0]
    out = subprocess.run(shlex.split(fix.replace("python", sys.executable, 1)), capture_output=True, text=True)
    assert json.loads(out.stdout) == [{"image_id": 1, "caption": "a red circle"}]
    path.write_text(json.dumps({"captions": {"1": "a red circle"}}))  # another object: the plain error, no hint
    error = str(read_error(path))
    assert "must be a list of {'image_id', 'caption'} objects, got dict" in error and "JSON Lines" not in error


def test_a_coco_results_file_of_one_line_is_parsed_once(tmp_path, monkeypatch):
    # the tools' detectors read a first line as a JSON Lines record: a COCO results list written on one line (as
    # json.dump writes it) was the whole file, parsed again by each of three detectors before its reader parsed it
    path = tmp_path / "results.json"
    path.write_text(json.dumps([{"image_id": i, "caption": f"image {i}"} for i in range(3)]))
    parsed = []
    real = jsonl.parse_json
    monkeypatch.setattr(jsonl, "parse_json", lambda *a, **k: parsed.append(1) or real(*a, **k))
    fmt, read = read_predictions(path)
    assert fmt == "coco" and read.captions == {i: [f"image {i}"] for i in range(3)} and not parsed
    # a first line holding an object is still read (an lmms-eval or ms-swift line), white space before it too
    path.write_text(' \t{"image_id": 1, "caption": "a dog"}\n')
    assert jsonl.first_record(path) == {"image_id": 1, "caption": "a dog"} and parsed


def read_error(path):
    with pytest.raises(DataError) as e:
        read_predictions(path)
    return e.value


def test_a_vlmevalkit_json_result_file_scores_as_its_tsv(tmp_path, capsys, captions):
    # PRED_FORMAT=json: VLMEvalKit writes <model>_<dataset>.json, the table as a JSON list of row objects
    # (open-compass/VLMEvalKit e8e78f05, vlmeval/smp/file.py: get_pred_file_path, dump_json's
    # DataFrame.to_dict('records') with indent=4); it was read as COCO results: "missing key 'image_id'"
    ids, preds, refs = captions
    rows = [{"index": k, "question": "Please describe this image in general.", "answer": str(r), "prediction": p}
            for k, (p, r) in enumerate(zip(preds, refs, strict=True))]  # fmt: skip
    path = tmp_path / "Qwen2-VL-2B_COCO_VAL.json"
    path.write_text(json.dumps(rows, indent=4, ensure_ascii=False), encoding="utf-8")
    name, read = read_predictions(path)
    assert name == "vlmevalkit" and read.captions == {k: [p] for k, p in enumerate(preds)}
    assert read.references == dict(enumerate(refs))
    assert score(capsys, "--predictions", str(path)) == pycocoevalcap_scores(preds, refs)
    # a JSON list of other objects is still COCO results (with COCO's errors), and a VLMEvalKit list whose rows
    # are not one table says so
    (tmp_path / "other.json").write_text(json.dumps([{"index": 0, "caption": "a dog"}]))
    with pytest.raises(DataError, match="missing key 'image_id'"):
        read_predictions(tmp_path / "other.json")
    path.write_text(json.dumps([rows[0], {"index": 1, "prediction": "a dog"}]))
    with pytest.raises(DataError, match=r"\[1\] has the keys \['index', 'prediction'\], the first row"):
        read_predictions(path)


def test_an_lmms_eval_log_of_0_2_3_scores_as_its_sample_lines(tmp_path, capsys, captions):
    # lmms-eval up to 0.2.3 wrote --log_samples as <output_path>/<task>.json, one object whose `logs` are the
    # documents (EvolvingLMMs-Lab/lmms-eval e20d5d6b^, lmms_eval/__main__.py:529-533: {"args", "model_configs",
    # "logs" sorted by doc_id, "time"}, json.dumps indent=4); it was read as COCO results: "must be a list, got dict"
    ids, preds, refs = captions
    lines = lmms_eval_log(tmp_path / "20240101_samples_coco2017_cap_val.jsonl", ids, preds, refs)
    logs = [json.loads(line) | {"doc": {"question_id": f"{i:012d}.jpg"}, "arguments": [["Provide a caption.", {}]],
                                "resps": [[p]], "filtered_resps": [p]}  # the old logs kept the document, the
            # arguments and the responses, and did not flatten them
            for line, i, p in zip(lines.read_text().splitlines(), ids, preds, strict=True)]  # fmt: skip
    old = tmp_path / "coco2017_cap_val.json"
    old.write_text(json.dumps({"args": {"model": "llava", "tasks": "coco2017_cap_val"}, "model_configs": {},
                               "logs": logs, "time": "0101_1200"}, indent=4, ensure_ascii=False))  # fmt: skip
    name, read = read_predictions(old)
    assert name == "lmms-eval" and read == read_predictions(lines)[1]
    assert score(capsys, "--predictions", str(old)) == pycocoevalcap_scores(preds, refs)
    old.write_text(json.dumps({"args": {}, "model_configs": {}, "logs": [logs[0], ["a dog"]]}, indent=4))
    with pytest.raises(DataError, match=r"logs\[1\]: expected a JSON object"):
        read_predictions(old)


def test_an_lmms_eval_test_split_line_is_read_under_its_entrys_image_id_not_its_row(tmp_path, capsys):
    # lmms-eval's nocaps test split logs no references, only {"pred", "image_id"} (EvolvingLMMs-Lab/lmms-eval,
    # lmms_eval/tasks/nocaps/utils.py at 75571cfe, nocaps_test_process_result: "nocaps_passthrough"); doc_id is the
    # row. Scored against references of one's own, the row would pair each caption with another image (ids 0 and 1
    # are images here too), silently.
    rows = [{"doc_id": k, "target": "", "filtered_resps": [pred], "nocaps_passthrough": {"pred": pred, "image_id": i}}
            for k, (i, pred) in enumerate([(1, "a dog on grass"), (0, "a red car")])]  # fmt: skip
    log = write_lines(tmp_path / "20250101_samples_nocaps_test.jsonl", rows)
    name, read = read_predictions(log)
    assert name == "lmms-eval" and read.captions == {1: ["a dog on grass"], 0: ["a red car"]}
    refs = tmp_path / "refs.jsonl"
    write_lines(refs, [{"id": 0, "image": "0.jpg", "captions": ["a red car"]},
                       {"id": 1, "image": "1.jpg", "captions": ["a dog on grass"]}])  # fmt: skip
    for k in (0, 1):
        (tmp_path / f"{k}.jpg").write_bytes(b"")
    code, out, err = run_cli(["eval", "--predictions", str(log), "--references", str(refs), "--metrics", "bleu",
                              "--format", "json"])  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["BLEU-1"] == pytest.approx(1.0)


def test_an_lmms_eval_chair_log_is_named_with_what_finecap_scores_instead(tmp_path):
    # lmms-eval's coco_cap_chair (EvolvingLMMs-Lab/lmms-eval 0124da0c, lmms_eval/tasks/coco_cap_chair/utils.py,
    # coco_cap_chair_process_result): per document {"answer": doc["gt_object"], "pred": node_words, "image_id"} under
    # coco_cap_chair_s, coco_cap_chair_i and coco_cap_recall, `pred` the COCO categories the caption names; the log
    # was refused as "the caption must be text, got list", saying neither what the file is nor what to do (and one
    # whose image has no annotated object as "'target' must hold reference captions", its empty `answer`)
    caption = "A man walks his dog past a bench."
    entry = {"answer": ["person", "dog", "car"], "pred": ["person", "dog", "bench"], "image_id": 139}
    line = {"doc_id": 0, "target": str(entry["answer"]), "filtered_resps": caption, "token_counts": [None],
            **{f"coco_cap_{m}": entry for m in ("chair_s", "chair_i", "recall")},
            "input": "Please describe this image in detail."}  # fmt: skip
    log = write_lines(tmp_path / "20250101_samples_coco_cap_chair.jsonl", [line])
    for answer in (["person", "dog", "car"], []):
        entry["answer"] = answer
        write_lines(log, [line])
        with pytest.raises(DataError) as caught:
            read_predictions(log)
        error = str(caught.value)
        assert error.startswith(f"{log}, line 1: the entry 'coco_cap_chair_s' is a CHAIR task's (lmms-eval's "
                                "coco_cap_chair): its 'pred' is the list of COCO object categories the caption names "
                                "(['person', 'dog', 'bench'])")  # fmt: skip
        assert "write each line's caption ('filtered_resps') under the entry's 'image_id' as COCO results" in error
        assert "--instances instances_<split>.json --metrics hallucination" in error
    # another task's entry whose `pred` is no text: said as such, with what it holds
    write_lines(log, [{"doc_id": 0, "target": "a", "filtered_resps": "a", "vqa": {"pred": {"a": 1}, "answer": "a"}}])
    with pytest.raises(DataError) as caught:
        read_predictions(log)
    assert str(caught.value) == (f"{log}, line 1: the caption must be text, got dict (the entry 'vqa' holds as 'pred' "
                                 "{'a': 1}): not the log of a caption task")  # fmt: skip


def test_a_swift_line_without_labels_is_refused_not_scored_against_its_own_response(tmp_path):
    # ms-swift appends the response to `messages` (modelscope/ms-swift ccf47658, March 2025, to 3602360a): a data set
    # without answer turns gave `labels: null`, and the reference was taken from the last assistant turn of
    # `messages`, the response itself: BLEU-1 1.0 for any caption
    lines = [swift_infer_line("a dog on grass", "a dog on the grass"), swift_infer_line("a red car", None)]
    path = write_lines(tmp_path / "infer_result.jsonl", lines)
    with pytest.raises(DataError, match=r"infer_result.jsonl, line 2: 'labels' is null: no reference caption"):
        read_predictions(path)
    interactive = {"response": "a red car", "messages": [{"role": "user", "content": "<image>Describe."},
                                                         {"role": "assistant", "content": "a red car"}]}  # fmt: skip
    write_lines(path, [interactive])  # `swift infer` without a data set: no labels at all
    with pytest.raises(DataError, match=r"line 1: 'labels' is missing: no reference caption"):
        read_predictions(path)
    path2 = write_lines(tmp_path / "infer2.jsonl", [swift2_infer_line("a red car", None)])  # ms-swift 2
    with pytest.raises(DataError, match=r"line 1: 'label' is null"):
        read_predictions(path2)
    write_lines(path2, [swift2_infer_line("a red car", "a red car parked"), swift2_infer_line("a dog", "a dog")])
    assert read_predictions(path2) == ("swift", Predictions({0: ["a red car"], 1: ["a dog"]},
                                                            {0: ["a red car parked"], 1: ["a dog"]}))  # fmt: skip


@pytest.mark.parametrize("target", ["", "[]", "None"])
def test_an_lmms_eval_test_split_log_carries_no_references(tmp_path, target):
    # lmms-eval's test splits log only {"pred", "image_id"} (EvolvingLMMs-Lab/lmms-eval 75571cfe: coco_cap/utils.py
    # coco_test_process_result, nocaps/utils.py nocaps_test_process_result, flickr30k/utils.py
    # flickr_test_process_result, whose `pred` is the list of responses); `target` is str() of the test document's
    # answer field (loggers/evaluation_tracker.py, save_results_samples). It was read as the references: a log with
    # target "" or "None" was scored without --references against "" or "None", silently; one with "[]" was refused
    # even with --references ("must hold reference captions")
    images = [(391895, "a man rides a bike"), (522418, "a woman cuts a cake")]
    rows = [{"doc_id": k, "target": target, "filtered_resps": pred, "token_counts": [None], "doc_hash": "ab" * 32,
             "coco_passthrough": {"pred": [pred], "image_id": i}, "input": "Provide a one-sentence caption."}
            for k, (i, pred) in enumerate(images)]  # fmt: skip
    log = write_lines(tmp_path / "20260101_120000_samples_coco2017_cap_test.jsonl", rows)
    name, read = read_predictions(log)
    assert name == "lmms-eval" and read == Predictions(
        {391895: ["a man rides a bike"], 522418: ["a woman cuts a cake"]}
    )
    code, _, err = run_cli(["eval", "--predictions", str(log), "--metrics", "bleu", "--format", "json"])
    assert code != 0 and "--references: required" in err
    # a val line (a metric entry with references) among them: not one task's log
    val = {"doc_id": 2, "target": "['a dog']", "coco_Bleu_4": {"pred": "a dog", "answer": ["a dog"], "image_id": 1}}
    write_lines(log, [*rows, val])
    with pytest.raises(DataError, match=r"line 3: a line with references among lines without them"):
        read_predictions(log)


def test_json_lines_of_no_known_tool_are_named_as_such_not_as_invalid_json(tmp_path):
    # LLaVA's answers file (one {"question_id", "text", ...} a line) is valid JSON Lines of no format finecap reads:
    # the error said "invalid JSON at line 2, column 1: Extra data", as if the file were broken
    path = write_lines(tmp_path / "answers.jsonl", [{"question_id": k, "prompt": "Describe.", "text": "a dog",
                                                     "answer_id": "x", "model_id": "llava", "metadata": {}}
                                                    for k in range(2)])  # fmt: skip
    error = str(read_error(path))
    assert "invalid JSON" not in error
    assert error == (f"{path}: JSON Lines whose line 1 has the keys 'question_id', 'prompt', 'text', 'answer_id', "
                     "'model_id', ...: not a predictions file finecap recognises (lmms-eval, llamafactory, swift, "
                     "vlmevalkit, coco); name its format with --predictions-format")  # fmt: skip


def test_a_carried_empty_reference_is_refused_as_in_finecaps_own_references(tmp_path):
    # LLaMA-Factory's do_predict on a data set without answers decodes all-ignored labels to "" (hiyouga/LLaMA-Factory
    # ff6d4d12, src/llamafactory/train/sft/trainer.py save_predictions: {"prompt", "predict", "label"},
    # ensure_ascii=False): each caption was scored against an empty reference, exit 0; finecap's own references
    # refuse an empty caption (records.clean_captions)
    rows = [{"prompt": "user\n<image>Describe.\nassistant\n", "predict": "a dog on grass", "label": "a dog on grass"},
            {"prompt": "user\n<image>Describe.\nassistant\n", "predict": "a red car", "label": ""}]  # fmt: skip
    path = write_lines(tmp_path / "generated_predictions.jsonl", rows)
    with pytest.raises(DataError, match=r"generated_predictions.jsonl, line 2: 'label': caption 0 is empty"):
        read_predictions(path)
    code, _, err = run_cli(["eval", "--predictions", str(path), "--metrics", "bleu", "--format", "json"])
    assert code != 0 and "caption 0 is empty" in err
    rows[1]["label"] = "a red car\nparked "  # a line break in a reference: a space, as in finecap's references
    write_lines(path, rows)
    assert read_predictions(path)[1].references == {0: ["a dog on grass"], 1: ["a red car parked"]}


def test_reference_errors_name_a_json_lines_files_lines_and_a_tables_rows(tmp_path):
    # a JSON Lines file's references were named by "row N" (LLaMA-Factory's, ms-swift's, lmms-eval's; N the line
    # number), as a table's are, and an old lmms-eval <task>.json's and a VLMEvalKit .json's by a "row" number that is
    # no place in the file (its logs[k] / [k], k from 0; the .json's "row 2" was its first element, [0])
    lines = [{"prompt": "", "predict": "a dog", "label": "a dog"}, {"prompt": "", "predict": "a cat", "label": ""}]
    lf = write_lines(tmp_path / "generated_predictions.jsonl", lines)
    with pytest.raises(DataError) as caught:
        read_predictions(lf)
    assert str(caught.value) == f"{lf}, line 2: 'label': caption 0 is empty"
    bare = [{"doc_id": 0, "target": str(["a dog"]), "filtered_resps": "a dog"},
            {"doc_id": 1, "target": "['a cat", "filtered_resps": "a cat"},
            {"doc_id": 2, "target": 5, "filtered_resps": "a car"}]  # fmt: skip
    log = write_lines(tmp_path / "bare.jsonl", bare[:2])
    warning = read_predictions(log)[1].warnings[0]
    assert warning.startswith(f"{log}: 'target': 1 value(s) look like a stringified list") and "(lines 2: " in warning
    write_lines(log, bare)
    with pytest.raises(DataError) as caught:
        read_predictions(log)
    assert str(caught.value) == f"{log}, line 3: 'target' must be text, got 5"
    old = tmp_path / "coco2017_cap_val.json"
    old.write_text(json.dumps({"args": {}, "model_configs": {}, "logs": bare[:2]}, indent=4))
    assert "(logs[1]: e.g." in read_predictions(old)[1].warnings[0]
    old.write_text(json.dumps({"args": {}, "model_configs": {}, "logs": bare}, indent=4))
    with pytest.raises(DataError) as caught:
        read_predictions(old)
    assert str(caught.value) == f"{old}: logs[2]: 'target' must be text, got 5"
    rows = [{"index": 0, "answer": "a dog", "prediction": "a dog"}, {"index": 1, "answer": "", "prediction": "x"}]
    vlm = tmp_path / "m_COCO_VAL.json"
    vlm.write_text(json.dumps(rows, indent=4))
    with pytest.raises(DataError) as caught:
        read_predictions(vlm)
    assert str(caught.value) == f"{vlm}: [1]: 'answer': caption 0 is empty"
    tsv = tmp_path / "m_COCO_VAL.tsv"  # a table's rows keep their numbers, the header row 1
    with open(tsv, "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([list(rows[0]), *[list(r.values()) for r in rows]])
    with pytest.raises(DataError) as caught:
        read_predictions(tsv)
    assert str(caught.value) == f"{tsv}: row 3: column 'answer': caption 0 is empty"


def test_a_vlmevalkit_index_listed_again_with_other_references_is_refused(tmp_path):
    # as lmms-eval's (test above): the first caption of index 1 was scored against the last row's references, silently
    # (VLMEvalKit's tsv: pandas to_csv(sep='\t', quoting=csv.QUOTE_ALL), open-compass/VLMEvalKit e8e78f05
    # vlmeval/smp/file.py dump_tsv)
    path = tmp_path / "m_COCO_VAL.tsv"
    rows = [["index", "question", "answer", "prediction"], [1, "Describe.", str(["a dog on grass"]), "a dog on grass"],
            [1, "Describe.", str(["a dog on grass"]), "a dog"]]  # fmt: skip
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter="\t", quoting=csv.QUOTE_ALL).writerows(rows)
    assert read_predictions(path)[1].captions == {1: ["a dog on grass", "a dog"]}  # the same references: samples
    rows[2][2] = str(["a red car"])
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter="\t", quoting=csv.QUOTE_ALL).writerows(rows)
    with pytest.raises(DataError, match=r"m_COCO_VAL.tsv: row 3: image id 1 is listed again with other references"):
        read_predictions(path)


def test_a_vlmevalkit_index_is_read_as_an_id_by_the_one_rule(tmp_path):
    # a .tsv's index "1" is image 1, but str.isdigit() also took "01" as 1 (two images merged into one's samples,
    # where records.id_key keeps "01" its own id), "²" to int() (a bare ValueError naming no file) and a 30-digit
    # index to an integer beyond MAX_INT_ID; records.id_from_key reads them as JSON keys are read
    path = tmp_path / "m_COCO_VAL.tsv"
    long = "1" * 30
    rows = [["index", "question", "answer", "prediction"], ["1", "Describe.", str(["a dog"]), "a dog"],
            ["01", "Describe.", str(["a cat"]), "a cat"], ["²", "Describe.", str(["a cow"]), "a cow"],
            [long, "Describe.", str(["a hen"]), "a hen"], ["-3", "Describe.", str(["a pig"]), "a pig"]]  # fmt: skip
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter="\t", quoting=csv.QUOTE_ALL).writerows(rows)
    read = read_predictions(path)[1]
    assert read.captions == {1: ["a dog"], "01": ["a cat"], "²": ["a cow"], long: ["a hen"], -3: ["a pig"]}
    assert [type(i) for i in read.captions] == [int, str, str, str, int]


def test_a_vlmevalkit_xlsx_as_pandas_writes_it_scores_as_its_tsv(tmp_path, capsys, captions):
    # VLMEvalKit's default result file, <model>_<dataset>.xlsx (open-compass/VLMEvalKit 00fff545 vlmeval/smp/file.py
    # dump_xlsx: DataFrame.to_excel(index=False) of the result table through pd.ExcelWriter, engine xlsxwriter; here
    # pandas' default engine, openpyxl, as xlsxwriter is not installed: the same sheet of cells, the header row first).
    # The columns as its tsv (dump_tsv, tests above): index, question, answer (str() of the list), prediction
    import pandas as pd

    ids, preds, refs = captions
    table = pd.DataFrame({"index": range(len(preds)), "question": "Please describe this image in general.",
                          "answer": [str(r) for r in refs], "prediction": preds})  # fmt: skip
    xlsx = tmp_path / "Qwen2-VL-2B_COCO_VAL.xlsx"
    table.to_excel(xlsx, index=False)
    tsv = tmp_path / "Qwen2-VL-2B_COCO_VAL.tsv"
    table.to_csv(tsv, sep="\t", index=False, quoting=csv.QUOTE_ALL)
    name, read = read_predictions(xlsx)
    assert name == "vlmevalkit" and read == read_predictions(tsv)[1]
    assert read.captions == {k: [p] for k, p in enumerate(preds)} and read.references == dict(enumerate(refs))
    assert score(capsys, "--predictions", str(xlsx)) == pycocoevalcap_scores(preds, refs)
    # cells as a sheet holds them: unicode kept, a number-like caption read as its text, an index read as an int;
    # rows named by the sheet's row numbers (the header is row 1): a cut-off answer on row 3, an index again on row 4
    few = pd.DataFrame({"index": [7, 8, 7], "answer": [str(["un café au lait"]), "['a dog", str(["a red car"])],
                        "prediction": ["un café", "42", "a car"]})  # fmt: skip
    few.to_excel(xlsx, index=False)
    with pytest.raises(DataError, match=r"COCO_VAL.xlsx: row 4: image id 7 is listed again with other references"):
        read_predictions(xlsx)
    few.iloc[:2].to_excel(xlsx, index=False)
    _, read = read_predictions(xlsx)
    assert read.captions == {7: ["un café"], 8: ["42"]} and read.references == {7: ["un café au lait"], 8: ["['a dog"]}
    assert len(read.warnings) == 1 and "column 'answer': 1 value(s) look like a stringified list" in read.warnings[0]
    assert "(rows 3: e.g." in read.warnings[0]


def test_a_vlmevalkit_xlsx_is_bounded_by_its_size_and_by_what_it_unzips_to_before_openpyxl_opens_it(
    tmp_path, capsys, monkeypatch
):
    import openpyxl
    import pandas as pd

    xlsx = tmp_path / "m_COCO_VAL.xlsx"
    pd.DataFrame({"index": [1], "answer": [str(["a dog"])], "prediction": ["a dog"]}).to_excel(xlsx, index=False)
    with zipfile.ZipFile(xlsx, "a", zipfile.ZIP_DEFLATED) as z:  # a zip bomb's way: 8 MiB of zeros zip to ~8 KB
        z.writestr("xl/media/padding.bin", bytes(8 * 2**20))
    size = xlsx.stat().st_size
    with zipfile.ZipFile(xlsx) as z:
        unzipped = sum(m.file_size for m in z.infolist())
    assert size < 2**20 < 8 * 2**20 < unzipped
    assert read_predictions(xlsx)[1].captions == {1: ["a dog"]}  # within the default bound (2 GiB): read

    def opened(*args, **kwargs):
        raise AssertionError("openpyxl opened a workbook over the bound")

    monkeypatch.setattr(openpyxl, "load_workbook", opened)  # refused before openpyxl sees it
    monkeypatch.setenv("FINECAP_MAX_DATA_BYTES", str(2**20))  # over the file's size, under what it unzips to
    unzips = rf"m_COCO_VAL.xlsx \(unzipped: the sum of its zip members' sizes\): too large \({unzipped:,} bytes"
    with pytest.raises(FileTooLarge, match=unzips + r".*set FINECAP_MAX_DATA_BYTES=BYTES to read a larger one"):
        read_predictions(xlsx)
    capsys.readouterr()
    assert cli(["eval", "--predictions", str(xlsx), *METRICS]) == 2
    assert "m_COCO_VAL.xlsx (unzipped: the sum of its zip members' sizes): too large" in capsys.readouterr().err
    monkeypatch.setenv("FINECAP_MAX_DATA_BYTES", str(size - 1))  # under the file's own size, as a .tsv's
    with pytest.raises(FileTooLarge, match=rf"m_COCO_VAL.xlsx: too large \({size:,} bytes"):
        read_predictions(xlsx)


@pytest.mark.parametrize(
    ("column", "cell"), [("prediction", "= a cat on a mat"), ("answer", "=B2"), ("index", "=1+1")]
)
def test_a_formula_cell_in_a_vlmevalkit_xlsx_is_refused_naming_its_row_not_read_as_empty(tmp_path, column, cell):
    import openpyxl
    import pandas as pd

    xlsx = tmp_path / "m_COCO_VAL.xlsx"
    table = pd.DataFrame(
        {"index": [1, 2], "answer": [str(["a dog"]), str(["a cat"])], "prediction": ["a dog", "a cat"]}, dtype=object
    )
    table.loc[1, column] = cell  # pandas (openpyxl engine; xlsxwriter too) saves a text starting with "=" as a formula
    table.to_excel(xlsx, index=False)
    book = openpyxl.load_workbook(xlsx, data_only=True)  # how it was read: the formula's result, none saved
    assert [c.value for c in book.active[3]][list(table).index(column)] is None
    with pytest.raises(
        DataError, match=rf"m_COCO_VAL.xlsx: row 3: the {column} cell holds a formula \('{re.escape(cell)}'\)"
    ):
        read_predictions(xlsx)
    book = openpyxl.Workbook()  # a text cell starting with "=" is text: read as it is
    book.active.append(["index", "answer", "prediction"])
    book.active.append([1, str(["a dog"]), None])
    book.active["C2"].value, book.active["C2"].data_type = "= a dog", "s"
    book.save(xlsx)
    assert read_predictions(xlsx)[1].captions == {1: ["= a dog"]}


@pytest.mark.parametrize("tool", ["llamafactory", "swift"])
def test_line_numbered_predictions_pair_with_references_only_in_their_order(tmp_path, tool):
    # LLaMA-Factory's and ms-swift's ids are line numbers; with --references they were matched to the images whose ids
    # are those numbers (a data set with ids 0, 1, 2: Flickr30k Karpathy's imgid), whatever order the lines were in
    # (ms-swift shuffles a --dataset's validation split; LLaMA-Factory's val_size too): silently wrong pairs
    images = [(0, "a red car parked"), (1, "a dog on the grass"), (2, "a man rides a bike")]
    refs = write_lines(tmp_path / "refs.jsonl", [{"id": i, "image": f"{i}.jpg", "captions": [c]} for i, c in images])
    for i, _ in images:
        (tmp_path / f"{i}.jpg").write_bytes(b"")

    def lines(order):
        if tool == "llamafactory":  # the label as the tokenizer decodes it: spacing may differ from the data set's
            return [{"prompt": "", "predict": images[i][1], "label": images[i][1].replace(" ", "  ")} for i in order]
        return [swift_infer_line(images[i][1], images[i][1].upper()) for i in order]

    def run(order):
        path = write_lines(tmp_path / f"{tool}.jsonl", lines(order))
        fmt = ["--predictions-format", tool]
        return run_cli(["eval", "--predictions", str(path), "--references", str(refs), "--metrics", "bleu", *fmt,
                        "--format", "json"])  # fmt: skip

    code, out, err = run([0, 1, 2])  # in the references' order: scored against them
    assert code == 0, err
    assert json.loads(out)["BLEU-1"] == pytest.approx(1.0)
    code, out, err = run([1, 0, 2])  # shuffled: line 0 is image 1's caption, not image 0's
    assert code != 0 and out == ""
    assert "2 of 3 records' references are not among their image's, e.g. id 0" in err
    assert "leave out --references to score against the references the file carries" in err


def test_stringified_references_with_unicode_and_both_quotes_parse_as_written(tmp_path):
    # str() of a list (lmms-eval's `target`, VLMEvalKit's `answer`) quotes each item as Python's repr does: '...' or,
    # holding a ', "..."; non-printable characters escaped (\u2028), others kept (ensure_ascii=False files)
    refs = ["un café au lait", "l'été à Paris", 'a "quoted" dog', "a cat\u2028on a mat", "日本の猫"]
    log = write_lines(tmp_path / "bare.jsonl", [{"doc_id": 0, "target": str(refs), "filtered_resps": "un café"}])
    assert "\\u2028" in log.read_text(encoding="utf-8") and "日本の猫" in log.read_text(encoding="utf-8")
    name, read = read_predictions(log)
    assert name == "lmms-eval" and read.warnings == []
    assert read.references == {0: ["un café au lait", "l'été à Paris", 'a "quoted" dog', "a cat on a mat", "日本の猫"]}


def test_a_file_two_formats_recognise_is_refused_not_read_as_the_first(tmp_path):
    # a line with LLaMA-Factory's fields and ms-swift's (a file merged by hand): read as LLaMA-Factory's, silently,
    # its `label` the reference and not `labels`
    line = {"prompt": "", "predict": "a dog", "label": "a dog on grass", "response": "a cat", "labels": "a cat"}
    path = write_lines(tmp_path / "merged.jsonl", [line])
    error = str(read_error(path))
    assert error == (f"{path}: its first record reads as llamafactory and as swift predictions; name its format with "
                     "--predictions-format")  # fmt: skip
    assert read_predictions(path, "swift")[1].captions == {0: ["a cat"]}  # named, it is read
