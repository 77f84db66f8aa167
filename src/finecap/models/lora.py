"""LoRA adapters (``peft``) on the captioner's language model and/or vision encoder: what SR-L / SR-V / SR-LV train.

NDLB (Sec. 4.2) fine-tunes with self-retrieval by training ClipCap's mapper fully and GPT-2 and CLIP through LoRA
adapters of rank 32. In finecap *whether* a part learns is ``model.train_lm`` / ``model.train_encoder``, and *how*
is ``lora.lm`` / ``lora.encoder`` (adapters) or full fine-tuning; the mapper always learns. :func:`configure_training`
applies this to a captioner, also one loaded from a checkpoint (``train.init_from``, ``--resume``), so the run's
configuration, not the checkpoint's, decides what is trained.

Each adapted part is wrapped in a ``peft.PeftModel`` (the backbone's ``lora_module(part)``: ClipCap's ``model.lm`` and
``model.encoder.model``, BLIP's text decoder and vision model, a VLM's language model and vision tower; see
:mod:`finecap.models.blip` and :mod:`finecap.models.vlm` for their targets); module names stay the checkpoint's own,
so targets are plain module names. Empty targets mean the backbone's ``lora_default_targets(part)`` (a VLM family's
documented list), and when that is empty too:

- ``lora.lm_targets`` (empty = every ``nn.Linear`` / GPT-2 ``Conv1D`` of the LM except the output head, i.e. for
  GPT-2 ``c_attn``, ``c_proj``, ``c_fc`` of every block);
- ``lora.encoder_targets`` (empty = every ``nn.Linear`` on the image side of the dual encoder: the vision tower and
  the visual projection, e.g. CLIP's ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, ``fc1``, ``fc2``,
  ``visual_projection``). The text tower is never adapted, whatever the targets say.

Fresh adapters leave out the modules whose output never reaches the captioner's (the backbone's ``lora_unreached``:
a VLM tower's layers past the one its language model reads, a ViT's ``visual_projection`` under the world BLIP's /
VLM's image tokens); adapters there could never learn.

A target is matched as a full module name or a dot-separated suffix of one (``c_attn`` matches
``transformer.h.0.attn.c_attn``); a target that matches nothing is an error naming the option.

**Checkpoints** (:func:`save_adapters` / :func:`load_adapters`, called by ``CaptionerBase.save`` /
``CaptionerBase.from_checkpoint``): the *base* weights go where a plain checkpoint keeps them (``lm/``, ``encoder/``;
LoRA's ``base_layer`` names are undone, so these folders load with plain ``from_pretrained``), the adapters in
peft's own format next to them (``lm_lora/``, ``encoder_lora/``: ``adapter_config.json`` +
``adapter_model.safetensors``, loadable with ``PeftModel.from_pretrained(base, dir)``), and ``captioner.json``
records them under ``"lora"``. Reloading gives the same unmerged, trainable adapters (so ``--resume`` continues
them); :func:`merge_lora` folds them into the base weights (``merge_and_unload``) for inference or export
(``finecap export RUN --merged OUT`` writes a plain checkpoint).

Choices the paper leaves open: ``alpha = rank`` (scale 1) and no LoRA dropout by default, so the policy that
REINFORCE scores is the one it sampled from; targets as above (NDLB only says "rank 32 on GPT-2 and CLIP").

**Initialisation** (``lora.init``): one factor of each adapter starts at zero (the model is unchanged until the
first update). ``kaiming`` (the default) and ``gaussian`` are peft's: B = 0 and A Kaiming-uniform (entries up to
``1/sqrt(fan_in)``) or normal with standard deviation 1/r. ``normal`` is NDLB's released code
(manugaurdl/no-detail-left-behind at 77b3e7e, ``finetuning/lora.py:9-14``): its own parametrisation adds
``B @ A * alpha / r`` to ``layer.weight`` with ``B = 0`` of shape (rows, r) and ``A ~ N(0, 1)`` of shape (r, columns)
*of the stored weight*. For ``nn.Linear`` and CLIP's attention (weights stored out x in) the random factor is the
input side, peft's A; for GPT-2's ``Conv1D`` (stored in x out) it is the output side, so on those layers ``normal``
draws peft's B from N(0, 1) and sets A = 0. peft offers neither, so :func:`init_adapters` re-draws a fresh adapter
after peft made it, from torch's global RNG as peft's own initialisation does; adapters loaded from a checkpoint are
never re-drawn. With Adam a unit-variance factor makes the adapters' first updates larger at the same learning rate.

A ``model`` here is a captioner (:class:`finecap.models.base.CaptionerBase`), typed ``nn.Module``: the base saves and
loads through this module, so naming it here, even for type checkers only, would make an import circle.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import torch
from safetensors.torch import save_file
from torch import nn
from transformers.pytorch_utils import Conv1D

from finecap.config import LoraInit
from finecap.models import strict
from finecap.models.captioner import PARTS
from finecap.models.peft_import import get_peft_model, is_lora_layer, is_peft, peft_library
from finecap.models.vision import TEXT_SIDE
from finecap.runs import CAPTIONER_FILE, CheckpointError
from finecap.utils.reading import read_json
from finecap.utils.text import short_repr

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel

    from finecap.config import Config

ADAPTER_DIRS = {"lm": "lm_lora", "encoder": "encoder_lora"}
INITS = get_args(LoraInit)
PEFT_INIT: dict[str, bool | str] = {"kaiming": True, "gaussian": "gaussian", "normal": True}
"""peft's ``init_lora_weights`` for each ``lora.init`` (``normal`` then re-draws A: :func:`init_adapters`)."""


