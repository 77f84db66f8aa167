"""Links and names (issue 48): what a data set, a run's name and an option may name.

- A ``folder`` data set's caption files (``captions.jsonl``, ``captions.csv``, each ``.txt``) are read only inside
  the folder, as its images are: a link out (to a file, through a linked folder, by ``..``) is refused, named, before
  it is opened.
- ``run.name`` holding a control character is refused when the configuration is read; every user string in a model
  card is escaped (one line, no HTML, no markdown or YAML structure made of it).
- An integer image id is one every JSON reader holds exactly (``|id| <= 2**53 - 1``, RFC 8259): file names beyond it
  keep their names as ids, and data set, results and bags files holding one are refused, naming the record.
- ``model.attn_implementation=flash_attention_2`` without flash-attn (or a CUDA GPU) is one line naming the option,
  what is installed and the fix, before anything is made.
"""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from finecap.config import ConfigError, from_dict, load
from finecap.data.bags_file import read_bags
from finecap.data.formats.coco import read_coco_captions
from finecap.data.formats.folder import read_folder
from finecap.data.formats.jsonl import read_jsonl
from finecap.data.formats.karpathy import read_karpathy
from finecap.data.records import MAX_INT_ID, DataError, id_from_key
from finecap.data.results import read_results, write_results
from finecap.inference import image_files, image_ids
from finecap.train.model_card import md_code, model_card, one_line
from helpers.cli import refused, run_cli
from helpers.user_folders import snapshot

# --------------------------------------------------------------------------------------------------------------------
# (a) A folder data set's caption files: only inside the folder
# --------------------------------------------------------------------------------------------------------------------

SECRET = "the secret caption of a file outside the data set"


def png(path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 30, 30)).save(path)
    return path


