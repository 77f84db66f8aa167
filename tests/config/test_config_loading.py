"""Configuration loading: YAML + dotlist overrides, type checks, error messages that name the key."""

import dataclasses
import re

import pytest
import yaml

from finecap.config import SECTIONS, Config, ConfigError, absolute_paths, describe, from_dict, load
from helpers.recipe_values import refused_both_ways


def test_defaults_and_overrides():
    cfg = load(None, ["world.n_train=200", "train.lr=1e-4", "decode.strategy=beam", "eval.bag_sizes=[3,5]"])
    assert cfg.world.n_train == 200
    assert cfg.train.lr == pytest.approx(1e-4)  # "1e-4" is a YAML string; the float field converts it
    assert cfg.decode.strategy == "beam"
    assert cfg.eval.bag_sizes == [3, 5]
    assert cfg.world.n_val == 500  # untouched default


def test_recipe_then_override(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: 0.5\n  epochs: 3\nworld:\n  n_train: 10\n")
    cfg = load(recipe, ["train.lr=0.25"])
    assert (cfg.train.lr, cfg.train.epochs, cfg.world.n_train) == (0.25, 3.0, 10)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "train: [unclosed\n",
            "invalid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>' "
            r"\(while parsing a flow sequence at line 1, column 8\)",
        ),
        # a tab: PyYAML's "found character '\t' that cannot start any token" said neither that YAML indents with
        # spaces only nor where a tab may not go
        (
            "train:\n\tlr: 1\n",
            "invalid YAML at line 2, column 1: a tab in the indentation: YAML allows no tabs there; "
            "indent with spaces$",
        ),
        (
            "train:\n  lr: 1\n \tmax_steps: 3\n",
            "invalid YAML at line 3, column 2: a tab in the indentation: .*indent with spaces$",
        ),
        (
            "train:\n  lr:\t1\n",
            "invalid YAML at line 2, column 6: a tab; PyYAML reads no tab between a key, its value "
            "and a comment, nor inside an unquoted value: write a space, or quote the text$",
        ),
        ("- train\n", "a recipe must be a mapping of sections"),
        ("trian: 5\n", r"unknown section 'trian' \(did you mean 'train'\?\)"),  # the name first, as for a mapping
        # a section that is no mapping: a traceback (5, true), an error naming nothing (lr=1e-4), or nothing (false, 0)
        *[
            (f"train: {v}\n", rf"section 'train' must be a mapping of keys, got {e}")
            for v, e in (("5", "5"), ("true", "True"), ("false", "False"), ("0", "0"), ("lr=1e-4", "'lr=1e-4'"))
        ],
    ],
)
def test_malformed_recipe_names_the_file(tmp_path, text, error):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=error) as e:
        load(recipe)
    assert str(e.value).startswith(f"{recipe}: ") and "\n" not in str(e.value)  # one line (PyYAML's: six)


def test_a_tab_indenting_a_stored_config_names_the_file_the_line_and_spaces(tmp_path):
    # a run's config.yaml edited by hand goes through the recipe's reader: the same words
    from finecap.config import load_stored

    stored = tmp_path / "config.yaml"
    stored.write_text("run:\n  seed: 1\ntrain:\n\tlr: 0.5\n")
    with pytest.raises(ConfigError, match="line 4, column 1: a tab in the indentation: .*indent with spaces$") as e:
        load_stored(stored)
    assert str(e.value).startswith(f"{stored}: ")


@pytest.mark.parametrize(
    ("encoding", "error"),
    [
        ("utf-16", r"not a UTF-8 text file \(.*\): it is UTF-16 .*save it as UTF-8"),
        ("latin-1", "not a UTF-8 text file"),
    ],
)
def test_a_recipe_or_stored_config_not_in_utf8_names_the_file(tmp_path, encoding, error):
    # a recipe saved as Windows' "Unicode": the error was "'utf-8' codec can't decode byte 0xff in position 0"
    from finecap.config import load_stored

    recipe = tmp_path / "bad.yaml"
    recipe.write_bytes("run:\n  name: caf\u00e9\n".encode(encoding))
    for read in (load, load_stored):
        with pytest.raises(ConfigError, match=error) as e:
            read(recipe)
        assert str(e.value).startswith(f"{recipe}: ")


