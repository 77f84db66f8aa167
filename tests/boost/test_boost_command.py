"""``finecap boost`` end to end on a tiny world: the boosted data set in the world format, ``data.captions`` and
``bags.text_from`` reading it back, and a run killed mid-way (SIGKILL) that resumes with nothing lost or duplicated."""

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finecap.app import boost as boost_command
from finecap.app.boost import boost_settings, settings_changes
from finecap.app.boost import main as boost
from finecap.boost.engine import BoostFailed
from finecap.config import load
from finecap.data.caption_fields import select_captions
from finecap.data.datasets import load_records
from finecap.data.formats import read_dataset
from finecap.world.facts import facts
from helpers.chat_server import ChatServer
from helpers.tiny_world import SETTINGS, make_tiny_world, world_items


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    return make_tiny_world(out)


def _openai(url: str, mode: str = "blend") -> list[str]:
    return [f"boost.mode={mode}", "boost.llm_backend=openai", "boost.llm_model=m", f"boost.llm_base_url={url}",
            "boost.concurrency=2"]  # fmt: skip


def test_world_blend_through_the_world_backend(world, tmp_path):
    cfg = load(None, [*world_items(world), "boost.mode=blend"])
    summary = boost(cfg, tmp_path / "out", progress=False)
    assert summary["requested"] == {"blend": 32} and summary["status"] == "ok"
    assert (summary["to_boost"], summary["boosted"], summary["failed"], summary["not_done"]) == (32, 32, 0, 0)
    records = read_dataset("world", tmp_path / "out")  # a world folder: images link, scenes, dense captions
    source = read_dataset("world", world)
    assert [r.image_id for r in records] == [r.image_id for r in source]
    for r, s in zip(records, source, strict=True):
        assert r.boosted["original"] == s.captions
        union = set().union(*(facts(c) for c in s.captions))
        assert len(r.captions) == 1 and facts(r.captions[0]) == union  # BlendCap = the union of the human facts
    # data.captions reads either field back; the train split of the boosted world trains on BlendCap.
    boosted_cfg = load(None, [*world_items(tmp_path / "out"), "data.captions=blend"])
    assert [r.captions for r in load_records(boosted_cfg, "train")] == [
        r.captions for r in records if r.split == "train"
    ]
    original_cfg = load(None, [*world_items(tmp_path / "out"), "data.captions=original"])
    assert load_records(original_cfg, "test")[0].captions == [s for s in source if s.split == "test"][0].captions
    with pytest.raises(ValueError, match="data.captions=holistic: 32 of 32 images"):
        select_captions(records, "holistic", tmp_path / "out" / "dataset.json")
    dense = select_captions(source, "dense", world / "dataset.json")
    assert dense[0].captions == [json.loads((world / "dense.json").read_text())[str(source[0].image_id)]]
    # boost.json records the settings it was made with: a pipeline that reads it back compares them (the demo's VCB)
    assert json.loads((tmp_path / "out" / "boost.json").read_text())["config"] == boost_settings(cfg)
    assert settings_changes(tmp_path / "out", cfg) == []
    fewer = load(None, [*world_items(world), "boost.mode=blend", "boost.limit=3"])
    assert settings_changes(tmp_path / "out", fewer) == ["boost.limit: 0 -> 3"]


