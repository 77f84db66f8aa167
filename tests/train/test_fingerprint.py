"""Fingerprints of a run's inputs (finecap.train.fingerprint): what identifies the data and the encoders, what a change
does to them, and the checks that refuse a run or a bags file read against other inputs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from finecap.config import WorldConfig, load
from finecap.runs import FINGERPRINTS_FILE, checkpoint_dir
from finecap.train import fingerprint as fpm
from finecap.train.checkpoint import save_checkpoint
from finecap.train.fingerprint import (
    FingerprintMismatch,
    bags_file_data,
    check_bags_data,
    check_fingerprints,
    check_run_dir,
    data_fingerprint,
    dataset_fingerprint,
    differences,
    run_fingerprints,
    source_fingerprint,
    stored_path,
    write_fingerprints,
)
from finecap.world.make import make_world, world_key


def tiny_world(out: Path, seed: int = 0) -> Path:
    cfg = WorldConfig(n_train=6, n_val=2, n_test=3, image_size=16, seed=seed)
    return make_world(cfg, out=out, progress=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return tiny_world(tmp_path_factory.mktemp("fp") / "world")


def karpathy_copy(world: Path, out: Path) -> Path:
    """The world's dataset.json alone in another folder: a Karpathy file (no scenes.jsonl next to it)."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(world / "dataset.json", out / "captions.json")
    return out / "captions.json"


# --------------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------------