def test_a_subsection_that_is_no_mapping_is_refused_with_an_override_too(tmp_path):
    recipe = tmp_path / "bad.yaml"
    for text in ("data:\n  hf: [a]\n", "data:\n  image_column: img\n  hf: [a]\n"):  # the second: a former key's move
        recipe.write_text(text)
        for overrides in ([], ["data.hf.image_column=x"]):  # with the override, the list was dropped without a word
            with pytest.raises(ConfigError, match=r"data.hf .*mapping.* got \['a'\]") as e:
                load(recipe, overrides)
            assert str(e.value).startswith(f"{recipe}: ")


def test_unknown_key_lists_valid_keys(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("world:\n  n_trian: 10\n")
    with pytest.raises(ConfigError) as e:
        load(recipe)
    msg = str(e.value)
    assert str(recipe) in msg and "world.n_trian" in msg and "n_train" in msg


def test_unknown_section():
    with pytest.raises(ConfigError, match="unknown section 'wrld'.*world"):
        load(None, ["wrld.n_train=3"])


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match="world.n_train: expected an integer, got 'ten'"):
        load(None, ["world.n_train=ten"])
    with pytest.raises(ConfigError, match="model.train_encoder: expected true/false"):
        load(None, ["model.train_encoder=3"])


def test_invalid_choice_lists_choices():
    expected = "decode.strategy: invalid value 'nucleus'; valid choices: greedy, beam, sample"
    with pytest.raises(ConfigError, match=expected):
        load(None, ["decode.strategy=nucleus"])


def test_cross_field_check_names_key():
    with pytest.raises(ConfigError, match="decode.num_return_sequences"):
        load(None, ["decode.strategy=beam", "decode.beam_size=2", "decode.num_return_sequences=3"])
    with pytest.raises(ConfigError, match="world.image_size"):
        load(None, ["world.image_size=4"])


def test_malformed_override():
    with pytest.raises(ConfigError, match="section.key=value"):
        load(None, ["train.lr"])
    with pytest.raises(ConfigError, match="section.key"):
        load(None, ["lr=3"])


def test_every_field_has_default_and_doc():
    for name, cls in SECTIONS.items():
        rows = describe(cls)
        assert rows, name
        for key, _tp, _default, text in rows:
            assert text, f"{name}.{key} has no doc"


def test_save_roundtrip(tmp_path):
    cfg = load(None, ["world.seed=7", "eval.metrics=[length]"])
    cfg.save(tmp_path / "config.yaml")
    again = from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert again == absolute_paths(cfg)  # relative paths are stored absolute (the working directory's)
    assert dataclasses.asdict(again) == absolute_paths(cfg).to_dict()
    assert isinstance(again, Config)


def test_layers_base_recipe_over_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  max_steps: 800\n  lr: 0.5\n")
    cfg = load(recipe, ["train.lr=0.125"], base={"train": {"max_steps": 1, "batch_size": 7}},
               over={"train": {"max_steps": 40}})  # fmt: skip
    # base < recipe < over < overrides
    assert (cfg.train.batch_size, cfg.train.max_steps, cfg.train.lr) == (7, 40, 0.125)


