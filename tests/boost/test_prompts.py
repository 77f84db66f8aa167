"""Default prompts with few-shot turns, prompt-file overrides, and errors naming the prompt file."""

import pytest

from finecap.boost.prompts import DEFAULT_PROMPTS, Prompts


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
