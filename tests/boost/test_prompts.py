"""Default prompts with few-shot turns, prompt-file overrides, and errors naming the prompt file."""

import pytest
import yaml

from finecap.boost.prompts import DEFAULT_PROMPTS, PACKAGED, Prompts
from finecap.config import load


def test_default_messages_with_few_shot_turns():
    m = Prompts.load().messages("holistic", captions=["a dog"], blend="A dog.", visual="A brown dog on grass.")
    n_examples = len(DEFAULT_PROMPTS["holistic"]["examples"])
    assert [x["role"] for x in m] == ["system"] + ["user", "assistant"] * n_examples + ["user"]
    assert m[-1]["content"] == "Human caption: A dog.\nModel description: A brown dog on grass.\nImproved caption:"
    assert m[2]["content"] == DEFAULT_PROMPTS["holistic"]["examples"][0]["answer"]


def test_prompt_file_overrides_parts(tmp_path):
    path = tmp_path / "prompts.yaml"
    path.write_text(
        "blend:\n"
        '  user: "{n_captions} captions:\\n{captions}\\nOne sentence:"\n'
        "  examples: [{captions: [a cat, a black cat], answer: A black cat.}]\n"
    )
    prompts = Prompts.load(path)
    m = prompts.messages("blend", captions=["a dog", "a brown dog"])
    assert m[0]["content"] == DEFAULT_PROMPTS["blend"]["system"]  # not overridden: the default
    assert (
        m[1]["content"] == "2 captions:\n- a cat\n- a black cat\nOne sentence:" and m[2]["content"] == "A black cat."
    )
    assert m[3]["content"] == "2 captions:\n- a dog\n- a brown dog\nOne sentence:"
    assert prompts.source == str(path)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("blend:\n  user: '{visual}'\n", r"blend.user \(line 2\) uses unknown variable\(s\) \['visual'\]"),
        ("summary:\n  user: x\n", "unknown step 'summary'"),
        ("visual:\n  prompt: x\n", "visual: expected keys system, user, examples"),
        ("blend:\n  examples: [{captions: [a]}]\n", r"blend.examples\[0\] \(line 2\) needs an 'answer'"),
        ("blend: [unclosed\n", "invalid YAML"),
        ("- blend\n", r"a prompt file maps steps \(blend, visual, holistic\)"),
    ],
)
def test_bad_prompt_files_name_the_file(tmp_path, text, error):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error) as info:
        Prompts.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("blend:\n  system: ok\n  user: 'Captions: {captions'\n", r"blend.user \(line 3\): expected '}' before end"),
        ("holistic:\n  user: 'a } b {blend}'\n", r"holistic.user \(line 2\): Single '}' encountered"),
    ],
)
def test_unbalanced_brace_names_file_key_and_line(tmp_path, text, error):
    path = tmp_path / "braces.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error) as info:
        Prompts.load(path)
    assert str(info.value).startswith(f"{path}: ") and "{{ and }} for a literal brace" in str(info.value)


def test_non_utf8_prompt_file_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("blend:\n  user: 'L\u00e9gende: {captions}'\n".encode("latin-1"))  # é as the single byte 0xe9
    with pytest.raises(ValueError, match=r"not UTF-8 text: byte 0xe9 at line 2") as info:
        Prompts.load(path)
    assert str(info.value).startswith(f"{path}: ")


def test_packaged_paper_prompts():
    prompts = Prompts.load("ndlb")
    t = prompts.templates
    assert prompts.source == str(PACKAGED["ndlb"]) and PACKAGED["ndlb"].is_file()
    assert len(t["blend"]["examples"]) == 3 and len(t["holistic"]["examples"]) == 3  # the paper's 3 + 3
    assert all(len(ex["captions"]) == 5 for ex in t["blend"]["examples"])
    assert t["blend"]["system"].startswith("You are given a reference set of 5 image captions. Create a holistic")
    assert t["holistic"]["system"].endswith("simply generate the caption. Three examples are shown below :")
    # VisualCap: the paper's one instruction, beside the image, with no system message.
    assert prompts.messages("visual") == [{"role": "user", "content": "Briefly describe the content of the image."}]
    m = prompts.messages("blend", captions=["A dog.", "A brown dog runs."])
    assert [x["role"] for x in m] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    first_example = "Reference caption 1: A plate full of food with an assortment of food on it."
    assert m[1]["content"].splitlines()[0] == first_example
    assert m[-1]["content"] == "Reference caption 1: A dog.\nReference caption 2: A brown dog runs."
    m = prompts.messages("holistic", captions=["A dog."], blend="A dog.", visual="A brown dog on grass.")
    assert m[-1]["content"] == "Correct caption: A dog.\nNew noisy caption: A brown dog on grass."
    assert m[6]["content"] == t["holistic"]["examples"][2]["answer"]


@pytest.mark.parametrize("recipe", ["coco/boost_blend", "coco/boost_visual", "coco/boost_holistic"])
def test_coco_recipes_use_the_paper_prompts(recipe):
    assert load(recipe).boost.prompts == "ndlb"
    assert Prompts.load(load(recipe).boost.prompts).source == str(PACKAGED["ndlb"])


@pytest.mark.parametrize(
    ("example", "words"),
    [
        ({"captions": ["a dog"], "answer": "A dog."}, r"holistic.examples\[0\].* needs 'blend', 'visual'"),
        ({"captions": "a dog", "blend": "b", "visual": "v", "answer": "A dog."}, r"'captions' must be a list"),
        ({"captions": ["a dog"], "blend": ["b"], "visual": "v", "answer": "A dog."}, r"'blend' must be a string"),
    ],
)
def test_an_example_missing_what_its_step_fills_in_is_refused_when_the_file_loads(tmp_path, example, words):
    # it failed with a bare KeyError when the holistic messages were built, after the paid blend and visual steps;
    # a string of captions was formatted one character a line
    path = tmp_path / "prompts.yaml"
    path.write_text(yaml.safe_dump({"holistic": {"examples": [example]}}))
    with pytest.raises(ValueError, match=words):
        Prompts.load(path)