@dataclass(frozen=True)
class LoraSpec:
    """Adapter settings of one part. ``targets``: module names or suffixes (empty = the part's default)."""

    rank: int = 32
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ()
    init: LoraInit = "kaiming"

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ValueError(f"lora.init: invalid value {self.init!r}; valid choices: {', '.join(INITS)}")
        if self.rank < 1:
            raise ValueError(f"lora.rank must be >= 1, got {self.rank}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"lora.alpha must be a finite number > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")


def specs_from_config(cfg: Config) -> dict[str, LoraSpec | None]:
    """``{"lm": spec or None, "encoder": spec or None}`` from ``cfg.lora``."""
    c = cfg.lora
    common = dict(rank=c.rank, alpha=float(c.alpha), dropout=c.dropout, init=c.init)
    return {
        "lm": LoraSpec(**common, targets=tuple(c.lm_targets)) if c.lm else None,
        "encoder": LoraSpec(**common, targets=tuple(c.encoder_targets)) if c.encoder else None,
    }


# --------------------------------------------------------------------------------------------------------------------
# Which modules of a part
# --------------------------------------------------------------------------------------------------------------------


def unwrapped(module: nn.Module) -> nn.Module:
    """The model inside a ``PeftModel`` (with LoRA layers injected), or ``module`` itself."""
    return module.get_base_model() if is_peft(module) else module


def _part_module(model: nn.Module, part: str) -> nn.Module:
    """The module of ``part`` (the captioner's ``lora_module``: ClipCap's LM / dual encoder, BLIP's text decoder /
    vision tower)."""
    if part not in PARTS:
        raise ValueError(f"LoRA part must be one of {', '.join(PARTS)}, got {part!r}")
    module = model.lora_module(part)
    if module is None:
        raise ValueError(f"lora.{part}=true: this captioner has no {part}")
    return module


def _set_part_module(model: nn.Module, part: str, module: nn.Module) -> None:
    model.set_lora_module(part, module)  # keeps the part's place, so parameter order is stable


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear | Conv1D)


def candidate_modules(part: str, module: nn.Module) -> list[str]:
    """Names of the modules LoRA may adapt in ``part``: linear layers of the LM except its output head, or linear
    layers on the image side of a dual encoder (never the text tower or text projection)."""
    base = unwrapped(module)
    head = base.get_output_embeddings() if part == "lm" and hasattr(base, "get_output_embeddings") else None
    names = []
    for name, m in base.named_modules():
        if not _is_linear(m) or m is head or "lora_" in name:
            continue
        name = name.removesuffix(".base_layer")  # a layer already wrapped by LoRA keeps its own name
        if part == "encoder" and name.split(".", 1)[0] in TEXT_SIDE:
            continue
        names.append(name)
    return names


def resolve_targets(part: str, module: nn.Module, targets: Sequence[str]) -> list[str]:
    """Full module names adapted in ``part`` for ``targets`` (names or dot-suffixes; empty = every candidate)."""
    candidates = candidate_modules(part, module)
    option = f"lora.{part}_targets"
    if not candidates:
        raise ValueError(f"{option}: the {part} ({type(unwrapped(module)).__name__}) has no linear layers to adapt")
    if not targets:
        return candidates
    out = []
    for target in targets:
        hits = [n for n in candidates if n == target or n.endswith("." + target)]
        if not hits:
            examples = sorted({n.rsplit(".", 1)[-1] for n in candidates})
            raise ValueError(
                f"{option}: {target!r} matches no linear layer of the {part}; available names: {', '.join(examples)}"
            )
        out += [n for n in hits if n not in out]
    return [n for n in candidates if n in out]  # module order


# --------------------------------------------------------------------------------------------------------------------
# Applying, inspecting, merging
# --------------------------------------------------------------------------------------------------------------------


def _targets(model: nn.Module, part: str, spec: LoraSpec) -> tuple[str, ...]:
    """The spec's targets, or the backbone's default targets of ``part`` when the spec has none."""
    return tuple(spec.targets) or tuple(model.lora_default_targets(part))


