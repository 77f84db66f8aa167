"""End to end on realistic raw text: ``finecap eval`` vs a pycocoevalcap ``COCOEvalCap``-equivalent script.

    .venv/bin/python benchmarks/eval_end_to_end.py [--images 8000] [--repeat 3] [--scaling 5000,50000,200000]
                                                   [--lmms-images 2000] [--json OUT] [--work DIR]

Data: :mod:`coco_like` (seeded COCO-like raw captions: capitalised, punctuated, Zipfian ~10k-type vocabulary, 8-20
words, 5 references per image), written once as a COCO reference file and a COCO results file.

1. **End to end** (the number a user replacing pycocoevalcap sees): two subprocesses on the same files, each the best
   wall time of ``--repeat`` runs, interleaved:

   - reference: a script doing what ``COCOEvalCap.evaluate`` does for BLEU-1..4, ROUGE-L and CIDEr-D (pycocotools
     ``COCO`` + ``loadRes``, pycocoevalcap's Java ``PTBTokenizer``, ``Bleu(4)``, ``Rouge()``, ``Cider()``; METEOR and
     SPICE left out on both sides);
   - ``finecap eval --predictions results.json --references captions.json --metrics bleu,rouge,cider --format json``.

   Both print their scores; the largest absolute difference is printed (it must be ~1e-15). Peak memory (max RSS)
   and CPU time (user + sys) come from ``/usr/bin/time``. Both sides run with compiled bytecode, as installed
   packages have it: the subprocesses get a temporary ``PYTHONPYCACHEPREFIX`` (and no ``PYTHONDONTWRITEBYTECODE``,
   which some sandboxes set: finecap, installed editable, would then recompile its sources on every run, while
   pycocoevalcap and numpy come precompiled in site-packages) and one untimed warm-up run each.
2. **Per metric** (in this process, on the same text after tokenisation, best of ``--repeat``): PTB tokenizer
   (pycocoevalcap's Java one vs :func:`finecap.metrics.ptb_tokenize.ptb_tokenize`), then BLEU, ROUGE-L, CIDEr-D
   (pycocoevalcap's ``compute_score`` vs finecap's ``*_per_item``, both giving corpus and per-image scores), as CPU
   time of this process (``time.process_time``; robust to other jobs on a shared machine; the Java tokenizer runs in
   a child process, so it is timed by the wall clock).
3. **Scaling** (``--scaling``): ``finecap eval`` alone on 5k, 50k, 200k images: wall and CPU time, CPU microseconds
   per image, peak memory and kilobytes per image, so that a user knows what a large corpus costs.

4. **lmms-eval's per-metric pattern** (``--lmms-images``, 0 to skip): the aggregation of lmms-eval's COCO caption
   task (``tasks/coco_cap/utils.py``: for each of its 7 metrics, build every scorer (``Meteor()`` starts a JVM), a
   COCO index, ``COCOEvalCap`` for its params, run ``PTBTokenizer`` (a JVM) on gts and res, then one scorer), run
   unmodified in a subprocess on pycocoevalcap, and the same script on ``finecap.compat`` (``finecap.compat.install()``
   first): best wall and CPU time of ``--repeat`` runs each, their ratio, and the largest score difference.

On a shared machine the wall clock swings with other jobs; CPU times (from ``/usr/bin/time``, child processes such as
the Java tokenizer included) are printed next to it and are the steadier comparison.

Targets (issues 11 and 23): end to end >= 15x; CIDEr-D >= 25x, BLEU >= 10x, ROUGE-L >= 10x; cost per image flat
within 1.5x from 5k to 200k images. ``--json OUT`` writes every row.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import coco_like  # noqa: E402
import lmms_eval_coco_cap  # noqa: E402
from finecap.utils.text import shell_command
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

TARGETS = {"end_to_end": 15.0, "bleu": 10.0, "rouge_l": 10.0, "cider_d": 25.0, "lmms_eval": 20.0}

# lmms-eval's coco_cap aggregation (lmms_eval_coco_cap.py) as that task runs it, once per metric; argv: references
# file, results file, "finecap" to run it on finecap.compat.install()
LMMS_SCRIPT = (
    "import json, sys\nif sys.argv[3] == 'finecap':\n    import finecap.compat\n    finecap.compat.install()\n"
    + lmms_eval_coco_cap.SOURCE
    + f"""