def test_data_file_fingerprint_is_the_sha256_of_its_bytes(world, tmp_path):
    path = karpathy_copy(world, tmp_path / "a")
    fp = dataset_fingerprint("karpathy", path, captions="original")
    assert fp["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()  # an independent hash of the same bytes
    assert (fp["kind"], fp["format"], fp["captions"]) == ("file", "karpathy", "original")
    assert fp["path"] == str(path) and "split" not in fp
    # The same bytes elsewhere are the same data (the path is not compared); one changed caption is not.
    moved = karpathy_copy(world, tmp_path / "b")
    assert dataset_fingerprint("karpathy", moved)["id"] == fp["id"]
    assert differences(fp, dataset_fingerprint("karpathy", moved)) == []
    data = json.loads(moved.read_text())
    data["images"][0]["sentences"][0]["raw"] = "a different caption"
    moved.write_text(json.dumps(data))
    changed = dataset_fingerprint("karpathy", moved)
    assert changed["id"] != fp["id"]
    diff = differences(fp, changed)
    assert diff[0].startswith(f"sha256: '{fp['sha256']}' -> ") and diff[-1].startswith("path: ")
    # Caption field, format and split are part of the fingerprint.
    assert dataset_fingerprint("karpathy", path, captions="holistic")["id"] != fp["id"]
    assert dataset_fingerprint("jsonl", path)["id"] != fp["id"]
    assert dataset_fingerprint("karpathy", path, split="test")["split"] == "test"


def test_world_fingerprint_is_its_content_key_and_dataset_hash(world, tmp_path):
    cfg = load(None, [f"world.out={world}"])
    fp = data_fingerprint(cfg)
    assert fp["world_key"] == world_key(WorldConfig(n_train=6, n_val=2, n_test=3, image_size=16, seed=0))
    assert (fp["kind"], fp["format"]) == ("world", "world")
    assert fp["sha256"] == hashlib.sha256((world / "dataset.json").read_bytes()).hexdigest()  # its content too
    # Another world copied over the same folder: the fingerprint follows the files, not the configuration.
    other = tiny_world(tmp_path / "other", seed=1)
    replaced = tmp_path / "replaced"
    shutil.copytree(world, replaced)
    before = data_fingerprint(load(None, [f"world.out={replaced}"]))
    shutil.rmtree(replaced)
    shutil.copytree(other, replaced)
    after = data_fingerprint(load(None, [f"world.out={replaced}"]))
    assert before["world_key"] == fp["world_key"] != after["world_key"]
    assert differences(before, after)[0].startswith("world_key: ")


def test_hf_saved_dataset_uses_the_datasets_fingerprint(tmp_path):
    datasets = pytest.importorskip("datasets")

    def save(test_caption: str) -> dict[str, str]:
        dd = datasets.DatasetDict({
            "train": datasets.Dataset.from_dict({"image": ["a.png", "b.png"], "captions": [["a"], ["b"]]}),
            "test": datasets.Dataset.from_dict({"image": ["c.png"], "captions": [[test_caption]]}),
        })  # fmt: skip
        shutil.rmtree(tmp_path / "saved", ignore_errors=True)
        dd.save_to_disk(str(tmp_path / "saved"))
        return {split: ds._fingerprint for split, ds in dd.items()}  # what datasets computed for what it saved

    saved = save("c")
    cfg = load(None, ["data.format=hf", f"data.path={tmp_path / 'saved'}"])
    fp = data_fingerprint(cfg)
    assert (fp["kind"], fp["datasets"]) == ("hf", saved)
    assert fp["options"]["caption_column"] == "captions"
    # Another column option reads other records: another fingerprint; so does other content saved in its place.
    assert data_fingerprint(load(None, [*_hf(tmp_path), "data.hf.caption_column=image"]))["id"] != fp["id"]
    # data.hf.questions_column came later: unset, the options are the four columns runs recorded before it (the pinned
    # ids below); set, it reads other records (their questions), so it is part of the fingerprint
    assert fp["options"] == {
        "caption_column": "captions",
        "id_column": "",
        "image_column": "image",
        "split_column": "",
    }
    asked = data_fingerprint(load(None, [*_hf(tmp_path), "data.hf.questions_column=qa"]))
    assert asked["options"]["questions_column"] == "qa" and asked["id"] != fp["id"]
    changed = save("another caption")
    assert changed["test"] != saved["test"] and data_fingerprint(cfg)["datasets"] == changed


def _hf(tmp_path: Path) -> list[str]:
    return ["data.format=hf", f"data.path={tmp_path / 'saved'}"]


def test_hub_names_record_the_cached_revision(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert source_fingerprint("org/clip")["revision"] is None  # not cached: nothing downloaded, name only
    ref = tmp_path / "models--org--clip" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("0123abcd\n")
    fp = source_fingerprint("org/clip")
    assert (fp["kind"], fp["name"], fp["revision"]) == ("hub", "org/clip", "0123abcd")
    (tmp_path / "datasets--org--coco" / "refs").mkdir(parents=True)
    (tmp_path / "datasets--org--coco" / "refs" / "main").write_text("feed")
    hub_data = dataset_fingerprint("hf", "org/coco")
    assert (hub_data["hub"], hub_data["revision"]) == ("org/coco", "feed")


def test_recorded_data_fingerprints_stay_the_same(tmp_path, monkeypatch):
    # A run records these ids and refuses to resume when they change: they are pinned as finecap computed them before
    # the data formats became Format specs (issue 51), for data sets of fixed bytes; a change here breaks every run.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # the Hub name below is not cached
    (tmp_path / "refs.jsonl").write_text('{"image": "a.png", "captions": ["a red circle"]}\n')
    (tmp_path / "captions_val2014.json").write_text('{"images": [{"id": 1, "file_name": "a.png"}], "annotations": '
                                                    '[{"image_id": 1, "caption": "a red circle"}]}')  # fmt: skip
    (tmp_path / "dataset_coco.json").write_text('{"images": [{"filename": "a.png", "split": "test", "sentences": '
                                                '[{"raw": "a red circle"}]}]}')  # fmt: skip
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.png").write_bytes(b"12345")
    (tmp_path / "photos" / "a.txt").write_text("a red circle\n")
    held_out = {"captions": "holistic", "split": "test", "split_fractions": {"val": 0.1, "test": 0.0, "seed": 0}}
    pinned = {"jsonl": ("refs.jsonl", "bf7538985d8e", "51aea7bab19a"),
              "coco": ("captions_val2014.json", "bcad78197805", "785430ee1915"),
              "karpathy": ("dataset_coco.json", "30ce210610e8", "0bf4a76a5c63"),
              "folder": ("photos", "1dcdce2fc37a", "e320aaf628b3")}  # fmt: skip
    for fmt, (name, plain, other) in pinned.items():
        assert dataset_fingerprint(fmt, tmp_path / name)["id"] == plain, fmt
        assert dataset_fingerprint(fmt, tmp_path / name, **held_out)["id"] == other, fmt
    columns = {"image_column": "image", "caption_column": "captions", "split_column": "", "id_column": ""}
    assert dataset_fingerprint("hf", "someone/not-cached", options=columns)["id"] == "587593fb680e"


# --------------------------------------------------------------------------------------------------------------------
# Encoders
# --------------------------------------------------------------------------------------------------------------------


def test_local_checkpoint_fingerprint_covers_weights_and_config_only(tmp_path):
    ckpt = tmp_path / "clip"
    (ckpt / "accelerate").mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (ckpt / "config.json").write_text("{}")
    (ckpt / "README.md").write_text("notes")
    fp = source_fingerprint(ckpt)
    expected = hashlib.sha256()  # (relative path, file hash) in sorted order, computed here by hand
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"weights")):
        expected.update(f"{name}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    assert fp["sha256"] == expected.hexdigest() and fp["kind"] == "checkpoint"
    (ckpt / "README.md").write_text("other notes")  # not part of the model
    (ckpt / "accelerate" / "optimizer.bin").write_bytes(b"state")  # optimizer state is not the model
    assert source_fingerprint(ckpt)["sha256"] == fp["sha256"]
    (ckpt / "model.safetensors").write_bytes(b"retrained")
    assert source_fingerprint(ckpt)["sha256"] != fp["sha256"]


def test_run_fingerprints_of_a_world_run(world, tmp_path):
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "model.safetensors").write_bytes(b"w")
    cfg = load(None, [f"world.out={world}", f"model.encoder={enc}", f"run.cache_dir={tmp_path / 'cache'}"])
    fps = run_fingerprints(cfg)
    assert fps["data"]["world_key"] and fps["captioner"]["path"] == str(enc)
    # The retriever of a world run is the world encoder; not trained yet: its key is known, its weights are not.
    assert fps["retriever"]["kind"] == "world-encoder" and fps["retriever"]["sha256"] is None
    # ... and an unknown recorded value is not compared once the encoder exists.
    trained = {**fps["retriever"], "sha256": "abc"}
    assert differences(fps["retriever"], trained) == []
    assert differences(trained, fps["retriever"]) == ["sha256: 'abc' -> None"]
    # A pretrained BLIP and a trained encoder are held by the checkpoint itself.
    blip = load(None, [f"world.out={world}", "model.kind=blip", f"blip.name={enc}"])
    assert run_fingerprints(blip)["captioner"]["kind"] == "in-checkpoint"