def _reached_targets(model: nn.Module, part: str, spec: LoraSpec) -> list[str]:
    """The modules fresh adapters of ``part`` wrap: the spec's targets (:func:`_targets`, :func:`resolve_targets`)
    but those whose output never reaches the captioner's (the backbone's ``lora_unreached``: a VLM tower's layers
    past the one its language model reads, a ViT's ``visual_projection`` under image tokens), which would be frozen
    and saved at zero; targets that reach nothing
    are refused, naming the option."""
    names = resolve_targets(part, _part_module(model, part), _targets(model, part, spec))
    unreached = model.lora_unreached(part) or frozenset()
    kept = [n for n in names if n not in unreached]
    if not kept:
        raise ValueError(f"lora.{part}_targets: {strict.listed(names)} never reach the captioner's output (the "
                         f"{part}'s output is not read after them): their adapters could not learn")  # fmt: skip
    return kept


def unreached_modules(module: nn.Module, reached: Collection[str]) -> frozenset[str]:
    """The modules of ``module`` (plain names, :func:`plain_name`; adapters left out) none of whose own weights are
    among ``reached`` (plain names of the weights its output depends on, found by a probe: a VLM tower's
    :meth:`finecap.models.vlm.VlmImages.reached_names`, a dual encoder's :meth:`finecap.models.vision.VisionEncoder.
    image_parameters`): what fresh adapters leave out (a backbone's ``lora_unreached``).

    >>> layers = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    >>> sorted(unreached_modules(layers, {"a.weight", "a.bias"}))
    ['b']
    """
    names = {plain_name(n) for n, _ in module.named_parameters() if "lora_" not in n}
    return frozenset(n.rpartition(".")[0] for n in names - set(reached)) - {n.rpartition(".")[0] for n in reached}


def _lora_config(part: str, module: nn.Module, targets: Sequence[str], spec: LoraSpec):
    names = resolve_targets(part, module, targets)
    base = unwrapped(module)
    modules = dict(base.named_modules())
    conv1d = any(isinstance(modules[n], Conv1D) for n in names)  # GPT-2 stores weights as (in, out)
    return peft_library().LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                                     target_modules=names, fan_in_fan_out=conv1d, bias="none",
                                     init_lora_weights=PEFT_INIT[spec.init])  # fmt: skip


def init_adapters(module: nn.Module, init: LoraInit) -> None:
    """Re-draw the fresh adapters of a ``PeftModel`` for ``init="normal"``, NDLB's released code (module docstring):
    the factor on the side of the stored weight's columns ~ N(0, 1), the other 0; peft's own initialisation stands
    for the other choices."""
    if init != "normal":
        return
    with torch.no_grad():
        for layer in module.modules():
            if not is_lora_layer(layer):
                continue
            for adapter in layer.lora_A:
                a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight  # (r, in), (out, r)
                # the code's N(0, 1) factor: the output side of a Conv1D (stored in x out), else the input side
                drawn, zero = (b, a) if isinstance(layer.get_base_layer(), Conv1D) else (a, b)
                drawn.normal_(0.0, 1.0)
                zero.zero_()


def apply_lora(model: nn.Module, part: str, spec: LoraSpec) -> None:
    """Wrap ``part`` (``"lm"`` or ``"encoder"``) of ``model`` in fresh LoRA adapters (in place); only the adapters of
    that part are then trainable. The adapter initialisation draws from torch's global RNG (LoRA's B = 0, so the
    model's outputs are unchanged until the first update)."""
    module = _part_module(model, part)
    if is_peft(module):
        raise ValueError(f"the {part} already has LoRA adapters; merge them first (merge_lora)")
    wrapped = get_peft_model(module, _lora_config(part, module, _reached_targets(model, part, spec), spec))
    init_adapters(wrapped, spec.init)
    _set_part_module(model, part, wrapped)
    freeze_to_adapters(wrapped)


def drop_adapters(model: nn.Module, layers: Sequence[str]) -> None:
    """Put the base layers back in place of the LoRA layers at ``layers`` (paths in ``model``, the captioner, e.g.
    ``model.model.vision_tower.base_model.model.encoder.layers.1.mlp.fc1``) and take them out of their part's
    targets: a sharded run's other processes, built on the meta device where no probe of what reaches the output
    runs, adapt the modules the main process left out (:func:`finecap.models.sharding.match_main`)."""
    for path in layers:
        layer = model.get_submodule(path)
        if not is_lora_layer(layer):
            raise ValueError(f"{path}: not a LoRA layer")
        part = next((p for p in PARTS if is_peft(model.lora_module(p)) and path.startswith(model.part_path(p) + ".")),
                    None)  # fmt: skip
        if part is None:
            raise ValueError(f"{path}: a LoRA layer outside the captioner's adapted parts")
        parent, _, attr = path.rpartition(".")
        setattr(model.get_submodule(parent), attr, layer.get_base_layer())
        config = model.lora_module(part).peft_config["default"]
        inner = path[len(model.part_path(part)) + 1 :].removeprefix("base_model.model.")
        config.target_modules = {n for n in config.target_modules if n != inner}


def freeze_to_adapters(module: nn.Module) -> None:
    """Only the LoRA parameters of a ``PeftModel`` train; its base weights are frozen."""
    for name, p in module.named_parameters():
        p.requires_grad_("lora_" in name)


