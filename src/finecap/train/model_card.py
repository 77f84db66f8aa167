"""The model card of a checkpoint: ``README.md`` in its model folder, as the Hugging Face Hub and other tools read one.

Every checkpoint finecap writes carries one (:func:`finecap.train.checkpoint.save_checkpoint`): a YAML header
(``library_name``, ``base_model`` when the base is a Hub name, ``pipeline_tag: image-to-text``, tags) and what a
reader needs to trust and reuse the weights: the backbone and its base model, the objective, the data and its
fingerprint, the training progress, the validation values of the checkpoint (a best checkpoint; a last one has none
of its own), the adapters it holds and how to load it with finecap, transformers or peft, and the command that made
it, secret overrides masked (:func:`finecap.locks.command_line`); the credentials of any URL in it are masked
(:func:`finecap.config.secrets.masked_url_secrets`). Everything in it comes from the run's configuration,
the checkpoint's ``info.json``, its ``captioner.json`` and its ``fingerprints.json``; nothing is estimated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.config.secrets import masked_url_secrets

if TYPE_CHECKING:
    from finecap.config import Config

CARD_NAME = "README.md"


def _hub_name(source: str) -> str | None:
    """``source`` when it looks like a Hub model id (``owner/name``), else ``None`` (a local path, ``world-tiny``)."""
    parts = source.split("/")
    if len(parts) == 2 and all(parts) and not source.startswith((".", "~")) and not Path(source).exists():
        return source
    return None


def base_models(meta: dict[str, Any]) -> dict[str, str]:
    """What the captioner was built on, from its ``captioner.json``: ``{role: source}``."""
    if meta.get("kind", "clipcap") == "clipcap":
        out = {"language model": meta.get("lm_source", ""), "vision encoder": meta.get("encoder_source", "")}
    else:
        out = {"model": meta.get("source", "")}
        if meta.get("world_source"):
            out["vision encoder"] = meta["world_source"]
    return {k: v for k, v in out.items() if v}


def _yaml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _loading(meta: dict[str, Any]) -> list[str]:
    kind = meta.get("kind", "clipcap")
    lines = ["```python", "from finecap import Captioner", "",
             'captioner = Captioner.from_pretrained("path/to/this/folder")',
             'print(captioner.caption(["image.jpg"]))', "```"]  # fmt: skip
    if kind in ("blip", "vlm") and not meta.get("world_source"):
        auto = "BlipForConditionalGeneration" if kind == "blip" else "AutoModelForImageTextToText"
        lines += ["", f"The folder is also a plain transformers checkpoint (`{auto}.from_pretrained(folder)`, "
                  "base weights without adapters)."]  # fmt: skip
        if meta.get("adapter"):
            adapter = meta["adapter"]
            lines += [f"`{adapter}/` is one peft LoRA adapter for the whole model: "
                      f"`PeftModel.from_pretrained({auto}.from_pretrained(base), \"{adapter}\")`."]  # fmt: skip
    elif kind == "clipcap":
        lines += ["", "`lm/` is a plain `AutoModelForCausalLM` folder; `mapper.safetensors` maps image features "
                  "to its prefix (finecap's `ClipCap` reads both)."]  # fmt: skip
    return lines


def model_card(cfg: Config, info: dict[str, Any], meta: dict[str, Any], fingerprints: dict[str, Any] | None,
               command: str) -> str:  # fmt: skip
    """The ``README.md`` of a checkpoint (module docstring). ``info``: the checkpoint's ``info.json``; ``meta``: its
    ``captioner.json``; ``fingerprints``: its ``fingerprints.json`` (``None``: not recorded); ``command``: the command
    line that made it, secrets already masked."""
    kind = meta.get("kind", "clipcap")
    bases = base_models(meta)
    hub = [h for h in (_hub_name(s) for s in bases.values()) if h]
    objective = cfg.train.objective
    header = ["---", f"library_name: {'peft' if meta.get('adapter') else 'transformers'}"]
    if hub:
        header.append(f"base_model: {_yaml_list(hub)}")
    header += ["pipeline_tag: image-to-text", f"tags: {_yaml_list(['finecap', 'image-captioning', kind, objective])}",
               "---", ""]  # fmt: skip
    body = [f"# {cfg.run.name}: a finecap captioner", "",
            f"- **Backbone**: `{kind}`" + (f" ({meta['family']})" if meta.get("family") else ""),
            *[f"- **Base {role}**: `{source}`" for role, source in bases.items()],
            f"- **Objective**: `{objective}`",
            f"- **Trains**: language side {'yes' if meta.get('train_lm') else 'no'}, vision side "
            f"{'yes' if meta.get('train_encoder') else 'no'}"
            + (f"; LoRA adapters on {', '.join(sorted(meta['lora']))}" if meta.get("lora") else ""),
            f"- **Data**: `{cfg.data.format}`" + (f" `{cfg.data.path}`" if cfg.data.path else "")]  # fmt: skip
    data = (fingerprints or {}).get("data") or {}
    if data:
        body.append(f"- **Data fingerprint**: `{data.get('id', '?')}` (sha256 `{data.get('sha256', '?')}`)")
    total = info.get("total_steps")
    body.append(f"- **Progress**: step {info.get('step', '?')}" + (f" of {total}" if total else "")
                + (f", epoch {info['epoch']}" if "epoch" in info else ""))  # fmt: skip
    values = info.get("values") or {}
    body += ["", "## Validation at this checkpoint", ""]
    if values:
        body += [f"Best checkpoint by `{info.get('metric', '?')}`.", "", "| metric | value |", "|---|---|"]
        body += [f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in sorted(values.items())]
    else:
        body.append("None recorded for this checkpoint (the run's last state; its best checkpoint holds the values).")
    body += ["", "## Loading", "", *_loading(meta), "", "## Made by", "", "```", command, "```", ""]
    return masked_url_secrets("\n".join(header + body))  # a data path or base model given as a URL may hold a password