COCO_METRICS = {lmms_eval_coco_cap.COCO_METRICS!r}
refs = json.load(open(sys.argv[1]))
by_image = {{}}
for a in refs["annotations"]:
    by_image.setdefault(a["image_id"], []).append(a["caption"])
results = [{{"image_id": r["image_id"], "pred": r["caption"], "answer": by_image[r["image_id"]]}}
           for r in json.load(open(sys.argv[2]))]
out = {{m: float(coco_aggregation_result(results, m)) for m in COCO_METRICS}}
print(json.dumps(out))
"""
)

REFERENCE_SCRIPT = r"""
import json, sys
from pycocotools.coco import COCO
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.cider.cider import Cider

# COCOEvalCap.evaluate (pycocoevalcap/eval.py) without METEOR and SPICE
coco = COCO(sys.argv[1])
coco_result = coco.loadRes(sys.argv[2])
img_ids = coco_result.getImgIds()
gts = {i: coco.imgToAnns[i] for i in img_ids}
res = {i: coco_result.imgToAnns[i] for i in img_ids}
tokenizer = PTBTokenizer()
gts, res = tokenizer.tokenize(gts), tokenizer.tokenize(res)
out = {}
for scorer, names in [(Bleu(4), ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"]), (Rouge(), "ROUGE-L"), (Cider(), "CIDEr-D")]:
    score, scores = scorer.compute_score(gts, res)
    out.update(zip(names, score) if isinstance(names, list) else {names: score})
print(json.dumps(out))
"""


_ENV: dict[str, str] = dict(os.environ)  # the subprocesses' environment (main() sets the bytecode cache)


def _timed(cmd: list[str]) -> dict:
    """Run ``cmd`` under /usr/bin/time: {"wall", "cpu", "maxrss_kb", "stdout"}; errors raise with stderr."""
    fmt = "__TIME__ %e %U %S %M"
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", fmt, *cmd], capture_output=True, text=True, check=False, env=_ENV)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{shell_command(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = [x for x in proc.stderr.splitlines() if x.startswith("__TIME__")][-1].split()
    return {"wall": wall, "cpu": float(line[2]) + float(line[3]), "maxrss_kb": int(line[4]), "stdout": proc.stdout}


def _finecap_cmd(refs: Path, res: Path) -> list[str]:
    exe = Path(sys.executable).parent / "finecap"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "finecap"]
    return cmd + ["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "bleu,rouge,cider",
                  "--format", "json"]  # fmt: skip


def _scores(stdout: str) -> dict[str, float]:
    start = stdout.rindex("\n{") + 1 if "\n{" in stdout else stdout.index("{")
    return json.loads(stdout[start:])


def end_to_end(refs: Path, res: Path, repeat: int) -> dict:
    ref_cmd = [sys.executable, "-c", REFERENCE_SCRIPT, str(refs), str(res)]
    runs: dict[str, list[dict]] = {"reference": [], "finecap": []}
    _timed(ref_cmd), _timed(_finecap_cmd(refs, res))  # warm-up: bytecode compiled, files in the page cache
    for _ in range(repeat):  # interleaved, so that a burst of load on the machine hits both
        runs["reference"].append(_timed(ref_cmd))
        runs["finecap"].append(_timed(_finecap_cmd(refs, res)))
    best = {k: min(v, key=lambda r: r["wall"]) for k, v in runs.items()}
    a, b = _scores(best["reference"]["stdout"]), _scores(best["finecap"]["stdout"])
    diff = max(abs(a[k] - b[k]) for k in a)
    return {
        "reference_s": best["reference"]["wall"],
        "finecap_s": best["finecap"]["wall"],
        "ratio": best["reference"]["wall"] / best["finecap"]["wall"],
        "cpu_ratio": min(r["cpu"] for r in runs["reference"]) / min(r["cpu"] for r in runs["finecap"]),
        "reference_cpu_s": best["reference"]["cpu"],
        "finecap_cpu_s": best["finecap"]["cpu"],
        "reference_maxrss_mb": best["reference"]["maxrss_kb"] / 1024,
        "finecap_maxrss_mb": best["finecap"]["maxrss_kb"] / 1024,
        "max_abs_diff": diff,
        "scores": b,
    }


def lmms_pattern(refs: Path, res: Path, repeat: int) -> dict:
    """Section 4 of the module docstring: lmms-eval's aggregation on pycocoevalcap vs on finecap.compat."""
    sides = ("pycocoevalcap", "finecap")
    cmds = {side: [sys.executable, "-c", LMMS_SCRIPT, str(refs), str(res), side] for side in sides}
    runs: dict[str, list[dict]] = {side: [] for side in cmds}
    _timed(cmds["finecap"])  # warm-up: bytecode compiled, METEOR's paraphrase index built
    for _ in range(repeat):
        for side, cmd in cmds.items():
            runs[side].append(_timed(cmd))
    best = {k: min(v, key=lambda r: r["wall"]) for k, v in runs.items()}
    a, b = _scores(best["pycocoevalcap"]["stdout"]), _scores(best["finecap"]["stdout"])
    return {
        "reference_s": best["pycocoevalcap"]["wall"],
        "finecap_s": best["finecap"]["wall"],
        "ratio": best["pycocoevalcap"]["wall"] / best["finecap"]["wall"],
        "reference_cpu_s": min(r["cpu"] for r in runs["pycocoevalcap"]),
        "finecap_cpu_s": min(r["cpu"] for r in runs["finecap"]),
        "cpu_ratio": min(r["cpu"] for r in runs["pycocoevalcap"]) / min(r["cpu"] for r in runs["finecap"]),
        "max_abs_diff": max(abs(a[k] - b[k]) for k in a),
        "scores": b,
    }


def _best(fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.process_time) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = clock()
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
        best = min(best, clock() - t)
    return best


def per_metric(refs_raw: dict, preds_raw: dict, repeat: int) -> dict[str, dict[str, float]]:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from finecap.metrics.ngram import bleu_per_item, cider_d_per_item, rouge_l_per_item
    from finecap.metrics.ptb_tokenize import ptb_tokenize

    coco_refs = {i: [{"caption": c} for c in caps] for i, caps in refs_raw.items()}
    coco_preds = {i: [{"caption": c}] for i, c in preds_raw.items()}
    rows: dict[str, dict[str, float]] = {}

    def java_tok():
        with contextlib.redirect_stderr(io.StringIO()):
            PTBTokenizer().tokenize(coco_refs), PTBTokenizer().tokenize(coco_preds)

    def ours_tok():
        ptb_tokenize(refs_raw), ptb_tokenize({i: [c] for i, c in preds_raw.items()})

    rows["ptb_tokenize"] = {"reference_s": _best(java_tok, repeat, time.perf_counter),
                            "finecap_s": _best(ours_tok, repeat, time.perf_counter)}  # fmt: skip
    gts = ptb_tokenize(refs_raw)
    res_list = ptb_tokenize({i: [c] for i, c in preds_raw.items()})
    res = {i: c[0] for i, c in res_list.items()}
    for name, ref_fn, ours_fn in [
        ("bleu", lambda: Bleu(4).compute_score(gts, res_list), lambda: bleu_per_item(res, gts)),
        ("rouge_l", lambda: Rouge().compute_score(gts, res_list), lambda: rouge_l_per_item(res, gts)),
        ("cider_d", lambda: Cider().compute_score(gts, res_list), lambda: cider_d_per_item(res, gts)),
    ]:
        rows[name] = {"reference_s": _best(ref_fn, repeat), "finecap_s": _best(ours_fn, repeat)}
    for r in rows.values():
        r["ratio"] = r["reference_s"] / r["finecap_s"]
    return rows


def scaling(sizes: list[int], work: Path, seed: int) -> list[dict]:
    rows = []
    for k, n in enumerate(sizes):
        refs, res = coco_like.write_coco(work / f"n{n}", n, seed)
        if k == 0:
            _timed(_finecap_cmd(refs, res))  # warm-up: bytecode compiled, files in the page cache
        r = _timed(_finecap_cmd(refs, res))
        rows.append({"images": n, "wall_s": r["wall"], "cpu_s": r["cpu"], "us_per_image": r["wall"] / n * 1e6,
                     "cpu_us_per_image": r["cpu"] / n * 1e6,
                     "maxrss_mb": r["maxrss_kb"] / 1024, "kb_per_image": r["maxrss_kb"] / n})  # fmt: skip
        print(f"  {n:>7} images: {r['wall']:7.2f} s wall, {r['cpu']:.2f} s CPU ({r['cpu'] / n * 1e6:6.1f} us/image), "
              f"peak {r['maxrss_kb'] / 1024:7.0f} MB ({r['maxrss_kb'] / n:5.2f} KB/image)", flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=8000, help="images of the end-to-end and per-metric comparison")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scaling", default="5000,50000,200000", help="comma-separated sizes ('' to skip)")
    ap.add_argument("--skip-compare", action="store_true", help="only the scaling rows")
    ap.add_argument("--work", default=None, help="folder for the generated files (default: a temporary one)")
    ap.add_argument("--lmms-images", type=int, default=2000, help="images of lmms-eval's per-metric pattern (0: skip)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        _ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        _ENV["PYTHONPYCACHEPREFIX"] = tmp + "/pycache"
        out: dict = {"machine": machine(), "images": args.images}
        print(machine_line())
        if not args.skip_compare:
            refs, res = coco_like.write_coco(work / f"n{args.images}", args.images, args.seed)
            print(f"{args.images} images, 5 references each (benchmarks/coco_like.py, seed {args.seed})")
            e = out["end_to_end"] = end_to_end(refs, res, args.repeat)
            print(f"end to end: pycocoevalcap-equivalent {e['reference_s']:.2f} s ({e['reference_cpu_s']:.2f} s CPU, "
                  f"peak {e['reference_maxrss_mb']:.0f} MB), finecap eval {e['finecap_s']:.2f} s "
                  f"({e['finecap_cpu_s']:.2f} s CPU, peak {e['finecap_maxrss_mb']:.0f} MB): "
                  f"{e['ratio']:.1f}x wall, {e['cpu_ratio']:.1f}x CPU (target >= {TARGETS['end_to_end']:.0f}x); "
                  f"max |score difference| {e['max_abs_diff']:.1e}", flush=True)  # fmt: skip
            refs_raw, preds_raw = coco_like.generate(args.images, args.seed)
            rows = out["per_metric"] = per_metric(refs_raw, preds_raw, args.repeat)
            for name, r in rows.items():
                target = f" (target >= {TARGETS[name]:.0f}x)" if name in TARGETS else ""
                print(f"{name:>13}: pycocoevalcap {r['reference_s']:.3f} s, finecap {r['finecap_s']:.3f} s, "
                      f"{r['ratio']:.1f}x{target}")  # fmt: skip
        if args.lmms_images:
            refs, res = coco_like.write_coco(work / f"lmms{args.lmms_images}", args.lmms_images, args.seed)
            e = out["lmms_eval"] = lmms_pattern(refs, res, args.repeat)
            print(f"lmms-eval's per-metric pattern ({args.lmms_images} images, 7 metrics): pycocoevalcap "
                  f"{e['reference_s']:.2f} s ({e['reference_cpu_s']:.2f} s CPU), finecap.compat "
                  f"{e['finecap_s']:.2f} s ({e['finecap_cpu_s']:.2f} s CPU): {e['ratio']:.1f}x wall, "
                  f"{e['cpu_ratio']:.1f}x CPU (target >= {TARGETS['lmms_eval']:.0f}x); max |score difference| "
                  f"{e['max_abs_diff']:.1e}", flush=True)  # fmt: skip
        sizes = [int(x) for x in args.scaling.split(",") if x.strip()]
        if sizes:
            print("scaling (finecap eval --metrics bleu,rouge,cider):")
            rows = out["scaling"] = scaling(sizes, work, args.seed)
            per = [r["us_per_image"] for r in rows]
            cpu = [r["cpu_us_per_image"] for r in rows]
            print(f"  cost per image, largest / smallest: {max(per) / min(per):.2f} wall, {max(cpu) / min(cpu):.2f} "
                  "CPU (target <= 1.5)")  # fmt: skip
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
            print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
