"""The model card asks the backbone's class what the folder was built on and how other tools load it
(``base_models`` / ``card_lines`` of :class:`finecap.models.base.CaptionerBase`): the lines of each registered
backbone, from hand-written ``captioner.json`` contents."""

from __future__ import annotations

import html
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from finecap.app.cli import main
from finecap.config import absolute_paths, from_dict
from finecap.data.formats import read_dataset
from finecap.data.records import DataError
from finecap.locks import command_argv, command_line
from finecap.train.model_card import model_card
from finecap.utils.text import shell_command
from finecap.world.make import load_scenes

HUB_BLIP, HUB_VLM = "Salesforce/blip-image-captioning-base", "HuggingFaceTB/SmolVLM-256M-Instruct"
CLIP = "openai/clip-vit-base-patch32"
BLIP_CLASS = "BlipForConditionalGeneration"
PEFT_BLIP = ("`adapter/` is one peft LoRA adapter for the whole model: "
             f'`PeftModel.from_pretrained({BLIP_CLASS}.from_pretrained(base), "adapter")`.')  # fmt: skip
BLIP_GENERATE = ("BLIP's `generate` decodes as the run did only when passed the folder's settings: "
                 "`model.generate(**inputs, generation_config=model.generation_config)`.")  # fmt: skip


def card(meta: dict) -> list[str]:
    return model_card(from_dict({"run": {"name": "r"}}), {"step": 1}, meta, None, "finecap train").split("\n")


def loading(lines: list[str]) -> list[str]:
    """The lines of the "Loading" section after finecap's own code block, up to the next section."""
    start = lines.index("## Loading")
    end = lines.index("## Made by")
    block_end = lines.index("```", lines.index("```python", start) + 1)
    return [line for line in lines[block_end + 1 : end] if line]


@pytest.mark.parametrize(
    ("meta", "bases", "hub", "extra"),
    [
        ({"kind": "clipcap", "lm_source": "gpt2", "encoder_source": CLIP},
         {"language model": "gpt2", "vision encoder": CLIP}, [CLIP],
         ["`lm/` is a plain `AutoModelForCausalLM` folder; `mapper.safetensors` maps image features to its prefix "
          "(finecap's `ClipCap` reads both)."]),
        ({"lm_source": "world-tiny", "encoder_source": "/x/enc"},  # no kind: clipcap
         {"language model": "world-tiny", "vision encoder": "/x/enc"}, [],
         ["`lm/` is a plain `AutoModelForCausalLM` folder; `mapper.safetensors` maps image features to its prefix "
          "(finecap's `ClipCap` reads both)."]),
        ({"kind": "blip", "source": HUB_BLIP, "adapter": "adapter", "lora": {"lm": {}}}, {"model": HUB_BLIP},
         [HUB_BLIP],
         [f"The folder is also a plain transformers checkpoint (`{BLIP_CLASS}.from_pretrained(folder)`, "
          "base weights without adapters).", PEFT_BLIP, BLIP_GENERATE]),
        ({"kind": "blip", "source": "world-tiny", "world_source": "/x/enc"},  # reads a dual encoder: finecap's only
         {"model": "world-tiny", "vision encoder": "/x/enc"}, [], []),
        ({"kind": "clipcap", "lm_source": "gpt2", "encoder_source": CLIP, "lora": {"lm": {"dir": "lm_lora"}}},
         {"language model": "gpt2", "vision encoder": CLIP}, [CLIP],
         ["`lm/` is a plain `AutoModelForCausalLM` folder; `mapper.safetensors` maps image features to its prefix "
          "(finecap's `ClipCap` reads both).",
          "`lm/` holds the base weights of the language model and `lm_lora/` its LoRA adapter: "
          '`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("lm"), "lm_lora")`.']),
        ({"kind": "vlm", "source": HUB_VLM, "lora": {}}, {"model": HUB_VLM}, [HUB_VLM],
         ["The folder is also a plain transformers checkpoint (`AutoModelForImageTextToText.from_pretrained(folder)`, "
          "the captioner's weights; no adapter to add)."]),
        ({"kind": "vlm", "source": HUB_VLM, "lora": {"encoder": {}}}, {"model": HUB_VLM}, [HUB_VLM],
         ["The folder is also a plain transformers checkpoint (`AutoModelForImageTextToText.from_pretrained(folder)`, "
          "base weights without adapters)."]),
        ({"kind": "vlm", "source": "world-tiny", "world_source": "/x/enc", "adapter": "adapter"},
         {"model": "world-tiny", "vision encoder": "/x/enc"}, [], []),
    ],
    ids=["clipcap", "clipcap-no-kind", "blip-adapter", "blip-world", "clipcap-lora", "vlm-merged", "vlm-lora",
         "vlm-world"],
)  # fmt: skip
def test_the_card_asks_the_backbone(meta, bases, hub, extra):
    lines = card(meta)
    assert [line for line in lines if line.startswith("- **Base ")] == [
        f"- **Base {role}**: `{source}`" for role, source in bases.items()
    ]
    assert [line for line in lines if line.startswith("base_model:")] == ([f'base_model: ["{hub[0]}"]'] if hub else [])
    assert f"- **Backbone**: `{meta.get('kind', 'clipcap')}`" in lines
    assert loading(lines) == extra


