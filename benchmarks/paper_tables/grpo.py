"""finecap's check of the GRPO family on the world (issue 50): SCST against GRPO and GRPO + KL on SCST's reward,
CIDEr-D. Not a paper's page: no paper's numbers; each judged cell's expected sign was declared here before any run
(2026-11-25).

The signs: ↑ where Liang, *Group Relative Policy Optimization for Image Captioning* (arXiv:2503.01333, 2025: GRPO
with its KL term in place of SCST on COCO and Flickr8k) claims an effect, in its abstract: GRPO reaches a higher
CIDEr than SCST, and "combined with KL divergence constraints, GRPO can improve diversity" (so: sampled Div-2 above
SCST's, and above GRPO's without the KL); = (no change) where nothing is claimed (caption length, the world's fact
precision and recall, and the KL's effect on CIDEr-D), a null the world either keeps (*holds*: within noise) or
breaks (*changed*). Primary cell, declared before running: GRPO against SCST on CIDEr-D. The settings were fixed
before running and are not tuned after (the issue: "never tune until an effect appears")."""

from __future__ import annotations

from .schema import Column, Paper, Primary, Row, Table

GRPO_COLUMNS = (
    Column("CIDEr-D", "CIDEr-D", 100.0),
    Column("Div-2 (sampled)", "sample/Div-2"),
    Column("Length", "Length"),
    Column("fact precision", "faith/precision"),
    Column("fact recall", "faith/recall"),
)
AGAINST_SCST = (+1, +1, 0, 0, 0)
"""Liang (2025) against SCST: CIDEr-D ↑ and sampled Div-2 ↑; no claim on length and the facts (=)."""
KL_AGAINST_GRPO = (0, +1, 0, 0, 0)
"""The KL term against GRPO without it: sampled Div-2 ↑ (Liang's "improve diversity"); no claim elsewhere (=)."""

SETTINGS = (
    "Every run starts from the world seed's MLE start (`mle`, the grid's shared start) and trains 100 steps at lr "
    "1e-4 (constant, Adam, no weight decay, gradient clip 1) on the CIDEr-D reward, each step on 64 images with 5 "
    "captions sampled per image at T = 1 (320 sampled captions), and captions the test split with its final model "
    "(beam 5). SCST = demo/scst: REINFORCE with the greedy caption's CIDEr-D as the baseline (64 more captions "
    "decoded per step) and log p summed over the caption's tokens. GRPO = demo/grpo_cider at SCST's batch "
    "(train.batch_size=64, rl.samples=5: the recipe's 32 images x 8 samples would be 256 sampled captions a step "
    "against SCST's 320, and other images): the group of an image is its 5 samples, advantage (r − group mean) / "
    "(group std + 1e-4), no greedy caption, the clipped ratio surrogate averaged over each caption's tokens then over "
    "captions (TRL's loss_type=grpo), one optimizer step per rollout (the ratio is 1: nothing is clipped), the "
    "reward-hacking monitor warning only. What differs from SCST is what makes GRPO: the baseline (the group mean "
    "instead of the greedy caption), the scaling (by the group's spread) and the per-caption token mean instead of "
    "the sum. GRPO + KL = the same with grpo.kl_coef=0.04 (β of demo/grpo_sr_cider, TRL's older default; fixed before "
    "running): TRL's k3 estimator per token to the MLE start, with the importance-ratio factor (TRL 1.16's default). "
    "Columns: CIDEr-D of the beam captions against references 2-5 (×100); Div-2 (sampled) = distinct bigrams over "
    "all bigrams of 5 captions sampled per image at T = 1 (the exploration paper's set-level Div-2, as its page's "
    "(rs) rows); Length = words per beam caption; fact precision / recall = the world's faithfulness of the beam "
    "captions (true stated facts / stated facts; scene facts stated / scene facts, checked against the scene "
    "graphs)."
)
BUDGET = (
    "Budget, measured 2026-11-25 (the 2-core machine shared with other jobs, `nice -n 10`, `OMP_NUM_THREADS=1`: "
    "with torch's two threads beside other jobs a world-encoder step took about 2.7 s, with one 0.18-0.26 s): per "
    "world seed the world encoder 4.6-6.7 minutes, the MLE start 391-498 s, then SCST 143-149 s, GRPO 158-160 s "
    "and GRPO + KL 163-197 s, each with its evaluation (the result files' `seconds`): the six RL runs of both seeds "
    "16 minutes, the whole page about 45."
)

GRPO = Paper(
    key="grpo",
    title="GRPO against SCST on the world: a finecap check (issue 50)",
    source="",
    metrics=("cider", "length", "faithfulness"),
    diversity=True,
    notes="Not a paper's page: finecap's own check of the GRPO family it adds (docs/methods/grpo.md), on one reward "
    "(CIDEr-D) where SCST is the reference. Each judged cell's expected sign was declared in "
    "`benchmarks/paper_tables/grpo.py` before any run: ↑ where Liang, Group Relative Policy Optimization for Image "
    "Captioning (arXiv:2503.01333, 2025) claims an effect in its abstract (CIDEr above SCST's; more diverse "
    "captions, with the KL term), = where nothing is claimed (a null the world keeps or breaks). The 'paper' half "
    "of each cell is empty: there are no paper numbers. " + SETTINGS + " " + BUDGET,
    tables=(
        Table(
            "check_grpo",
            "SCST, GRPO and GRPO + KL on SCST's reward (CIDEr-D), from the same MLE start",
            GRPO_COLUMNS,
            (
                Row("mle", "MLE start (no RL; not judged)", "mle"),
                Row("scst", "SCST (greedy baseline)", "scst"),
                Row("grpo", "GRPO (group-normalised advantages, β = 0)", "grpo", vs=("scst",), expect=AGAINST_SCST),
                Row("grpo_kl", "GRPO + KL (β = 0.04)", "grpo_kl", vs=("scst",), expect=AGAINST_SCST),
            ),
            notes="Signs against SCST from Liang (2025): CIDEr-D ↑, sampled Div-2 ↑; = elsewhere (no claim). Liang's "
            "GRPO has the KL term, so both rows are judged against SCST.",
            primary=(Primary("grpo", "scst", "CIDEr-D"),),
        ),
        Table(
            "check_kl",
            "the KL penalty to the MLE start: GRPO + KL against GRPO",
            GRPO_COLUMNS,
            (
                Row("grpo", "GRPO (β = 0)", "grpo"),
                Row("grpo_kl", "GRPO + KL (β = 0.04)", "grpo_kl", vs=("grpo",), expect=KL_AGAINST_GRPO),
            ),
            notes="Sign from Liang (2025): sampled Div-2 ↑ with the KL term; = elsewhere (no claim: the KL's cost in "
            "CIDEr-D, if any, is what the world shows).",
        ),
    ),
)
