import functools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from finecap.config import load
from finecap.data.features import (
    CACHE_SUBDIR,
    Ranks,
    cache_file,
    cached_features,
    compute_features,
    fingerprint_data,
    fingerprint_module,
    lock_file,
    model_features,
)
from finecap.data.loading import LoaderSettings
from finecap.data.records import Record
from finecap.data.samplers import process_slice
from helpers.waiting import SAYS_WAITING, until


@pytest.fixture
def records(tmp_path):
    out = []
    for i in range(5):
        path = tmp_path / "images" / f"{i}.png"
        path.parent.mkdir(exist_ok=True)
        Image.new("RGB", (4, 4), (50 * i, 0, 0)).save(path)
        out.append(Record(i, path, "train", [f"caption {i}"]))
    return out


class RedEncoder(torch.nn.Module):
    """Stand-in vision encoder: feature = scale * mean red value of the image (preprocess -> (B, 3, 4, 4))."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        self.calls = 0

    def preprocess(self, images):
        return torch.stack([torch.tensor(list(im.getdata()), dtype=torch.float32).T.reshape(3, 4, 4) for im in images])

    def forward(self, pixel_values):
        self.calls += 1
        return pixel_values[:, 0].mean(dim=(1, 2))[:, None] * self.scale  # (B, 2)


class StandIn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = RedEncoder()


def test_fingerprint_module_tracks_weights_and_extra():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    b.load_state_dict(a.state_dict())
    assert fingerprint_module(a) == fingerprint_module(b)
    assert fingerprint_module(a, {"size": 32}) != fingerprint_module(a, {"size": 64})
    with torch.no_grad():
        b.bias[0] += 1e-6
    assert fingerprint_module(a) != fingerprint_module(b)


def test_fingerprint_data_tracks_images_not_captions(tmp_path, records):
    key = fingerprint_data(records)
    assert key == fingerprint_data(records)
    assert key != fingerprint_data(records[::-1])  # order of rows matters
    assert key != fingerprint_data([Record(99, records[0].path, "train"), *records[1:]])  # ids matter
    # Captions and the split label do not change image features, so they do not change the key.
    assert key == fingerprint_data([Record(r.image_id, r.path, "val", ["other"]) for r in records])
    st = os.stat(records[0].path)
    os.utime(records[0].path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # an image rewritten
    assert key != fingerprint_data(records)
    with pytest.raises(FileNotFoundError, match="record 'gone'"):
        fingerprint_data([Record("gone", tmp_path / "missing.png", "train")])


def test_fingerprint_data_tracks_an_image_edited_in_place_with_its_size_and_times_restored(records):
    # an image rewritten in place (same name, same size) with its times set back (os.utime, as `cp -p`, rsync and
    # editors that keep times do) kept its key, so the feature cache served the old image's features
    path = Path(records[0].path)
    before, key = os.stat(path), fingerprint_data(records)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF

    def rewritten() -> bool:  # the change time ticks coarsely: written again until it moved
        path.write_bytes(bytes(data))
        return os.stat(path).st_ctime_ns != before.st_ctime_ns

    until(rewritten, "the image's change time never moved")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns) and path.read_bytes() == data
    assert fingerprint_data(records) != key


def test_cache_file_is_keyed_by_model_data_and_split(tmp_path):
    base = cache_file(tmp_path, "enc", "data", "train")
    assert base.parent == tmp_path / CACHE_SUBDIR and base.name.startswith("train-")
    others = {cache_file(tmp_path, "enc2", "data", "train"), cache_file(tmp_path, "enc", "data2", "train"),
              cache_file(tmp_path, "enc", "data", "val")}  # fmt: skip
    assert base not in others and len(others) == 3


def test_cached_features_computed_once(tmp_path, records):
    calls = []

    def encode(images):
        calls.append(len(images))
        return torch.arange(len(images) * 2, dtype=torch.float32).reshape(-1, 2)

    kwargs = {"cache_dir": tmp_path / "cache", "encoder_key": "enc", "data_key": "data", "split": "train",
              "batch_size": 2, "progress": False}  # fmt: skip
    first = cached_features(records, encode, **kwargs)
    assert calls == [2, 2, 1] and first.shape == (5, 2)  # batches of 2, 2, 1
    again = cached_features(records, encode, **kwargs)
    assert calls == [2, 2, 1] and torch.equal(first, again)  # loaded, not recomputed
    entries = sorted((tmp_path / "cache" / "features").iterdir())
    files = [p for p in entries if not p.name.startswith(".")]
    assert len(files) == 1 and files[0].name.startswith("train-") and files[0].suffix == ".safetensors"
    assert entries == [lock_file(files[0]), files[0]]  # and the lock it was made under
    with safe_open(str(files[0]), "pt") as f:
        assert f.metadata() == {"encoder": "enc", "data": "data", "split": "train", "n": "5"}
    cached_features(records, encode, **{**kwargs, "encoder_key": "other"})
    assert len(calls) == 6  # another encoder: recomputed, into its own file
    assert len(list((tmp_path / "cache" / "features").glob("*.safetensors"))) == 2
    # The default data key is the fingerprint of the records' images.
    cached_features(records, encode, **{**kwargs, "data_key": None})
    assert len(calls) == 9
    assert cache_file(tmp_path / "cache", "enc", fingerprint_data(records), "train").exists()


def test_unreadable_cache_file_is_recomputed(tmp_path, records):
    calls = []

    def encode(images):
        calls.append(len(images))
        return torch.ones(len(images), 3)

    kwargs = {"cache_dir": tmp_path, "encoder_key": "enc", "split": "train", "progress": False}
    want = cached_features(records, encode, **kwargs)
    (path,) = (tmp_path / CACHE_SUBDIR).glob("*.safetensors")
    path.write_bytes(b"garbage")  # e.g. a foreign or truncated file
    assert torch.equal(cached_features(records, encode, **kwargs), want)
    assert len(calls) == 2 and torch.equal(cached_features(records, encode, **kwargs), want) and len(calls) == 2


def test_model_features_never_reuses_a_stale_cache(tmp_path, records):
    cfg = load(None, [f"run.cache_dir={tmp_path / 'cache'}"])
    model = StandIn()
    feats = model_features(model, records, cfg, "train", progress=False)
    # red channel of image i is 50 * i everywhere -> features (50 i * 1, 50 i * 2)
    expected = torch.tensor([[50.0 * i, 100.0 * i] for i in range(5)])
    assert torch.allclose(feats, expected)
    calls = model.encoder.calls
    assert torch.equal(model_features(model, records, cfg, "train", progress=False), feats)
    assert model.encoder.calls == calls  # cache hit
    with torch.no_grad():
        model.encoder.scale[1] = 3.0  # e.g. an encoder fine-tuned in place
    changed = model_features(model, records, cfg, "train", progress=False)
    assert model.encoder.calls > calls and torch.allclose(changed[:, 1], expected[:, 0] * 3)
    assert not any(Path(p).name.endswith(".tmp") for p in os.listdir(tmp_path / "cache" / "features"))


# ---------------------------------------------------------------------------------------------------------------------
# Several processes build one file, each its part (simulated with threads and a real all-gather between them)
# ---------------------------------------------------------------------------------------------------------------------


class Collective:
    """``all_gather`` among ``world`` threads: each puts its object in its slot, waits for the others, reads all (in
    rank order), and waits again so that no slot is overwritten before everyone has read it."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list = [None] * world
        self.rounds = [0] * world

    def gather(self, rank: int, obj):
        self.slots[rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        self.rounds[rank] += 1
        return out


def run_ranks(world: int, work) -> list:
    """``work(rank, ranks)`` in ``world`` threads that share one :class:`Collective`; their results, by rank."""
    collective = Collective(world)
    results, errors = [None] * world, []

    def target(rank: int) -> None:
        try:
            results[rank] = work(rank, Ranks(rank, world, functools.partial(collective.gather, rank), rank == 0))
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(e)
            collective.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def red_encoder(seen: list):
    """encode(pixels) -> (b, 2) features (mean red, 2 x mean red) of RedEncoder's preprocess; appends the red means
    of the images it encoded to ``seen``."""

    def encode(pixels):
        red = pixels[:, 0].mean(dim=(1, 2))  # (b,)
        seen.extend(red.tolist())
        return torch.stack([red, 2 * red], dim=1)  # (b, 2)

    return encode


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_build_equals_the_single_build(tmp_path, records, world):
    records = records + [Record(10 + r.image_id, r.path, "train") for r in records[:2]]  # 7 images
    preprocess = RedEncoder().preprocess
    single_seen: list = []
    kwargs = {"encoder_key": "enc", "split": "train", "batch_size": 2, "progress": False, "preprocess": preprocess}
    single = cached_features(records, red_encoder(single_seen), cache_dir=tmp_path / "single", **kwargs)
    assert len(single_seen) == 7

    seen: list[list] = [[] for _ in range(world)]
    out = run_ranks(world, lambda rank, ranks: cached_features(
        records, red_encoder(seen[rank]), cache_dir=tmp_path / "sharded", ranks=ranks, **kwargs))  # fmt: skip
    for tensor in out:
        assert torch.equal(tensor, single)  # every process holds the whole tensor
    # each process encoded only its contiguous part: 7 images over 2 -> 4 + 3, over 3 -> 3 + 2 + 2
    assert [len(s) for s in seen] == [len(process_slice(7, r, world)) for r in range(world)]
    assert sum(seen, []) == single_seen  # the parts, in rank order, are the records in order
    (written,) = (tmp_path / "sharded" / CACHE_SUBDIR).glob("*.safetensors")  # one file, by the writer
    assert written.name == cache_file(tmp_path / "single", "enc", fingerprint_data(records), "train").name
    assert torch.equal(load_file(str(written))["features"], single)

    # Read again: every process has the file, nobody encodes.
    again: list[list] = [[] for _ in range(world)]
    out = run_ranks(world, lambda rank, ranks: cached_features(
        records, red_encoder(again[rank]), cache_dir=tmp_path / "sharded", ranks=ranks, **kwargs))  # fmt: skip
    assert all(torch.equal(t, single) for t in out) and again == [[] for _ in range(world)]


def test_a_process_lacking_the_file_gets_it_from_the_others(tmp_path, records):
    # Two machines with their own cache folders: the first holds the file, the second does not. The second
    # computes its part only, the first sends its part from the file; both end with the whole tensor, the second
    # with the file too (each machine's main process writes).
    kwargs = {"encoder_key": "enc", "split": "train", "batch_size": 2, "progress": False,
              "preprocess": RedEncoder().preprocess}  # fmt: skip
    single = cached_features(records, red_encoder([]), cache_dir=tmp_path / "m0", **kwargs)
    seen: list[list] = [[], []]

    def work(rank, ranks):
        ranks = Ranks(rank, 2, ranks.all_gather, writes=True)  # both are the main process of their machine
        return cached_features(records, red_encoder(seen[rank]), cache_dir=tmp_path / f"m{rank}", ranks=ranks,
                               **kwargs)  # fmt: skip

    out = run_ranks(2, work)
    assert all(torch.equal(t, single) for t in out)
    assert seen[0] == [] and len(seen[1]) == len(process_slice(5, 1, 2)) == 2
    assert len(list((tmp_path / "m1" / CACHE_SUBDIR).glob("*.safetensors"))) == 1


def test_compute_features_in_workers_equals_main_process(records):
    preprocess = RedEncoder().preprocess
    main = compute_features(records, red_encoder([]), batch_size=2, progress=False, preprocess=preprocess)
    workers = compute_features(records, red_encoder([]), batch_size=2, progress=False, preprocess=preprocess,
                               loader=LoaderSettings(num_workers=2))  # fmt: skip
    assert torch.equal(main, workers) and main.shape == (5, 2)
    assert compute_features([], red_encoder([]), progress=False).shape == (0, 0)


# --------------------------------------------------------------------------------------------------------------------
# Two processes needing one feature file (one cache, two terminals or a job array)
# --------------------------------------------------------------------------------------------------------------------

PAUSED_BUILDER = (
    SAYS_WAITING
    + """
import logging, sys
from pathlib import Path
import torch
from finecap.data.features import cached_features
from finecap.data.records import Record

cache, computed, *images = sys.argv[1:]

def encode(images):
    with open(computed, "a") as f:
        f.write("computed\\n")
    print("computing", flush=True)
    sys.stdin.readline()  # the test says when to go on
    return torch.ones(len(images), 2)

records = [Record(i, path, "train") for i, path in enumerate(images)]
features = cached_features(records, encode, cache_dir=cache, encoder_key="enc", split="train", progress=False)
print("done", tuple(features.shape), flush=True)
"""
)


def _paused_builder(cache: Path, computed: Path, records) -> subprocess.Popen:
    """A process asking for the features of ``records``: prints ``computing`` (then waits for a line on its stdin)
    when it computes them, ``waiting`` when it waits for another's lock, ``done SHAPE`` at the end."""
    return subprocess.Popen([sys.executable, "-c", PAUSED_BUILDER, str(cache), str(computed),
                             *(str(r.path) for r in records)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip


@pytest.mark.slow
def test_two_processes_needing_one_feature_file_compute_it_once(tmp_path, records):
    """Two processes needing the same missing feature file both computed it (the last rename won), and the temporary
    file a writer killed before its rename left (``.<name>.<random>.tmp``, maybe hundreds of MB) stayed for ever. Now
    the second waits for the first's lock and reads its file, and the first removes that file's leftovers, nothing
    else."""
    cache, computed = tmp_path / "cache", tmp_path / "computed.txt"
    path = cache_file(cache, "enc", fingerprint_data(records), "train")
    path.parent.mkdir(parents=True)
    leftover = path.with_name(f".{path.name}.k2x9a1zq.tmp")  # a killed writer's, of this very file
    other = path.with_name(f".{path.name[:-12]}0.safetensors.k2x9a1zq.tmp")  # of another file: not this lock's
    mine = path.parent / "notes.txt"  # the user's own
    for planted in (leftover, other, mine):
        planted.write_bytes(b"x" * 100)
    first = _paused_builder(cache, computed, records)
    second = None
    try:
        assert first.stdout.readline() == "computing\n"
        assert not leftover.exists(), "the killed writer's temporary file of this feature file stayed"
        second = _paused_builder(cache, computed, records)
        assert second.stdout.readline() == "waiting\n", "the second process computed the features again"
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.stdout.readline() == "done (5, 2)\n"
        assert second.stdout.readline() == "done (5, 2)\n"  # read from the first's file
        assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert computed.read_text() == "computed\n"
    assert other.read_bytes() == b"x" * 100 and mine.read_bytes() == b"x" * 100
    assert load_file(str(path))["features"].shape == (5, 2)