@pytest.mark.parametrize(
    ("meta", "front"),
    [
        ({"kind": "clipcap", "lm_source": "gpt2", "encoder_source": CLIP},
         {"pipeline_tag": "image-to-text", "base_model": [CLIP]}),
        ({"kind": "blip", "source": HUB_BLIP, "adapter": "adapter"},
         {"library_name": "transformers", "pipeline_tag": "image-to-text", "base_model": [HUB_BLIP]}),
        ({"kind": "blip", "source": "world-tiny", "world_source": "/x/enc"}, {"pipeline_tag": "image-to-text"}),
        ({"kind": "vlm", "source": HUB_VLM, "adapter": "adapter"},
         {"library_name": "transformers", "pipeline_tag": "image-text-to-text", "base_model": [HUB_VLM]}),
        ({"kind": "vlm", "source": "world-tiny", "world_source": "/x/enc"}, {"pipeline_tag": "image-text-to-text"}),
    ],
    ids=["clipcap", "blip", "blip-world", "vlm", "vlm-world"],
)  # fmt: skip
def test_the_front_matter_names_the_library_and_task_the_folder_is_for(meta, front):
    """What the Hub reads to offer a snippet: ``library_name: transformers`` only where transformers alone loads the
    folder as the captioner (ClipCap's top holds no config.json, ``lm/`` and the mapper: ``pipeline(...,
    model=folder)`` fails on it; the world models caption only with finecap's world encoder), and a VLM's task is its
    base models' ``image-text-to-text`` (an image and a prompt: transformers 5 runs ``image-to-text`` as that task,
    and refuses a VLM asked without text). Every card said ``library_name: transformers`` and ``image-to-text``."""
    card = model_card(from_dict({"run": {"name": "r"}}), {"step": 1}, meta, None, "finecap train")
    header = yaml.safe_load(card.split("\n---\n")[0].removeprefix("---\n"))
    assert {k: v for k, v in header.items() if k != "tags"} == front


