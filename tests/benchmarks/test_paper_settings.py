"""The settings that follow the papers' released code, and the papers' signs in benchmarks/effects.py.

- DiscriTune and NDLB divide a caption's summed token log-probs by its length and scale the retriever's cosines by
  CLIP's own ``exp(logit_scale)``; every recipe of theirs says so and cites the file and commit it comes from.
- NDLB's ClipCap captions end at their first full stop (its released code forces EOS after a period), so its coco
  recipes set ``decode.stop_at_period`` and their log p's length is the released code's.
- Every effect of benchmarks/effects.py that quotes the paper's numbers ("a -> b") expects the sign of ``b - a``.
- The demo's ``sr_bagcurri`` header describes the bag schedule it runs.
- NDLB's coco ClipCap recipes take App. C.3 Table 12's settings (batch, schedule, steps, learning rate by reward) and
  App. C.2's baselines, and the BagCurri recipe's schedule gives, epoch by epoch, the sizes and bags per batch its
  header and the released code say.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from finecap.config import load
from finecap.data.bags import BagCurriSampler
from finecap.recipes import resolve_recipe
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]
DISCRITUNE_COMMIT = "7c5351f"  # EGG branch rll_refactor (facebookresearch/EGG#258)
NDLB_COMMIT = "77b3e7e"  # manugaurdl/no-detail-left-behind
# recipe -> the commit of the released code its log-prob and scale settings come from
SELF_RETRIEVAL_RECIPES = {
    "demo/discritune": DISCRITUNE_COMMIT,
    "demo/blip_discritune": DISCRITUNE_COMMIT,
    "coco/discritune_clipcap": DISCRITUNE_COMMIT,
    "coco/discritune_blip": DISCRITUNE_COMMIT,
    "demo/sr_bagcurri": NDLB_COMMIT,
    "demo/sr_l": NDLB_COMMIT,
    "coco/sr_l_clipcap": NDLB_COMMIT,
    "coco/sr_v_clipcap": NDLB_COMMIT,
    "coco/sr_lv_bagcurri_clipcap": NDLB_COMMIT,
}


def comment_above(text: str, key: str) -> str:
    """The comment lines directly above the first line setting ``key:`` (and that line's own comment)."""
    lines = text.splitlines()
    index = next(i for i, line in enumerate(lines) if re.match(rf"\s*{key}:", line))
    block = [lines[index].partition("#")[2]]
    for line in reversed(lines[:index]):
        if not line.strip().startswith("#"):
            break
        block.append(line)
    return "\n".join(reversed(block))


@pytest.mark.parametrize("name", sorted(SELF_RETRIEVAL_RECIPES))
def test_self_retrieval_recipes_follow_the_released_code(name):
    cfg = load(resolve_recipe(name))
    assert cfg.rl.logprob == "mean", f"{name}: the released code divides the summed log-prob by the length"
    assert cfg.sr.logit_scale == 0.0, f"{name}: the released code scales by the retriever's exp(logit_scale)"
    text = resolve_recipe(name).read_text()
    commit = SELF_RETRIEVAL_RECIPES[name]
    for key in ("logprob", "logit_scale"):
        source = comment_above(text, key)
        assert commit in source and ".py:" in source, f"{name}: {key} must cite the file and line of commit {commit}"


@pytest.mark.parametrize(
    "name", sorted(n for n, c in SELF_RETRIEVAL_RECIPES.items() if c == NDLB_COMMIT and n.startswith("coco/"))
)
def test_ndlb_clipcap_recipes_stop_at_the_full_stop_as_the_released_code(name):
    # NDLB's released code decodes ClipCap's GPT-2 with a StopTokenLogitsProcessor that forces EOS after any token
    # holding a '.', and its log p (clipcap.py:358) masks EOS and what follows: "a dog ." EOS scores log p =
    # (l_a + l_dog + l_.) / 3.
    # finecap's rl.logprob=mean divides by Generation.lengths, the tokens up to and including the stop token: with
    # decode.stop_at_period the period is that token ((l_a + l_dog + l_.) / 3, the released code's), without it the
    # caption runs on to EOS and scores (l_a + l_dog + l_. + l_EOS) / 4, or a second sentence. (The demo's NDLB
    # recipes decode the world's captions, which have no period: its tokenizer has no punctuation.)
    cfg = load(resolve_recipe(name))
    assert (cfg.model.kind, cfg.clipcap.lm) == ("clipcap", "gpt2"), name
    assert cfg.decode.stop_at_period, f"{name}: the released code stops a caption at its first full stop"
    source = comment_above(resolve_recipe(name).read_text(), "stop_at_period")
    assert NDLB_COMMIT in source and "StopTokenLogitsProcessor" in source, source


# NDLB App. C.3 Table 12 (REINFORCE on ClipCap): batch 100, constant schedule, 23,000 steps, no warmup; the learning
# rate by reward: SR 9e-8, CIDEr 1e-6, CIDEr + SR 1e-7. App. C.2: the running-mean baseline for SR alone, the greedy
# one when CIDEr is in the reward. Sec. 4.2: LoRA of rank 32; Sec. 4.8: R = SR + 0.5 CIDEr.
TABLE_12 = {  # recipe: (learning rate, reward weights, baseline)
    "coco/sr_l_clipcap": (9e-8, {"retrieval": 1.0}, "mean"),
    "coco/sr_v_clipcap": (9e-8, {"retrieval": 1.0}, "mean"),
    "coco/scst_clipcap": (1e-6, {"cider": 1.0}, "greedy"),
    "coco/sr_lv_bagcurri_clipcap": (1e-7, {"retrieval": 1.0, "cider": 0.5}, "greedy"),
}


@pytest.mark.parametrize("name", sorted(TABLE_12))
def test_ndlb_clipcap_recipes_use_the_settings_of_table_12(name):
    cfg = load(resolve_recipe(name))
    lr, rewards, baseline = TABLE_12[name]
    train = cfg.train
    assert (train.batch_size, train.schedule, train.max_steps, train.warmup_steps) == (100, "constant", 23000, 0)
    assert train.lr == lr, name
    assert dict(cfg.rl.rewards) == rewards and cfg.rl.baseline == baseline, name
    if "retrieval" in rewards:  # the SR runs: LoRA of rank 32 (Sec. 4.2), sampled at T = 0.3 (released code)
        assert cfg.lora.rank == 32 and cfg.rl.temperature == 0.3, name


def test_the_coco_bag_curriculum_by_epoch():
    # coco/sr_lv_bagcurri_clipcap's {end_epoch: size}: epoch e (0-based) takes the size of the smallest end > e, as
    # the released code's get_bsz (egg/core/trainers.py at 77b3e7e); later epochs keep the last size. Whole bags per
    # batch of 100 (int(batch_size / bag_size), coco_dataloader.py): 100 // 2 = 50, // 3 = 33, // 5 = 20, // 7 = 14,
    # // 10 = 10, // 15 = 6, // 20 = 5.
    cfg = load(resolve_recipe("coco/sr_lv_bagcurri_clipcap"))
    table = [[j for j in range(20) if j != i] for i in range(20)]  # 20 images, each the others' neighbour
    sampler = BagCurriSampler(table, cfg.train.batch_size, cfg.data.bag_schedule)
    assert [sampler.bag_size(e) for e in range(10)] == [0, 2, 3, 5, 7, 10, 15, 20, 20, 20]
    sizes = [2, 3, 5, 7, 10, 15, 20]
    assert [sampler.bags_per_batch(s) for s in sizes] == [50, 33, 20, 14, 10, 6, 5]


def test_sr_bagcurri_header_describes_its_schedule():
    path = resolve_recipe("demo/sr_bagcurri")
    schedule = load(path).data.bag_schedule
    comments = [line for line in path.read_text().splitlines() if line.startswith("#") and "finecap " not in line]
    header = "\n".join(comments).split("Override")[0]  # the header's description, not the override example
    described = {int(n) for n in re.findall(r"bags of (\d+)", header)}
    assert described == {size for size in schedule.values() if size}, (described, schedule)
    random_first = 0 in schedule.values()
    assert ("no random-batch epoch" in header) != random_first


def load_effects():
    return benchmark("effects", neighbours=True)


def test_effect_signs_are_the_papers():
    effects = load_effects().headline_effects(99)
    by_name = {e.name: e for e in effects}
    # the sequence-level exploration paper: SLE raises CIDEr over SCST (Table 2: 115.0 -> 117.2; Table 4 rs/bs)
    assert by_name["SLE CIDEr-D change (sle - scst)"].sign == +1
    assert by_name["SLE sample CIDEr-D change (sle - scst)"].sign == +1
    assert "Table 2" in by_name["DiscriTune CIDEr-D change"].source  # DiscriTune's CIDEr drop is its Table 2
    checked = 0
    for e in effects:
        # the paper's numbers, "a -> b" or "XE a -> SLL b" (row numbers, "rows 1 -> 4", have no decimals)
        quoted = re.findall(r"(\d+\.\d+) -> (?:[A-Za-z-]+ )?(\d+\.\d+)", e.source)
        for before, after in quoted:
            change = float(after) - float(before)
            assert change != 0 and (change > 0) == (e.sign > 0), f"{e.name}: sign {e.sign} vs {e.source!r}"
            checked += 1
    assert checked == 24  # every effect that has a paper source with numbers (6 of them on the hard RD, family R@1)


def test_effect_sources_name_tables_that_exist():
    # the tables each paper has (the paper texts under shared/papers): a label naming another number is a typo
    tables = {"SMILE": 10, "exploration": 4, "DiscriTune": 14, "NDLB": 14}
    for e in load_effects().headline_effects(99):
        for paper, numbers in re.findall(r"(SMILE|exploration|DiscriTune|NDLB) Tables? ([\d, and]+)", e.source):
            for n in re.findall(r"\d+", numbers):
                assert 1 <= int(n) <= tables[paper], f"{e.name}: {paper} has no Table {n}"


def test_recipe_yaml_has_no_duplicate_keys():
    # the edits above add keys next to existing ones; a duplicated key would silently shadow the first
    class Strict(yaml.SafeLoader):
        pass

    def no_duplicates(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
        return loader.construct_mapping(node, deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_duplicates)
    for name in SELF_RETRIEVAL_RECIPES:
        yaml.load(resolve_recipe(name).read_text(), Loader=Strict)


def test_effects_check_names_each_headline_effect_that_fails_on_a_seed():
    effects = load_effects()
    names = {e.name for e in effects.headline_effects(99)}
    headline = [h.format(n=99) for h in effects.HEADLINE]
    assert set(headline) <= names  # every effect issue 26 lists is computed
    # each effect judged over world and run seeds (issue 54): its verdict and 95% interval (mean, low, high)
    numbers = {name: {"verdict": "holds", "interval": (1.0, 0.5, 1.5)} for name in names}
    # the documented non-reproduction: no gain, and an interval that excludes the paper's +1.9% of SCST's 1.75
    numbers["SLE CIDEr-D change (sle - scst)"] = {"verdict": "within noise", "interval": (-0.01, -0.03, 0.01)}
    results = {0: {"scst": {"CIDEr-D": 1.75}}}
    assert effects.headline_failures(numbers, 99, results) == []
    numbers["SLE sample Div-2 recovery (sle - scst)"] = {"verdict": "within noise", "interval": (0.05, -0.01, 0.11)}
    del numbers["BLIP SMILE length ratio (blip_smile / blip_mle)"]
    assert effects.headline_failures(numbers, 99, results, missing=[3]) == [
        "world seed 3: no results (a missing seed file fails the check)",
        "SLE sample Div-2 recovery (sle - scst): within noise over world and run seeds (+0.050 [-0.010, +0.110])",
        "BLIP SMILE length ratio (blip_smile / blip_mle): not computed",
    ]


def test_effects_check_judges_documented_non_reproductions_and_lists_their_interval():
    effects = load_effects()
    names = {e.name for e in effects.headline_effects(99)}
    assert set(effects.NON_REPRODUCTIONS) <= names  # each names an effect that is computed
    numbers = {name: {"verdict": "holds", "interval": (0.2, 0.1, 0.3)} for name in names}
    sle = "SLE CIDEr-D change (sle - scst)"
    results = {s: {"scst": {"CIDEr-D": 1.75}} for s in range(3)}  # the paper's gain here: 1.75 * 2.2 / 115 = 0.0335
    # mean -1, sd 2 over three world means, t(2) = 4.303: half width 4.303 * 2 / sqrt(3) = 4.969
    numbers[sle] = {"verdict": "within noise", "interval": (-1.0, -5.969, 3.969), "worlds": 3, "runs": 12}
    assert effects.headline_failures(numbers, 99, results) == [
        f"{sle}: its interval -1.000 [-5.969, +3.969] does not exclude the paper's effect (+0.033): the "
        "non-reproduction is not established"
    ]
    (line,) = effects.non_reproduction_lines(numbers, results)
    assert line.startswith(f"- {sle}: -1.000, 95% interval [-5.969, +3.969] over 3 world seeds and 12 runs; the "
                           "paper's effect +0.033") and "docs/results.md#training-noise" in line  # fmt: skip
    numbers[sle] = {"verdict": "within noise", "interval": (-0.01, -0.03, 0.01), "worlds": 3, "runs": 12}
    assert effects.headline_failures(numbers, 99, results) == []  # no gain, the paper's effect excluded
    numbers[sle] = {"verdict": "holds", "interval": (0.02, 0.01, 0.03), "worlds": 3, "runs": 12}
    assert effects.headline_failures(numbers, 99, results) == [
        f"{sle}: a gain appears (+0.020 [+0.010, +0.030]), where the world did not reproduce it"
    ]


def test_effects_check_reads_the_stored_results_of_a_fresh_clone(tmp_path, capsys):
    effects = load_effects()
    rows = {stage: {"RD99/R@1": 0.5, "Length": 8.0} for stage in ("mle", "smile")}
    rows["smile"]["Length"] = 12.0
    store = tmp_path / "store"
    store.mkdir()
    (store / "seed0.json").write_text(json.dumps(rows))
    code = effects.main(["--seeds", "0", "--root", str(tmp_path / "none"), "--store", str(store),
                         "--summarise-only", "--check"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1  # most headline effects are missing from these rows: named, and the check fails
    assert "| SMILE length ratio (smile / mle) | 1.50" in out
    assert "SCST sample Div-2 change (collapse): not computed" in out.split("--check fails")[1]
    run = tmp_path / "runs" / "seed0"
    run.mkdir(parents=True)
    rows["smile"]["Length"] = 6.0
    (run / "results.json").write_text(json.dumps(rows))
    effects.main(["--seeds", "0", "--root", str(tmp_path / "runs"), "--store", str(store), "--summarise-only"])
    assert json.loads((store / "seed0.json").read_text())["smile"]["Length"] == 6.0  # a run seed's copy is kept
