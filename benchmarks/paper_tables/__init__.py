"""The four papers' tables on the embedded world: one command per paper runs its ablation grid and writes
``docs/reproductions/<paper>.md``, the paper's numbers beside finecap's world analogue with a verdict per row.

    nice -n 10 python benchmarks/paper_tables.py --paper sle                  # every runnable table, seeds 0,1
    python benchmarks/paper_tables.py --paper smile --tables 1,5 --seeds 0,1,2
    python benchmarks/paper_tables.py --paper smile --quick                   # tiny world, a few steps per run
    python benchmarks/paper_tables.py --paper ndlb --page-only                # rewrite the page from the results
    python benchmarks/paper_tables.py --paper smile --list                    # the tables, rows and runs
    python benchmarks/paper_tables.py --paper sle --run-seeds 101,102         # primary cells under two more run seeds

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

Run seeds (``--run-seeds M,...``, :func:`run_replicates`): the runs of the tables' primary cells
(:func:`primary_runs`) are trained again under run seed M on each world seed, in ``<runs>/seed<N>/run<M>/``, each from
its start retrained there too (the whole chain a comparison reads, the MLE start included), and with its own world
encoder (the retriever: its cache key holds ``run.seed``, so it is trained again under run seed M, and the
replicate's self-retrieval rewards and retrieval columns read it), while the rest of the world seed's data is shared
(its world, boosted captions and their visual expert, simplified corpora, fluency LM and bags, made by the world
seed's own grid first with the world seed's encoder, :func:`.cli.ensure_shared`); evaluated as the grid's runs,
written to
``<data>/<paper>/seed<N>/run<M>/<run>.json``, skipped when that file exists. The shared data must be the one the
grid's own runs used: on a machine without the grid's ``<runs>/seed<N>/``, it is made again, and equals the committed
grid's only if the code that makes it has not changed since.

Verdicts (:func:`row_verdict`, :mod:`.verdicts`): a row judged against row ``b`` is judged column by column. The
paper's effect is ``sign(paper[row] - paper[b])``, or 0 ("no change", shown ``=``) when the two numbers differ by less
than :attr:`Column.same` (0.5 in the paper's unit by default; 0.005 for fractions such as Div-n) or the row states 0
(``Row.expect``); a world-only column (:attr:`Column.sign_from`: NDLB's hard RD100 and family R@1) takes the effect of
the paper's column it names (RD100). The world's difference ``d_s = world[row] - world[b]`` (the paper's unit) is
compared with its noise on each world seed ``s``:

- one run per world seed (the grid's own, run seed = world seed): when both runs' items files hold per-image values
  of the column's key for the same test images, the 95% percentile interval of the mean per-image difference,
  ``paired_difference.paired_bootstrap`` with 2,000 resamples and seed 0 (a page is the same every time it is made).
  It holds the test split's noise only: *one run: test-split noise only*, as the page says of every secondary cell.
- a primary cell (:class:`Primary`: the paper's headline comparison of a row group, declared in the table's data) with
  three run seeds or more on that world seed (``--run-seeds``: result files ``seed<N>/run<M>/<run>.json``, loaded as
  ``<run>@r<M>``): the 95% random-effects t interval over run seeds and test images,
  ``mean_r d ± t(0.975, R - 1)·√(s_r²/R + v/n)`` (:func:`.verdicts.run_seed_interval`: ``s_r`` the runs' spread,
  ``v/n`` the test images' shared noise), rather than a two-level bootstrap, which with three run seeds draws from ten
  multisets and comes out too narrow.

The cell: *holds* / *reversed* / *within noise* / *changed* (a no-change column whose intervals exclude 0) when every
seed's interval says so, *mixed* otherwise; without per-image values, the 95% Student-t interval over the world seeds
alone (*within the seeds' spread* when it covers 0); an interval of zero width (every image's difference alike, or a
count that moved equally on every seed) measures no noise and is dropped, so such a cell has *no noise estimate*, as
one seed without per-image values does. Own-field CIDEr-D of runs trained on a boosted field follows caption length
(r = 0.90 over the HolisticCap results), so two runs of the same boosted field are compared *at matched length*: on
the test images whose two captions have the same number of words, paired (length stratified at its finest; the human
references' CIDEr-D has no per-image values and penalises length the other way); between fields the cell is printed
and not judged. A column with a ceiling (:attr:`Column.ceiling`: NDLB's RD100 at 90) marks a cell where either row's
mean is above it *saturated*. The row's word comes from its directional, unsaturated, judged cells alone: *holds* when
every one holds, *partly holds* when one does, *reversed* when every one reverses, *does not hold* when none holds and
one reverses, *within noise*, *no noise estimate*, *undecided* otherwise; no-change cells never make a row hold (a row
of them alone is *unchanged within noise* or *changed*). A table may name the row the paper chose among a grid
(:class:`Best`): the verdict says whether it is the world's best on the mean over seeds, and against the noise (the
chosen row judged against each other row by the cell rule: best beyond noise, rows better beyond noise, rows it is
mixed against, one seed each way, and rows it is not shown better than). Each page ends its introduction with a
multiplicity note: how many cells it judges and how many would come out *holds* or *changed* by chance
(:func:`.verdicts.chance_note`).

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
papers (the MLE start, ``scst``, ``discritune``, ``sr_bagcurri``). Run seeds: the primary cells' runs of the four
papers (42 runs, every start among them) took 78 and 81 minutes per world seed in the committed result files' times
(NDLB's 20 of them 54 and 59 minutes, times that count the stretches its grid was stopped for other jobs), so two
more run seeds on two world seeds take about 4 to 5.5 hours, plus the shared data where it must be made again.
``--quick`` (the demo's quick settings: a world of
300 training scenes, 12 steps per run) checks that the runner works; its pages go under ``runs/paper_tables-quick``
and say that they are not results.

The package: :mod:`.schema` (what a table is), :mod:`.runs` (the world runs), one module of table data per paper
(:mod:`.smile`, :mod:`.sle`, :mod:`.ndlb`, :mod:`.discritune`) and per finecap check page without a paper
(:mod:`.grpo`: SCST against GRPO and GRPO + KL, ``--paper grpo``; :mod:`.judges`: GRPO on QA utility at three judge
error rates against GRPO on CIDEr-D, ``--paper judges``, whose ``--run-seeds`` retrain every RL run from the world
seed's own MLE start, :attr:`Paper.replicate_from_start`), :mod:`.verdicts`, :mod:`.page`, :mod:`.runner` (a
seed's grid on :class:`finecap.stages.StageRunner`), :mod:`.evaluation`, :mod:`.shift_tokens` (SMILE's shift token
in a shifted run's raw token ids), :mod:`.fluency`, :mod:`.corpora` and :mod:`.cli`; ``benchmarks/paper_tables.py``
runs :func:`main`.
"""

from .cli import main, primary_runs, run_grid, run_replicates, runs_of
from .corpora import simple_caption
from .discritune import DISCRITUNE
from .evaluation import extra_evaluations
from .grpo import GRPO
from .judges import JUDGES
from .ndlb import NDLB
from .page import render_page, render_table, write_page
from .papers import PAPERS
from .runner import caption_field_overrides, make_grid
from .runs import FIELDS, RUNS
from .schema import Best, Column, Paper, Primary, Results, Row, Run, Table
from .sle import SLE
from .smile import SMILE
from .verdicts import metric_value, row_verdict, world_values

__all__ = ["DISCRITUNE", "FIELDS", "GRPO", "JUDGES", "NDLB", "PAPERS", "RUNS", "SLE", "SMILE", "Best", "Column",
           "Paper", "Primary", "Results", "Row", "Run", "Table", "caption_field_overrides", "extra_evaluations",
           "main", "make_grid", "metric_value", "primary_runs", "render_page", "render_table", "row_verdict",
           "run_grid", "run_replicates", "runs_of", "simple_caption", "world_values", "write_page"]  # fmt: skip