def test_a_relative_local_base_is_never_named_a_hub_model_from_another_working_directory(tmp_path, monkeypatch):
    """``clipcap.lm=models/gpt2`` given where that folder exists: captioner.json records ``models/gpt2`` as given, the
    stored configuration ``<there>/models/gpt2``. A card written from another working directory (``finecap export``
    run elsewhere) said ``base_model: ["models/gpt2"]``, a machine-local folder presented as a Hub model; it names the
    Hub encoder only, and still shows the base as the user gave it."""
    (tmp_path / "proj" / "models" / "gpt2").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    cfg = from_dict({"run": {"name": "r"}, "clipcap": {"lm": "models/gpt2"}})
    stored = absolute_paths(cfg)  # what the run's config.yaml holds
    assert stored.clipcap.lm == str(tmp_path / "proj" / "models" / "gpt2")
    meta = {"kind": "clipcap", "lm_source": "models/gpt2", "encoder_source": CLIP}
    for where, config in (("proj", cfg), ("elsewhere", stored)):
        monkeypatch.chdir(tmp_path / where)
        lines = model_card(config, {"step": 1}, meta, None, "finecap export").split("\n")
        assert [line for line in lines if line.startswith("base_model:")] == [f'base_model: ["{CLIP}"]'], where
        assert "- **Base language model**: `models/gpt2`" in lines
    hub = {"kind": "clipcap", "lm_source": "openai-community/gpt2", "encoder_source": CLIP}  # a Hub name stays one
    card_text = model_card(stored, {"step": 1}, hub, None, "finecap export")
    assert f'base_model: ["openai-community/gpt2", "{CLIP}"]' in card_text.split("\n")


BF16 = {"lm": {"trainable": "float32", "frozen": "bfloat16"}, "encoder": {"frozen": "bfloat16"},
        "rest": {"frozen": "bfloat16"}}  # captioner.json's dtypes of a model.dtype=bfloat16 LoRA run  # fmt: skip


def test_a_16_bit_runs_card_loads_the_base_in_that_dtype_under_its_adapter():
    """A run with ``model.dtype=bfloat16`` computed in bf16: the adapter over a base loaded in its saved float32
    captioned 2 of 4 tiny Qwen2.5-VL images as the run did, over a bf16 base 4 of 4. The card's peft line loads the
    base in the run's dtype; a float32 run's loads it as saved."""
    vlm = {"kind": "vlm", "source": HUB_VLM, "adapter": "adapter", "lora": {"lm": {}}}
    assert ("`adapter/` is one peft LoRA adapter for the whole model: `PeftModel.from_pretrained("
            'AutoModelForImageTextToText.from_pretrained(base, dtype=torch.bfloat16), "adapter")`.'
            in loading(card(vlm | {"dtypes": BF16})))  # fmt: skip
    fp32 = {part: {"frozen": "float32"} for part in BF16}
    assert ('`PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base), "adapter")`.'
            in loading(card(vlm | {"dtypes": fp32}))[-1])  # fmt: skip
    clipcap = {"kind": "clipcap", "lm_source": "gpt2", "encoder_source": CLIP, "lora": {"lm": {"dir": "lm_lora"}},
               "dtypes": {"lm": {"trainable": "float32", "frozen": "float16"}}}  # fmt: skip
    assert loading(card(clipcap))[-1].endswith(
        '`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("lm", dtype=torch.float16), "lm_lora")`.'
    )


def test_an_unknown_kind_names_the_file():
    with pytest.raises(
        ValueError, match=r"^captioner.json: unknown captioner kind 'nope'; valid names: blip, clipcap"
    ):
        card({"kind": "nope"})


# --------------------------------------------------------------------------------------------------------------------
# A command finecap prints is the command that ran (issue 61, class 12): shell-quoted, so that pasting it runs exactly
# the recorded arguments
# --------------------------------------------------------------------------------------------------------------------