@pytest.mark.slow
def test_killed_run_resumes_without_loss_or_duplicates(world, tmp_path, caplog):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    with ChatServer(delay=0.1) as server:
        args = [sys.executable, "-m", "finecap.app.cli", "boost", "--out", str(out), *world_items(world)]
        proc = subprocess.Popen([*args, *_openai(server.url)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while len(server.requests) < 10 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        proc.kill()  # SIGKILL: no clean-up runs
        proc.wait()
        first = len(server.requests)
        assert 10 <= first < 32, "the run must be killed mid-way"
        cached = [json.loads(line) for line in (out / "cache.jsonl").read_text().splitlines() if line.strip()]
        assert 0 < len(cached) <= first
        assert not (out / "dataset.json").exists()
        assert json.loads((out / ".boost.lock").read_text())["pid"] == proc.pid  # the killed run's lock record
        # Resume in-process with the same --out: only the missing answers are requested.
        cfg = load(None, [*world_items(world), *_openai(server.url)])
        summary = boost(cfg, out, progress=False)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"taking over the lock of pid {proc.pid}" in m for m in warned)  # the kill left it: taken over
    assert summary["requested"] == {"blend": 32 - len(cached)}
    # Lost at most the requests in flight at the kill (concurrency 2), never an answer that was cached.
    assert len(server.requests) - first == 32 - len(cached) and first - len(cached) <= 2
    lines = [json.loads(line) for line in (out / "cache.jsonl").read_text().splitlines() if line.strip()]
    assert len(lines) == len({row["key"] for row in lines}) == 32  # every image once, no duplicate answer
    records = read_dataset("world", out)
    assert len(records) == 32 and len({r.image_id for r in records}) == 32
    for r in records:
        assert r.captions == [f"boosted {r.boosted['original'][0]}"]
    assert (out / "failures.jsonl").read_text() == ""


@pytest.mark.parametrize("name", ["failures.jsonl", "cache.jsonl"])
def test_a_users_line_without_a_newline_under_a_boost_files_name_is_refused_untouched(world, tmp_path, name):
    # A last line without its newline was taken as one a kill had cut, whatever it held: a user's one-line note named
    # failures.jsonl was replaced by boost's (empty) failures list, and one named cache.jsonl was appended to (the run
    # then failed at the end, after every request was paid for).
    out = tmp_path / "out"
    out.mkdir()
    note = "notes on last week's labelling: image 7 is mislabelled"
    (out / name).write_text(note)
    with pytest.raises(ValueError, match=f"{name} is not finecap boost's"):
        boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == [name] and (out / name).read_text() == note


def test_a_cache_whose_last_line_a_kill_cut_is_resumed(world, tmp_path):
    # the line a kill cuts, even within its first bytes, is still boost's: the run resumes
    items = [*world_items(world), "boost.mode=blend", "boost.limit=2"]
    boost(load(None, items), tmp_path / "whole", progress=False)
    line = json.dumps({"key": "k", "step": "blend", "image_id": 1, "answer": "café"}).encode()
    for cut in (line[:4], line[:-3]):  # '{"ke'; all but the end of the answer
        out = tmp_path / f"cut{len(cut)}"
        out.mkdir()
        (out / "cache.jsonl").write_bytes(cut)
        assert boost(load(None, items), out, progress=False)["boosted"] == 2
        assert (out / "dataset.json").read_bytes() == (tmp_path / "whole" / "dataset.json").read_bytes()


@pytest.mark.slow
def test_bags_take_text_embeddings_from_the_chosen_field(world, tmp_path, monkeypatch):
    import torch

    import finecap.app.bags as bags_app

    boost(load(None, [*world_items(world), "boost.mode=blend"]), tmp_path / "out", progress=False)
    seen = {}

    class FakeRetriever:
        device, name = "cpu", "fake"

    def embeddings(retriever, records, cache_dir):
        seen["captions"] = [r.captions for r in records]
        return torch.nn.functional.normalize(torch.randn(len(records), 4, generator=torch.Generator().manual_seed(0)))

    monkeypatch.setattr(bags_app, "load_retriever", lambda cfg: FakeRetriever())
    monkeypatch.setattr(bags_app, "record_embeddings", embeddings)
    boosted = read_dataset("world", tmp_path / "out")
    for field in ("blend", "original"):
        cfg = load(None, [*world_items(tmp_path / "out"), f"bags.text_from={field}"])
        bags_app.main(cfg, split="train", sizes="2", out=tmp_path / f"bags_{field}.json")
        assert seen["captions"] == [r.boosted[field] for r in boosted if r.split == "train"]


def _as_format(world: Path, fmt: str, out: Path, ids: bool = True) -> Path:
    """The tiny world's test split as a ``fmt`` file in ``out`` naming images relative to ``world`` (COCO: with one
    image that has no caption annotation, which readers drop)."""
    source = [r for r in read_dataset("world", world) if r.split == "test"]
    rel = [str(Path(r.path).relative_to(world)) for r in source]
    if fmt == "karpathy":
        images = [{"filename": Path(p).name, "filepath": str(Path(p).parent), "split": "test", "imgid": r.image_id,
                   "sentences": [{"raw": c} for c in r.captions]}
                  for r, p in zip(source, rel, strict=True)]  # fmt: skip
        path, text = out / "dataset_x.json", json.dumps({"images": images})
    elif fmt == "coco":
        images = [{"id": r.image_id, "file_name": p} for r, p in zip(source, rel, strict=True)] + [
            {"id": 999, "file_name": "x"}
        ]
        anns = [{"id": k, "image_id": r.image_id, "caption": c} for k, (r, c) in
                enumerate((r, c) for r in source for c in r.captions)]  # fmt: skip
        path, text = out / "captions_test.json", json.dumps({"images": images, "annotations": anns})
    else:
        lines = [json.dumps({"image": p, "captions": r.captions, **({"id": r.image_id} if ids else {})})
                 for r, p in zip(source, rel, strict=True)]  # fmt: skip
        path, text = out / "test.jsonl", "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("fmt", ["karpathy", "coco", "jsonl"])
def test_blend_in_each_file_format_reads_back(world, tmp_path, fmt):
    src = _as_format(world, fmt, tmp_path / "src")
    cfg = load(None, [f"data.format={fmt}", f"data.path={src}", f"data.images={world}", "boost.mode=blend"])
    summary = boost(cfg, tmp_path / "out", progress=False)
    assert summary["images"] == summary["boosted"] == 4 and summary["failed"] == 0
    source = read_dataset(fmt, src, images=world)
    boosted = read_dataset(fmt, tmp_path / "out" / src.name, images=world)  # images named relative to the source root
    assert [r.image_id for r in boosted] == [r.image_id for r in source]
    for r, s in zip(boosted, source, strict=True):
        assert r.path.resolve() == s.path.resolve() and r.path.exists()
        assert r.boosted["original"] == s.captions
        assert len(r.captions) == 1 and facts(r.captions[0]) == set().union(*(facts(c) for c in s.captions))
    if fmt == "coco":  # the image without a caption is kept, unboosted; the original annotations are kept too
        raw = json.loads((tmp_path / "out" / src.name).read_text())
        assert raw["images"][-1] == {"id": 999, "file_name": "x"}
        assert len(raw["original_annotations"]) == sum(len(s.captions) for s in source)


def _strict(text: str):
    """``json.loads`` refusing Python's ``NaN`` / ``Infinity`` tokens, as ``jq`` and JavaScript do."""

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("fmt", ["karpathy", "coco", "jsonl"])
def test_a_sources_value_that_is_no_number_is_written_as_strict_json(world, tmp_path, fmt):
    # a field of the user's own holding NaN / Infinity (which Python's reader takes) was copied into the boosted file
    # as a bare token, which jq, JavaScript and strict parsers refuse
    src = _as_format(world, fmt, tmp_path / "src")
    if fmt == "jsonl":
        rows = [{**json.loads(line), "quality": float("nan")} for line in src.read_text().splitlines()]
        src.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        raw = json.loads(src.read_text())
        for img in raw["images"]:
            img["quality"] = float("inf")
        src.write_text(json.dumps(raw))
    assert "NaN" in src.read_text() or "Infinity" in src.read_text()
    cfg = load(None, [f"data.format={fmt}", f"data.path={src}", f"data.images={world}", "boost.mode=blend"])
    assert boost(cfg, tmp_path / "out", progress=False)["boosted"] == 4
    text = (tmp_path / "out" / src.name).read_text()
    written = [_strict(line) for line in text.splitlines()] if fmt == "jsonl" else _strict(text)["images"]
    assert written and all(row["quality"] is None for row in written)
    _strict((tmp_path / "out" / "boost.json").read_text())  # boost's other files too
    for name in ("cache.jsonl", "failures.jsonl"):
        [_strict(line) for line in (tmp_path / "out" / name).read_text().splitlines()]
    boosted = read_dataset(fmt, tmp_path / "out" / src.name, images=world)  # and it reads back as boost's output
    assert len(boosted) == 4 and all(len(r.captions) == 1 for r in boosted)


@pytest.mark.parametrize("fmt", ["coco", "jsonl"])
def test_boosting_a_boosted_file_again_keeps_the_sources_ids_and_original_annotations(world, tmp_path, fmt):
    """A JSONL whose lines have no ``id`` (the id is then the image path as written) keeps its ids although boost
    writes absolute image paths; a COCO file boosted twice keeps the first source's annotations as the original."""
    src = _as_format(world, fmt, tmp_path / "src", ids=False)
    first, second = tmp_path / "out1", tmp_path / "out2"
    for source, out in ((src, first), (first / src.name, second)):
        cfg = load(None, [f"data.format={fmt}", f"data.path={source}", f"data.images={world}", "boost.mode=blend",
                          "data.allow_outside_paths=true"])  # fmt: skip
        assert boost(cfg, out, progress=False)["boosted"] == 4
    want = [r.image_id for r in read_dataset(fmt, src, images=world)]
    for out in (first, second):
        assert [r.image_id for r in read_dataset(fmt, out / src.name, images=world, allow_outside=True)] == want
    if fmt == "coco":
        assert (
            json.loads((second / src.name).read_text())["original_annotations"]
            == json.loads(src.read_text())["annotations"]
        )


def test_a_jsonl_naming_images_through_links_keeps_their_paths_and_reads_back(world, tmp_path):
    # boost wrote each image path resolved: a link (an image folder of links into a store, as a Hugging Face snapshot
    # is) became its target's name, and two lines naming one stored file under two names in two splits (a photo
    # stored once) then named the same file: the boosted data set was refused on reading ("has split 'train' here
    # but 'test' at line 1 (the same file)")
    source = [r for r in read_dataset("world", world) if r.split == "test"][:2]
    src, store = tmp_path / "src", tmp_path / "store"
    (src / "images").mkdir(parents=True)
    store.mkdir()
    rows = []
    for k, (r, split) in enumerate(zip([*source, source[0]], ["test", "test", "train"], strict=True)):
        blob = store / f"blob{k % 2}"
        if not blob.exists():
            blob.write_bytes(r.path.read_bytes())
        (src / "images" / f"img{k}.png").symlink_to(blob)
        rows.append({"id": f"im-{k}", "image": f"images/img{k}.png", "captions": r.captions, "split": split,
                     "note": "café"})  # fmt: skip
    data = src / "d.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load(None, ["data.format=jsonl", f"data.path={data}", "boost.mode=blend", "data.allow_outside_paths=true"])
    assert boost(cfg, tmp_path / "out", progress=False)["boosted"] == 3
    boosted = read_dataset("jsonl", tmp_path / "out" / data.name, images=src, allow_outside=True)
    assert [(r.image_id, r.path, r.split) for r in boosted] == [
        (f"im-{k}", (src / "images" / f"img{k}.png").absolute(), split)
        for k, split in enumerate(["test", "test", "train"])
    ]
    written = [json.loads(line) for line in (tmp_path / "out" / data.name).read_text().splitlines()]
    assert [row["note"] for row in written] == ["café"] * 3


def test_a_coco_file_without_images_keeps_its_boost_fields(world, tmp_path):
    # pycocotools reads a file of annotations alone; boost stored the fields on 'images' entries only: none were
    # written, the boosted captions read back as human ones, and a second boost blended the first one's answers
    src = _as_format(world, "coco", tmp_path / "src")
    raw = json.loads(src.read_text())
    del raw["images"]
    src.write_text(json.dumps(raw))
    source = read_dataset("coco", src, images=world, check_images=False)
    first, second = tmp_path / "out1", tmp_path / "out2"
    for data, out in ((src, first), (first / src.name, second)):
        cfg = load(None, ["data.format=coco", f"data.path={data}", f"data.images={world}", "boost.mode=blend"])
        assert boost(cfg, out, progress=False)["boosted"] == 4
    humans = [r.captions for r in source]
    for out in (first, second):
        boosted = read_dataset("coco", out / src.name, images=world, check_images=False)
        assert [(r.image_id, r.path) for r in boosted] == [(r.image_id, r.path) for r in source]
        assert [r.captions for r in select_captions(boosted, "original", out / src.name)] == humans
        blend = [r.captions for r in select_captions(boosted, "blend", out / src.name)]
        assert blend == [r.captions for r in boosted] and blend != humans
    written = json.loads((first / src.name).read_text())["images"]
    assert [img["id"] for img in written] == [r.image_id for r in source] and all(img["boost"] for img in written)


@pytest.mark.parametrize("fmt", ["karpathy", "jsonl"])
def test_a_source_reordered_during_the_run_is_refused_not_paired_by_position(world, tmp_path, monkeypatch, fmt):
    # the file was read again at the end and its entries given the fields by position: each image of a file reordered
    # meanwhile got another image's captions, exit 0
    src = _as_format(world, fmt, tmp_path / "src")
    before = src.read_text()
    boost_records = boost_command.boost_records

    def reordered_meanwhile(*args, **kwargs):
        result = boost_records(*args, **kwargs)
        if fmt == "karpathy":
            raw = json.loads(src.read_text())
            src.write_text(json.dumps({"images": raw["images"][::-1]}))
        else:
            src.write_text("\n".join(src.read_text().splitlines()[::-1]) + "\n")
        return result

    monkeypatch.setattr(boost_command, "boost_records", reordered_meanwhile)
    first = read_dataset(fmt, src, images=world)[0]
    cfg = load(None, [f"data.format={fmt}", f"data.path={src}", f"data.images={world}", "boost.mode=blend"])
    out = tmp_path / "out"
    said = f"boost stopped: {src}: changed while boost ran: entry 0 is now image "
    boosted = f", but image {first.image_id!r} ({first.path}) was boosted there; re-run with the same --out"
    with pytest.raises(BoostFailed, match=re.escape(said) + ".*" + re.escape(boosted)):
        boost(cfg, out, progress=False)
    assert not (out / src.name).exists() and src.read_text() != before
    summary = json.loads((out / "boost.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith(f"{src}: changed while boost ran")
    # Re-run on the file as it is now: every answer from the cache, each paired with its own image.
    monkeypatch.setattr(boost_command, "boost_records", boost_records)
    assert boost(cfg, out, progress=False)["requested"] == {"blend": 0}
    source = {r.image_id: r.captions for r in read_dataset(fmt, src, images=world)}
    written = read_dataset(fmt, out / src.name, images=world, allow_outside=True)
    assert [r.image_id for r in written] == list(source)
    assert all(r.boosted["original"] == source[r.image_id] for r in written)


def test_formats_boost_cannot_write_fail_before_any_request(world, tmp_path):
    cfg = load(None, ["data.format=hf", f"data.path={world}", "boost.mode=blend"])
    with pytest.raises(ValueError, match="data.format=hf: finecap boost writes world, karpathy, coco, jsonl only"):
        boost(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_world_boosted_into_a_folder_of_another_worlds_boost_links_its_own_images(world, tmp_path):
    # the images link of the earlier run stayed: the new captions were paired with the other world's images under the
    # same file names (and a link left dangling failed the run after every request was paid for)
    seeded = (*SETTINGS, "world.seed=1")
    other = make_tiny_world(tmp_path / "other", seeded)
    out = tmp_path / "out"
    boost(load(None, [*world_items(other, seeded), "boost.mode=blend"]), out, progress=False)
    assert (out / "images").resolve() == (other / "images").resolve()
    boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)
    assert (out / "images").resolve() == (world / "images").resolve()
    os.replace(out / "images", tmp_path / "moved")  # a real folder of the user's where the link goes: refused
    (out / "images").mkdir()
    with pytest.raises(ValueError, match=r"is a folder, not the link to the images boost makes"):
        boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)


@pytest.mark.parametrize("kind", ["file", "folder", "link"])
def test_the_images_link_is_made_without_touching_a_users_entry_at_its_temporary_name(world, tmp_path, kind):
    # the new link was made at .images.<pid>.tmp after unlinking whatever was there: a user's file of that name in a
    # folder boost wrote before was deleted (a folder there failed the run after every request was paid for)
    out = tmp_path / "out"
    boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)
    (out / "images").unlink()  # the link goes again (the user moved it): the next run makes it anew
    users = out / f".images.{os.getpid()}.tmp"
    if kind == "file":
        users.write_text("mine")
    elif kind == "folder":
        users.mkdir()
        (users / "notes.txt").write_text("mine")
    else:
        users.symlink_to(tmp_path / "elsewhere")
    boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)
    assert (out / "images").is_symlink() and (out / "images").resolve() == (world / "images").resolve()
    if kind == "file":
        assert users.read_text() == "mine"
    elif kind == "folder":
        assert (users / "notes.txt").read_text() == "mine"
    else:
        assert os.readlink(users) == str(tmp_path / "elsewhere")
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".images.")) == [users.name]  # none of ours