def test_registry_names_are_checked_at_load():
    from finecap.config import ConfigError

    cases = {
        "train.objective=smiel": "train.objective: unknown objective 'smiel' (did you mean 'smile'?); valid names: "
        "grpo, mle, reinforce",
        "data.sampler=bagcur": "data.sampler: unknown sampler 'bagcur' (did you mean 'bagcurri'?)",
        "rl.rewards={cidr: 1.0}": "rl.rewards: unknown reward 'cidr' (did you mean 'cider'?)",
        "train.validators=[retreival]": "train.validators: unknown validator 'retreival' (did you mean 'retrieval'?)",
        "eval.metrics=[blue]": "eval.metrics: unknown metric group 'blue' (did you mean 'bleu'?)",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as e:
            load(None, [override])
        assert str(e.value).startswith(f"override {override!r}: {message}")
    # user code by dotted path is allowed (imported, and checked, when used)
    assert load(None, ["train.objective=my.pkg:factory"]).train.objective == "my.pkg:factory"


def test_validator_keys_are_what_the_validators_return():
    # the torch-free table the configuration checks train.best_metric against, vs the app's validator factories
    from finecap.registry import VALIDATOR_KEYS, VALIDATORS

    assert set(VALIDATORS) == set(VALIDATOR_KEYS)


# --- did you mean, blame, list values ---------------------------------------------------------------------------


def test_typos_get_a_suggestion_in_files_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("world:\n  n_trian: 10\n")
    with pytest.raises(ConfigError) as e:
        load(recipe)
    message = "line 2: unknown key 'world.n_trian' (did you mean 'world.n_train'?); valid"
    assert str(e.value).startswith(f"{recipe}: {message}")
    with pytest.raises(ConfigError) as e:
        load(None, ["train.lerning_rate=3"])  # nothing close enough: no suggestion, the valid keys
    assert "did you mean" not in str(e.value) and "valid keys of [train]: batch_size" in str(e.value)
    with pytest.raises(ConfigError, match=r"unknown section 'trian' \(did you mean 'train'\?\)"):
        load(None, ["trian.lr=3"])
    with pytest.raises(ConfigError, match=r"decode.strategy: invalid value 'beem' \(did you mean 'beam'\?\); valid "):
        load(None, ["decode.strategy=beem"])
    with pytest.raises(ConfigError, match=r"train.best_metric: 'los' \(did you mean 'loss'\?\) is not"):
        load(None, ["train.best_metric=los"])
    with pytest.raises(ConfigError, match=r"YAML reads Describe: the image as a mapping: quote the text, e.g. "
                                          r"vlm.prompt='\"Describe: the image\"'"):  # fmt: skip
        load(None, ["vlm.prompt=Describe: the image"])
    assert load(None, ['vlm.prompt="Describe: the image"']).vlm.prompt == "Describe: the image"  # the way out works
    with pytest.raises(ConfigError, match=r"unknown measure 'lenght_drift' \(did you mean 'length_drift'\?\); valid"):
        load(None, ["rl.alarms={lenght_drift: 1}"])
    with pytest.raises(ConfigError, match=r"unknown tracker 'tensorbord' \(did you mean 'tensorboard'\?\); valid"):
        load(None, ["train.log_with=[jsonl, tensorbord]"])


def test_an_override_at_fault_is_named_not_the_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: 0.5\n  epochs: 3\n")
    cases = {
        "train.lr=abc": "override 'train.lr=abc': train.lr: expected a number, got 'abc'",
        "train.eopchs=2": "override 'train.eopchs=2': unknown key 'train.eopchs' (did you mean 'train.epochs'?)",
        "train.lr=-1": "override 'train.lr=-1': train.lr: must be > 0",  # a __post_init__ check
        "train.objective=smiel": "override 'train.objective=smiel': train.objective: unknown objective",
        # a cross-field check naming a key left at its default: the override of the section is the one at fault
        "rl.strategy=greedy": "override 'rl.strategy=greedy': rl.samples: must be 1 with rl.strategy=greedy",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as e:
            load(recipe, [override])
        assert str(e.value).startswith(message), str(e.value)
        assert str(recipe) not in str(e.value)
    # the same mistakes in the file are blamed on the file
    recipe.write_text("train:\n  lr: abc\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: line 2: train.lr: expected a number"):
        load(recipe, ["train.epochs=2"])
    recipe.write_text("train:\n  lr: -1\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: line 2: train.lr: must be > 0"):
        load(recipe, ["train.epochs=2"])


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("train.log_with=tensorboard", "train.log_with", ["tensorboard"]),  # a single value where a list is expected
        ("train.log_with=jsonl,tensorboard", "train.log_with", ["jsonl", "tensorboard"]),  # a,b like [a,b]
        ("train.log_with=[jsonl, tensorboard]", "train.log_with", ["jsonl", "tensorboard"]),
        ("eval.metrics=bleu", "eval.metrics", ["bleu"]),
        ("eval.metrics=bleu, cider", "eval.metrics", ["bleu", "cider"]),
        ("eval.bag_sizes=3", "eval.bag_sizes", [3]),
        ("eval.bag_sizes=3,5", "eval.bag_sizes", [3, 5]),
        ("train.validators=", "train.validators", []),
        ("demo.stages=world,mle", "demo.stages", ["world", "mle"]),
    ],
)
def test_list_values_accept_one_value_and_commas(override, key, expected):
    section, name = key.split(".")
    assert getattr(getattr(load(None, [override]), section), name) == expected


