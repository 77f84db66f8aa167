"""The model card of a checkpoint: ``README.md`` in its model folder, as the Hugging Face Hub and other tools read one.

Every checkpoint finecap writes carries one (:func:`finecap.train.checkpoint.save_checkpoint`): a YAML header
(``library_name`` where transformers loads the folder and ``pipeline_tag``: :func:`hub_keys`; ``base_model`` when the
base is a Hub name; tags) and what a reader needs to trust and reuse the weights: the backbone and its base model, the
objective, the data and its fingerprint, the training progress, the validation values of the checkpoint (a best
checkpoint; a last one has none of its own), the adapters it holds and how to load it with finecap, transformers or
peft, and the command that made
it as the shell command that runs it when pasted (:func:`command_block`), secret overrides masked
(:func:`finecap.locks.command_argv`); the credentials of any URL in it are masked
(:func:`finecap.config.secrets.masked_url_secrets`). Everything in it comes from the run's configuration,
the checkpoint's ``info.json``, its ``captioner.json`` and its ``fingerprints.json``; nothing is estimated. What
depends on the backbone (its base models, how other tools load the folder) is asked of its class
(:meth:`~finecap.models.base.CaptionerBase.base_models`, :meth:`~finecap.models.base.CaptionerBase.card_lines`).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from finecap.config.paths import read_as_path
from finecap.config.secrets import masked_url_secrets
from finecap.runs import BEST, CAPTIONER_FILE, LAST
from finecap.utils.text import CONTROL_CHARACTERS, shell_command

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.models.base import CaptionerBase

CARD_NAME = "README.md"


def _hub_name(source: str, cfg: Config) -> str | None:
    """``source`` when it looks like a Hub model id (``owner/name``), else ``None`` (``world-tiny``, or a local path:
    one that exists from here or that the run's configuration ``cfg`` read as a folder,
    :func:`finecap.config.paths.read_as_path`, so that a card written from another working directory never names a
    relative ``models/gpt2`` as a Hub model)."""
    parts = source.split("/")
    if len(parts) == 2 and all(parts) and not source.startswith((".", "~")) and not read_as_path(source, cfg):
        return source
    return None


def backbone_of(meta: dict[str, Any]) -> type[CaptionerBase]:
    """The captioner class of a ``captioner.json`` (``kind``; ``clipcap`` when absent), which the card asks what the
    folder was built on and how other tools load it (deferred import: the backbones need torch)."""
    from finecap.models.backbones import backbone

    return backbone(meta.get("kind", "clipcap"), CAPTIONER_FILE, "captioner kind")


def base_models(meta: dict[str, Any]) -> dict[str, str]:
    """What the captioner was built on, from its ``captioner.json``: ``{role: source}`` (its backbone's
    ``base_models``, unknown sources dropped)."""
    return {k: v for k, v in backbone_of(meta).base_models(meta).items() if v}


# --------------------------------------------------------------------------------------------------------------------
# User strings in a card: one line each, no HTML, no markdown or YAML structure
# --------------------------------------------------------------------------------------------------------------------

_MARKDOWN = re.compile(r"([\\`*_\[\]|~!#])")
"""Markdown's inline punctuation, escaped by a backslash in card text: code, emphasis, links and images, table cells,
strike-through, a heading's closing ``#``. (Card text never starts a line, so ``-``, ``+`` and ``1.`` make no list.)"""


def one_line(text: str) -> str:
    """``text`` on one line: each control character (``\\n``, ``\\r``, tab, NUL, U+2028, ...) written as its Python
    escape, so nothing is lost and nothing starts a line of its own (a heading, a YAML key, a new front matter)."""
    return CONTROL_CHARACTERS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def md_text(text: str) -> str:
    """A user's string (``run.name``) as literal markdown text: one line (:func:`one_line`), HTML's ``&``, ``<``,
    ``>`` and ``"`` as entities (no tag reaches a renderer), markdown's punctuation escaped (no link, emphasis or
    table cell is made of it)."""
    return _MARKDOWN.sub(r"\\\1", html.escape(one_line(text), quote=True))


def md_code(text: str) -> str:
    """A user's string (a path, a model name) as an inline code span: one line (:func:`one_line`), between backtick
    fences longer than any run of backticks in it (CommonMark's rule), so it cannot close the span; HTML is not
    interpreted inside a code span."""
    text = one_line(text)
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_block(text: str) -> str:
    """A user's text (the command line) as a fenced code block: one line (:func:`one_line`), fenced by more
    backticks than any run in it (at least three), so it cannot close the block."""
    text = one_line(text)
    fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"


