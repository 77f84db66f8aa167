"""Issue 48, class 5 (hangs), round three of the hostile user's trial: inputs that made finecap run for ever.

- **Chat templates** (:mod:`finecap.models.chat_templates`): a checkpoint's ``chat_template.jinja`` is a program;
  nested loops, huge repetitions, powers and widths, recursive or doubling macros, doubling strings and lists and
  floods of output each end in one error naming the template's file and the limit, within the time limit (shortened
  here to keep the tests fast), while real templates render exactly as transformers renders them; through ``finecap
  caption`` on a planted checkpoint the error is one ``finecap: error:`` line with exit code 2.
- **METEOR**: its normaliser's handling of runs of dots is linear (the jar's loops kept here as the oracle), and a
  caption or reference longer than ``eval.meteor_max_words`` is refused naming the image, its length, the limit and
  the option (``finecap eval``: one line, exit 2); at the limit it is scored.
- FSDP2's validation deadlock: tests/train/test_fsdp_validation.py.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
import types
from pathlib import Path

import pytest
import transformers
from PIL import Image
from transformers.utils import chat_template_utils

from finecap.app.cli import main as cli
from finecap.config import DecodeConfig, WorldConfig
from finecap.data.datasets import model_collator
from finecap.metrics.meteor import meteor_per_item
from finecap.metrics.meteor import resources as R
from finecap.metrics.meteor.inputs import MAX_WORDS, check_lengths
from finecap.metrics.meteor.normalize import Normalizer, protect_dots, restore_dots
from finecap.models import chat_templates
from finecap.models import vlm as vlm_module
from finecap.models.chat_templates import ChatTemplateError, apply_chat_template
from finecap.models.presets import CHAT_TEMPLATES, save_tiny_vlm
from finecap.models.tokenizer import world_tokenizer
from finecap.models.vlm import Vlm
from finecap.world.make import make_world

needs_meteor_data = pytest.mark.skipif(R.data_unavailable_reason() is not None, reason="pycocoevalcap's data missing")
MESSAGES = [{"role": "user", "content": "Describe the image."}]
SHORT_SECONDS = 0.5  # the time limit in these tests (the real one: chat_templates.MAX_SECONDS)

# -- chat templates -------------------------------------------------------------------------------------------------

NESTED = "{% for a in range(10**5) %}{% for b in range(10**5) %}x{% endfor %}{% endfor %}"
HOSTILE = {
    "nested loops": (NESTED, "MAX_SECONDS|MAX_CHARS"),
    "nested loops printing nothing": (
        "{% for a in range(10**5) %}{% for b in range(10**5) %}{% endfor %}{% endfor %}", "MAX_SECONDS"),
    "six nested loops of 20": ("{% for a in range(20) %}" * 6 + "{% endfor %}" * 6, "MAX_SECONDS"),
    "string times 10**9": ("{{ 'x' * 10**9 }}", "MAX_CHARS"),
    "list times a variable": ("{% set n = 10**9 %}{{ (['ab'] * 1000) * n }}", "MAX_CHARS"),
    "power": ("{% set n = 10**9 %}{{ 10**n }}", "MAX_INT_BITS"),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses"),
    "doubling macro": ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}x{% endif %}"
                       "{% endmacro %}{{ f(60) }}", "MAX_SECONDS|MAX_CHARS"),
    "doubling string": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s }}", "MAX_CHARS"),
    "doubling shared list": ("{% set ns = namespace(l=['x']) %}{% for i in range(64) %}{% set ns.l = [ns.l, ns.l] %}"
                             "{% endfor %}{{ ns.l }}", "MAX_CHARS|MAX_SECONDS"),
    "width filter": ("{{ 'x'|center(10**9) }}", "MAX_CHARS"),
    "width method": ("{{ 'x'.ljust(10**9) }}", "MAX_CHARS"),
    "width in str.format": ("{{ '{:>999999999}'.format(1) }}", "MAX_CHARS"),
    "width in %": ("{{ '%999999999d' % 1 }}", "MAX_CHARS"),
    "replace product": ("{% set s = 'x' * 10**6 %}{{ s|replace('x', s) }}", "MAX_CHARS"),
    "quadratic sum": ("{{ ([[1]] * 100000)|sum(start=[])|length }}", "MAX_CHARS|MAX_SECONDS"),
    "output flood": ("{% for a in range(100000) %}{{ 'y' * 100 }}{% endfor %}", "MAX_CHARS|MAX_SECONDS"),
    "output past the cap": ("{% for a in range(3) %}{{ 'y' * 1000000 }}{% endfor %}", "renders more than .*MAX_CHARS"),
}  # fmt: skip


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(chat_templates, "MAX_SECONDS", SHORT_SECONDS)


def saved_tokenizer(folder: Path, template: str):
    """A word-level tokenizer with ``template``, saved and loaded back as a checkpoint's tokenizer would be."""
    tok = world_tokenizer(["<user>", "<assistant>"])
    tok.chat_template = template
    tok.save_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_chat_template_stops_with_an_error_naming_its_file_and_limit(name, tmp_path, short_limit):
    template, limit = HOSTILE[name]
    tok = saved_tokenizer(tmp_path / "ckpt", template)
    start = time.monotonic()
    with pytest.raises(ChatTemplateError) as caught:
        apply_chat_template(tok, MESSAGES, tokenize=False, add_generation_prompt=True)
    assert time.monotonic() - start < SHORT_SECONDS + 4  # measuring a value at the limit takes up to ~2 s
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'ckpt' / 'chat_template.jinja'}: chat template refused: "), message
    assert re.search(limit, message), message
    assert "\n" not in message and len(message) < 400
    # transformers' own compiler is back in place, and a good template renders after the refusal
    assert chat_template_utils._compile_jinja_template is chat_templates.transformers_compiler()
    tok.chat_template = "{{ messages[0]['content'] }}"
    assert apply_chat_template(tok, MESSAGES, tokenize=False) == "Describe the image."