HOSTILE_ARGS = {
    "redirect-in": "run.name=<in", "redirect-out": "run.name=>out", "separator": "run.name=a;touch sep",
    "substitution": "run.name=$(touch made)", "backticks": "run.name=`touch ticks`", "variable": "data.path=$HOME/x",
    "single-quote": "run.name=it's", "double-quote": 'run.name="quoted"', "spaces": "run.name=a  b",
    "newline": "data.path=a\nb", "newline-then-command": "run.name=x\ntouch nl", "unicode": "run.name=café ☕ 猫",
    "empty": "", "glob": "run.name=*", "comment": "run.name=#c", "pipe-and": "run.name=a|b&&touch amp",
    "backslash": "run.name=a\\b", "history": "run.name=!!", "tilde": "~", "dash-c": "-c", "tab": "run.name=a\tb",
}  # fmt: skip
PLANTED = ("in", "out", "sep", "made", "ticks", "nl", "amp")
"""Files the hostile arguments would create or read if a shell ran them as code."""
ECHO = "import json, sys\nprint(json.dumps(sys.argv[1:]))\n"
"""The stand-in program: prints the arguments it was given."""


def run_in_bash(printed: str, cwd: Path) -> list[str]:
    """The arguments a stand-in program gets when ``printed`` (its first word that program) runs in bash."""
    done = subprocess.run(["bash", "-c", printed], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture()
def stand_in(tmp_path) -> Path:
    program = tmp_path / "bin" / "finecap"  # named as finecap: the printed commands start with it
    program.parent.mkdir()
    program.write_text(f"#!{sys.executable}\n{ECHO}")
    program.chmod(0o755)
    return program


@pytest.mark.parametrize("case", list(HOSTILE_ARGS))
def test_a_printed_command_reads_back_as_its_arguments(case):
    argv = ["finecap", "train", "demo/mle", HOSTILE_ARGS[case], "train.max_steps=3"]
    assert shlex.split(shell_command(argv)) == argv
    assert shlex.split(shell_command([*argv, *HOSTILE_ARGS.values()])) == [*argv, *HOSTILE_ARGS.values()]


def test_every_printed_form_runs_exactly_its_arguments_in_bash(tmp_path, stand_in, monkeypatch):
    argv = [str(stand_in), "train", "demo/mle", *HOSTILE_ARGS.values(), "train.max_steps=3"]
    monkeypatch.setattr(sys, "argv", argv)
    card = model_card(from_dict({"run": {"name": "r"}}), {"step": 1}, {"kind": "clipcap"}, None, command_argv())
    lines = card.split("\n")
    start = lines.index("## Made by") + 2
    fence = lines[start]
    assert set(fence) == {"`"} and len(fence) >= 3
    block = "\n".join(lines[start + 1 : lines.index(fence, start + 1)])
    printed = {"shell_command": shell_command(argv), "command_line": command_line(), "card": block}
    for form, text in printed.items():
        assert shlex.split(text) == argv, form
        assert run_in_bash(text, tmp_path) == argv[1:], form  # the stand-in got every argument as it was
    assert not [name for name in PLANTED if (tmp_path / name).exists()]  # nothing ran, nothing was redirected


def test_the_cards_command_block_renders_as_one_code_block(monkeypatch):
    markdown_it = pytest.importorskip("markdown_it")
    argv = ["finecap", "train", "run.name=```\n<script>alert(1)</script>", "data.path=a\n---\nlicense: x", "# h"]
    card = model_card(from_dict({"run": {"name": "r"}}), {"step": 1}, {"kind": "clipcap"}, None, argv)
    assert card.split("\n")[:2] == ["---", "pipeline_tag: image-to-text"]  # ClipCap: no library loads it alone
    assert yaml.safe_load(card.split("\n---\n")[0].removeprefix("---\n"))["pipeline_tag"] == "image-to-text"
    rendered = markdown_it.MarkdownIt("commonmark").render(card.split("\n---\n", 1)[1])
    made_by = rendered.split("<h2>Made by</h2>")[1]
    blocks = re.findall(r"<pre><code>(.*?)</code></pre>", made_by, re.S)
    assert [html.unescape(b) for b in blocks] == [shell_command(argv) + "\n"]  # the command, as it is, in one block
    assert "<script>" not in rendered and "<h1>" not in made_by


def test_the_hints_naming_a_path_are_quoted(tmp_path, stand_in, capsys):
    folder = tmp_path / "my $(touch made) recipes; touch sep"
    folder.mkdir()
    assert main(["recipes", "cp", "demo/mle", str(folder / "it's.yaml")]) == 0
    hint = capsys.readouterr().out.strip().split("; run it with: ", 1)[1]
    assert shlex.split(hint) == ["finecap", "train", str(folder / "it's.yaml")]
    assert run_in_bash(hint.replace("finecap", str(stand_in), 1), tmp_path) == ["train", str(folder / "it's.yaml")]
    with pytest.raises(FileNotFoundError) as e:
        load_scenes(folder)
    hint = str(e.value).split("run `", 1)[1].rsplit("` first", 1)[0]
    assert shlex.split(hint) == ["finecap", "world", "make", "--out", str(folder)]
    with pytest.raises(DataError) as e:
        read_dataset("world", folder / "dataset.json")
    hint = str(e.value).split("create the world with `", 1)[1].rstrip("`")
    assert shlex.split(hint) == ["finecap", "world", "make", "--out", str(folder)]
    assert not [name for name in PLANTED if (tmp_path / name).exists()]


def test_the_title_names_grpo_and_its_former_name():
    from finecap.train.model_card import title

    meta = {"kind": "vlm", "name": "HuggingFaceTB/SmolVLM-256M-Instruct"}
    assert title("grpo", meta).startswith("GRPO captioner on ")
    assert title("reinforce", meta).startswith("REINFORCE captioner on ")


class _Bare:
    tokenizer = None  # what save_checkpoint reads of a captioner besides save (no weights are needed here)

    def save(self, out, state_dict=None):
        out.mkdir(parents=True)


@pytest.mark.parametrize(
    ("which", "says", "never"),
    [
        ("best", "a best checkpoint records the validation values it was chosen by", "its best checkpoint holds"),
        ("last", "the run's last state, chosen by no validation", "a best checkpoint records"),
        ("step-9", "None recorded for this checkpoint.", "last state"),
    ],
)
def test_a_checkpoint_without_values_says_what_is_true_of_its_folder(tmp_path, which, says, never):
    # every card without values said "the run's last state; its best checkpoint holds the values", also a best
    # checkpoint's (whose trainer_state.json lost them) and a folder of another name, which is neither
    from finecap.train.checkpoint import save_checkpoint

    folder = save_checkpoint(tmp_path / "run" / "checkpoints" / which, model=_Bare(), cfg=from_dict({}),
                             info={"step": 1})  # fmt: skip
    text = (folder / "model" / "README.md").read_text()
    section = text.split("## Validation at this checkpoint\n\n")[1].split("\n")[0]
    assert section.startswith("None recorded for this checkpoint") and says in section and never not in section


def test_a_command_started_as_python_dash_m_finecap_is_recorded_as_one_that_runs(tmp_path, monkeypatch):
    """``python -m finecap train ...`` has finecap's ``__main__.py`` as ``sys.argv[0]``: recorded as is, the card's
    "Made by" and the run's lock record named a file that is no command when pasted. They name this interpreter's
    ``-m finecap``; and the printed command runs those arguments in bash (the interpreter a stand-in here)."""
    import finecap
    import finecap.locks as locks

    main = str(Path(finecap.__file__).with_name("__main__.py"))  # sys.argv[0] under -m (importing it runs finecap)
    monkeypatch.setattr(sys, "argv", [main, "train", "demo/mle", "run.name=a b"])
    assert command_argv() == [sys.executable, "-m", "finecap", "train", "demo/mle", "run.name=a b"]
    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!{sys.executable}\n{ECHO}")
    stand_in.chmod(0o755)
    monkeypatch.setattr(locks.sys, "executable", str(stand_in))
    assert run_in_bash(command_line(), tmp_path) == ["-m", "finecap", "train", "demo/mle", "run.name=a b"]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/finecap", "train"])  # the console script: as it is
    assert command_argv() == ["/usr/bin/finecap", "train"]