def test_a_data_set_named_like_a_boost_file_is_refused(world, tmp_path):
    # a JSONL source named failures.jsonl was written, then replaced by the (empty) failures list; exit 0
    source = tmp_path / "failures.jsonl"
    source.write_text(json.dumps({"image": str(world / "images" / "x.png"), "captions": ["a dog"]}) + "\n")
    cfg = load(None, [f"data.path={source}", "data.format=jsonl", "boost.mode=blend"])
    with pytest.raises(ValueError, match=r"a data set named failures.jsonl would be written over"):
        boost(cfg, tmp_path / "out", progress=False)


def test_a_run_that_crashes_leaves_boost_json_running_not_an_earlier_runs_ok(world, tmp_path, monkeypatch):
    # an earlier run's boost.json (status ok) stayed when a later run crashed (an out-of-memory error, a bug)
    out = tmp_path / "out"
    boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)
    assert json.loads((out / "boost.json").read_text())["status"] == "ok"

    def crash(*args, **kwargs):
        raise MemoryError("out of memory")

    monkeypatch.setattr("finecap.app.boost.boost_records", crash)
    with pytest.raises(MemoryError):
        boost(load(None, [*world_items(world), "boost.mode=blend"]), out, progress=False)
    assert json.loads((out / "boost.json").read_text())["status"] == "running"
    boost_again = load(None, [*world_items(world), "boost.mode=blend"])
    monkeypatch.undo()
    assert boost(boost_again, out, progress=False)["status"] == "ok"  # the folder is boost's: a re-run finishes


