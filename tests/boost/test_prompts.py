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
    assert len(t["blend"]["examples"]) == 3 and len(t["holistic"]["examples"]) == 3  # the 3 + 3 the paper prints
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


# NDLB appendix A.1 as the paper prints it (001_a7069adbd94b2d1a.txt, lines 413-481), its bold markers left out and a
# long line continued with a backslash; each blank line is the paper's paragraph break. The only layout the paper
# leaves open: the paragraphs of one user turn are joined by a line break (docs/boost.md#prompts).
PAPER_A1 = """\
(a) BlendCap

System prompt : You are given a reference set of 5 image captions. Create a holistic caption to describe the same \
image by incorporating relevant information from all the reference captions. Ensure that the generated caption \
minimizes redundancy by excluding overlapping information found in the reference set. Do not include additional \
information and adjectives other than what is given in reference set. Stop after the first period and do not ask \
any additional questions. Just complete the text. Three examples are shown below :

In context examples :

User : Reference caption 1: A plate full of food with an assortment of food on it.

Reference caption 2: There is meat and vegetables on a white and brown plate.

Reference caption 3: A plate on a table that has food on it.

Reference caption 4: A plate with some steak, carrots, and sliced fried potatoes.

Reference caption 5: A plate of food on a table.

Assistant : A white and brown plate on a table with an assortment of steak, carrots, sliced fried potatoes, and \
vegetables.

User : Reference caption 1: A park bench on the side of a lake.

Reference caption 2: A lone bench sits atop a hill looking over the river.

Reference caption 3: A wooden bench sitting on top of a sandy beach.

Reference caption 4: A bench on a river bank in the countryside.

Reference caption 5: A wood bench is sitting in front of a river.

Assistant : A wooden bench sits atop a hill in front of a river overlooking the water and the surrounding \
countryside.

User : Reference caption 1: A bathroom with a toilet sitting next to a sink.

Reference caption 2: A white sink and toilet in a room.

Reference caption 3: A bathroom with a mirror, sinks, toilet and toilet roll.

Reference caption 4: A bathroom that has a toilet sink and mirror in it.

Reference caption 5: A bathroom with a toilet next to a sink.

Assistant : A bathroom with a toilet next to a white sink, mirror and toilet roll.

(b) Visual Caption

System prompt : Briefly describe the content of the image.

(c) HolisticCap

System prompt : In this task, your objective is to improve “Correct caption” by incorporating any additional \
information present in “New caption”. If there are conflicting details between the two captions regarding the \
objects or their attributes, strictly use information from “Correct caption”. “New caption” can have incorrect \
information sometimes but “Correct caption” will always be correct. The focus is on transferring missing \
information, including adjectives and nouns, from “New caption” to “Correct caption”. Refrain from seeking further \
clarification and explanations; simply generate the caption. Three examples are shown below :

In context examples :

User : Correct caption: A man reaches up with a tennis racquet to hit an approaching ball in a tennis court.

New noisy caption: In this image, a woman is playing tennis on a purple court. She is wearing a white shirt and a \
blue short, and she is holding a tennis racket. The tennis ball is in the air as she prepares to hit it with her \
racket.

Assistant : A man wearing a white shirt and blue shorts reaches up with a tennis racquet to hit an approaching ball \
in a purple tennis court.

User : Correct caption: A white fire hydrant sits in front of an old couch on a sidewalk in front of a house.

New noisy caption: In this image, there is a black fire hydrant sitting on the sidewalk in front of a brick \
building. The fire hydrant is positioned next to a couch, which is placed on the sidewalk in front of the building.

Assistant : A white fire hydrant sits in front of an old couch on a sidewalk in front of a brick house.

User : Correct caption: A young boy poses next to a wall with writing on it, smiling and holding bags.

New noisy caption: In this image, a young girl is sitting in front of a graffiti-covered wall, wearing a red shirt. \
She is holding a box of crayons and smiling at the camera.

Assistant : A young boy wearing a red shirt poses next to a graffiti-covered wall with writing on it. He is holding \
bags of crayons and smiling at the camera.
"""


def paper_turns() -> dict[str, list[tuple[str, str]]]:
    """``{step: [(role, text), ...]}`` of :data:`PAPER_A1`: the system prompt, then the examples' turns in order."""
    steps = {"(a) BlendCap": "blend", "(b) Visual Caption": "visual", "(c) HolisticCap": "holistic"}
    roles = {"System prompt : ": "system", "User : ": "user", "Assistant : ": "assistant"}
    turns: dict[str, list[tuple[str, str]]] = {}
    step = ""
    for paragraph in PAPER_A1.strip().split("\n\n"):
        role = next((r for r in roles if paragraph.startswith(r)), None)
        if paragraph in steps:
            step = steps[paragraph]
            turns[step] = []
        elif role is not None:
            turns[step].append((roles[role], paragraph.removeprefix(role)))
        elif paragraph != "In context examples :":  # a turn's next paragraph: its next line
            turns[step][-1] = (turns[step][-1][0], turns[step][-1][1] + "\n" + paragraph)
    return turns


def test_ndlb_prompts_are_the_papers_word_for_word():
    # every message boost.prompts=ndlb sends before the image's own turn: the system prompt and the examples, in the
    # paper's order, against the paper's text (not against the packaged file it was copied into)
    prompts, paper = Prompts.load("ndlb"), paper_turns()
    assert [len(paper[s]) for s in ("blend", "visual", "holistic")] == [7, 1, 7]  # the parse saw every turn
    for step in ("blend", "holistic"):
        sent = prompts.messages(step, captions=["A dog."], blend="A dog.", visual="A brown dog.")
        assert [(m["role"], m["content"]) for m in sent[:-1]] == paper[step]
    # VisualCap: the paper's system prompt goes as the one instruction beside the image (InstructBLIP has no system
    # role: docs/boost.md#prompts), and nothing else is sent
    assert prompts.messages("visual") == [{"role": "user", "content": paper["visual"][0][1]}]
    # the image's own turn has the examples' layout: the labels of the paper's user turns, one per line, every human
    # caption in the data set's order, and BlendCap and VisualCap as the step before gave them
    captions = ["A dog.", "A brown dog runs.", "A dog on grass.", "A dog runs on grass.", "A small dog.", "A pet."]
    numbered = "\n".join(f"Reference caption {k}: {c}" for k, c in enumerate(captions, 1))
    assert prompts.messages("blend", captions=captions)[-1] == {"role": "user", "content": numbered}
    holistic = prompts.messages("holistic", captions=captions, blend="A dog runs.", visual="A brown dog on grass.")
    assert holistic[-1] == {
        "role": "user",
        "content": "Correct caption: A dog runs.\nNew noisy caption: A brown dog on grass.",
    }
