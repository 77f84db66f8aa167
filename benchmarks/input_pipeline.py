"""Images per second of finecap's input pipeline against a bare loop (PIL open + the same image processor), with 0
and 2 DataLoader workers, in the same run.

    .venv/bin/python benchmarks/input_pipeline.py [--images 200] [--batch 32] [--repeat 3] [--workers 0,2]
                                                  [--json OUT]

Data: ``--images`` generated 640x480 photo-like JPEGs (quality 90) in an image folder with a ``captions.jsonl``
sidecar (``data.format=folder``), on local disk and read once before timing (the page cache holds them: this
measures decoding and processing, not the disk). Processor: ``CLIPImageProcessor()`` built from its defaults (no
download: shortest edge 224, centre crop 224, the ViT-B/32 settings), the one ``openai/clip-vit-base-patch32``
ships; the slow (PIL) backend, as transformers falls back to without torchvision.

- ``bare``: for each batch of ``--batch`` paths, ``PIL.Image.open(path).convert("RGB")`` and one
  ``processor(images=batch, return_tensors="pt")`` call: the least a loop can do;
- ``finecap, N workers``: what training (a trained encoder) and captioning read: ``load_records`` of the folder,
  ``CaptionDataset`` (finecap's checked decode: format whitelist, decompression-bomb limit, EXIF orientation),
  ``CaptionCollator`` (captions tokenised too, with the world tokenizer: work the bare loop does not do) with the
  same processor call, through :meth:`finecap.data.loading.LoaderSettings.loader` with N workers (their start-up
  included: one loader per pass, as captioning builds one); with ``data.jpeg_draft`` on (finecap's default: the
  JPEGs decoded at 320x240, still >= 224) and off (full decodes, the bare loop's pixels).

Each variant runs ``--repeat`` times, interleaved; the best time counts, with the CPU time it took (this process
and its finished children, the workers: user + system). Ratios: finecap / bare images per second (target: >= 1
with 0 workers), the same in CPU time per image (what the load of the machine moves least), and N workers / 0
workers (target: scaling with workers). The machine this was written on has 2 cores shared with other jobs: 2
workers compete with them, so the scaling is bounded by 2 and by the load (printed with the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)


def make_folder(folder: Path, n: int) -> None:
    """``n`` photo-like 640x480 JPEGs (smooth colour fields plus grain) and a captions.jsonl sidecar."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        coarse = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((640, 480), Image.BICUBIC)).astype(np.int16)
        pixels = np.clip(smooth + rng.integers(-12, 13, (480, 640, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:04d}.jpg", "JPEG", quality=90)
        lines.append(json.dumps({"image": f"{i:04d}.jpg", "captions": [f"a photo number {i} of a thing"]}))
    (folder / "captions.jsonl").write_text("\n".join(lines) + "\n")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children, the DataLoader workers: those that finished
    (``getrusage``) and those alive (persistent workers: ``/proc/<pid>/stat``)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    pid = os.getpid()
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile: counted by getrusage once reaped
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def bare(paths: list[Path], processor, batch: int) -> int:
    from PIL import Image

    done = 0
    for start in range(0, len(paths), batch):
        images = [Image.open(p).convert("RGB") for p in paths[start : start + batch]]
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        done += len(pixels)
    return done


def finecap(folder: Path, processor, batch: int, workers: int, draft: bool, kept: bool = False):
    """A pass of finecap's loader over the folder (a callable returning the images done); the data set and the
    collator are built once, outside the timing, as a run builds them once. The DataLoader (and its workers) is
    built in each pass, as captioning and the feature cache build theirs; ``kept``: built once with persistent
    workers and run once before the timing, as training's (a pass is then a later epoch)."""
    from finecap.config import load
    from finecap.data.datasets import CaptionCollator, CaptionDataset, load_records
    from finecap.data.loading import LoaderSettings, chunks, encoder_draft
    from finecap.models.tokenizer import world_tokenizer

    cfg = load(None, ["data.format=folder", f"data.path={folder}", f"data.jpeg_draft={str(draft).lower()}",
                      f"data.num_workers={workers}"])  # fmt: skip

    class Encoder:
        image_processor = processor

        @staticmethod
        def preprocess(images):
            return processor(images=images, return_tensors="pt")["pixel_values"]

    records = load_records(cfg, "train")
    dataset = CaptionDataset(records, per_caption=False, draft=encoder_draft(Encoder, cfg.data))
    collate = CaptionCollator(world_tokenizer(), cfg.data.max_tokens, preprocess=Encoder.preprocess)
    settings = LoaderSettings.of(cfg.data, "cpu", per_run=kept)
    batches = chunks(range(len(dataset)), batch)
    kept_loader = settings.loader(dataset, batches, collate) if kept else None

    def run() -> int:
        loader = kept_loader or settings.loader(dataset, batches, collate)
        return sum(len(b["pixel_values"]) for b in loader)

    if kept:
        run()  # the first epoch starts the workers
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--json", default=None, help="write the results as JSON")
    args = parser.parse_args()

    import torch
    from transformers import CLIPImageProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)  # the processor is PIL + numpy; one thread per process, as in DataLoader workers
    processor = CLIPImageProcessor()
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_folder(folder, args.images)
        paths = sorted(folder.glob("*.jpg"))
        for p in paths:  # into the page cache
            p.read_bytes()
        variants = {"bare": lambda: bare(paths, processor, args.batch)}
        for w in workers:
            for kept in (False, True) if w else (False,):
                for draft in (False, True):
                    name = f"finecap, {w} workers{' kept' if kept else ''}, draft {'on' if draft else 'off'}"
                    variants[name] = finecap(folder, processor, args.batch, w, draft, kept)
        best: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, run in variants.items():
                used = cpu_seconds()
                start = time.perf_counter()
                n = run()
                elapsed = time.perf_counter() - start
                assert n == args.images, (name, n)
                if elapsed < best.get(name, float("inf")):
                    best[name], cpu[name] = elapsed, cpu_seconds() - used
    rate = {name: args.images / t for name, t in best.items()}
    load = os.getloadavg()[0]
    print(f"{args.images} 640x480 JPEGs, batches of {args.batch}, CLIPImageProcessor (224), best of {args.repeat}; "
          f"{os.cpu_count()} cores, load average {load:.1f}")  # fmt: skip
    print(machine_line())
    for name, r in rate.items():
        print(f"  {name:<37} {r:7.1f} images/s  ({1000 / r:5.2f} ms per image; CPU, workers included: "
              f"{1000 * cpu[name] / args.images:5.2f} ms per image)")  # fmt: skip
    print("ratios in this run:")
    for name in rate:
        if name == "bare":
            continue
        draft = name.rsplit(" ", 1)[1]
        base = f"finecap, 0 workers, draft {draft}"
        scaling = f"; / 0 workers {rate[name] / rate[base]:.2f}" if name != base and base in rate else ""
        print(f"  {name:<37} / bare {rate[name] / rate['bare']:.2f} (CPU per image: bare / this "
              f"{cpu['bare'] / cpu[name]:.2f}){scaling}")  # fmt: skip
    if args.json:
        out = {"machine": machine(), "images": args.images, "batch": args.batch, "load": load, "images_per_s": rate,
               "cpu_s": cpu}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
