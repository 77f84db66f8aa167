"""Hugging Face's names of finecap's options (finecap.config.hf_names): an unknown key spelt as transformers'
``generate``, its ``TrainingArguments`` or TRL's ``GRPOConfig`` spell it is told finecap's key, never read as it."""

import re

import pytest

from finecap.config import SECTIONS, ConfigError, load
from finecap.config.fields import option_fields
from finecap.config.hf_names import HF_NAMES
from finecap.config.loading import options_named

OPTIONS = {key for s, cls in SECTIONS.items() for key, _, _ in option_fields(cls, f"{s}.")}


@pytest.mark.parametrize("name", sorted(HF_NAMES))
def test_each_name_points_at_an_option_that_takes_its_value_and_is_no_option_of_that_section(name):
    hf = HF_NAMES[name]
    if hf.key is None:  # no counterpart: then no option of finecap has the name either
        assert not options_named(name)
        return
    assert hf.key in OPTIONS
    section = hf.key.rsplit(".", 1)[0]
    assert f"{section}.{name}" not in OPTIONS  # else it would be read, never told
    if hf.value:  # a switch: the value it stands for is one the option takes
        cfg = load(None, [f"{hf.key}={hf.value}"])
        assert str(getattr(getattr(cfg, section), hf.key.rsplit(".", 1)[1])) == hf.value


@pytest.mark.parametrize(
    "override, told",
    [
        # the closest key by spelling was finished_beams; max_new_tokens was told the boost LLM's option,
        # do_sample and learning_rate nothing; gradient_accumulation_steps was right by spelling and stays right
        ("decode.num_beams=3", "Hugging Face's num_beams is 'decode.beam_size' here; read with decode.strategy=beam"),
        ("decode.max_new_tokens=30", "Hugging Face's max_new_tokens is 'decode.max_length' here; generated tokens"),
        ("decode.do_sample=true", "Hugging Face's do_sample=true is 'decode.strategy=sample' here"),
        ("decode.repetition_penalty=1.2", "Hugging Face's repetition_penalty has no counterpart in finecap"),
        ("train.learning_rate=1e-4", "Hugging Face's learning_rate is 'train.lr' here)"),
        ("train.per_device_train_batch_size=8", "Hugging Face's per_device_train_batch_size is 'train.batch_size'"),
        ("train.num_train_epochs=3", "Hugging Face's num_train_epochs is 'train.epochs' here)"),
        ("train.eval_steps=50", "Hugging Face's eval_steps is 'train.eval_every' here; 0 evaluates once per epoch"),
        ("train.lr_scheduler_type=cosine", "Hugging Face's lr_scheduler_type is 'train.schedule' here; linear"),
        ("train.num_beams=3", "Hugging Face's num_beams is 'decode.beam_size' here"),  # from another section too
        ("rl.num_generations=8", "TRL's num_generations is 'rl.samples' here)"),
        ("grpo.beta=0.04", "TRL's beta is 'grpo.kl_coef' here; read with grpo.policy_loss=clipped"),
    ],
)
def test_a_hugging_face_name_is_told_finecaps_key_and_still_refused(override, told):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"unknown key '{re.escape(key)}' \({re.escape(told)}"):
        load(None, [override])


def test_a_recipe_writing_a_hugging_face_name_is_told_the_key_on_its_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("decode:\n  strategy: beam\n  num_beams: 3\n")
    with pytest.raises(ConfigError) as e:
        load(recipe)
    assert str(e.value).startswith(f"{recipe}: line 3: unknown key 'decode.num_beams' (Hugging Face's num_beams is "
                                   "'decode.beam_size' here")  # fmt: skip


def test_a_name_of_finecap_elsewhere_is_still_suggested_outside_the_section_hugging_face_means():
    # boost.max_new_tokens is the boost LLM's own option: train.max_new_tokens names it first, as every key of
    # another section is
    with pytest.raises(ConfigError, match=r"unknown key 'train.max_new_tokens' \(did you mean 'boost.max_new_tokens'"):
        load(None, ["train.max_new_tokens=30"])