def test_a_lazy_transformers_module_that_cannot_import_is_not_touched(tmp_path, monkeypatch):
    """transformers 5.19 leaves lazy modules in ``sys.modules`` whose attribute lookup imports a submodule needing a
    package that may be missing (``transformers.models.aria`` needs torchvision): swapping the compiler reads each
    module's own namespace and never triggers such an import."""

    class Lazy(types.ModuleType):
        def __getattr__(self, name):
            raise ModuleNotFoundError("No module named 'torchvision'")

    monkeypatch.setitem(sys.modules, "transformers.models.lazy_needs_torchvision", Lazy("lazy"))
    tok = saved_tokenizer(tmp_path / "ckpt", "{{ messages[0]['content'] }}")
    assert apply_chat_template(tok, MESSAGES, tokenize=False) == "Describe the image."


@pytest.mark.parametrize("template", ["{% for %}", "{{ raise_exception('no images here') }}", "{{ lipsum(5) }}"])
def test_a_broken_chat_template_is_named_too(template, tmp_path):
    tok = saved_tokenizer(tmp_path, template)
    with pytest.raises(
        ChatTemplateError, match=re.escape(f"{tmp_path / 'chat_template.jinja'}: the chat template fails")
    ):
        apply_chat_template(tok, MESSAGES, tokenize=False)


REAL = (  # the constructs of the Hub's chat templates (Llama 3, Qwen, SmolVLM, LLaVA)
    "{%- set ns = namespace(images=0, system=false) -%}{{ bos_token }}"
    "{%- if tools is not none %}{{ tools|tojson(indent=2) }}{% endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] == 'system' %}{% set ns.system = true %}{% endif -%}"
    "<|im_start|>{{ message['role']|capitalize }}{{ ':' if message['content'] is string else ' ' }}"
    "{%- if message['content'] is string %}{{ message['content']|trim }}{% else -%}"
    "{%- for c in message['content'] -%}"
    "{%- if c['type'] == 'image' %}{% set ns.images = ns.images + 1 %}<image {{ ns.images }}>"
    "{%- else %}{{ c['text'] | replace('  ', ' ') }}{% endif -%}{%- endfor -%}{%- endif -%}"
    "<end_of_utterance>{{ '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ 'Assistant:' ~ (' ' * 1) }}{{ '%s-%d' % ('x', 3) }}"
    "{{ '{} {}'.format(ns.images, loop) if false else '' }}{{ (messages|map(attribute='role')|join(','))|upper }}"
    "{%- endif -%}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Describe the image."}],
    [{"role": "system", "content": "  Be brief.  "},
     {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe  it."}, {"type": "image"}]}],
]  # fmt: skip


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, [{"name": "f", "parameters": {"x": [1, 2, {"y": "z"}]}}]])
def test_real_templates_render_as_transformers_renders_them(conversation, tools, tmp_path):
    for template in [REAL, *CHAT_TEMPLATES.values()]:
        if template is not REAL and isinstance(conversation[0]["content"], str):
            continue  # the tiny VLMs' templates expect content parts
        tok = saved_tokenizer(tmp_path / str(len(template)), template)
        options = dict(tokenize=False, add_generation_prompt=True, tools=tools)
        assert apply_chat_template(tok, conversation, **options) == tok.apply_chat_template(conversation, **options)
        ids = dict(tokenize=True, add_generation_prompt=True, return_dict=True)
        assert apply_chat_template(tok, conversation, **ids) == tok.apply_chat_template(conversation, **ids)