# --------------------------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------------------------


def test_check_refuses_other_data_naming_both_fingerprints(world, tmp_path):
    path = karpathy_copy(world, tmp_path / "data")
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "model.safetensors").write_bytes(b"w")
    cfg = load(None, ["data.format=karpathy", f"data.path={path}", f"model.encoder={enc}"])
    recorded_file = write_fingerprints(tmp_path / "run", cfg)
    recorded = json.loads(recorded_file.read_text())
    check_fingerprints(recorded, cfg, source=recorded_file)  # the same inputs pass
    path.write_text(path.read_text().replace('"raw": "', '"raw": "edited ', 1))
    now = data_fingerprint(cfg)
    with pytest.raises(FingerprintMismatch) as e:
        check_fingerprints(recorded, cfg, source=recorded_file)
    message = str(e.value)
    assert str(recorded_file) in message and recorded["data"]["id"] in message and now["id"] in message
    assert f"sha256: '{recorded['data']['sha256']}' -> '{now['sha256']}'" in message
    assert "captioner" not in message  # only what differs is named
    check_fingerprints(recorded, cfg, source=recorded_file, parts=["captioner"])  # the encoder alone still matches
    (enc / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(FingerprintMismatch, match="captioner's vision encoder"):
        check_fingerprints(recorded, cfg, source=recorded_file, parts=["captioner"])
    shutil.rmtree(enc)
    with pytest.raises(FingerprintMismatch, match="is gone"):
        check_fingerprints(recorded, cfg, source=recorded_file, parts=["captioner"])


def test_check_of_a_folder_without_captioner_json_names_the_file_not_a_gone_encoder(world, tmp_path):
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "model.safetensors").write_bytes(b"w")
    cfg = load(None, [f"world.out={world}", f"model.encoder={enc}"])
    recorded_file = write_fingerprints(tmp_path / "run", cfg)
    folder = tmp_path / "copied-checkpoint"
    folder.mkdir()  # the encoder is there; the checkpoint's record of it is not
    with pytest.raises(FingerprintMismatch) as e:
        check_fingerprints(json.loads(recorded_file.read_text()), cfg, source=recorded_file, parts=["captioner"],
                           model_folder=folder)  # fmt: skip
    message = str(e.value)
    assert f"{folder} holds no captioner.json" in message and "incomplete copy" in message
    assert "is gone" not in message