def train_part(module: nn.Module, trainable: bool) -> None:
    """``requires_grad`` of one part of a captioner: through its adapters when it has some (base weights frozen),
    else every parameter; nothing when ``trainable`` is false. What each backbone's ``apply_trainable`` uses."""
    if trainable and is_peft(module):
        freeze_to_adapters(module)
    else:
        for p in module.parameters():
            if p.is_floating_point() or not trainable:  # quantized weights cannot learn (models.memory checks)
                p.requires_grad_(trainable)


def adapter_spec(model: nn.Module, part: str) -> LoraSpec | None:
    """The settings of ``part``'s adapters (targets as full module names), or None without adapters."""
    module = model.lora_module(part)
    if module is None or not is_peft(module):
        return None
    c = module.peft_config["default"]
    targets = c.target_modules
    names = sorted(targets) if isinstance(targets, set | list | tuple) else [targets]
    return LoraSpec(rank=int(c.r), alpha=float(c.lora_alpha), dropout=float(c.lora_dropout), targets=tuple(names))


def _same(model: nn.Module, part: str, have: LoraSpec, want: LoraSpec) -> bool:
    """Whether ``part``'s adapters (``have``) are those ``want`` makes: the same settings and modules, leaving out
    modules that never reach the captioner's output (older checkpoints adapted them too); where that is unknown (the
    meta device), adapters on some of the wanted modules (the main process left out the others)."""
    module = _part_module(model, part)
    resolved = set(resolve_targets(part, module, _targets(model, part, want)))
    unreached = model.lora_unreached(part)
    targets = set(have.targets)
    same_modules = targets <= resolved if unreached is None else targets - unreached == resolved - unreached
    return same_modules and (have.rank, have.alpha, have.dropout) == (want.rank, want.alpha, want.dropout)