def test_the_assistant_mask_renders_as_transformers_renders_it(tmp_path):
    template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} <eos>"
                "{% endgeneration %}{% else %}<user> {{ m['content'] }}{% endif %}{% endfor %}")  # fmt: skip
    tok = saved_tokenizer(tmp_path, template)
    chat = [{"role": "user", "content": "a red circle"}, {"role": "assistant", "content": "two blue squares"}]
    options = dict(tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ours = apply_chat_template(tok, chat, **options)
    assert ours == tok.apply_chat_template(chat, **options) and any(ours["assistant_masks"])


def test_a_template_is_compiled_once_and_a_captioner_renders_its_prompt_once(tmp_path, monkeypatch):
    tok = saved_tokenizer(tmp_path / "tok", REAL)
    apply_chat_template(tok, MESSAGES, tokenize=False)
    hits = chat_templates.compile_bounded.cache_info().hits
    for _ in range(3):
        apply_chat_template(tok, MESSAGES, tokenize=False)
    assert chat_templates.compile_bounded.cache_info().hits == hits + 3  # compiled once, rendered each time
    renders = []
    monkeypatch.setattr(vlm_module, "apply_chat_template", lambda *a, **k: renders.append(1) or apply_chat_template(
        *a, **k))  # fmt: skip
    model = Vlm.from_pretrained(save_tiny_vlm(tmp_path / "vlm", "llava"))
    items = [{"caption": "a red circle", "image": Image.new("RGB", (16, 16), c), "image_id": i, "references": ["x"],
              "index": i} for i, c in enumerate(["red", "blue", "green"])]  # fmt: skip
    for _ in range(2):
        model.generate(model_collator(model, 8)(items), DecodeConfig(strategy="greedy", max_length=3))
    assert renders == [1]  # the prompt of every caption is the one rendered when the captioner was built


def _train_tiny_vlm_run(tmp_path: Path) -> Path:
    world = tmp_path / "world"
    make_world(WorldConfig(n_train=16, n_val=4, n_test=4, image_size=32, seed=0), out=world, progress=False)
    vlm = save_tiny_vlm(tmp_path / "tiny-vlm", "llava")
    run = tmp_path / "run"
    assert cli(["train", "model.kind=vlm", f"vlm.name={vlm}", f"world.out={world}", "world.n_train=16",
                "world.n_val=4", "world.n_test=4", "world.image_size=32", "train.max_steps=1", "train.batch_size=4",
                f"run.dir={run}", f"run.cache_dir={tmp_path / 'cache'}", "decode.max_length=4"]) == 0  # fmt: skip
    return run


@pytest.mark.slow
def test_finecap_caption_on_a_checkpoint_with_a_hostile_template_ends_in_one_line(tmp_path, capsys, short_limit):
    run = _train_tiny_vlm_run(tmp_path)
    for variant, (template, limit) in {k: HOSTILE[k] for k in ("nested loops", "string times 10**9")}.items():
        planted = [p for p in (run / "checkpoints").glob("*/model/chat_template.jinja")]
        assert len(planted) == 2  # best and last
        for path in planted:
            path.write_text(template)
        before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
        capsys.readouterr()
        start = time.monotonic()
        assert cli(["caption", "--checkpoint", str(run), "--out", str(tmp_path / "captions.json")]) == 2, variant
        assert time.monotonic() - start < 60
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finecap: error:")]
        assert len(err) == 1 and re.search(limit, err[0]), err
        assert f"{run / 'checkpoints' / 'best' / 'model' / 'chat_template.jinja'}: chat template refused:" in err[0]
        assert not (tmp_path / "captions.json").exists()
        assert before == {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}  # nothing written


# -- METEOR ---------------------------------------------------------------------------------------------------------


def jar_protect_dots(s: str) -> str:
    """The jar's (Moses') loop that :func:`protect_dots` replaces: the oracle."""
    while "DOTMULTI." in s:
        s = re.sub(r"DOTMULTI\.([^.])", r"DOTDOTMULTI \1", s)
        s = s.replace("DOTMULTI.", "DOTDOTMULTI")
    return s


def jar_restore_dots(s: str) -> str:
    while "DOTDOTMULTI" in s:
        s = s.replace("DOTDOTMULTI", "DOTMULTI.")
    return s.replace("DOTMULTI", ".")


def test_the_dot_rules_equal_the_jars_loops_and_are_linear():
    rng = random.Random(48)
    pieces = ["DOTMULTI"] * 3 + ["." * k for k in range(1, 7)] + ["DOT", "D", "OT", "MULTI", "I", " ", "x", "\n"]
    for _ in range(20_000):
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 20)))
        assert protect_dots(s) == jar_protect_dots(s), repr(s)
        assert restore_dots(s) == jar_restore_dots(s), repr(s)
    normalizer = Normalizer({"Mr": 1})
    for text in ["a " + "." * 100_000 + " b", "." * 100_000, "x" + "..x" * 30_000]:
        start = time.monotonic()
        words = normalizer.words(text)
        assert time.monotonic() - start < 2  # the loops took minutes on 100,000 dots
        assert "".join(words).replace(".", "") == "".join(text.split()).replace(".", "")


