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

Verdicts (:func:`row_verdict`): for a row judged against row ``b`` on a column whose paper numbers differ, the paper's
effect is ``sign(paper[row] - paper[b])`` and the world's, per seed, ``sign(world[row] - world[b])``. The row
"holds" when every judged column has the paper's sign on every seed, "does not hold" when none does on any seed, and
"partly holds" otherwise; the cell lists each column as ``label ↑ k/n`` (``k`` of ``n`` seeds with the paper's sign).
Rows the world cannot make say why ("not comparable: ..."). A table may also name the row the paper chose among a
grid (:class:`Best`, e.g. the exploration paper's α = 0.75): the verdict says whether it is the world's best.

This is a benchmark, not a test. Budget per world seed on the 2-core development machine, estimated from the demo's
stage times (docs/demo.md: MLE start about 340 s, SMILE about 100 s, SCST/SLE about 130 s, SR stages about 1 s per
step), not measured: SLE about 25 minutes (8 runs after the shared MLE start); SMILE about 50 (21 runs, two of them
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

from .cli import main, run_grid, runs_of
from .corpora import simple_caption
from .discritune import DISCRITUNE
from .evaluation import extra_evaluations
from .ndlb import NDLB
from .page import render_page, render_table, write_page
from .papers import PAPERS
from .runner import caption_field_overrides, make_grid
from .runs import FIELDS, RUNS
from .schema import Best, Column, Paper, Results, Row, Run, Table
from .sle import SLE
from .smile import SMILE
from .verdicts import metric_value, row_verdict, world_values

__all__ = ["DISCRITUNE", "FIELDS", "NDLB", "PAPERS", "RUNS", "SLE", "SMILE", "Best", "Column", "Paper", "Results",
           "Row", "Run", "Table", "caption_field_overrides", "extra_evaluations", "main", "make_grid", "metric_value",
           "render_page", "render_table", "row_verdict", "run_grid", "runs_of", "simple_caption", "world_values",
           "write_page"]  # fmt: skip
