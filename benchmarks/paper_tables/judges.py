"""finecap's check of judge-backed rewards on the world (issue 66): GRPO with CapRL's QA-utility reward
(``qa_utility``, answered by the exact ``world`` judge) against GRPO with CIDEr-D, and the same QA-utility run with a
judge wrong on 10 % and 30 % of its answers (``judge.noise``: answers flipped at random, seeded;
docs/methods/judges.md). Not a paper's page: no paper's numbers; each judged cell's expected sign was declared here
before any run (2026-11-26).

The signs: CapRL (InternLM/CapRL, 2025: Qwen2.5-VL-3B trained with GRPO on the share of an image's multiple-choice
questions a text-only LLM answers from the caption) claims, as issue 66 states it, that QA utility raises recall over
CIDEr-D rewards without losing precision: fact recall ↑ against GRPO on CIDEr-D, and fact precision not lower. The
verdict rule has no one-sided "not lower"; the precision cell is declared = (no change), so a precision within noise
*holds*, and one beyond noise reads *changed*, the cell's Δ saying which way (a rise keeps CapRL's claim, a fall
breaks it; the row's word comes from its directional cells alone, so it can say *holds* while precision fell: read
the precision cell). Caption length, hallucination share and CIDEr-D are
printed, not judged (no claim). Primary cells, declared before running: QA utility against CIDEr-D on fact recall and
on fact precision. The judge-noise curve (noise 0, 0.1, 0.3) has no declared sign: it is reported as measured, over
the run seeds (the table's computed note). The settings were fixed before running and are not tuned after."""

from __future__ import annotations

import statistics

from .schema import Column, Paper, Primary, Results, Row, Table, replicate_key
from .verdicts import fmt, fmt_width, replicate_seeds, run_seed_interval, signed

JUDGE_COLUMNS = (
    Column("fact recall", "faith/recall"),
    Column("fact precision", "faith/precision"),
    Column("hallucination share", "faith/halluc_rate"),
    Column("Length", "Length"),
    Column("CIDEr-D", "CIDEr-D", 100.0),
)
QA_AGAINST_CIDER = (+1, 0, None, None, None)
"""CapRL against CIDEr-D rewards: fact recall ↑, fact precision = ("without losing precision": the verdict rule's
no-change sign, module docstring); no claim on hallucination share, length and CIDEr-D (not judged)."""
NOISE_RUNS = (("grpo_qa", 0.0), ("grpo_qa_noise10", 0.1), ("grpo_qa_noise30", 0.3))
"""The noise curve's runs and their ``judge.noise`` (:data:`.runs.RUNS`)."""


def run_seed_values(results: Results, seed: int, run: str, key: str) -> dict[int, float]:
    """``{run seed: value}`` of metric ``key`` of ``run`` on world seed ``seed``: the grid's own run (run seed = world
    seed) and its replicates (``<run>@r<M>``, :func:`.schema.replicate_key`).

    >>> run_seed_values({0: {"a": {"x": 1.0}, "a@r101": {"x": 2.0}, "b": {"x": 5.0}}}, 0, "a", "x")
    {0: 1.0, 101: 2.0}
    """
    runs = results.get(seed, {})
    names = {seed: run} | {m: replicate_key(run, m) for m in sorted(replicate_seeds(runs, run))}
    return {m: float(runs[name][key]) for m, name in names.items() if name in runs and key in runs[name]}


JUDGE_CHANGE = (
    "**The world judge changed on 2026-11-28** (commit `8ce752e`): a caption stating two or more values of one fact "
    "(two colours of the circle) is now answered 'cannot answer'; before, it got whichever stated value came first "
    "among the shuffled options, so a caption listing several values of a fact was paid for the one that was true. "
    "Every result on this page was trained under the new judge, on world seeds 0 and 1 (2026-11-28; the runs of "
    "2026-11-26 under the old judge, world seeds 0 and 1, are in the git history before that date). Under "
    "both judges the QA-utility runs state many false facts, patterns above all: the old judge's three world seed 0 "
    "runs had hallucination shares 0.687, 0.799 and 0.871, the new judge's 0.721, 0.809 and 0.772, so the hedge was "
    "not what drove them; a wrong answer costs no more than 'cannot answer' (CapRL's reward), so guessing a fact pays "
    "on average. The old judge's run seed 102 had the longest captions (19.4 words, fact precision 0.719; 13.7 and "
    "0.867 under the new judge)."
)
"""What the page says of the world judge's change (docs/methods/judges.md), whatever the results' commits."""