def command_block(argv: Sequence[str]) -> str:
    """A command's arguments as a fenced code block holding the shell command that runs exactly them
    (:func:`finecap.utils.text.shell_command`: pasted, ``run.name=a;b`` or ``$(...)`` stay one quoted argument), fenced
    by more backticks than any run in it (at least three), so no line of it can close the block. Unlike
    :func:`md_block` nothing in it is escaped (an escape would change the command): an argument holding a line break
    spans lines inside its quotes, which a fenced block shows as they are."""
    text = shell_command(argv)
    fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"


def _yaml_list(items: list[str]) -> str:
    """A YAML flow list of strings, each a JSON string (YAML reads JSON's double-quoted strings, escapes included:
    no ``: ``, ``---``, ``#`` or newline in a value can change the front matter's structure)."""
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def hub_keys(meta: dict[str, Any]) -> list[str]:
    """The front matter's lines that tell the Hub which library loads the folder and for which task, from its
    backbone: ``library_name: transformers`` only where transformers alone loads the folder as the captioner (BLIP, a
    VLM: :meth:`~finecap.models.base.CaptionerBase.transformers_loads`; a whole-model adapter is in a folder of its
    own, so not ``peft``, whose snippet looks for ``adapter_config.json`` at the top), ``[]`` in its place otherwise
    (ClipCap's ``lm/`` and mapper, the world models: the Hub's transformers snippet fails on them), then
    ``pipeline_tag`` (the backbone's ``PIPELINE_TAG``: a VLM's is ``image-text-to-text``, its base models' task)."""
    backbone = backbone_of(meta)
    library = ["library_name: transformers"] if backbone.transformers_loads(meta) else []
    return [*library, f"pipeline_tag: {backbone.PIPELINE_TAG}"]


def with_hub_keys(card: str, meta: dict[str, Any]) -> str:
    """``card`` (a model card finecap wrote) with its front matter's ``library_name`` and ``pipeline_tag`` lines
    replaced by :func:`hub_keys` of ``meta`` (cards written before 2026-11-29 said ``library_name: transformers`` and
    ``pipeline_tag: image-to-text`` for every backbone, before 2026-11-27 ``library_name: peft`` with a whole-model
    adapter); a card without front matter is returned as it is."""
    if not card.startswith("---\n") or "\n---\n" not in card[3:]:
        return card
    front, rest = card[4:].split("\n---\n", 1)
    kept = [line for line in front.split("\n") if not line.startswith(("library_name:", "pipeline_tag:"))]
    return "\n".join(["---", *hub_keys(meta), *kept, "---", rest])


def _loading(meta: dict[str, Any]) -> list[str]:
    """The card's "Loading" section: finecap's own lines, then the backbone's (``card_lines``: other tools)."""
    lines = ["```python", "from finecap import Captioner", "",
             'captioner = Captioner.from_pretrained("path/to/this/folder")',
             'print(captioner.caption(["image.jpg"]))', "```"]  # fmt: skip
    return lines + backbone_of(meta).card_lines(meta)


def title(objective: str, meta: dict[str, Any]) -> str:
    """The card's title from what the folder is: the objective and the base model (``SCST captioner on
    HuggingFaceTB/SmolVLM-256M-Instruct``), not the run's name, which may be anything."""
    bases = base_models(meta)
    base = bases.get("model") or bases.get("language model") or meta.get("kind", "clipcap")
    return f"{OBJECTIVE_NAMES.get(objective, objective)} captioner on {base}"


OBJECTIVE_NAMES = {
    "mle": "MLE",
    "smile": "SMILE",
    "reinforce": "REINFORCE",
    "grpo": "GRPO",
    "scst_me": "SCST-ME",
    "sle": "SLE",
}
"""How a title names finecap's objectives (a user's own by its name)."""


def folder_line(meta: dict[str, Any], merged_from: str | None, merged: str = "") -> str:
    """What the folder holds: merged weights (an export, ``merged``: the parts whose adapters were folded in) or a
    checkpoint's model folder, with its adapter."""
    if merged_from is not None:
        return (f"- **Folder**: a merged export of {md_code(merged_from)} (`finecap export --merged`): LoRA adapters "
                f"folded into the base weights: {md_text(merged or 'none')}; no adapter folder")  # fmt: skip
    adapter = f", with one peft adapter of the whole model in {md_code(meta['adapter'] + '/')}" if meta.get(
        "adapter") else ""  # fmt: skip
    return f"- **Folder**: a finecap checkpoint's model folder{adapter}"


