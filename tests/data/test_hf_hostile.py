"""Hostile Hugging Face data sets (issue 48, class 8: ``data.format=hf``) through the command line.

- Tampered ``save_to_disk`` folders: ``dataset_dict.json`` / ``state.json`` that are not JSON, nested thousands of
  levels, huge, not UTF-8, of the wrong shape or missing their ``_data_files``; split folders and data files named
  by ``..``, absolute paths or links leading out of the folder (to a valid data set, so that reading it would
  succeed); a split named but missing; Arrow files that are not Arrow, truncated, or carry forged feature metadata.
- Parquet / Arrow files: truncated, not parquet, of no rows, one bad file in a folder, a folder mixing both kinds.
- Column options (``data.*_column``) naming a column that is not there: the columns listed, the closest suggested.
- An embedded image that is not an image, in training.

Each ends in one ``finecap: error:`` line naming the file (and the entry, split or option) and exit code 2, never a
traceback; a split of no rows next to others is left out. Reading a data set folder, a parquet or Arrow file or a
folder of them writes nothing outside the finecap home (no ``~/.cache/huggingface``) nor into the working directory
or the data set (checked in a subprocess whose ``HOME``, ``HF_HOME``, ``HF_DATASETS_CACHE`` and ``XDG_CACHE_HOME``
are empty folders, as ``datasets`` reads them when imported).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from finecap.data.hf_files import HF_CACHE, MAX_METADATA_BYTES  # noqa: E402
from finecap.data.records import DataError  # noqa: E402
from helpers.cli import run_cli  # noqa: E402

ROWS = {"image": ["a.png", "b.png"], "captions": [["a red square"], ["a blue circle"]], "cocoid": [1, 2]}
SECRET = {"image": ["s.png", "t.png"], "captions": [["the secret caption"], ["another secret"]], "cocoid": [1, 2]}
EMPTY = {"image": [], "captions": [], "cocoid": []}
FEATURES = datasets.Features({"image": datasets.Value("string"), "cocoid": datasets.Value("int64"),
                              "captions": datasets.Sequence(datasets.Value("string"))})  # fmt: skip
DEEP = "[" * 100_000 + "]" * 100_000


def one_error_line(code: int, err: str) -> str:
    """The one ``finecap: error:`` line of a failed command (progress bars of ``datasets`` may precede it)."""
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("finecap: ")]
    assert len(lines) == 1 and lines[0].startswith("finecap: error: "), err
    assert err.rstrip("\n").endswith(lines[0]), err  # the last thing printed
    return lines[0]


def dataset(rows: dict) -> object:
    return datasets.Dataset.from_dict(rows, features=FEATURES)


def save(folder: Path, rows: dict = ROWS, **more: dict) -> Path:
    """A DatasetDict with split ``test`` (and ``more``) saved to ``folder``."""
    datasets.DatasetDict({"test": dataset(rows), **{k: dataset(v) for k, v in more.items()}}).save_to_disk(str(folder))
    return folder


def edit_json(path: Path, edit: Callable[[dict], object]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


class Ctx:
    """A good saved data set ``saved`` (split ``test``: ids 1, 2) inside ``tmp/data``, and outside it, a valid saved
    data set ``elsewhere`` of secret captions with the same ids: reading it instead would score."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.saved = save(tmp / "data" / "saved")
        self.elsewhere = save(tmp / "elsewhere", SECRET)
        self.state = self.saved / "test" / "state.json"
        self.listing = self.saved / "dataset_dict.json"
        self.arrow = self.saved / "test" / "data-00000-of-00001.arrow"
        self.secret_arrow = self.elsewhere / "test" / "data-00000-of-00001.arrow"

    def parquet(self, rows: dict = ROWS, name: str = "test.parquet") -> Path:
        path = self.tmp / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        dataset(rows).to_parquet(str(path))
        return path


# --------------------------------------------------------------------------------------------------------------------
# The variants: each tampers with a data set and returns (data set path, fragments of the one error line, overrides)
# --------------------------------------------------------------------------------------------------------------------


def set_filename(ctx: Ctx, written: str) -> None:
    edit_json(ctx.state, lambda s: s.update(_data_files=[{"filename": written}]))


