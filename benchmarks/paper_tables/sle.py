"""The tables of Sequence-level exploration: the paper's numbers and the world run behind each row (the paper's text:
``shared/papers/003_c4a4bb2d7c995365.txt``)."""

from __future__ import annotations

from .schema import Best, Column, Paper, Primary, Row, Table

SLE_PRECISION = (Column("Meteor", "METEOR", 100.0), Column("CIDEr", "CIDEr-D", 100.0), Column("Spice", "SPICE", 100.0))
SLE_DIVERSITY = (
    Column("CIDEr", "CIDEr-D", 100.0),
    Column("Div1", "Div-1", arrow="↑", same=0.005),  # fractions: half a point in percent
    Column("Div2", "Div-2", arrow="↑", same=0.005),
    Column("mBleu4", "mBLEU-4", arrow="↓", same=0.005),
)
SLE_GRID = (Column("CIDEr", "CIDEr-D", 100.0), Column("Div2 (rs)", "sample/Div-2", same=0.005))


def sle_table4_rows() -> tuple[Row, ...]:
    numbers = {  # Table 4: (rs) then (bs)
        "xe": ((74.2, 0.57, 0.78, 0.06), (102.5, 0.27, 0.35, 0.80)),
        "sll": ((114.6, 0.25, 0.32, 0.81), (115.0, 0.26, 0.35, 0.78)),
        "me": ((115.1, 0.25, 0.33, 0.80), (115.6, 0.26, 0.34, 0.79)),
        "sle": ((115.9, 0.29, 0.40, 0.68), (117.2, 0.27, 0.36, 0.76)),
    }
    names = {"xe": ("XE", "mle"), "sll": ("SLL", "scst"), "me": ("SLL-ME", "scst_me"), "sle": ("SLL-SLE", "sle")}
    vs = {"xe": (), "sll": ("xe",), "me": ("sll",), "sle": ("sll", "me")}
    rows = []
    for mode, index, prefix in (("rs", 0, "sample/"), ("bs", 1, "beam/")):
        for key, (label, run) in names.items():
            rows.append(Row(f"{key}_{mode}", f"{label} ({mode})", run, numbers[key][index],
                            vs=tuple(f"{v}_{mode}" for v in vs[key]), prefix=prefix))  # fmt: skip
    for mode, prefix in (("rs", "sample/"), ("bs", "beam/")):  # no paper numbers: nothing is judged
        rows.append(Row(f"overlap_{mode}", f"SLL-SLE, length-neutral distance ({mode}; finecap's ablation, not the "
                        "paper's)", "sle_overlap", prefix=prefix))  # fmt: skip
    return tuple(rows)


SLE = Paper(
    key="sle",
    title="Better Captioning with Sequence-Level Exploration (Chen & Jin, CVPR 2020)",
    source="003_c4a4bb2d7c995365.txt",
    metrics=("bleu", "cider", "meteor", "length", "vocab", "faithfulness"),
    diversity=True,
    notes="World runs: XE = the MLE start; SLL = SCST (demo/scst: CIDEr-D reward, greedy baseline, 5 samples); "
    "SLL-ME = demo/scst_me (max-entropy coefficient 1e-2); SLL-SLE = demo/sle (α = 0.75, BLEU-3/4 distance). Test "
    "captions by beam search (beam 5), as the paper. SPICE is not computed (its Stanford CoreNLP jars are not "
    "shipped); METEOR where pycocoevalcap is installed (otherwise the result file says why not): in Python since "
    "2026-11-24, equal to pycocoevalcap's jar, which computed the stored results.",
    tables=(
        Table(
            "2",
            "Image captioning (the middle block: the paper's own model, no attention)",
            SLE_PRECISION,
            (
                Row("sll", "SLL", "scst", (26.8, 115.0, 20.0)),
                Row("me", "SLL-ME", "scst_me", (26.8, 115.6, 20.1), vs=("sll",)),
                Row("sle", "SLL-SLE (ours)", "sle", (27.0, 117.2, 20.3), vs=("sll", "me")),
            ),
            primary=(Primary("sle", "sll", "CIDEr"),),
        ),
        Table(
            "4",
            "Precision and diversity (5 captions per image: random sampling (rs) or the top 5 of beam search (bs))",
            SLE_DIVERSITY,
            sle_table4_rows(),
            notes="(rs): 5 captions sampled at T = 1, CIDEr-D averaged over them (as the paper); (bs): the top 5 "
            "beams, CIDEr-D of the top beam (the paper's (bs) CIDEr equals its Table 2 beam-search CIDEr). The last "
            "two rows are finecap's ablation, not the paper's: SLL-SLE with sle.distance=overlap34 (1 - mean "
            "3-/4-gram overlap over the shorter caption's n-grams) instead of the BLEU-3/4 distance, which leans "
            "towards short captions (docs/results.md, Training noise).",
            primary=(Primary("sle_rs", "sll_rs", "Div2"), Primary("sle_bs", "sll_bs", "CIDEr")),
        ),
        Table(
            "alpha",
            "the exploration weight α, tuned among 0.25, 0.5, 0.75",
            SLE_GRID,
            (
                Row("a025", "α = 0.25", "sle_a025"),
                Row("a050", "α = 0.5", "sle_a050"),
                Row("a075", "α = 0.75 (chosen)", "sle"),
            ),
            best=Best(
                "CIDEr",
                "a075",
                basis="tuned on the validation set; 'a quite stable value to reach the best "
                "performance across different datasets'",
            ),  # fmt: skip
            notes="The paper reports only its choice. World: test CIDEr-D of the beam-search captions.",
        ),
        Table(
            "me_coef",
            "the max-entropy weight of SLL-ME, tuned among 1e-1, 1e-2, 1e-3",
            SLE_GRID,
            (
                Row("e1", "coefficient 1e-1", "scst_me_1e1"),
                Row("e2", "coefficient 1e-2 (chosen)", "scst_me"),
                Row("e3", "coefficient 1e-3", "scst_me_1e3"),
            ),
            best=Best("CIDEr", "e2", basis="'tuned among 1e-1, 1e-2, 1e-3 and set to 1e-2 for the best performance'"),
            notes="The paper reports only its choice.",
        ),
        Table(
            "check_selection",
            "the model captioned: the last checkpoint (the demo's) or the best validation CIDEr-D (the paper's)",
            SLE_GRID,
            (
                Row("scst_last", "SLL, last checkpoint (step 100)", "scst"),
                Row("scst_val", "SLL, best validation CIDEr-D", "scst_val"),
                Row("sle_last", "SLL-SLE, last checkpoint (step 100)", "sle"),
                Row("sle_val", "SLL-SLE, best validation CIDEr-D", "sle_val", vs=("scst_val",), expect=(+1, +1)),
            ),
            notes="Not a paper table: the paper reports validation-selected models, the demo's scst and sle recipes "
            "caption with the final model. The _val runs validate every 20 steps with the CIDEr-D validator "
            "(train.validators=[cider], train.best_metric=cider_d; 500 validation images, beam 5, all references). "
            "The validation-selected SLL-SLE is judged against the validation-selected SLL with the signs of the "
            "paper's Tables 2 and 4 (SLE's CIDEr and sampled Div-2 above SLL's).",
            primary=(Primary("sle_val", "scst_val", "Div2 (rs)"),),
        ),
    ),
)
