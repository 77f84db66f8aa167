"""What a paper's table is, as data: the :class:`Run` standing in for a row, the paper's :class:`Column` s and
:class:`Row` s, the row it chose in a grid (:class:`Best`), a :class:`Table` and a :class:`Paper`; and
:data:`Results`, the numbers the result files hold, and :data:`Items`, the per-image values beside them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Results = dict[int, dict[str, dict[str, float]]]  # seed -> run -> metric key -> value
Items = dict[int, dict[str, dict[str, dict[str, float]]]]  # seed -> run -> metric key -> image id (text) -> value
# A world seed's runs under other run seeds (``run.seed=M``, :func:`replicate_key`) sit beside its own runs in
# Results and Items, keyed ``<run>@r<M>``: the grid's own run of a world seed N has run seed N.


def replicate_key(run: str, run_seed: int) -> str:
    """The key of run ``run`` trained with run seed ``run_seed`` in :data:`Results` (``sle@r101``)."""
    return f"{run}@r{run_seed}"


def is_replicate(key: str) -> bool:
    """Whether ``key`` names a run retrained under another run seed (:func:`replicate_key`), not a grid's own run."""
    return "@r" in key


@dataclass(frozen=True)
class Run:
    """One trained captioner of the grid (or a caption source that needs no training)."""

    recipe: str | None  # packaged recipe ``demo/<recipe>``; None: the human references (first caption of each image)
    overrides: tuple[str, ...] = ()  # ``section.key=value`` overrides that make this run from the recipe
    init: str | None = "mle"  # the run whose best checkpoint it starts from (None: a fresh model)
    # caption field trained on and scored against: ``original`` (the world's human captions) or a field of the
    # world's Visual Caption Boosting data set (``blend`` / ``holistic``, made as the demo's ``vcb`` stages make it)
    captions: str = "original"
    # a simplified corpus of the world's images (SMILE Fig. 4b: ``simplest`` / ``simpler``, :func:`simple_corpus`)
    # trained on instead of the human captions; "" = none
    corpus: str = ""


@dataclass(frozen=True)
class Column:
    """A column of a paper's table and the finecap metric key that stands in for it."""

    label: str  # the paper's column label
    key: str  # finecap's metric key (``RD/`` = RD-N with the run's ``eval.n_distractors``); rows may add a prefix
    scale: float = 1.0  # finecap value x scale = the paper's unit (fractions -> %, CIDEr x 100)
    arrow: str = ""  # the paper's direction mark, when it has one (↑ / ↓)
    # paper differences smaller than this (in the paper's unit) are the paper's "comparable": judged as no change
    same: float = 0.5
    # a world-only column (no paper numbers) judged with the paper's effect on the column of this label: NDLB's
    # hard RD and family R@1, judged with its RD100's direction (retrieval off the world's ceiling); "" = its own
    sign_from: str = ""
    # world values above this (the paper's unit) are at the world's ceiling: a cell where either row's mean is above
    # it is printed and marked saturated, and left out of the row's word (NDLB's RD100 above 90); None = no ceiling
    ceiling: float | None = None


@dataclass(frozen=True)
class Row:
    """A row of a paper's table: its numbers, the world run standing in for it, the rows it is judged against."""

    id: str  # unique in its table
    label: str  # the paper's row label
    run: str | None  # key of RUNS; None: not made on the world (``why`` says why)
    paper: tuple[float | None, ...] = ()  # one number per column (None: not reported); () = no numbers
    vs: tuple[str, ...] = ()  # ids of the rows whose difference to this one is judged
    prefix: str = ""  # prefix of the metric keys (the exploration paper's Table 4: ``sample/`` or ``beam/``)
    expect: tuple[int | None, ...] = ()  # signs the paper states without numbers (a figure): +1, -1, 0 (no change)
    why: str = ""  # why the row is not made on the world


@dataclass(frozen=True)
class Primary:
    """The paper's headline comparison in one row group of a table: row ``row`` against row ``against`` on the
    column labelled ``column``. Declared before any run: the cells the grid repeats over run seeds
    (``--run-seeds``), whose verdict interval then holds retraining noise as well as the test split's."""

    row: str
    against: str
    column: str


@dataclass(frozen=True)
class Best:
    """The row a paper chose in a grid by one column; the world's verdict is whether it is the best there too."""

    column: str  # column label
    chosen: str  # row id the paper chose
    higher: bool = True
    basis: str = ""  # what the paper chose it on


@dataclass(frozen=True)
class Table:
    id: str  # as the paper numbers it ("2", "4", "fig4a"); --tables takes these
    title: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    runnable: bool = True  # False: rows listed with the paper's numbers, world runs not defined yet
    best: Best | None = None
    notes: str = ""
    primary: tuple[Primary, ...] = ()  # one per row group: the paper's headline comparisons (:class:`Primary`)
    # a note computed from the results, printed under the table (e.g. a correlation over the runs); "" = none
    computed_note: Callable[[Results], str] | None = None

    @property
    def heading(self) -> str:
        """``Table 2: ...``; figures and sections by their names, finecap's own checks (ids ``check_*``) as such."""
        name = "finecap check" if self.id.startswith("check_") else HEADINGS.get(self.id, "Table " + self.id)
        return f"{name}: {self.title}"


HEADINGS = {"fig3": "Figure 3", "fig4a": "Figure 4a", "fig4b": "Figure 4b", "alpha": "Section 5.1",
            "me_coef": "Section 5.2"}  # fmt: skip


@dataclass(frozen=True)
class Paper:
    key: str
    title: str
    source: str  # the paper text (shared/papers/README.md); "" = finecap's own check page, no paper's tables
    metrics: tuple[str, ...]  # finecap.metrics.suite groups evaluated for every run of this paper
    tables: tuple[Table, ...]
    diversity: bool = False  # 5 sampled and 5 beam captions per image (the exploration paper's set-level metrics)
    fluency_lm: bool = False  # train the world's fluency LM and report perplexity under it (SMILE's PPL column)
    bags_from: str = "original"  # caption field whose text embeddings build the test bags (NDLB: holistic)
    notes: str = ""
    # every run also scored on the scene-family test world (the ImageCoDe analogue; the world encoder reads it)
    families: bool = True
    # --run-seeds retrains every trained run of the tables (not only the primary cells'), each from the world seed's
    # own start (its MLE start, shared: not retrained, nor its world encoder), so that the run seeds vary the runs
    # the page compares and nothing beneath them (the judges page: RL runs from one MLE start)
    replicate_from_start: bool = False
    # the page ends with where and when each result file was made (machine, run seed, seconds): a check page whose
    # runs share a busy machine says so run by run
    provenance: bool = False

    def table(self, table_id: str) -> Table:
        for t in self.tables:
            if t.id == table_id:
                return t
        valid = ", ".join(t.id for t in self.tables)
        raise SystemExit(f"--tables: {self.key} has no table {table_id!r}; tables: {valid}")