def case_state_without_data_files(ctx):
    edit_json(ctx.state, lambda s: s.pop("_data_files"))
    return ctx.saved, [f"{ctx.state}: no '_data_files' list", "split 'test'"], []


def case_state_data_files_not_a_list(ctx):
    edit_json(ctx.state, lambda s: s.update(_data_files={"filename": ctx.arrow.name}))
    return ctx.saved, [f"{ctx.state}: no '_data_files' list"], []


def case_state_filename_dotdot(ctx):
    written = "../../../elsewhere/test/data-00000-of-00001.arrow"
    set_filename(ctx, written)
    return ctx.saved, [f"{ctx.state}: _data_files[0].filename", repr(written), f"resolves to {ctx.secret_arrow}",
                       f"outside the data set folder {ctx.saved}"], []  # fmt: skip


def case_state_filename_absolute(ctx):
    set_filename(ctx, str(ctx.secret_arrow))
    return ctx.saved, [f"{ctx.state}: _data_files[0].filename", repr(str(ctx.secret_arrow)), "absolute path"], []


def case_state_filename_link(ctx):
    ctx.arrow.unlink()
    ctx.arrow.symlink_to(ctx.secret_arrow)  # inside by name, outside once resolved
    return ctx.saved, [f"{ctx.state}: _data_files[0].filename", f"resolves to {ctx.secret_arrow}", "outside"], []


def case_state_filename_not_a_string(ctx):
    edit_json(ctx.state, lambda s: s.update(_data_files=[{"filename": 7}]))
    return ctx.saved, [f"{ctx.state}: _data_files[0].filename", "must be a path relative", "got 7"], []


def case_state_lists_a_file_twice(ctx):
    edit_json(
        ctx.state, lambda s: s.update(_data_files=[{"filename": ctx.arrow.name}, {"filename": f"./{ctx.arrow.name}"}])
    )
    return ctx.saved, [f"{ctx.state}: _data_files[1].filename: names {ctx.arrow} again", "_data_files[0]"], []


def case_dict_lists_a_split_twice(ctx):
    edit_json(ctx.listing, lambda d: d.update(splits=["test", "test/"]))
    return ctx.saved, [f"{ctx.listing}: splits[1]: names {ctx.saved / 'test'} again (as {ctx.listing}: splits[0])"], []


def case_state_names_a_missing_file(ctx):
    set_filename(ctx, "data-00001-of-00002.arrow")
    missing = ctx.saved / "test" / "data-00001-of-00002.arrow"
    return ctx.saved, [f"{missing}: split 'test'", "does not exist", f"named by {ctx.state}"], []


def case_state_missing(ctx):
    ctx.state.unlink()
    return ctx.saved, [f"{ctx.listing}: splits[0]", f"{ctx.state} does not exist"], []


def case_state_not_json(ctx):
    ctx.state.write_text('{"_data_files": [')
    return ctx.saved, [f"{ctx.state}: invalid JSON"], []


def case_state_nested_deeply(ctx):
    ctx.state.write_text(DEEP)
    return ctx.saved, [f"{ctx.state}: ", "nested too deeply"], []


def case_state_huge(ctx):
    with ctx.state.open("r+b") as f:
        f.truncate(MAX_METADATA_BYTES + 1)  # sparse: no disk used
    return ctx.saved, [f"{ctx.state}: {MAX_METADATA_BYTES + 1:,} bytes", "refused unread", "MAX_METADATA_BYTES"], []


def case_dict_split_dotdot(ctx):
    written = "../../elsewhere/test"
    edit_json(ctx.listing, lambda d: d.update(splits=[written]))
    return ctx.saved, [f"{ctx.listing}: splits[0]", repr(written), f"resolves to {ctx.elsewhere / 'test'}",
                       f"outside the data set folder {ctx.saved}"], []  # fmt: skip


def case_dict_split_absolute(ctx):
    written = str(ctx.elsewhere / "test")
    edit_json(ctx.listing, lambda d: d.update(splits=[written]))
    return ctx.saved, [f"{ctx.listing}: splits[0]", repr(written), "absolute path"], []