@needs_meteor_data
@pytest.mark.slow  # the first scoring builds the paraphrase index in the test session's finecap home
@pytest.mark.parametrize("side", ["prediction", "reference"])
def test_meteor_scores_at_the_limit_and_refuses_past_it(side):
    ref = "a man riding a wave on a surfboard"
    for n, ok in [(50, True), (51, False)]:
        long = " ".join((["surfer", "on", "a", "wave"] * 13)[:n])
        preds, refs = ({7: long}, {7: [ref]}) if side == "prediction" else ({7: ref}, {7: [ref, long]})
        if ok:
            corpus, _ = meteor_per_item(preds, refs, max_words=50, processes=1)
            assert 0 < corpus["METEOR"] <= 1
            continue
        for backend in ("python", "java"):  # checked before either runs (no JVM is started for it)
            with pytest.raises(ValueError) as caught:
                meteor_per_item(preds, refs, max_words=50, processes=1, backend=backend)
            where = "predictions[7]" if side == "prediction" else "references[7][1]"
            assert str(caught.value).startswith(
                f"{where}: 51 words, more than METEOR's limit of 50 (eval.meteor_max_words"
            )


def test_check_lengths_names_the_first_caption_past_the_limit():
    check_lengths([1, 2], ["a " * MAX_WORDS, "b"], [["c"], ["d " * MAX_WORDS]])  # at the limit: nothing
    with pytest.raises(ValueError, match=r"^references\['b'\]\[2\]: 1,001 words, more than METEOR's limit of 1,000"):
        check_lengths(["a", "b"], ["x", "y"], [["x"], ["y", "z", "w " * 1001]])


def _coco_files(tmp_path: Path, caption: str) -> tuple[Path, Path]:
    captions = [(1, "a dog runs on grass"), (1, "a dog on a lawn"), (2, "a red bus")]
    annotations = [{"image_id": i, "id": k, "caption": c} for k, (i, c) in enumerate(captions)]
    refs = {"images": [{"id": i} for i in (1, 2)], "annotations": annotations}
    res = [{"image_id": 1, "caption": "a dog running on grass"}, {"image_id": 2, "caption": caption}]
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "res.json").write_text(json.dumps(res))
    return tmp_path / "refs.json", tmp_path / "res.json"


@needs_meteor_data
@pytest.mark.slow
def test_finecap_eval_refuses_a_too_long_caption_in_one_line(tmp_path, capsys):
    long = " ".join((["red", "bus", "on", "a"] * 300)[:1001])
    refs, res = _coco_files(tmp_path, long)
    argv = ["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "meteor", "--format", "json"]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "finecap: error: predictions[2]: 1,001 words, more than METEOR's limit"
    ), err
    assert "eval.meteor_max_words" in err[0]
    assert cli([*argv, "eval.meteor_max_words=1001"]) == 0  # the option raises it
    assert 0 < json.loads(capsys.readouterr().out)["METEOR"] < 1