def merge_part(model: nn.Module, part: str) -> None:
    """Fold ``part``'s adapters into its base weights (``merge_and_unload``), in place; refused on a quantized base
    (its weights are not float)."""
    from finecap.models.memory import quantization_of

    module = _part_module(model, part)
    if is_peft(module) and (kind := quantization_of(module)) is not None:
        raise ValueError(
            f"the {part}'s base weights are quantized ({kind}): its LoRA adapters cannot be merged into them; load "
            "the checkpoint with model.quantization=none (dequantized) to merge, or keep the adapters' settings"
        )
    if is_peft(module):
        _set_part_module(model, part, module.merge_and_unload())
        model.base_changed = True  # the adapters are in the base weights now: no adapter on the source reproduces it


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into the base weights (in place; returns ``model``): a plain captioner with the same
    outputs (up to rounding: a 16-bit weight holds ``W + BA`` rounded to its dtype), for inference or
    :meth:`ClipCap.save` as a plain checkpoint. Trainability follows ``model.train_lm`` / ``model.train_encoder``
    again (full fine-tuning)."""
    for part in PARTS:
        if model.lora_module(part) is not None:
            merge_part(model, part)
    set_trainable(model, lm=model.train_lm, encoder=model.train_encoder)
    return model


def has_adapters(model: nn.Module) -> bool:
    return any(adapter_spec(model, p) is not None for p in PARTS)


def is_adapter_parameter(name: str) -> bool:
    """Whether the parameter ``name`` belongs to a LoRA adapter (peft's ``lora_A`` / ``lora_B`` / ...)."""
    return "lora_" in name


def adapters_are_identity(model: nn.Module) -> bool:
    """Whether every LoRA adapter of ``model`` adds nothing (one of its factors all zero, as fresh adapters are):
    the model then computes what its base does, and :func:`adapters_disabled` gives the same function."""
    for module in model.modules():
        if is_lora_layer(module):
            for key in module.lora_A:
                if bool(module.lora_A[key].weight.any()) and bool(module.lora_B[key].weight.any()):
                    return False
    return True


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, ``model`` computes with every adapted part's adapters off (peft's
    ``PeftModel.disable_adapter()`` on each part): the base model, with no second copy of it (the GRPO family's
    reference policy under LoRA, :mod:`finecap.objectives.reference`)."""
    with contextlib.ExitStack() as stack:
        for part in PARTS:
            module = model.lora_module(part)
            if module is not None and is_peft(module):
                stack.enter_context(module.disable_adapter())
        yield model


def set_trainable(model: nn.Module, *, lm: bool, encoder: bool) -> None:
    """Set what learns: the backbone's always-trained parts (ClipCap's mapper, a VLM's projector); the LM and
    encoder when asked, through their adapters when they have some, else fully (the backbone's ``apply_trainable``).
    Updates ``model.train_lm`` / ``model.train_encoder`` (batches then carry pixel inputs)."""
    if encoder and model.lora_module("encoder") is None:
        raise ValueError("model.train_encoder=true needs a captioner with a vision encoder")
    model.train_lm, model.train_encoder = bool(lm), bool(encoder)
    model.apply_trainable()  # requires_grad from the flags (the text side of a dual encoder always stays frozen)
    model.train(model.training)  # frozen parts back to eval mode


def configure_training(model: nn.Module, cfg: Config) -> nn.Module:
    """Make ``model`` train what ``cfg`` says (``model.train_lm``, ``model.train_encoder``, ``lora.*``), in place.

    Adapters the model already has with the same settings are kept (``--resume``, or continuing a LoRA run);
    adapters with other settings, or on a part now trained fully or frozen, are merged into the base weights first;
    missing ones are created fresh.
    """
    wanted = specs_from_config(cfg)
    flags = {"lm": cfg.model.train_lm, "encoder": cfg.model.train_encoder}  # LoRA on a frozen part: a ConfigError
    for part in PARTS:
        have = adapter_spec(model, part)
        want = wanted[part]
        if have is not None and (want is None or not _same(model, part, have, want)):
            merge_part(model, part)
    for part in PARTS:
        want = wanted[part]
        if want is not None and adapter_spec(model, part) is None:
            apply_lora(model, part, want)
    set_trainable(model, lm=flags["lm"], encoder=flags["encoder"])
    return model


# --------------------------------------------------------------------------------------------------------------------
# Saving and loading (hooks of ClipCap.save / ClipCap.from_checkpoint)
# --------------------------------------------------------------------------------------------------------------------


def plain_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict of a model whose parts may be wrapped in adapters (``...text_decoder.base_model.model.x.
    base_layer.weight``), without the adapters and under the plain model's names (``...text_decoder.x.weight``)."""
    return {plain_name(k): v for k, v in state.items() if "lora_" not in k}


def plain_name(key: str) -> str:
    """The plain model's name of a state-dict key of an adapted model (:func:`plain_state`)."""
    return key.replace("base_model.model.", "").replace(".base_layer.", ".")


def merged_weight(layer: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (the whole base weight of the LoRA ``layer``) with its active adapters added, as a new tensor: the
    adapters' ``get_delta_weight`` added in float32 and rounded once to the weight's dtype, which for one adapter (as
    finecap makes) are the values peft's ``merge_adapter`` would write into the base weight, without writing them.
    Merging and unmerging in place, as peft does, does not give the base weight back (``(w + d) - d`` rounds twice;
    in bfloat16 by far more than in float32): a policy synced that way at every step drifts from its own frozen
    weights."""
    total = weight.float()
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            delta = layer.get_delta_weight(adapter)
            total = total + (delta.full_tensor() if hasattr(delta, "full_tensor") else delta).float()
    return total.to(weight.dtype)


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The unmerged LoRA layers of ``model``'s adapted parts, by the state-dict key of their base weight
    (``<layer>.base_layer.weight``); empty when no part is adapted."""
    if not any(m is not None and is_peft(m) for m in map(model.lora_module, PARTS)):
        return {}
    return {f"{name}.base_layer.weight": m for name, m in model.named_modules()
            if is_lora_layer(m) and not m.merged}  # fmt: skip


@contextlib.contextmanager
def plain_parts(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every adapted part of ``model`` is its base model (adapters' wrappers swapped out, LoRA
    layers still injected), so that a backbone's ``save_pretrained`` writes the model under its own names."""
    wrapped = {part: model.lora_module(part) for part in PARTS}
    try:
        for part, module in wrapped.items():
            if module is not None and is_peft(module):
                model.set_lora_module(part, module.get_base_model())
        with state_dict_as_given(model):
            yield model
    finally:
        for part, module in wrapped.items():
            if module is not None:
                model.set_lora_module(part, module)


def base_state_dict(module: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The state dict of ``module`` without adapters, under the base model's own names (``state``: the module's
    state dict to use, e.g. gathered from a sharded model; default ``module.state_dict()``)."""
    state = module.state_dict() if state is None else state
    if not is_peft(module):
        return dict(state)
    return {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v for k, v in state.items()
            if "lora_" not in k}  # fmt: skip


def save_base(module: nn.Module, out: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """``save_pretrained`` of a plain model, or of the base weights of a ``PeftModel`` (loadable without peft)."""
    with state_dict_as_given(module):
        unwrapped(module).save_pretrained(out, state_dict=base_state_dict(module, state))


@contextlib.contextmanager
def state_dict_as_given(module: nn.Module) -> Iterator[None]:
    """Within the block, ``save_pretrained`` of a quantized model inside ``module`` writes the state dict it is given:
    transformers (5.x) replaces it by the model's own when the model has a quantizer, which would write the LoRA
    layers under their peft names. The quantization config is still saved, so the folder loads quantized."""
    held = [(m, m.hf_quantizer) for m in module.modules() if getattr(m, "hf_quantizer", None) is not None]
    try:
        for m, _ in held:
            m.hf_quantizer = None
        yield
    finally:
        for m, quantizer in held:
            m.hf_quantizer = quantizer


def save_encoder(encoder: Any, out: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """Like ``VisionEncoder.save`` (weights + image processor), writing base weights when adapters are present."""
    out = Path(out)
    save_base(encoder.model, out, state)
    if encoder.image_processor is not None:
        encoder.image_processor.save_pretrained(out)


def save_adapters(
    model: nn.Module, out: str | Path, states: dict[str, dict[str, torch.Tensor]] | None = None
) -> dict[str, dict[str, Any]]:
    """Write each part's adapters in peft's format (``<out>/lm_lora``, ``<out>/encoder_lora``); returns what
    ``captioner.json`` records under ``"lora"`` (empty without adapters). ``states``: per part, the part's state dict
    to take the adapter weights from (default: the part's own)."""
    meta: dict[str, dict[str, Any]] = {}
    for part in PARTS:
        spec = adapter_spec(model, part)
        if spec is None:
            continue
        folder = Path(out) / ADAPTER_DIRS[part]
        _part_module(model, part).save_pretrained(folder, state_dict=(states or {}).get(part))
        meta[part] = {"dir": ADAPTER_DIRS[part], "rank": spec.rank, "alpha": spec.alpha, "dropout": spec.dropout,
                      "targets": list(spec.targets)}  # fmt: skip
    return meta


def load_adapters(model: nn.Module, path: str | Path, meta: dict[str, dict[str, Any]] | None) -> nn.Module:
    """Attach the adapters recorded in ``meta`` (``captioner.json``'s ``"lora"``) from checkpoint ``path``,
    unmerged; they are trainable when their part is (``model.train_lm`` / ``model.train_encoder``).

    Strictly (:func:`load_part_adapters`): the adapters are built from what ``captioner.json`` records, never from
    settings only their ``adapter_config.json`` holds, and a file that differs from that record or weights that do
    not fit the adapters are refused."""
    path = Path(path)
    for part, info in (meta or {}).items():
        if part not in PARTS:
            raise ValueError(f"{path}: captioner.json lists LoRA adapters of an unknown part {part!r}")
        load_part_adapters(model, path, part, info)
    set_trainable(model, lm=model.train_lm, encoder=model.train_encoder)
    return model


ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
"""peft's files in an adapter folder: its configuration and weights."""
NOT_COMPARED = frozenset({"auto_mapping", "base_model_name_or_path", "revision", "inference_mode", "peft_version",
                          "fan_in_fan_out", "init_lora_weights", "target_modules"})  # fmt: skip
"""Keys of ``adapter_config.json`` that say where the adapters came from or how peft loads them, not what they
compute (``fan_in_fan_out`` follows the base layer: peft sets it for GPT-2's ``Conv1D`` and clears it for
``nn.Linear`` whatever the file says, and a 4-bit base's ``Conv1D`` layers are ``Linear4bit`` until dequantized;
``init_lora_weights`` and ``target_modules`` are checked on their own). Every other key must hold what finecap
writes for the recorded adapters: a ``layer_replication``, ``rank_pattern``, ``use_dora`` or any setting that
changes what the adapters compute is refused."""
FRESH_INITS = (True, "gaussian")
"""``init_lora_weights`` finecap writes (:data:`PEFT_INIT`); others (``pissa``, ``loftq``, ...) change the base
weights when the adapters are built."""
SIZE_MISMATCH = re.compile(r"size mismatch for ([^:\s]+): copying a param with shape (torch\.Size\(\[[^\]]*\]\))")
"""How ``load_state_dict`` names a tensor of another shape (it raises even with ``strict=False``)."""


def recorded_spec(info: Any, where: str) -> LoraSpec:
    """The adapters' settings ``captioner.json`` records (``where``: the file and entry), checked as ``lora.*`` is."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: expected an object with the adapters' dir, rank, alpha and dropout")
    rank, alpha, dropout = info.get("rank"), info.get("alpha"), info.get("dropout", 0.0)
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v, kind in
               ((rank, int), (alpha, int | float), (dropout, int | float))):  # fmt: skip
        raise CheckpointError(
            f"{where}: rank (an integer), alpha and dropout (numbers) are required; got {short_repr(info, 200)}"
        )
    targets = info.get("targets", [])
    if not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise CheckpointError(f"{where}: targets must be a list of module names, got {short_repr(targets)}")
    try:
        return LoraSpec(rank=rank, alpha=float(alpha), dropout=float(dropout), targets=tuple(targets))
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


def load_part_adapters(model: nn.Module, path: Path, part: str, info: Any) -> None:
    """Attach ``part``'s adapters from checkpoint ``path`` as ``info`` (its ``captioner.json`` entry) records them.

    - Their folder and files lie inside the checkpoint folder (``..``, absolute paths and links leading out are
      refused: :func:`finecap.models.strict.inside`).
    - ``adapter_config.json`` holds what finecap writes for the recorded rank, alpha, dropout and target modules
      (:data:`NOT_COMPARED`); the adapters are built from the record, never from the file's other settings.
    - The weights fit the adapters exactly (peft only warns about missing ones and drops unexpected ones: a file of
      fewer target modules than trained would silently lose adapters), and are finite."""
    where = f"{path / CAPTIONER_FILE}: lora.{part}"
    spec = recorded_spec(info, where)
    name = info.get("dir", ADAPTER_DIRS[part])
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{where}: dir must be the adapters' folder name, got {short_repr(name)}")
    folder = strict.inside(path, name, f"{where}.dir")
    if not (folder / ADAPTER_CONFIG).exists():
        raise FileNotFoundError(f"{folder}: LoRA adapters of the {part} are missing (no {ADAPTER_CONFIG})")
    config_file = strict.inside(path, f"{name}/{ADAPTER_CONFIG}", f"{where}.dir")
    weights_file = strict.inside(path, f"{name}/{ADAPTER_WEIGHTS}", f"{where}.dir")
    if not weights_file.is_file():
        raise CheckpointError(f"{weights_file}: the {part}'s adapter weights are missing; copy the checkpoint again")
    module = _part_module(model, part)
    if is_peft(module):
        raise CheckpointError(f"{where}: the {part} already has LoRA adapters (listed twice?)")
    config = _checked_adapter_config(config_file, part, module, spec)
    wrapped = get_peft_model(module, config)
    tensors = strict.read_tensors(weights_file)
    kinds = [f"{k} (stored {str(v.dtype).removeprefix('torch.')})" for k, v in tensors.items()
             if not v.is_floating_point()]  # fmt: skip
    strict.refuse_misfit(weights_file, {"of another kind": kinds})
    strict.check_finite(tensors.items(), weights_file)
    try:
        result = peft_library().set_peft_model_state_dict(wrapped, tensors)
    except RuntimeError as e:  # torch's size mismatches, even with strict=False
        shapes = re.findall(SIZE_MISMATCH, str(e))
        if not shapes:
            raise
        shown = [f"{k.replace('.default.', '.')} (stored {s.removeprefix('torch.Size(').removesuffix(')')})"
                 for k, s in shapes]  # fmt: skip
        strict.refuse_misfit(weights_file, {"of another shape": shown})
    missing = [k.replace(".default.", ".") for k in result.missing_keys if "lora_" in k]
    unexpected = [k.replace(".default.", ".") for k in result.unexpected_keys]
    strict.refuse_misfit(weights_file, {"missing": missing, "unexpected": unexpected})
    _set_part_module(model, part, wrapped)


def _checked_adapter_config(file: Path, part: str, module: nn.Module, spec: LoraSpec) -> LoraConfig:
    """The ``LoraConfig`` of ``part``'s recorded adapters (``spec``; targets: the recorded ones, or for a checkpoint
    that did not record them the file's list), after refusing an ``adapter_config.json`` that says otherwise.

    Targets are compared as the modules they adapt (:func:`resolve_targets`: peft writes a long list of module names
    as the shortest list of name suffixes that matches exactly those modules)."""
    raw = read_json(file)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: expected a JSON object (peft's adapter configuration)")
    stored_targets = raw.get("target_modules")
    if not (isinstance(stored_targets, list) and stored_targets and all(isinstance(t, str) for t in stored_targets)):
        raise CheckpointError(f"{file}: target_modules must be the list of adapted module names finecap writes, got "
                              f"{short_repr(stored_targets)}")  # fmt: skip
    stored = _adapted(part, module, stored_targets, f"{file}: target_modules")
    trained = _adapted(part, module, list(spec.targets), f"{file.parent.parent / CAPTIONER_FILE}: lora.{part}.targets")
    init = raw.get("init_lora_weights", True)
    expected = _lora_config(part, module, trained or stored, LoraSpec(spec.rank, spec.alpha, spec.dropout))
    expected.init_lora_weights = init if init in FRESH_INITS else True
    written = {k: v for k, v in expected.to_dict().items() if k not in NOT_COMPARED}
    reference = json.loads(json.dumps(written, default=sorted))  # as save_pretrained writes it (enums as strings)
    differences = [f"{key} is {short_repr(value, 80)}, trained with {short_repr(reference[key], 80)}"
                   for key, value in raw.items()
                   if key in reference and not _same_value(value, reference[key])]  # fmt: skip
    if trained and stored != trained:
        left_out, added = sorted(set(trained) - set(stored)), sorted(set(stored) - set(trained))
        differences.append("target_modules " + ", ".join(
            ([f"leave out trained modules {strict.listed(left_out)}"] if left_out else [])
            + ([f"add modules never trained {strict.listed(added)}"] if added else [])
        ))  # fmt: skip
    if not any(init is i or init == i for i in FRESH_INITS if isinstance(init, type(i))):
        differences.append(f"init_lora_weights is {short_repr(init, 80)}, finecap writes true or gaussian")
    if differences:
        raise CheckpointError(
            f"{file}: not the adapters captioner.json records ({'; '.join(differences[: strict.NAMED])}"
            f"{f' and {len(differences) - strict.NAMED} more' if len(differences) > strict.NAMED else ''}); refused, "
            "as they would compute something else than what was trained: copy the checkpoint again"
        )
    return expected


def _adapted(part: str, module: nn.Module, targets: list[str], what: str) -> list[str]:
    """The modules of ``part`` that ``targets`` (names or suffixes) adapt, ``[]`` for none given; a target that
    matches no module LoRA may adapt is a :class:`CheckpointError` naming ``what``."""
    if not targets:
        return []
    try:
        return resolve_targets(part, module, targets)
    except ValueError as e:
        raise CheckpointError(f"{what}: {e}") from None


def _same_value(stored: Any, expected: Any) -> bool:
    """Whether a value of ``adapter_config.json`` equals finecap's (both as JSON): a float by value (an integer too;
    NaN equals nothing), anything else of the same JSON type and equal."""
    if isinstance(expected, float):
        return isinstance(stored, int | float) and not isinstance(stored, bool) and float(stored) == expected
    return type(stored) is type(expected) and stored == expected


# --------------------------------------------------------------------------------------------------------------------
# One adapter for the whole model, for other tools
# --------------------------------------------------------------------------------------------------------------------

WHOLE_ADAPTER_DIR = "adapter"
"""Where a checkpoint keeps the adapters of all its parts as one peft adapter of the whole transformers model."""


def _adapted_modules(part: PeftModel) -> list[str]:
    """Names (in the part's base model) of the modules carrying LoRA layers."""
    return [name for name, m in part.get_base_model().named_modules() if is_lora_layer(m)]


def save_whole_adapter(
    model: nn.Module,
    root: str,
    out: str | Path,
    states: dict[str, dict[str, torch.Tensor]],
    modules_to_save: Sequence[str] = (),
    saved_modules: dict[str, torch.Tensor] | None = None,
    base_name: str = "",
) -> str | None:
    """Write the adapters of every part as *one* standard peft LoRA adapter of the transformers model at attribute path
    ``root`` of the captioner (``model``: a BLIP's ``BlipForConditionalGeneration``, a VLM's
    ``...ForConditionalGeneration``) into ``<out>/adapter``, so that other tools load it on the base model:
    ``PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base), "<out>/adapter")``,
    ``model.load_adapter(...)``, and vLLM's LoRA loading when ``modules_to_save`` is empty and no vision tower is
    adapted (vLLM 0.32 refuses a trained projector there, and adapts a VLM's language model only: docs/caption.md).
    Returns the folder's name, or ``None`` when there is nothing to write (no adapters) or a part with adapters lies
    outside ``root`` (the world models' dual encoder).

    ``states``: per part, its state dict (adapter weights are taken from it, e.g. gathered from a sharded model).
    ``modules_to_save``: modules (paths under ``root``) trained fully beside the adapters (a VLM's projector), saved
    whole in the adapter as peft's ``modules_to_save``, from ``saved_modules`` (their state under ``root``'s names).
    ``base_name``: the base model's name or path, recorded as ``base_model_name_or_path``.

    Written with peft's own ``get_peft_model_state_dict`` per part (keys re-rooted at ``root``) and a ``LoraConfig``
    naming every adapted module by its full path, so the adapter wraps exactly the modules finecap adapted; parts
    with different ranks or alphas get peft's ``rank_pattern`` / ``alpha_pattern``."""
    parts = {p: model.lora_module(p) for p in PARTS if is_peft(model.lora_module(p))}
    if not parts:
        return None
    paths = {p: model.part_path(p) for p in parts}
    if any(not path.startswith(root + ".") for path in paths.values()):
        return None
    weights: dict[str, torch.Tensor] = {}
    targets: list[str] = []
    configs = {}
    for p, module in parts.items():
        inner = paths[p][len(root) + 1 :]  # e.g. "model.language_model"
        part_weights = peft_library().get_peft_model_state_dict(module, state_dict=states.get(p) or None)
        for key, value in part_weights.items():
            weights[f"base_model.model.{inner}.{key.removeprefix('base_model.model.')}"] = value.detach().cpu()
        names = [f"{inner}.{name}" for name in _adapted_modules(module)]
        targets += names
        configs[p] = (module.peft_config["default"], names)
    first = next(iter(configs.values()))[0]
    rank_pattern = {n: c.r for c, names in configs.values() if c.r != first.r for n in names}
    alpha_pattern = {n: c.lora_alpha for c, names in configs.values() if c.lora_alpha != first.lora_alpha
                     for n in names}  # fmt: skip
    for name in modules_to_save:
        prefix = name + "."
        for key, value in (saved_modules or {}).items():
            if key.startswith(prefix):
                weights[f"base_model.model.{key}"] = value.detach().cpu()
    config = peft_library().LoraConfig(
        r=first.r,
        lora_alpha=first.lora_alpha,
        lora_dropout=first.lora_dropout,
        target_modules=targets,
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        modules_to_save=list(modules_to_save) or None,
        base_model_name_or_path=base_name or None,
    )
    folder = Path(out) / WHOLE_ADAPTER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "adapter_model.safetensors"))
    return WHOLE_ADAPTER_DIR
