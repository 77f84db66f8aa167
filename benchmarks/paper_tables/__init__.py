"""The four papers' tables on the embedded world: one command per paper runs its ablation grid and writes
``docs/reproductions/<paper>.md``, the paper's numbers beside finecap's world analogue with a verdict per row.

    nice -n 10 python benchmarks/paper_tables.py --paper sle                  # every runnable table, seeds 0,1
    python benchmarks/paper_tables.py --paper smile --tables 1,5 --seeds 0,1,2
    python benchmarks/paper_tables.py --paper smile --quick                   # tiny world, a few steps per run
    python benchmarks/paper_tables.py --paper ndlb --page-only                # rewrite the page from the results
    python benchmarks/paper_tables.py --paper smile --list                    # the tables, rows and runs

Tables are data (:data:`PAPERS`): each :class:`Table` lists its :class:`Row` s with the paper's numbers (one per
:class:`Column`, ``None`` where the paper reports none), the world run that stands in for the row (a key of
:data:`RUNS`: a demo recipe, the overrides that make the row, and the run whose best checkpoint it starts from), and
the rows it is judged against (``vs``). A row the world cannot make names no run and says why
(``Row(..., run=None, why=...)``); a table whose world rows are not defined at all would have ``runnable=False``
(its rows print as "not run yet"; none is left).

What a run trains on (:class:`Run`): the world's human captions, a field of the world's Visual Caption Boosting data
set (``captions="blend"`` / ``"holistic"``: made once per seed as the demo's ``vcb`` stages make it, the visual
expert then ``finecap boost``; such a run is scored against the references of its own field, as NDLB scores models
trained on boosted captions, and beside that against the human references and a length-matched baseline,
:func:`.evaluation.boosted_field_metrics`), or a simplified corpus of the world's images (``corpus=``, SMILE
Fig. 4b). What a run is evaluated on: the test split, with the paper's metric groups and bags (NDLB's from HolisticCap,
:attr:`Paper.bags_from`); and, when a column of the paper reads it, the shifted domain's test split (``shifted/``
keys: DiscriTune's cross-domain columns, as the demo's ``transfer`` stage) or the scene-family test world
(``family/`` keys: the ImageCoDe analogue, :mod:`finecap.metrics.families`), both captioned zero-shot.

Runs, checkpoints and resume: every seed has its own world (``world.seed=N``) and run seed (``run.seed=N``) and one
folder ``<runs>/seed<N>/`` holding one run directory per trained run, shared by every table and paper that uses it: one
MLE start (``mle``) per seed, from which the other rows start. A run is trained once (its ``DONE`` marker); a killed
training resumes from its last checkpoint. After training, the run is evaluated for the paper (the paper's metric
groups, :attr:`Paper.metrics`) and the numbers are written to ``<data>/<paper>/seed<N>/<run>.json``: a run whose
result file exists is skipped, so the runner can be killed and started again, a row at a time, for hours. The page is
rewritten from all result files after every run (seeds present in the folder, not only those asked for now).

Verdicts (:func:`row_verdict`, :mod:`.verdicts`): a row judged against row ``b`` is judged column by column. The
paper's effect is ``sign(paper[row] - paper[b])``, or 0 ("no change", shown ``=``) when the two numbers differ by less
than :attr:`Column.same` (0.5 in the paper's unit by default: the paper's "comparable"; 0.005 for fractions such as
Div-n) or the row states 0 (``Row.expect``). The world's difference ``d_s = world[row] - world[b]`` (the paper's unit)
is compared with its noise, two estimates:

- per seed, when both runs' items files (``<run>.items.json``) hold per-image values of the column's key for the same
  test images: the 95% percentile interval of the mean per-image difference, ``paired_difference.paired_bootstrap``
  with 2,000 resamples and seed 0 (a page is the same every time it is made; 2,000 rather than 10,000 because a page
  judges hundreds of cells). Its outcome: *holds* (excludes 0 with the paper's sign), *reversed* (the opposite sign),
  *within noise* (covers 0); for a no-change column, covering 0 *holds* and excluding it is *changed*.
- over ``n >= 2`` seeds: the 95% Student-t interval of the mean difference, ``mean(d) ± t(0.975, n-1) sd(d)/√n``,
  judged the same way. Seeds are different worlds and initialisations, so this is the training-and-world noise that
  the test split's bootstrap cannot see; with two seeds its t quantile is 12.7, so it clears only differences that
  barely vary between worlds.

The cell's verdict: when every seed has a test-image interval, the seeds' own outcomes decide: *holds* / *reversed* /
*within noise* / *changed* when every seed says so (an effect significant on each independently trained world is a
replicated effect, whatever a one-degree-of-freedom interval says of its size, which the cell prints), *mixed*
otherwise (say, a seed that holds beside one within noise, or two seeds significant in opposite directions); when some
seed lacks per-image values, the seeds' interval alone (*within the seeds' spread* when it covers 0); *no noise
estimate* with one seed and no per-image values (result files older than the items files, or a key with no per-image
values: BLEU-4, METEOR, distinct words, mBLEU-4, perplexity; the exploration paper's Table 4 has them for its Div-n and
CIDEr-D columns, ``sample/`` and ``beam/``) -- never a verdict by sign alone. A no-change cell that holds says the
world shows no difference its noise can tell, which a wide interval always allows: the cell prints Δ and the interval's
half-width so a reader sees how wide. The row: *holds* when every judged column holds, *partly holds* when some do,
*reversed* when every one reverses, *does not hold* when none holds and one is reversed or changed, *within noise* when
every one is within noise or the seeds' spread, *no noise estimate* when none has one, *undecided* otherwise; the cell
lists each column as ``label arrow verdict (per seed: counts; Δ ...)``. Rows the world cannot make say why ("not
comparable: ..."). A table may also name the row the paper chose among a grid (:class:`Best`, e.g. the exploration
paper's α = 0.75): the verdict says whether it is the world's best on the mean over seeds, and against the noise (the
chosen row judged against each other row by the cell rule above: best beyond noise, another row better beyond noise, or
within noise of the rows it cannot be told from).

Per-image values (:func:`.evaluation.item_group`): beside each result file, ``<run>.items.json`` holds ``{"groups":
[{"ids": [...], "values": {key: [...]}}, ...]}``, one group per test world (the test split, then the shifted domain and
the scene families when evaluated), ids sorted as text, values to 4 significant digits (``null`` where an image has
none, e.g. an image in no bag), for every key whose corpus value is the mean over the test images
(:func:`finecap.metrics.suite.evaluate_items`: CIDEr-D, ROUGE-L, Length, faithfulness, RD-N / pool / bag R@k and mean
rank, CLIPScore, RefCLIPScore, ``family/`` and ``shifted/`` ones, and the exploration paper's ``sample/`` and ``beam/``
Div-1, Div-2 and CIDEr-D, :func:`finecap.stages.outputs.diversity_metrics_items`). The result file itself is unchanged,
so result files without items files still load.

This is a benchmark, not a test. Budget per world seed on the 2-core development machine, estimated from the demo's
stage times (docs/demo.md: MLE start about 340 s, SMILE about 100 s, SCST/SLE about 130 s, SR stages about 1 s per
step), not measured: SLE about 35 minutes (11 runs after the shared MLE start; the two validation-selected runs
caption the 500 validation images with beam 5 at five evaluations each); SMILE about 50 (21 runs, two of them
MLE from scratch on the simplified corpora); DiscriTune about 30 (12 runs, each also captioning the shifted domain
and the scene families when its tables read them); NDLB about 3.5 hours (32 runs: an hour of starts, the visual
expert and the boosting, then 25 SR runs of about 200 steps and three of 600). Runs and starts are shared between
papers (the MLE start, ``scst``, ``discritune``, ``sr_bagcurri``). ``--quick`` (the demo's quick settings: a world of
300 training scenes, 12 steps per run) checks that the runner works; its pages go under ``runs/paper_tables-quick``
and say that they are not results.

The package: :mod:`.schema` (what a table is), :mod:`.runs` (the world runs), one module of table data per paper
(:mod:`.smile`, :mod:`.sle`, :mod:`.ndlb`, :mod:`.discritune`), :mod:`.verdicts`, :mod:`.page`, :mod:`.runner` (a
seed's grid on :class:`finecap.stages.StageRunner`), :mod:`.evaluation`, :mod:`.shift_tokens` (SMILE's shift token
in a shifted run's raw token ids), :mod:`.fluency`, :mod:`.corpora` and :mod:`.cli`; ``benchmarks/paper_tables.py``
runs :func:`main`.
"""

from .cli import main, primary_runs, run_grid, run_replicates, runs_of
from .corpora import simple_caption
from .discritune import DISCRITUNE
from .evaluation import extra_evaluations
from .ndlb import NDLB
from .page import render_page, render_table, write_page
from .papers import PAPERS
from .runner import caption_field_overrides, make_grid
from .runs import FIELDS, RUNS
from .schema import Best, Column, Paper, Primary, Results, Row, Run, Table
from .sle import SLE
from .smile import SMILE
from .verdicts import metric_value, row_verdict, world_values

__all__ = ["DISCRITUNE", "FIELDS", "NDLB", "PAPERS", "RUNS", "SLE", "SMILE", "Best", "Column", "Paper", "Primary",
           "Results", "Row", "Run", "Table", "caption_field_overrides", "extra_evaluations", "main", "make_grid",
           "metric_value", "primary_runs", "render_page", "render_table", "row_verdict", "run_grid", "run_replicates",
           "runs_of", "simple_caption",
           "world_values", "write_page"]  # fmt: skip