def test_checkpoints_carry_the_runs_fingerprints(world, tmp_path):
    class Model:
        tokenizer = None  # the captioner contract's member save_checkpoint reads (no tokenizer: no special ids)

        def save(self, out, state_dict=None):
            out.mkdir(parents=True)
            (out / "weights.txt").write_text("1")

    cfg = load(None, [f"world.out={world}"])
    run_dir = tmp_path / "run"
    write_fingerprints(run_dir, cfg)
    best = save_checkpoint(checkpoint_dir(run_dir, "best"), model=Model(), cfg=cfg, info={})
    assert json.loads((best / FINGERPRINTS_FILE).read_text()) == json.loads((run_dir / FINGERPRINTS_FILE).read_text())
    assert fpm.find_fingerprints(best) == best / FINGERPRINTS_FILE
    (best / FINGERPRINTS_FILE).unlink()  # a checkpoint without its own copy falls back to its run's
    assert fpm.find_fingerprints(best) == run_dir / FINGERPRINTS_FILE
    elsewhere = save_checkpoint(tmp_path / "loose", model=Model(), cfg=cfg, info={})  # not in a run: none recorded
    assert not (elsewhere / FINGERPRINTS_FILE).exists() and fpm.check_run(elsewhere, cfg) is None


def test_bags_file_data_is_read_relative_to_the_file_and_checked(world, tmp_path):
    data = karpathy_copy(world, tmp_path / "run" / "data")
    fp = fpm.bags_data_fingerprint("karpathy", data, captions="original", split="test")
    bags = tmp_path / "run" / "bags.json"
    raw = {"split": "test", "data": "data/captions.json", "fingerprint": fp, "bags": {"2": [[1, 2]]}}
    bags.write_text(json.dumps(raw))
    # Relative to the bags file, not to the working directory (pytest runs elsewhere).
    assert bags_file_data(bags) == str(data)
    assert stored_path(str(data), bags) == str(data)  # absolute: as it is
    assert stored_path("org/coco", bags) == "org/coco"  # names nothing there: a Hub name, unchanged
    # The report's check of a run directory covers its bags files.
    cfg = load(None, ["data.format=karpathy", f"data.path={data}"])
    assert check_run_dir(tmp_path / "run", cfg) == [bags]
    data.write_text(data.read_text().replace('"raw": "', '"raw": "edited ', 1))
    with pytest.raises(FingerprintMismatch, match=r"bags were built on data .* but the data read now is"):
        bags_file_data(bags)
    with pytest.raises(FingerprintMismatch, match="sha256"):
        check_run_dir(tmp_path / "run", cfg)
    with pytest.raises(FingerprintMismatch, match="format: 'karpathy' -> 'jsonl'"):
        check_bags_data(bags, raw, "jsonl", data)


def test_captioner_encoder_seen_from_the_config_and_from_the_checkpoint_agree(world, tmp_path):
    # Training records the encoder from the configuration (model.encoder=world: the world encoder of its key); a
    # reader of a checkpoint sees the encoder its captioner.json refers to. Same encoder, same fingerprint.
    from finecap.models.world_encoder_cache import encoder_dir, encoder_key

    cfg = load(None, [f"world.out={world}", "model.encoder=world", f"run.cache_dir={tmp_path / 'cache'}"])
    before = fpm.captioner_fingerprint(cfg)  # not trained yet: key only
    assert (before["kind"], before["sha256"], before["world_encoder_key"]) == ("world-encoder", None, encoder_key(cfg))
    folder = encoder_dir(cfg)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"trained")
    (folder / "encoder.json").write_text(json.dumps({"key": encoder_key(cfg)}))
    recorded = fpm.captioner_fingerprint(cfg)
    model = tmp_path / "ckpt" / "model"
    model.mkdir(parents=True)
    (model / "captioner.json").write_text(json.dumps({"encoder_source": str(folder), "encoder_saved": False}))
    assert differences(before, recorded) == [] and differences(recorded, fpm.captioner_fingerprint(cfg, model)) == []
    # A captioner that saved its trained encoder depends on nothing outside: recorded as such from both sides.
    (model / "captioner.json").write_text(json.dumps({"encoder_source": str(folder), "encoder_saved": True}))
    trained = load(None, [f"world.out={world}", "model.encoder=world", "model.train_encoder=true"])
    assert (
        fpm.captioner_fingerprint(trained)["kind"] == fpm.captioner_fingerprint(cfg, model)["kind"] == "in-checkpoint"
    )
    # The world encoder retrained in place: the checkpoint no longer reads what it was trained with.
    (folder / "model.safetensors").write_bytes(b"retrained")
    (model / "captioner.json").write_text(json.dumps({"encoder_source": str(folder), "encoder_saved": False}))
    assert differences(recorded, fpm.captioner_fingerprint(cfg, model))[0].startswith("sha256: ")