def test_list_values_from_a_file_and_bad_items(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  log_with: tensorboard\neval:\n  bag_sizes: 3,5\n  metrics: bleu\n")
    cfg = load(recipe)
    assert (cfg.train.log_with, cfg.eval.bag_sizes, cfg.eval.metrics) == (["tensorboard"], [3, 5], ["bleu"])
    with pytest.raises(ConfigError, match=r"eval.bag_sizes\[1\]: expected an integer, got 'x'"):
        load(None, ["eval.bag_sizes=3,x"])
    with pytest.raises(ConfigError, match="unknown tracker 'tensorbord'"):
        load(None, ["train.log_with=jsonl,tensorbord"])
    with pytest.raises(ConfigError, match="eval.bag_sizes: expected a list, got"):
        load(None, ["eval.bag_sizes={a: 1}"])
    # no YAML list ('[a,,b]', '[,]': `finecap demo --stages ","`) was split at its commas, brackets and all:
    # "unknown stage(s) ['[', ']']", or ['[mle', '', 'smile]']
    for value in ("[mle,,smile]", "[,]", "mle,,smile", "mle,", "[mle"):
        with pytest.raises(ConfigError, match=rf"demo.stages: '{re.escape(value)}' is not a list: an empty item or "
                                              "an unclosed bracket; write \\[a, b\\] or a,b"):  # fmt: skip
            load(None, [f"demo.stages={value}"])
    assert load(None, ["demo.stages=[mle,]"]).demo.stages == ["mle"]  # YAML's own trailing comma


# --- secrets ------------------------------------------------------------------------------------------------------


def test_secrets_are_masked_when_saved_printed_or_logged(tmp_path):
    from finecap.config import MASK, SECRET_KEYS, load_stored, redacted

    assert SECRET_KEYS == ("boost.llm_api_key", "boost.vlm_api_key")
    cfg = load(None, ["boost.llm_api_key=sk-test-123", "boost.vlm_api_key=sk-test-456"])
    assert cfg.boost.llm_api_key == "sk-test-123"  # the running command has it
    assert cfg.to_dict()["boost"]["llm_api_key"] == "sk-test-123"
    for data in (cfg.to_dict(redact=True), cfg.saved_dict(), redacted(cfg.to_dict())):
        assert (data["boost"]["llm_api_key"], data["boost"]["vlm_api_key"]) == (MASK, MASK)
    assert load(None).to_dict(redact=True)["boost"]["llm_api_key"] == ""  # an unset key stays visibly unset
    cfg.save(tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "sk-test" not in text and f"llm_api_key: '{MASK}'" in text
    # read back, the mask means "not set" (the environment variable is used), never the key "***"
    again = load_stored(tmp_path / "config.yaml")
    assert (again.boost.llm_api_key, again.boost.vlm_api_key) == ("", "")


def test_only_mistypings_of_a_secret_key_are_taken_for_one():
    # a key close to a secret key's name is masked (its typo); no option of finecap's own is close enough to be
    from finecap.config.fields import option_fields
    from finecap.config.secrets import _secret_name, looks_secret

    keys = [f"{name}.{key}" for name, cls in SECTIONS.items() for key, _, _ in option_fields(cls)]
    assert [k for k in keys if looks_secret(k) and not _secret_name(k.rsplit(".", 1)[-1])] == []


def test_errors_never_repeat_a_secret(tmp_path):
    cases = {
        "boost.llm_apikey=sk-typo-1": "override 'boost.llm_apikey=***': unknown key 'boost.llm_apikey' (did you mean "
        "'boost.llm_api_key'?)",
        "boost.llm_api_key=[sk-list-2]": "override 'boost.llm_api_key=***': boost.llm_api_key: expected str (the "
        "value is not shown)",
        # a typo of a secret key's name without a secret word in it: the key was repeated in the error
        "boost.llm_api_kye=sk-typo-3": "override 'boost.llm_api_kye=***': unknown key 'boost.llm_api_kye' (did you "
        "mean 'boost.llm_api_key'?)",
        "boost.vlm_api=sk-typo-4": "override 'boost.vlm_api=***': unknown key 'boost.vlm_api' (did you mean "
        "'boost.vlm_api_key'?)",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as e:
            load(None, [override])
        assert str(e.value).startswith(message) and "sk-" not in str(e.value), str(e.value)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("boost:\n  vlm_api_key: {a: sk-map-3}\n")
    with pytest.raises(ConfigError) as e:
        load(recipe)
    assert str(e.value) == f"{recipe}: line 2: boost.vlm_api_key: expected str (the value is not shown)"


@pytest.mark.parametrize("key", ["run.root", "data.path", "vlm.name", "train.init_from"])
def test_a_path_option_holding_a_nul_character_is_refused_naming_it(key, tmp_path):
    # `finecap train demo/mle 'run.root="a\x00b"'` failed at the first mkdir with a bare "embedded null byte"
    refused_both_ways(key, '"a\\x00b"', tmp_path, rf"override '{key}=.*': {key}: 'a\\x00b' holds a NUL character",
                      rf"recipe\.yaml: line 2: {key}: 'a\\x00b' holds a NUL character")  # fmt: skip
    section, option = key.split(".")
    assert getattr(getattr(load(None, [f'{key}="a\\tb"']), section), option) == "a\tb"  # other characters are kept


@pytest.mark.parametrize(
    ("override", "suggested"),
    [("train.LR=1e-4", "train.lr"), ("TRAIN.lr=1e-4", "train"), ("world.N_TRAIN=20", "world.n_train"),
     ("data.hf.IMAGE_COLUMN=img", "data.hf.image_column"), ("train.MAX_STEPS=5", "train.max_steps")],
)  # fmt: skip
def test_a_key_typed_in_capitals_gets_its_did_you_mean(override, suggested):
    # `train.LR=1e-4` said "unknown key 'train.LR'" with no suggestion: difflib compares case, and 'LR' shares no
    # character with 'lr'
    with pytest.raises(ConfigError, match=re.escape(f"(did you mean {suggested!r}?)")):
        load(None, [override])


@pytest.mark.parametrize(
    ("override", "suggested"),
    [("train.beam_size=3", "'decode.beam_size'"), ("decode.lr=1e-4", "'retriever.lr' or 'train.lr'"),
     ("clipcap.prompt=Say it.", "'vlm.prompt'"), ("data.hf.path=d", "'data.path'"),
     ("data.questions_column=q", "'data.hf.questions_column'")],
)  # fmt: skip
def test_a_key_of_another_section_gets_that_section_in_its_did_you_mean(override, suggested, tmp_path):
    # `train.beam_size=3` suggested 'train.batch_size' (the closest name in [train]) and `decode.lr=1e-4` nothing:
    # the key was right, its section wrong. From a recipe alike.
    with pytest.raises(ConfigError, match=re.escape(f"(did you mean {suggested}?)")):
        load(None, [override])
    section, key = override.split("=")[0].split(".", 1)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"{section}:\n  {key}: 3\n" if "." not in key else "data:\n  hf:\n    path: d\n")
    line = 2 if "." not in key else 3
    where = re.escape(f"{recipe}: line {line}: unknown key")
    with pytest.raises(ConfigError, match=where + r".*" + re.escape(suggested)):
        load(recipe)


def test_an_integer_option_reads_a_whole_number_in_exponent_notation(tmp_path):
    # `world.n_train=1e3` was refused ("expected an integer, got '1e3'") while `1.0e+3` was 1000 and a float option
    # read `1e3` as 1000.0: PyYAML reads an exponent without a dot as a string, which only float options converted
    cfg = load(None, ["world.n_train=1e3", "world.n_val=2.5E2", "eval.bag_sizes=1e1,5"])
    assert (cfg.world.n_train, cfg.world.n_val, cfg.eval.bag_sizes) == (1000, 250, [10, 5])
    assert load(None, ["run.seed=12345678901234567891e0"]).run.seed == 12345678901234567891  # exact, not a float's
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("train:\n  max_steps: 1e3\n")
    assert load(recipe).train.max_steps == 1000
    for value in ("1.5e0", "1e-3", "1e400", "1e999999999"):  # not whole, or no option's number: refused, as written
        with pytest.raises(ConfigError, match=re.escape(f"world.n_train: expected an integer, got '{value}'")):
            load(None, [f"world.n_train={value}"])
    with pytest.raises(ConfigError, match=r"world.n_train: must be <= 1000000, got 1000000000000\.\.\.0+ "):
        load(None, ["world.n_train=1e30"])  # whole, and out of bounds


def test_an_integer_option_reads_a_whole_number_however_written(tmp_path):
    # `world.n_train='"5"'` (and `n_train: "5"` in a recipe) was refused ("expected an integer, got '5'") while
    # `"5e0"` and `"5.0"`... were read as 5: one rule now, a whole number whatever its spelling, as a float option
    # reads a number from any of them; the refusal states it
    from finecap.config import replaced_section
    from finecap.config.sections.decode import DecodeConfig

    for written in ('"5"', "'5'", '"5e0"', "5e0", "5.0", '"5.0"', "5", " 5 "):
        assert load(None, [f"world.n_train={written}"]).world.n_train == 5, written
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text('world:\n  n_train: "5"\n  n_val: "2.5e1"\neval:\n  bag_sizes: ["3", 2e0]\n')
    cfg = load(recipe)
    assert (cfg.world.n_train, cfg.world.n_val, cfg.eval.bag_sizes) == (5, 25, [3, 2])
    assert replaced_section(DecodeConfig(), "decode", max_length="12").max_length == 12
    for written in ('"5.5"', "5.5", '"5e-1"', '"five"', '"0x5"'):
        with pytest.raises(ConfigError, match=re.escape("(an integer option takes a whole number, however written: "
                                                        '5, 5.0, 5e0, "5" are 5)')):  # fmt: skip
            load(None, [f"world.n_train={written}"])


def test_a_string_option_given_a_yaml_word_says_to_quote_it_naming_the_file_and_line(tmp_path):
    # `name: null` (or `true`) in a string option was refused as "expected a string, got None", naming neither the
    # line nor the fix; numbers and yes/no are text already (`version: 1.10` keeps "1.10", `tag: yes` "yes")
    recipe = tmp_path / "recipe.yaml"
    for written, word, meaning in (
        ("null", "null", "no value"),
        ("~", "null", "no value"),
        ("True", "true", "a boolean"),
    ):
        recipe.write_text(f"train:\n  lr: 1.0e-4\nrun:\n  root: runs\n  name: {written}\n")
        with pytest.raises(ConfigError) as e:
            load(recipe)
        got = "None" if word == "null" else "True"
        assert str(e.value) == (f'{recipe}: line 5: run.name: expected a string, got {got}: YAML reads {word} as '
                                f'{meaning}; quote it for the text: name: "{word}" in a file, run.name=\'"{word}"\' '
                                "on the command line")  # fmt: skip
        recipe.write_text(f'run:\n  name: "{written}"\n')
        assert load(recipe).run.name == written  # quoted: the text
    message = "override 'run.name=false': run.name: expected a string, got False: YAML reads false as a boolean; quote"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(None, ["run.name=false"])
    assert load(None, ['run.name="false"']).run.name == "false"  # the shell's run.name='"false"'
    recipe.write_text("run:\n  name: 1.10\n")
    assert load(recipe).run.name == "1.10"


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("train:\n  epochs: 2\n  lr: abc\n", "line 6: train.lr: expected a number, got 'abc'"),  # a wrong type
        ("train:\n  epochs: 2\n  lr: -1\n", "line 6: train.lr: must be > 0, got -1.0"),  # a bound
        ("train:\n  epochs: 2\n  lerning_rate: 1\n", "line 6: unknown key 'train.lerning_rate'; valid keys"),
        ("train:\n  epochs: 2\n  LR: 1\n", "line 6: unknown key 'train.LR' (did you mean 'train.lr'?)"),
        ("Train:\n  epochs: 2\n", "line 4: unknown section 'Train' (did you mean 'train'?)"),
        ("train:\n  validators: [captions, nosuch]\n", "line 5: train.validators: unknown validator 'nosuch'"),
        ("train:\n  epochs: 0\n  max_steps: 0\n", "line 5: train.epochs/train.max_steps: one of them must be > 0"),
        ("data:\n  hf: [a]\n", "line 5: data.hf is a section: expected a mapping of its keys"),
        ("rl:\n  alpha: 1.5\n", "line 5: sle.alpha: must be in [0, 1], got 1.5"),  # set under its former name
        ("model:\n  kind: clipcap\n  prefix_length: 5\n", "line 6: 'model.prefix_length' moved to"),
    ],
)
def test_an_error_about_a_value_a_recipe_set_names_the_file_and_the_line(written, message, tmp_path):
    # only a YAML word in a string option (`name: null`) named its line: a wrong type, a bound, an unknown key or
    # section, a registry name and a check across keys named the file alone, leaving the line to be searched for
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"# a recipe\nrun:\n  name: x\n{written}")
    with pytest.raises(ConfigError) as e:
        load(recipe)
    assert str(e.value).startswith(f"{recipe}: {message}"), str(e.value)


