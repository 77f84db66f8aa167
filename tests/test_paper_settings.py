"""The settings that follow the papers' released code, and the papers' signs in benchmarks/effects.py.

- DiscriTune and NDLB divide a caption's summed token log-probs by its length and scale the retriever's cosines by
  CLIP's own ``exp(logit_scale)``; every recipe of theirs says so and cites the file and commit it comes from.
- Every effect of benchmarks/effects.py that quotes the paper's numbers ("a -> b") expects the sign of ``b - a``.
- The demo's ``sr_bagcurri`` header describes the bag schedule it runs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from finecap.config import load
from finecap.recipes import resolve_recipe

ROOT = Path(__file__).resolve().parents[1]
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
    # as `python benchmarks/effects.py` runs it: benchmarks/ on sys.path (it imports paired_difference)
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("effects_under_test", ROOT / "benchmarks" / "effects.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
    numbers = {name: {"holds": 3, "n": 3} for name in names}
    assert effects.headline_failures(numbers, 99) == []
    numbers["SLE sample Div-2 recovery (sle - scst)"] = {"holds": 2, "n": 3}
    del numbers["BLIP SMILE length ratio (blip_smile / blip_mle)"]
    assert effects.headline_failures(numbers, 99) == ["SLE sample Div-2 recovery (sle - scst) (2/3)",
                                                      "BLIP SMILE length ratio (blip_smile / blip_mle)"]  # fmt: skip


def test_effects_check_leaves_out_documented_non_reproductions_and_lists_their_interval():
    effects = load_effects()
    names = {e.name for e in effects.headline_effects(99)}
    assert set(effects.NON_REPRODUCTIONS) <= names  # each names an effect that is computed
    numbers = {name: {"holds": 3, "n": 3, "values": {0: 0.1, 1: 0.2, 2: 0.3}} for name in names}
    sle = "SLE CIDEr-D change (sle - scst)"
    numbers[sle] = {"holds": 1, "n": 3, "values": {0: 1.0, 1: -1.0, 2: -3.0}}
    assert effects.headline_failures(numbers, 99) == []  # documented: not a failure
    lines = effects.non_reproduction_lines(numbers)
    # mean -1, sd 2, t(2) = 4.303: half width 4.303 * 2 / sqrt(3) = 4.969
    assert f"- {sle}: -1.000, 95% interval over 3 seed(s) [-5.969, +3.969], sign holds on 1/3 seeds" in lines[0]
    assert "docs/results.md#training-noise" in lines[0]
    numbers[sle]["holds"] = 3
    assert "holds on every seed here" in effects.non_reproduction_lines(numbers)[0]


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
    assert "SCST sample Div-2 change (collapse)" in out.split("failing")[1]
    run = tmp_path / "runs" / "seed0"
    run.mkdir(parents=True)
    rows["smile"]["Length"] = 6.0
    (run / "results.json").write_text(json.dumps(rows))
    effects.main(["--seeds", "0", "--root", str(tmp_path / "runs"), "--store", str(store), "--summarise-only"])
    assert json.loads((store / "seed0.json").read_text())["smile"]["Length"] == 6.0  # a run seed's copy is kept