def test_karpathy_output_tokens_are_made_as_karpathys(world, tmp_path):
    # tokens were caption.split(): "A Red circle," kept its capitals and comma, unlike Karpathy's own files
    # ("raw": "A man with a red helmet ... road. ", "tokens": ["a", "man", ..., "road"])
    from finecap.boost.output import write_boosted

    src = _as_format(world, "karpathy", tmp_path / "src")
    records = read_dataset("karpathy", src, images=world)
    caption = "A Red circle, left of the star.  It's big!"
    fields = [{"blend": [caption], "original": list(r.captions)} for r in records]
    written = write_boosted("karpathy", src, tmp_path / "out", records, fields, "blend")
    sentences = [s for img in json.loads(written.read_text())["images"] for s in img["sentences"]]
    assert len(sentences) == len(records)
    assert all(s == {"raw": caption, "tokens": ["a", "red", "circle", "left", "of", "the", "star", "its", "big"]}
               for s in sentences)  # fmt: skip


class ClosedBackend:
    """A backend built by the run (an in-process engine holding memory): records its close, or fails it."""

    def __init__(self, role: str, closed: list[str], fails: bool = False) -> None:
        self.role, self.closed, self.fails = role, closed, fails

    def close(self) -> None:
        self.closed.append(self.role)
        if self.fails:
            raise OSError(f"the {self.role} backend did not close")