def case_dict_split_link(ctx):
    import shutil

    shutil.rmtree(ctx.saved / "test")
    (ctx.saved / "test").symlink_to(ctx.elsewhere / "test", target_is_directory=True)
    return ctx.saved, [f"{ctx.listing}: splits[0]", "'test'", f"resolves to {ctx.elsewhere / 'test'}"], []


def case_dict_split_missing(ctx):
    edit_json(ctx.listing, lambda d: d.update(splits=["test", "val"]))
    return ctx.saved, [f"{ctx.listing}: splits[1]", "split 'val' is missing", str(ctx.saved / "val")], []


def case_dict_split_not_a_string(ctx):
    edit_json(ctx.listing, lambda d: d.update(splits=[["test"]]))
    return ctx.saved, [f"{ctx.listing}: splits[0]", "must be a path relative"], []


def case_dict_not_json(ctx):
    ctx.listing.write_text("splits: [test]")
    return ctx.saved, [f"{ctx.listing}: invalid JSON at line 1"], []


def case_dict_nested_deeply(ctx):
    ctx.listing.write_text('{"splits": ' + DEEP + "}")
    return ctx.saved, [f"{ctx.listing}: ", "nested too deeply"], []


def case_dict_huge(ctx):
    with ctx.listing.open("r+b") as f:
        f.truncate(MAX_METADATA_BYTES + 1)
    return ctx.saved, [f"{ctx.listing}: {MAX_METADATA_BYTES + 1:,} bytes", "refused unread"], []


def case_dict_not_utf8(ctx):
    ctx.listing.write_bytes(b'{"splits": ["t\xffst"]}')
    return ctx.saved, [f"{ctx.listing}: not UTF-8 text"], []


def case_dict_a_list(ctx):
    ctx.listing.write_text('["test"]')
    return ctx.saved, [f'{ctx.listing}: expected {{"splits": [split names]}}', "['test']"], []


def case_arrow_not_arrow(ctx):
    ctx.arrow.write_bytes(b"\x89PNG\r\n\x1a\n this is no Arrow file" * 10)
    return ctx.saved, [f"{ctx.arrow}: split 'test': not a readable Arrow file"], []


def case_arrow_truncated(ctx):
    data = ctx.arrow.read_bytes()
    ctx.arrow.write_bytes(data[: len(data) - 40])
    return ctx.saved, [f"{ctx.arrow}: split 'test': not a readable Arrow file", "truncated"], []


def case_arrow_empty_file(ctx):
    ctx.arrow.write_bytes(b"")
    return ctx.saved, [f"{ctx.arrow}: split 'test': not a readable Arrow file"], []