def validation_lines(
    info: dict[str, Any], which: str, merged_from: str | None = None, differs: Sequence[str] = ()
) -> list[str]:
    """The card's validation section: the values ``info`` records (a best checkpoint's, chosen by ``metric``), else a
    note true of the folder ``which`` (the checkpoint folder's name: ``best`` records the values it was chosen by,
    ``last`` is the run's last state, chosen by no validation); for an export (``merged_from``) the values are said
    to be the run's, measured on the source checkpoint and not on the export, with ``differs``: how the export
    computes otherwise than the run did (its values can differ)."""
    values = info.get("values") or {}
    lines = ["", "## Validation of the run at this checkpoint" if merged_from is not None
             else "## Validation at this checkpoint", ""]  # fmt: skip
    if merged_from is not None and values:
        lines += [f"The run's values, measured by the run on {md_code(merged_from)}, not on this export"
                  + (f", which computes otherwise: {'; '.join(differs)}; its own scores can differ: caption and "
                     "score this folder for numbers of its own." if differs else "."), ""]  # fmt: skip
    if values:
        metric = md_code(str(info.get("metric", "?")))
        lines += [f"Best checkpoint by {metric}.", "", "| metric | value |", "|---|---|"]
        lines += [f"| {md_text(str(k))} | {v:.4f} |" if isinstance(v, float) else f"| {md_text(str(k))} | "
                  f"{md_text(str(v))} |" for k, v in sorted(values.items())]  # fmt: skip
    elif which == BEST:
        lines.append("None recorded for this checkpoint: its trainer_state.json holds no values, although a best "
                     "checkpoint records the validation values it was chosen by.")  # fmt: skip
    elif which == LAST:
        lines.append("None recorded for this checkpoint: the run's last state, chosen by no validation (the run's "
                     "best checkpoint, where it validated, holds the values it was chosen by).")  # fmt: skip
    else:
        lines.append("None recorded for this checkpoint.")
    return lines


def model_card(cfg: Config, info: dict[str, Any], meta: dict[str, Any], fingerprints: dict[str, Any] | None,
               command: str | Sequence[str], merged_from: str | None = None, merged: str = "", which: str = "",
               differs: Sequence[str] = ()) -> str:  # fmt: skip
    """The ``README.md`` of a checkpoint (module docstring). ``info``: the checkpoint's ``info.json``; ``meta``: its
    ``captioner.json``; ``fingerprints``: its ``fingerprints.json`` (``None``: not recorded); ``command``: the
    arguments of the command that made it, secrets already masked (:func:`finecap.locks.command_argv`), shown as the
    shell command that runs them (:func:`command_block`), or a text shown on one line (:func:`md_block`);
    ``merged_from``: the model folder a merged export was made from, ``merged`` the parts whose adapters it folded
    in, ``differs`` how it computes otherwise than the run; ``which``: the checkpoint folder's name (``best``,
    ``last``), which says what a missing validation means (:func:`validation_lines`)."""
    kind = meta.get("kind", "clipcap")
    bases = base_models(meta)
    hub = [h for h in (_hub_name(s, cfg) for s in bases.values()) if h]
    objective = cfg.train.objective
    header = ["---", *hub_keys(meta)]
    if hub:
        header.append(f"base_model: {_yaml_list(hub)}")
    header += [f"tags: {_yaml_list(['finecap', 'image-captioning', kind, objective])}", "---", ""]
    body = [f"# {md_text(title(objective, meta))}", "", f"- **Run**: {md_code(cfg.run.name)} (finecap)",
            folder_line(meta, merged_from, merged),
            f"- **Backbone**: {md_code(kind)}" + (f" ({md_text(str(meta['family']))})" if meta.get("family") else ""),
            *[f"- **Base {role}**: {md_code(str(source))}" for role, source in bases.items()],
            *([f"- **Prompt**: {md_code(str(meta['prompt']))} (the user's turn of the chat template: the image, then "
               "this text; ask the model the same way for the run's captions)"] if meta.get("prompt") else []),
            f"- **Objective**: {md_code(objective)}",
            f"- **Trains**: language side {'yes' if meta.get('train_lm') else 'no'}, vision side "
            f"{'yes' if meta.get('train_encoder') else 'no'}"
            + (f"; LoRA adapters on {', '.join(map(md_text, sorted(meta['lora'])))}" if meta.get("lora") else ""),
            f"- **Data**: {md_code(cfg.data.format)}"
            + (f" {md_code(cfg.data.path)}" if cfg.data.path else "")]  # fmt: skip
    data = (fingerprints or {}).get("data") or {}
    if data:
        body.append(f"- **Data fingerprint**: {md_code(str(data.get('id', '?')))} (sha256 "
                    f"{md_code(str(data.get('sha256', '?')))})")  # fmt: skip
    total = info.get("total_steps")
    body.append(f"- **Progress**: step {info.get('step', '?')}" + (f" of {total}" if total else "")
                + (f", epoch {info['epoch']}" if "epoch" in info else ""))  # fmt: skip
    body += validation_lines(info, which, merged_from, differs)
    made_by = md_block(command) if isinstance(command, str) else command_block(command)
    body += ["", "## Loading", "", *_loading(meta), "", "## Made by", "", made_by, ""]
    return masked_url_secrets("\n".join(header + body))  # a data path or base model given as a URL may hold a password