def test_a_run_whose_vlm_backend_fails_to_start_closes_the_llm_backend_it_built(world, tmp_path, monkeypatch):
    # the LLM role's engine (boost.llm_backend=vllm: most of a GPU) stayed up when the VLM's failed to start
    closed = []

    def make(cfg, role):
        if role == "vlm":
            raise RuntimeError("the VLM's engine failed to start")
        return ClosedBackend(role, closed)

    monkeypatch.setattr(boost_command, "make_backend", make)
    with pytest.raises(RuntimeError, match="VLM's engine failed"):
        boost(load(None, [*world_items(world), "boost.mode=holistic"]), tmp_path / "out", progress=False)
    assert closed == ["llm"] and not (tmp_path / "out").exists()


def test_each_backend_is_closed_when_another_fails_to_close(world, tmp_path, monkeypatch):
    closed = []
    backends = {"llm": ClosedBackend("llm", closed, fails=True), "vlm": ClosedBackend("vlm", closed)}
    monkeypatch.setattr(boost_command, "make_backend", lambda cfg, role: backends[role])

    def crash(*args, **kwargs):
        raise MemoryError("out of memory")

    monkeypatch.setattr(boost_command, "boost_records", crash)
    with pytest.raises(OSError, match="llm backend did not close"):
        boost(load(None, [*world_items(world), "boost.mode=holistic"]), tmp_path / "out", progress=False)
    assert closed == ["llm", "vlm"]