def noise_curve_note(results: Results) -> str:
    """The judge-noise curve as measured (no declared sign), per world seed: each run's mean ± standard deviation
    over its run seeds, and its difference to the error-free judge's run (noise 0) paired by run seed, with the
    95% t interval over run seeds (:func:`.verdicts.run_seed_interval`, the run seeds' spread alone: the test split's
    shared noise is not added here)."""
    lines = []
    for seed in sorted(results):
        base = {c.key: run_seed_values(results, seed, NOISE_RUNS[0][0], c.key) for c in JUDGE_COLUMNS}
        if not any(base.values()):
            continue
        n = max(len(v) for v in base.values())
        plural = "s" if n != 1 else ""
        lines.append(f"Noise curve on world seed {seed} ({n} run seed{plural} per run; mean ± sd over run seeds; "
                     "Δ against noise 0, paired by run seed, with its 95% t interval over run seeds):")  # fmt: skip
        lines.append("")
        lines.append("| judge.noise | " + " | ".join(c.label for c in JUDGE_COLUMNS) + " |")
        lines.append("|" + " --- |" * (len(JUDGE_COLUMNS) + 1))
        for run, noise in NOISE_RUNS:
            cells = []
            for c in JUDGE_COLUMNS:
                mine = run_seed_values(results, seed, run, c.key)
                if not mine:
                    cells.append("not run yet")
                    continue
                values = [v * c.scale for v in mine.values()]
                mean = statistics.fmean(values)
                cell = fmt(mean) + (f" ± {fmt_width(statistics.stdev(values))}" if len(values) > 1 else "")
                paired = sorted(set(mine) & set(base[c.key]))
                if noise and paired:
                    diffs = [(mine[m] - base[c.key][m]) * c.scale for m in paired]
                    interval = run_seed_interval(diffs)
                    delta = statistics.fmean(diffs)
                    cell += f" (Δ {signed(delta)}" + (
                        f" [{signed(interval[1])}, {signed(interval[2])}])" if interval else ")"
                    )
                cells.append(cell)
            lines.append(f"| {noise:g} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


SETTINGS = (
    "Every RL run starts from its world seed's MLE start (`mle`, the grid's shared start; the same checkpoint and "
    "world encoder for every run seed: world seed 1's run-seed runs name that encoder as `model.encoder`, world seed "
    "0's said `world` and were given it by the checkpoint, before `train.init_from` refused the difference) "
    "and trains the packaged recipe as it is: 100 steps at lr 1e-4 (constant, Adam, "
    "no weight decay, gradient clip 1), each step on 32 images with 8 captions sampled per image at T = 1 (256 "
    "sampled captions; CapRL's 8 rollouts), GRPO's group advantage (r − group mean) / (group std + 1e-4), the "
    "clipped ratio surrogate averaged per caption then over captions, one optimizer step per rollout; the test "
    "split captioned by the final model (beam 5). GRPO + CIDEr-D = demo/grpo_cider. GRPO + QA utility = demo/grpo_qa: "
    "the world judge asks each image's questions made from its scene graph (colour, size, cell and pattern of every "
    "object, the background, the count) in 2 shuffled orders with a 'cannot answer' option, questions the blind "
    "judge answers right dropped; reward = share answered right. judge.noise = p replaces each answer, with "
    "probability p, by another option at random (seeded by judge.seed = 0, the caption, the question and the "
    "order: the same caption asked the same question in the same order gets the same answer); with p > 0 a blind "
    "question can be answered right by chance and is then dropped, so the question sets differ slightly between "
    "noise levels. The judge asks a question's 2 orders distinct (finecap since 2026-11-29; before, they were drawn "
    "independently, and a 2-option question's 2 orders were one order about half the time: docs/methods/judges.md). "
    "The judge.noise = 0 runs do not depend on the orders (the exact judge answers alike in any order and drops no "
    "blind question) and predate the change; the 0.1 and 0.3 runs do (a flip is drawn per order) and were run again "
    "under distinct orders on 2026-11-29 (f40815e5), all 12, from the same MLE starts (each retrained at that code "
    "reproduced its committed result file value for value and its items file byte for byte); two of them "
    "(world seed 0, judge.noise 0.3, run seeds 0 and 102) record seconds that include about 32 minutes each stopped "
    "(SIGSTOP) while a test suite was timed. Run seeds: the grid's own run (run "
    "seed 0) and `--run-seeds` (101, 102), each RL run retrained "
    "under run seed M (its sampling and data order) from the same MLE start. Columns: the world's faithfulness of the "
    "beam captions against the scene graphs: fact recall = scene facts stated / scene facts, fact precision = true "
    "stated facts / stated facts, hallucination share = share of captions stating at least one false fact "
    "(`faith/halluc_rate`); Length = words per caption; CIDEr-D against references 2-5 (×100)."
)
BUDGET = "Where and when each run ran, and its seconds, are in the last table of the page (from the result files)."

JUDGES = Paper(
    key="judges",
    title="How wrong may a judge be? QA-utility rewards on the world: a finecap check (issue 66)",
    source="",
    metrics=("cider", "length", "faithfulness"),
    families=False,
    replicate_from_start=True,
    provenance=True,
    notes="Not a paper's page: finecap's own check of the judge-backed rewards it adds (docs/methods/judges.md), on "
    "the world, whose exact judge knows every fact. Each judged cell's expected sign was declared in "
    "`benchmarks/paper_tables/judges.py` before any run: CapRL's claim, QA utility raises fact recall over "
    "CIDEr-D rewards (↑) without losing fact precision (declared = : the verdict rule has no one-sided sign, so "
    "*changed* on precision means beyond noise either way, and the cell's Δ says which); no sign for the judge-noise "
    "curve, reported as measured. The 'paper' half of each cell is empty: there are no paper numbers. "
    + JUDGE_CHANGE
    + " "
    + SETTINGS
    + " "
    + BUDGET,
    tables=(
        Table(
            "check_caprl",
            "GRPO on QA utility (the exact world judge) against GRPO on CIDEr-D, from the same MLE start",
            JUDGE_COLUMNS,
            (
                Row("mle", "MLE start (no RL; not judged)", "mle"),
                Row("cider", "GRPO + CIDEr-D", "grpo_cider8"),
                Row("qa", "GRPO + QA utility (judge.noise = 0)", "grpo_qa", vs=("cider",), expect=QA_AGAINST_CIDER),
            ),
            notes='Signs from CapRL: fact recall ↑; fact precision = ("without losing precision"); the other '
            "columns printed, not judged.",
            primary=(Primary("qa", "cider", "fact recall"), Primary("qa", "cider", "fact precision")),
        ),
        Table(
            "check_noise",
            "the judge's error rate: GRPO on QA utility with judge.noise 0, 0.1 and 0.3",
            JUDGE_COLUMNS,
            (
                Row("noise0", "QA utility, judge.noise = 0", "grpo_qa"),
                Row("noise10", "QA utility, judge.noise = 0.1", "grpo_qa_noise10"),
                Row("noise30", "QA utility, judge.noise = 0.3", "grpo_qa_noise30"),
            ),
            notes="No declared sign: the curve is reported as measured (the grid's own run in the table; every run "
            "seed in the note under it).",
            computed_note=noise_curve_note,
        ),
    ),
)