def case_arrow_forged_feature_metadata(ctx):
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.memory_map(str(ctx.arrow))).read_all()
    forged = {"huggingface": json.dumps({"info": {"features": {"image": {"_type": "NoSuchFeature"}}}})}
    table = table.replace_schema_metadata(forged)
    with pa.OSFile(str(ctx.arrow), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return ctx.saved, [f"split 'test' ({ctx.arrow})", "cannot read it as a Hugging Face data set"], []


def case_saved_of_no_rows(ctx):
    import shutil

    shutil.rmtree(ctx.saved)
    save(ctx.saved, EMPTY)  # datasets writes no shard for it
    return ctx.saved, [f"{ctx.saved}: no rows: an empty data set", "split 'test' (no files): 0 rows"], []


def case_saved_no_data_files(ctx):
    edit_json(ctx.state, lambda s: s.update(_data_files=[]))
    return ctx.saved, [f"{ctx.saved}: no rows: an empty data set", "split 'test' (no files): 0 rows"], []


def case_parquet_of_no_rows(ctx):
    path = ctx.parquet(EMPTY)
    return path, [f"{path}: no rows: an empty data set", f"split 'test' ({path}): 0 rows"], []


def case_parquet_truncated(ctx):
    path = ctx.parquet()
    path.write_bytes(path.read_bytes()[:200])
    return path, [f"{path}: split 'test': not a readable parquet file"], []


def case_parquet_not_parquet(ctx):
    path = ctx.tmp / "data" / "test.parquet"
    path.write_text("image,captions\na.png,a red square\n")
    return path, [f"{path}: split 'test': not a readable parquet file"], []


def case_parquet_folder_one_truncated(ctx):
    ctx.parquet(name="folder/train.parquet")
    bad = ctx.parquet(name="folder/test.parquet")
    bad.write_bytes(bad.read_bytes()[:-30])
    return bad.parent, [f"{bad}: split 'test': not a readable parquet file"], []


def case_arrow_file_truncated(ctx):
    path = ctx.tmp / "data" / "test.arrow"
    path.write_bytes(ctx.arrow.read_bytes()[:-40])
    return path, [f"{path}: split 'test': not a readable Arrow file"], []


def case_folder_mixing_parquet_and_arrow(ctx):
    ctx.parquet(name="folder/train.parquet")
    (ctx.tmp / "data" / "folder" / "test.arrow").write_bytes(ctx.arrow.read_bytes())
    folder = ctx.tmp / "data" / "folder"
    return folder, [f"{folder}: holds both .parquet and .arrow data files"], []


def case_image_struct_of_other_types(ctx):
    path = ctx.tmp / "data" / "test.parquet"
    rows = {"image": [{"bytes": 1, "path": "a.png"}, {"bytes": 2, "path": "b.png"}], **{k: ROWS[k] for k in ROWS
            if k != "image"}}  # fmt: skip
    datasets.Dataset.from_dict(rows).to_parquet(str(path))
    return path, [f"{path}: split 'test', row 0: the image column's field 'bytes' must be binary, got int64"], []


def case_caption_column_missing(ctx):
    return (
        ctx.saved,
        ["(split 'test'): no column 'caption' (data.hf.caption_column)", "columns: image, captions, cocoid",
         "(did you mean 'captions'?)"],
        ["data.hf.caption_column=caption"],
    )  # fmt: skip


def case_image_column_missing(ctx):
    path = ctx.parquet()
    return (
        path,
        [f"{path} (split 'test'): no column 'img' (data.hf.image_column)", "(did you mean 'image'?)"],
        ["data.hf.image_column=img"],
    )


def case_id_column_missing(ctx):
    return (
        ctx.saved,
        ["no column 'coco_id' (data.hf.id_column)", "(did you mean 'cocoid'?)"],
        ["data.hf.id_column=coco_id"],
    )


def case_split_column_missing(ctx):
    return (
        ctx.saved,
        ["no column 'part' (data.hf.split_column)", "columns: image, captions, cocoid"],
        ["data.hf.split_column=part"],
    )


CASES: dict[str, Callable] = {n.removeprefix("case_"): f for n, f in globals().items() if n.startswith("case_")}
CONTAINED = ["state_filename_dotdot", "state_filename_absolute", "state_filename_link", "dict_split_dotdot",
             "dict_split_absolute", "dict_split_link"]  # fmt: skip


def eval_argv(ctx: Ctx, data: Path, overrides: list[str]) -> list[str]:
    predictions = ctx.tmp / "predictions.json"
    predictions.write_text(json.dumps([{"image_id": 1, "caption": "the secret caption"},
                                       {"image_id": 2, "caption": "a blue circle"}]))  # fmt: skip
    return ["eval", "--predictions", str(predictions), "--references", str(data), "--metrics", "bleu",
            "data.hf.id_column=cocoid", *overrides]  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_hf_data_set_is_one_named_error(case, tmp_path):
    ctx = Ctx(tmp_path)
    data, expected, overrides = CASES[case](ctx)
    line = one_error_line(*run_cli(eval_argv(ctx, data, overrides))[::2])
    for fragment in expected:
        assert fragment in line, line
    assert len(line) < 2000 and "secret" not in line


@pytest.mark.parametrize("case", CONTAINED)
def test_the_outside_data_set_would_be_read_and_the_fingerprint_refuses_it_too(case, tmp_path):
    from finecap.config import load
    from finecap.train.fingerprint import data_fingerprint

    ctx = Ctx(tmp_path)
    # without tampering the command scores the folder's own captions; the secret ones would score otherwise
    code, out, err = run_cli([*eval_argv(ctx, ctx.saved, []), "--format", "json"])
    assert code == 0 and json.loads(out)["BLEU-1"] < 1.0, err
    data, expected, _ = CASES[case](ctx)
    with pytest.raises(DataError) as e:  # a run's fingerprint reads the same JSON files, as contained
        data_fingerprint(load(None, ["data.format=hf", f"data.path={data}"]))
    assert all(fragment in str(e.value) for fragment in expected), str(e.value)


# --------------------------------------------------------------------------------------------------------------------
# Handled cases: paths inside however written, an empty split next to others
# --------------------------------------------------------------------------------------------------------------------


def scores(ctx: Ctx, data: Path) -> dict:
    code, out, err = run_cli([*eval_argv(ctx, data, []), "--format", "json"])
    assert code == 0, err
    return json.loads(out)


def test_paths_inside_the_folder_are_read_however_written(tmp_path):
    ctx = Ctx(tmp_path)
    expected = scores(ctx, ctx.saved)
    set_filename(ctx, "../test/./data-00000-of-00001.arrow")  # `..` that stays inside
    assert scores(ctx, ctx.saved) == expected
    (ctx.saved / "shards").mkdir()
    ctx.arrow.rename(ctx.saved / "shards" / ctx.arrow.name)
    ctx.arrow.symlink_to(ctx.saved / "shards" / ctx.arrow.name)  # a link to a file inside
    set_filename(ctx, ctx.arrow.name)
    assert scores(ctx, ctx.saved) == expected
    (ctx.saved / "test").rename(ctx.saved / "real-test")
    (ctx.saved / "test").symlink_to(ctx.saved / "real-test", target_is_directory=True)  # a split folder linked inside
    assert scores(ctx, ctx.saved) == expected


def test_a_split_of_no_rows_next_to_others_is_left_out(tmp_path):
    ctx = Ctx(tmp_path)
    expected = scores(ctx, ctx.saved)
    both = save(tmp_path / "data" / "with-empty", val=EMPTY)
    assert scores(ctx, both) == expected
    parquet = ctx.parquet(name="folder/test.parquet")
    ctx.parquet(EMPTY, name="folder/val.parquet")
    assert scores(ctx, parquet.parent) == expected


# --------------------------------------------------------------------------------------------------------------------
# Nothing written outside the finecap home
# --------------------------------------------------------------------------------------------------------------------

WRITES_SCRIPT = """
import json, sys
from finecap.app.cli import main

predictions, sources = sys.argv[1], sys.argv[2:]
codes = [main(["eval", "--predictions", predictions, "--references", s, "--metrics", "bleu", "-q",
               "data.hf.id_column=cocoid"]) for s in sources]
print(json.dumps(codes))
"""


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder below ``folder``: (size, modification time) by relative path."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(folder))] = (st.st_size if path.is_file() else -1, st.st_mtime_ns)
    return out


def test_reading_writes_nothing_outside_the_finecap_home(tmp_path):
    """``datasets`` reads its cache settings when imported: a subprocess with every cache variable on empty
    folders reads a saved folder, a lone saved Dataset, a parquet file, a folder of parquet files and an Arrow file
    from an empty working directory."""
    ctx = Ctx(tmp_path)
    data = tmp_path / "data"
    ctx.parquet()
    ctx.parquet(name="folder/test.parquet")
    dataset(ROWS).save_to_disk(str(data / "lone" / "test"))
    (data / "test.arrow").write_bytes(ctx.arrow.read_bytes())
    sources = [ctx.saved, data / "lone" / "test", data / "test.parquet", data / "folder", data / "test.arrow"]
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps([{"image_id": 1, "caption": "a red square"}]))
    user, home, cwd = tmp_path / "user", tmp_path / "finecap-home", tmp_path / "cwd"
    for folder in (user, home, cwd):
        folder.mkdir()
    before = tree(data)
    env = {**os.environ, "HOME": str(user), "HF_HOME": str(user / "hf"), "HF_DATASETS_CACHE": str(user / "hfd"),
           "XDG_CACHE_HOME": str(user / "cache"), "FINECAP_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parents[2] / "src"),
                                                     os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
    for name in ("HF_DATASETS_OFFLINE", "HF_MODULES_CACHE", "TRANSFORMERS_CACHE"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", WRITES_SCRIPT, str(predictions), *map(str, sources)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1]) == [0] * len(sources), done.stderr
    assert list(user.iterdir()) == [], tree(user)  # no ~/.cache/huggingface, nothing in HOME
    assert list(cwd.iterdir()) == []
    assert tree(data) == before  # the data sets untouched
    # the parquet files' Arrow copies are in the finecap cache, and only they
    assert {p.relative_to(home).parts[:2] for p in home.rglob("*") if p.is_file()} == {("cache", HF_CACHE)}
    assert any(p.suffix == ".arrow" for p in (home / "cache" / HF_CACHE).rglob("*"))


def test_training_data_converts_parquet_into_run_cache_dir(tmp_path):
    from PIL import Image

    from finecap.config import load
    from finecap.data.datasets import load_records

    ctx = Ctx(tmp_path)
    path = ctx.parquet(name="train.parquet")
    for name in ROWS["image"]:
        Image.new("RGB", (4, 4)).save(path.parent / name)
    cache = tmp_path / "my-cache"
    cfg = load(None, ["data.format=hf", f"data.path={path}", "data.hf.id_column=cocoid", f"run.cache_dir={cache}"])
    assert [r.image_id for r in load_records(cfg, "train", captioned=True)] == [1, 2]
    copies = list((cache / HF_CACHE).rglob("*.arrow"))
    assert copies and all(p.stat().st_size > 0 for p in copies)


# --------------------------------------------------------------------------------------------------------------------
# An embedded image that is not an image, in training
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> Path:
    from finecap.models.presets import save_tiny_clip

    return save_tiny_clip(tmp_path_factory.mktemp("clip"), image_size=32, patch_size=16)


@pytest.mark.slow
@pytest.mark.parametrize(
    "payload",
    [b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, b""],
    ids=["text", "png-header-only", "empty"],
)
def test_training_on_an_embedded_image_that_is_no_image_is_one_named_error(tmp_path, tiny_clip, payload):
    from PIL import Image

    good = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(good, format="PNG")
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})
    rows = {"image": [{"bytes": good.getvalue(), "path": None}] * 3 + [{"bytes": payload, "path": "key.png"}],
            "captions": [["a red square"]] * 4}  # fmt: skip
    val = {"image": [{"bytes": good.getvalue(), "path": None}] * 2, "captions": [["a red square"]] * 2}
    splits = {"train": datasets.Dataset.from_dict(rows, features=features),
              "val": datasets.Dataset.from_dict(val, features=features)}  # fmt: skip
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "saved"))
    argv = ["train", "data.format=hf", f"data.path={tmp_path / 'saved'}", f"model.encoder={tiny_clip}",
            f"retriever.checkpoint={tiny_clip}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
            "clipcap.tiny_heads=2", "clipcap.prefix_length=2", "train.batch_size=4", "train.max_steps=1",
            "train.eval_samples=0", "decode.max_length=5", "--out", str(tmp_path / "run")]  # fmt: skip
    line = one_error_line(*run_cli(argv)[::2])
    assert f"image of record 'train/3' ({tmp_path / 'saved'}: split 'train', row 3): not an image" in line, line


def test_a_hub_name_is_read_as_references_with_data_format_hf(tmp_path, monkeypatch):
    """``finecap eval --references <hub name> data.format=hf`` (docs/data.md): not a local path, so not detected but
    read by the format that reads Hub names (here ``datasets.load_dataset`` answers from memory, no network)."""
    ctx = Ctx(tmp_path)
    expected = scores(ctx, ctx.saved)
    asked = []

    def from_the_hub(name, *args, **kwargs):
        asked.append(name)
        return datasets.DatasetDict({"test": datasets.Dataset.from_dict(ROWS, features=FEATURES)})

    monkeypatch.setattr(datasets, "load_dataset", from_the_hub)
    hub = "someone/captions"
    hf = ["data.format=hf", f"data.images={tmp_path}"]  # the rows' relative image paths: under a folder of ours
    code, out, err = run_cli([*eval_argv(ctx, Path(hub), hf), "--format", "json"])
    assert code == 0, err
    assert json.loads(out) == expected and asked == [hub]
    line = one_error_line(*run_cli(eval_argv(ctx, Path(hub), []))[::2])  # without it: not found, naming the way
    assert line == f"finecap: error: {hub}: reference file not found (a Hugging Face Hub data set: data.format=hf)"
