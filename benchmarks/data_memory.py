"""Memory of building the training data set of a Hugging Face data set with embedded images: finecap's lazy reader
against the eager one it replaced, in the same run, against the size of the images.

    .venv/bin/python benchmarks/data_memory.py [--images 3000] [--side 256] [--rev GIT_REVISION] [--json OUT]

A ``datasets.Dataset`` of ``--images`` random ``--side`` x ``--side`` JPEGs (quality 90; noise, so they do not
compress: about 60 kB each at 256 px) with five captions each is saved with ``save_to_disk`` into a temporary
folder: the layout of a COCO copy made with ``datasets``, at 1/40 of its 123k images. Then, each in its own child
process after its imports, the training data set is built as ``finecap train`` builds it for a trained encoder (no
feature cache): the ``train`` records (``finecap.data.datasets.load_records``) and the per-caption examples
(``CaptionDataset``). Measured: the peak resident memory the build added (``VmHWM`` after, minus ``VmRSS`` before,
the kernel's peak reset at the start: ``peak_rss.py``) and, after it, the allocated part
(``RssAnon``) and the mapped file pages (``RssFile``: the page cache, which the kernel may drop).

- ``eager``: the reader before the lazy one, reproduced here step for step (``datasets.load_from_disk``, the image
  column cast to undecoded, ``select_columns(...).to_dict()``, one record per row holding its image's bytes, as
  ``finecap.data.formats.hf.read_hf`` did until the lazy reader; the rest of the build is finecap's own);
- ``lazy``: finecap as it is (``finecap.data.formats.hf``: records hold a reference to their row, the image column
  stays memory-mapped);
- ``finecap@REV`` (``--rev``): finecap's sources at a git revision (``git archive``), e.g. the commit before the
  lazy reader, to check the reproduction.

It also decodes 64 items of the lazy data set, as a DataLoader worker does, and reports what that added (the images
read, decoded and freed). Ratios printed: each build's peak / the images' size, and eager / lazy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = 5


def make_dataset(folder: Path, n: int, side: int) -> int:
    """Save ``n`` random JPEGs with captions as a ``datasets`` data set in ``folder``; returns the images' bytes."""
    import io

    import datasets
    import numpy as np
    from PIL import Image

    datasets.disable_progress_bars()
    rng = np.random.default_rng(0)

    def rows(start: int, stop: int) -> dict:
        images = []
        for _ in range(start, stop):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
            images.append({"bytes": buf.getvalue(), "path": None})
        return {"image": images, "captions": [[f"a picture number {i} caption {j}" for j in range(CAPTIONS)]
                                               for i in range(start, stop)]}  # fmt: skip

    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})

    def generate():
        for start in range(0, n, 500):  # in chunks: this process does not hold every image at once either
            chunk = rows(start, min(n, start + 500))
            for i in range(len(chunk["image"])):
                yield {"image": chunk["image"][i], "captions": chunk["captions"][i]}

    ds = datasets.Dataset.from_generator(generate, features=features, cache_dir=str(folder / "hf-cache"))
    ds.save_to_disk(str(folder / "train"))
    table = datasets.load_from_disk(str(folder / "train")).data
    import pyarrow.compute as pc

    return int(pc.sum(pc.binary_length(pc.struct_field(table.column("image"), "bytes"))).as_py())


# --------------------------------------------------------------------------------------------------------------------
# One measurement (in a child process)
# --------------------------------------------------------------------------------------------------------------------


def eager_records(path: Path) -> list:
    """The eager reader, reproduced: every row's image bytes in a record (what read_hf did before it was lazy)."""
    import datasets

    from finecap.data.records import Record

    ds = datasets.load_from_disk(str(path))
    ds = ds.cast_column("image", datasets.Image(decode=False))
    table = ds.select_columns(["image", "captions"]).to_dict()
    return [Record(f"train/{i}", Path(f"train/{i}"), "train", list(table["captions"][i]),
                   image_bytes=table["image"][i]["bytes"]) for i in range(len(ds))]  # fmt: skip


def measure(mode: str, path: Path) -> dict:
    import gc

    import datasets  # noqa: F401 (imported before the measurement, as finecap's own imports are)
    import torch  # noqa: F401

    from finecap.config import load
    from finecap.data.datasets import CaptionDataset, load_records
    from peak_rss import peak_bytes, reset_peak, status_kb

    cfg = load(None, ["data.format=hf", f"data.path={path}"])
    gc.collect()
    before = reset_peak()
    anon, file = status_kb("RssAnon"), status_kb("RssFile")
    records = eager_records(path) if mode == "eager" else load_records(cfg, "train")
    dataset = CaptionDataset(records, per_caption=True)
    built = {"peak_mb": (peak_bytes() - before) / 2**20, "anon_mb": (status_kb("RssAnon") - anon) / 1024,
             "file_mb": (status_kb("RssFile") - file) / 1024, "examples": len(dataset)}  # fmt: skip
    if mode == "lazy":  # a worker's reads: 64 items decoded one by one
        before = reset_peak()
        for i in range(0, 64 * CAPTIONS, CAPTIONS):
            dataset[i]["image"].load()
        built["items_peak_mb"] = (peak_bytes() - before) / 2**20
    return built


# --------------------------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------------------------


def child(mode: str, path: Path, src: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(Path(__file__).parent)]),
           "TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}  # fmt: skip
    cmd = [sys.executable, __file__, "--child", json.dumps({"mode": mode, "path": str(path)})]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--rev", default=None, help="also measure finecap's sources at this git revision")
    parser.add_argument("--json", default=None, help="write the results as JSON")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["mode"], Path(spec["path"]))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        size = make_dataset(Path(tmp), args.images, args.side)
        data = Path(tmp) / "train"
        print(f"{args.images} embedded {args.side}x{args.side} JPEGs: {size / 2**20:.1f} MB of images "
              f"({size / args.images / 1024:.1f} kB each), {CAPTIONS} captions each", flush=True)  # fmt: skip
        runs = [("eager", "eager", ROOT / "src"), ("lazy", "lazy", ROOT / "src")]
        if args.rev:
            old = Path(tmp) / "old"
            old.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev, "src"], capture_output=True,
                                     check=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            runs.append((f"finecap@{args.rev}", "old", old / "src"))
        results = {}
        for name, mode, src in runs:
            row = results[name] = child(mode, data, src)
            extra = f"; then 64 items decoded: +{row['items_peak_mb']:.1f} MB peak" if "items_peak_mb" in row else ""
            print(f"{name:<18} peak +{row['peak_mb']:7.1f} MB ({row['peak_mb'] * 2**20 / size:5.3f} x the images)  "
                  f"after: allocated +{row['anon_mb']:7.1f} MB, mapped file +{row['file_mb']:6.1f} MB  "
                  f"({row['examples']} examples){extra}", flush=True)  # fmt: skip
    eager, lazy = results["eager"]["peak_mb"], results["lazy"]["peak_mb"]
    print(f"\n{machine_line()}")
    print(f"ratios in this run: eager / lazy peak {eager / lazy:.1f}x; lazy peak / images "
          f"{lazy * 2**20 / size:.3f}; eager peak / images {eager * 2**20 / size:.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "images": args.images, "side": args.side,
                                               "bytes": size, "results": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