def test_replaced_section_takes_an_option_called_name():
    # replaced_section(cfg.judge, "judge", name="x") was a TypeError (multiple values for argument 'name')
    from finecap.config import VlmBackboneConfig, replaced_section
    from finecap.config.sections.judge import JudgeConfig

    assert replaced_section(VlmBackboneConfig(), "vlm", name="world-tiny").name == "world-tiny"
    with pytest.raises(ConfigError, match=r"^judge.name: expected a string, got \[5\]"):
        replaced_section(JudgeConfig(), "judge", name=[5])


@pytest.mark.parametrize(("override", "how"), [("rl.rewards.cider=1.0", "rl.rewards='{cider: 1.0}'"),
                                               ("rl.alarms.kl=0.5", "rl.alarms='{kl: 0.5}'")])  # fmt: skip
def test_a_key_of_a_mapping_option_is_told_how_to_set_the_option(override, how):
    # `rl.rewards.cider=1.0` said "rl.rewards is no nested section; a key looks like section.key", which a user who
    # wrote a section.key.key override could not act on
    with pytest.raises(ConfigError, match=re.escape(f"is a mapping option, set whole (the keys it leaves out are "
                                                    f"dropped): {how}")):  # fmt: skip
        load(None, [override])
    assert load(None, ["rl.rewards={cider: 1.0}"]).rl.rewards == {"cider": 1.0}  # the way out works


@pytest.mark.parametrize(
    ("key", "written", "fix"),
    [("rl.rewards", "{cider:1}", "{cider: 1}"), ("train.loss_weights", "{mle: 1, sr:2}", "{sr: 2}"),
     ("data.bag_schedule", "{1:3}", "{1: 3}"), ("rl.rewards", "{pkg.mod:fn:2}", "{pkg.mod:fn: 2}")],
)  # fmt: skip
def test_a_mapping_without_a_space_after_its_colon_says_to_write_one(key, written, fix, tmp_path):
    # YAML ends a key at a colon only before a space: `rl.rewards={cider:1}` is the key 'cider:1' with no value,
    # refused as "rl.rewards.cider:1: expected a number, got None" (data.bag_schedule: "key: expected an integer")
    message = rf"{re.escape(key)}: '.*' is a key with no value: YAML ends a key at a colon only before a space; " \
              rf"write {re.escape(fix)}$"  # fmt: skip
    refused_both_ways(key, written, tmp_path, rf"^override '{re.escape(key)}=.*': {message}",
                      rf"recipe\.yaml: line 2: {message}")  # fmt: skip
    assert load(None, [f"{key}={fix}"])  # with the space: the mapping meant