def hostile_folder(tmp_path: Path, variant: str) -> tuple[Path, Path]:
    """A folder data set whose caption file reaches outside it (``variant``); returns (folder, the named file)."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    png(data / "cat.png")
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "captions.jsonl").write_text(json.dumps({"image": "cat.png", "captions": [SECRET]}) + "\n")
    (outside / "captions.csv").write_text(f"image,caption\ncat.png,{SECRET}\n")
    if variant == "txt-link-out":  # an absolute link to a file outside
        os.symlink(outside / "secret.txt", data / "cat.txt")
        return data, data / "cat.txt"
    if variant == "txt-dotdot-link":  # a relative link climbing out with ..
        os.symlink(Path("..") / "outside" / "secret.txt", data / "cat.txt")
        return data, data / "cat.txt"
    if variant == "dir-link-out":  # a linked folder holding an image and its caption file
        png(outside / "more" / "dog.png")
        (outside / "more" / "dog.txt").write_text(SECRET + "\n")
        (data / "cat.txt").write_text("a red square\n")
        os.symlink(outside / "more", data / "more")
        return data, data / "more" / "dog.txt"
    if variant in ("jsonl-link-out", "csv-link-out"):
        name = "captions.jsonl" if variant == "jsonl-link-out" else "captions.csv"
        os.symlink(outside / name, data / name)
        return data, data / name
    if variant == "csv-dotdot-link":
        os.symlink(Path("..") / "outside" / "captions.csv", data / "captions.csv")
        return data, data / "captions.csv"
    raise AssertionError(variant)


SIDECAR_VARIANTS = ["txt-link-out", "txt-dotdot-link", "dir-link-out", "jsonl-link-out", "csv-link-out",
                    "csv-dotdot-link"]  # fmt: skip


@pytest.mark.parametrize("variant", SIDECAR_VARIANTS)
def test_a_caption_file_linked_out_of_the_folder_is_refused_before_it_is_read(tmp_path, variant):
    data, named = hostile_folder(tmp_path, variant)
    with pytest.raises(DataError) as e:
        read_folder(data)
    message = str(e.value)
    assert "caption file" in message and named.name in message and "outside the data set's image folder" in message
    assert "data.allow_outside_paths" in message and SECRET not in message and "\n" not in message
    # the check is what stops it: allowed, the same file is read
    records = read_folder(data, allow_outside=True)
    assert SECRET in [c for r in records for c in r.captions]


@pytest.mark.parametrize("variant", SIDECAR_VARIANTS)
def test_eval_refuses_a_folder_whose_caption_file_links_out(tmp_path, variant):
    data, named = hostile_folder(tmp_path, variant)
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"image_id": "cat.png", "caption": "a red square"}]))
    before = snapshot(tmp_path)
    line = refused(["eval", "--predictions", str(preds), "--references", str(data), "--metrics", "bleu"],
                   named.name, "outside")  # fmt: skip
    assert SECRET not in line and snapshot(tmp_path) == before


def test_caption_files_linked_inside_the_folder_are_read(tmp_path):
    data = tmp_path / "data"
    png(data / "cat.png")
    png(data / "dog.png")
    (data / "shared").mkdir()
    (data / "shared" / "red.txt").write_text("a red square\n")
    os.symlink(Path("shared") / "red.txt", data / "cat.txt")  # a link that stays inside
    os.symlink(data / "shared" / "red.txt", data / "dog.txt")
    assert {r.image_id: r.captions for r in read_folder(data)} == {"cat.png": ["a red square"],
                                                                   "dog.png": ["a red square"]}  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# (b) run.name: no control character, and escaped in the model card
# --------------------------------------------------------------------------------------------------------------------

CONTROL_NAMES = {"newline": "a\nb", "carriage-return": "run\r# injected", "tab": "a\tb", "nul": "a\x00b",
                 "line-separator": "a\u2028b", "newline-then-yaml": "x\n---\nlicense: evil",
                 "newline-then-html": "x\n<script>alert(1)</script>"}  # fmt: skip


@pytest.mark.parametrize("name", list(CONTROL_NAMES))
def test_a_run_name_with_a_control_character_is_refused_when_read(tmp_path, name):
    value = CONTROL_NAMES[name]
    line = refused(["config", f"run.name={value}"], "run.name", "control character")
    assert value not in line  # shown escaped, on its one line
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"run": {"name": value}}))
    refused(["config", str(recipe)], str(recipe), "run.name", "control character")
    with pytest.raises(ConfigError, match="run.name"):
        load(None, [f"run.name={value}"])


HOSTILE_NAMES = {"html": "<script>alert(1)</script>", "img": '<img src=x onerror="alert(1)">',
                 "yaml-colon": "key: value", "yaml-document": "---", "yaml-flow": "[a, {b: c}] # comment",
                 "markdown": "# [click](javascript:alert(1)) *bold* _it_ `code` ![i](x) | cell ~~s~~ \\",
                 "entities": "&amp; &lt;b&gt;"}  # fmt: skip
FRONT_KEYS = {"pipeline_tag", "tags"}  # card_of's ClipCap: no library loads its folder alone, so no library_name


def card_of(name: str, data_path: str = "data/set.jsonl", command: str = "finecap train") -> str:
    cfg = from_dict({"run": {"name": name}, "data": {"format": "jsonl", "path": data_path}})  # values as they are
    meta = {"kind": "clipcap", "lm_source": "gpt2`</code><script>x</script>", "encoder_source": "world"}
    info = {"step": 3, "total_steps": 5, "metric": "cider", "values": {"cider": 0.5, "<b>x|y</b>": 1.0}}
    return model_card(cfg, info, meta, {"data": {"id": "a`b", "sha256": "0" * 64}}, command)


def front_matter(card: str) -> dict:
    lines = card.split("\n")
    assert lines[0] == "---"
    end = lines.index("---", 1)
    return yaml.safe_load("\n".join(lines[1:end]))


@pytest.mark.parametrize("name", list(HOSTILE_NAMES))
def test_a_hostile_run_name_is_escaped_in_the_model_card(name):
    markdown_it = pytest.importorskip("markdown_it")
    value = HOSTILE_NAMES[name]
    card = card_of(value, data_path="data/x\n---\n<script>.jsonl", command="finecap train run.name=```\n<script>")
    front = front_matter(card)
    assert set(front) == FRONT_KEYS and front["tags"] == ["finecap", "image-captioning", "clipcap", "mle"]
    title = [line for line in card.split("\n") if line.startswith("# ")]
    assert len(title) == 1
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(card.split("\n---\n", 1)[1])
    tags = set(re.findall(r"<\s*([a-zA-Z0-9]+)", rendered))
    assert tags <= {"h1", "h2", "p", "ul", "li", "strong", "code", "pre", "table", "thead", "tbody", "tr", "th", "td"}
    h1 = re.findall(r"<h1>(.*?)</h1>", rendered, re.S)
    # the title names the objective and the (here hostile) base model, literally, on one line (issue 49, item 2)
    assert [html.unescape(h) for h in h1] == ["MLE captioner on gpt2`</code><script>x</script>"]
    code = [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", rendered, re.S)]
    assert one_line(value) in code  # the run's name: literally, in one code span on its Run line
    assert "data/x\\n---\\n<script>.jsonl" in code  # a path: literally, in one code span
    assert "gpt2`</code><script>x</script>" in code
    assert any("run.name=```\\n<script>" in c for c in code)  # the command line: in its own block


@pytest.mark.parametrize("text", ["plain", "a`b", "``", "`edge`", "x\ny", "<b>"])
def test_a_code_span_holds_any_string(text):
    span = md_code(text)
    assert "\n" not in span
    fence = re.match(r"`+", span).group()
    assert span.endswith(fence) and fence not in span[len(fence) : -len(fence)]


# --------------------------------------------------------------------------------------------------------------------
# (c) Integer image ids: only those every JSON reader holds exactly
# --------------------------------------------------------------------------------------------------------------------

STEMS = {  # file stem -> the id it gives alone in its folder
    "coco-2017": ("000000391895", 391895),
    "coco-2014": ("COCO_val2014_000000000042", 42),
    "largest": (str(MAX_INT_ID), MAX_INT_ID),
    "one-past": (str(MAX_INT_ID + 1), None),
    "19-digits": ("1234567890123456789", None),
    "20-digits": ("12345678901234567890", None),
    "29-digits": ("12345678901234567890123456789", None),
    "leading-zeros-29": ("0" * 27 + "42", 42),
    "negative": ("-5", None),
    "zeros-past-the-limit": ("0" * 80 + "7", None),
}


@pytest.mark.parametrize("case", list(STEMS))
def test_file_name_ids_are_integers_only_within_the_json_safe_range(tmp_path, case):
    stem, expected = STEMS[case]
    png(tmp_path / "images" / f"{stem}.png")
    png(tmp_path / "images" / "000000000001.png")  # a COCO-named neighbour: ids are all numbers or all names
    ids = [f.image_id for f in image_files([tmp_path / "images"])]
    if expected is None:
        assert ids == ["000000000001.png", f"{stem}.png"] or ids == [f"{stem}.png", "000000000001.png"]
    else:
        assert sorted(ids) == sorted([1, expected])
    results = tmp_path / "results.json"
    write_results(results, {i: "a caption" for i in ids})
    assert list(read_results(results)) == ids  # written and read back as they were
    assert all(abs(v) <= MAX_INT_ID for v in ids if isinstance(v, int))


BIG = {"19-digits": 1234567890123456789, "20-digits": 12345678901234567890, "29-digits": 10**28 + 7,
       "one-past": MAX_INT_ID + 1, "negative-past": -(MAX_INT_ID + 1)}  # fmt: skip


@pytest.mark.parametrize("case", list(BIG))
def test_every_reader_and_writer_of_ids_refuses_an_integer_beyond_the_range(tmp_path, case):
    big = BIG[case]
    png(tmp_path / "1.png")
    readers = {
        "jsonl": (lambda p: read_jsonl(p, check_images=False),
                  json.dumps({"id": big, "image": "1.png", "captions": ["a"]}) + "\n"),
        "coco-images": (lambda p: read_coco_captions(p, check_images=False),
                        json.dumps({"images": [{"id": big, "file_name": "1.png"}],
                                    "annotations": [{"image_id": big, "caption": "a"}]})),
        "coco-annotations": (lambda p: read_coco_captions(p, check_images=False),
                             json.dumps({"annotations": [{"image_id": big, "caption": "a"}]})),
        "karpathy": (lambda p: read_karpathy(p, check_images=False),
                     json.dumps({"images": [{"filename": "1.png", "split": "test", "cocoid": big,
                                             "sentences": [{"raw": "a"}]}]})),
        "results": (read_results, json.dumps([{"image_id": big, "caption": "a"}])),
        "bags": (read_bags, json.dumps({"bags": {"2": [{"images": [1, big]}]}})),
    }  # fmt: skip
    for what, (read, text) in readers.items():
        path = tmp_path / f"{what}.json"
        path.write_text(text)
        with pytest.raises(DataError) as e:
            read(path)
        message = str(e.value)
        assert str(path) in message and "2**53" in message and "as a string" in message and "\n" not in message, what
    with pytest.raises(DataError, match="2\\*\\*53"):
        write_results(tmp_path / "out.json", {big: "a caption"})
    assert not (tmp_path / "out.json").exists()
    # the same id written as a string is read as one
    (tmp_path / "s.jsonl").write_text(json.dumps({"id": str(big), "image": "1.png", "captions": ["a"]}) + "\n")
    assert [r.image_id for r in read_jsonl(tmp_path / "s.jsonl", check_images=False)] == [str(big)]


def test_eval_refuses_a_results_file_with_an_id_beyond_the_range(tmp_path):
    refs = tmp_path / "refs.jsonl"
    png(tmp_path / "1.png")
    refs.write_text(json.dumps({"id": "1", "image": "1.png", "captions": ["a red circle"]}) + "\n")
    preds = tmp_path / "preds.json"
    preds.write_text('[{"image_id": 12345678901234567890123456789, "caption": "a red circle"}]')
    refused(["eval", "--predictions", str(preds), "--references", str(refs), "--metrics", "bleu"], str(preds),
            "2**53")  # fmt: skip


KEYS = [
    ("42", 42),
    ("-7", -7),
    ("0", 0),
    ("0042", "0042"),
    ("+4", "+4"),
    (str(MAX_INT_ID), MAX_INT_ID),
    (str(MAX_INT_ID + 1), str(MAX_INT_ID + 1)),
    ("1" * 29, "1" * 29),
    ("cat.png", "cat.png"),
    ("4 2", "4 2"),
]


@pytest.mark.parametrize(("key", "expected"), KEYS)
def test_an_id_written_as_a_json_key_reads_back_as_it_was(key, expected):
    assert id_from_key(key) == expected and type(id_from_key(key)) is type(expected)


def test_image_ids_of_names_keep_the_rule_for_small_numbers():
    assert image_ids([("7.png", Path("7.png")), ("007.png", Path("x/007.png"))]) == ["7.png", "007.png"]  # equal


# --------------------------------------------------------------------------------------------------------------------
# (d) flash_attention_2 without flash-attn
# --------------------------------------------------------------------------------------------------------------------


def test_flash_attention_without_flash_attn_is_one_line_before_anything_is_made(tmp_path):
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        pytest.skip("flash-attn and a CUDA GPU are here")
    run = tmp_path / "run"
    line = refused(["train", "model.attn_implementation=flash_attention_2", f"run.dir={run}",
                    f"world.out={tmp_path / 'world'}"], "model.attn_implementation=flash_attention_2",
                   "pip install flash-attn", "auto, sdpa, eager")  # fmt: skip
    assert "flash-attn is not installed" in line or "is installed" in line
    assert not run.exists() and not (tmp_path / "world").exists()  # refused before anything was made


@pytest.mark.parametrize("installed", [None, "2.6.3"])
def test_flash_attention_is_checked_when_a_model_is_built_and_says_what_is_installed(monkeypatch, installed):
    import importlib.metadata

    from finecap.models import memory

    if installed is not None:
        monkeypatch.setattr(importlib.metadata, "version", lambda name: installed)
    monkeypatch.setattr("transformers.utils.is_flash_attn_2_available", lambda: False)
    with pytest.raises(ValueError) as e:
        memory.LoadOptions(attn_implementation="flash_attention_2")
    message = str(e.value)
    assert "model.attn_implementation=flash_attention_2" in message and "\n" not in message
    assert ("flash-attn is not installed" if installed is None else "flash-attn 2.6.3 is installed") in message
    for other in ("auto", "sdpa", "eager"):
        memory.LoadOptions(attn_implementation=other)  # the others are never refused


def test_reading_a_configuration_never_needs_flash_attn():
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        pytest.skip("flash-attn and a CUDA GPU are here")
    code, _, err = run_cli(["config", "model.attn_implementation=flash_attention_2"])
    assert code == 0, err  # reading a configuration (a stored one, on another machine) never needs the kernel
