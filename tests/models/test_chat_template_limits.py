"""Chat templates that made finecap run for ever (issue 48).

A checkpoint's ``chat_template.jinja`` is a program (:mod:`finecap.models.chat_templates`): nested loops, huge
repetitions, powers and widths, recursive or doubling macros, doubling strings and lists and floods of output each end
in one error naming the template's file and the limit, within the time limit (shortened here to keep the tests fast),
while real templates render exactly as transformers renders them; through ``finecap caption`` on a planted checkpoint
the error is one ``finecap: error:`` line with exit code 2. METEOR's bounds: tests/metrics/test_meteor_limits.py;
FSDP2's validation deadlock: tests/train/test_fsdp_validation.py.
"""

from __future__ import annotations

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
from finecap.models import chat_templates
from finecap.models import vlm as vlm_module
from finecap.models.chat_templates import ChatTemplateError, apply_chat_template
from finecap.models.presets import CHAT_TEMPLATES, save_tiny_vlm
from finecap.models.tokenizer import world_tokenizer
from finecap.models.vlm import Vlm
from finecap.world.make import make_world

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
    # built: the prompt, and once the prompt with an assistant answer (what the template writes around an answer:
    # finecap.models.vlm.answer_context)
    assert renders == [1, 1]
    items = [{"caption": "a red circle", "image": Image.new("RGB", (16, 16), c), "image_id": i, "references": ["x"],
              "index": i} for i, c in enumerate(["red", "blue", "green"])]  # fmt: skip
    for _ in range(2):
        model.generate(model_collator(model, 8)(items), DecodeConfig(strategy="greedy", max_length=3))
    assert renders == [1, 1]  # the prompt of every caption is the one rendered when the captioner was built


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
