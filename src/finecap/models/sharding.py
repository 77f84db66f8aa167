"""Sharded training with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): sharding a captioner, full parameters
for decoding, and full state dicts for checkpoints.

finecap applies ``fully_shard`` itself (:func:`shard_captioner`), as torchtune does: to each transformer layer of every
transformers model inside the captioner (the classes listed in that model's ``_no_split_modules``: GPT-2's
``GPT2Block``, BLIP's and CLIP's encoder layers, a VLM's decoder and vision layers; an outermost match only, never one
inside another) and then to the captioner itself, the root, which holds what remains (embeddings, heads, norms,
ClipCap's mapper, a VLM's projector). The same code runs on CPU (gloo, tested here with 2 processes) and GPU (NCCL):
the process group is accelerate's. Mixed precision goes through FSDP2's ``MixedPrecisionPolicy`` (``bf16``: parameters
gathered in bfloat16 for the forward and backward, gradients reduced in float32). Under gradient accumulation each
micro-batch's gradients are reduce-scattered (FSDP2's default, kept: the accumulated gradients stay sharded; skipping
the sync until the last micro-batch would hold every layer's full gradient on every process; docs/training.md).

**Decoding needs full parameters.** Outside the root's ``forward``, a sharded parameter is a ``DTensor`` (decoding's
``start`` / ``step`` call the language model directly: "mixed torch.Tensor and DTensor"), and each layer's forward
hook would all-gather its shard at every decoding step, a collective that deadlocks as soon as two processes decode
captions of different lengths. :func:`decoding` (used by every caller that decodes: REINFORCE rollouts, validation,
``finecap caption``) therefore gathers every sharded module once, keeps it gathered while the block runs (no
collective inside it, so each process may decode its own batch for as long as it needs) and reshards afterwards,
as TRL's ``unwrap_model_for_generation`` gathers ZeRO-3 parameters. Without sharding it does nothing.

**One process reads the weights.** In a run of several processes only the main one loads the checkpoint; the others
build the captioner with its parameters on the meta device (:func:`finecap.models.memory.loading_onto`), shard it,
and receive their shards from the main process (:func:`receive_weights`: torch's ``set_model_state_dict`` with
``broadcast_from_rank0``, one tensor at a time), so host memory holds one copy of the model, not one per process.

**Checkpoints without pickle.** :func:`model_state` gathers the full weights (plain CPU tensors on the main process)
that the backbone's ``save`` writes in its own format; :func:`optimizer_state` / :func:`load_optimizer_state` use
torch's ``torch.distributed.checkpoint.state_dict`` APIs to turn the sharded AdamW state into a full one keyed by
parameter names, which finecap's JSON + safetensors state writer stores (DCP's own sharded format pickles its
metadata). The same name-keyed state loads under sharding and in one process.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from finecap.models import lora

STRATEGIES = ("ddp", "fsdp")
"""``train.strategy``: how several processes share a run (one process: no difference)."""


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that ``fully_shard`` was applied to, in a fixed order (the same on every process)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` (or a module inside it) is sharded with FSDP2."""
    return bool(fsdp_modules(model))


def layer_classes(model: nn.Module) -> set[str]:
    """Class names of the transformer layers of every transformers model inside ``model`` (their
    ``_no_split_modules``)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return names


def shard_layers(model: nn.Module) -> list[str]:
    """Names of the modules :func:`shard_captioner` shards besides the root: the outermost modules of ``model``
    whose class is a transformer layer (:func:`layer_classes`), except one holding a parameter tied to one outside it
    (BLIP lists its text embeddings as such a module, and its output head shares their weight): FSDP2 keeps a tied
    pair in one group, so that module is left to the root's."""
    classes = layer_classes(model)
    names: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(name)
    chosen: list[str] = []
    for name, module in model.named_modules():
        if type(module).__name__ not in classes or any(name.startswith(c + ".") for c in chosen):
            continue
        tied = any(not n.startswith(name + ".") for p in module.parameters() for n in names[id(p)])
        if not tied:
            chosen.append(name)
    return chosen


def shard_captioner(
    model: nn.Module, mixed_precision: str = "no", device: torch.device | str | None = None
) -> list[str]:
    """Apply ``fully_shard`` to each transformer layer of ``model`` (:func:`shard_layers`), then to ``model`` itself,
    over the default process group (all processes); ``mixed_precision`` (``train.mixed_precision``): ``bf16``
    gathers parameters in bfloat16 and reduces gradients in float32 (``fp16`` likewise in float16, except on a CPU
    ``device``, the process's: there accelerate has no float16 autocast nor gradient scaler and the run trains in
    float32, as it says at its start). Returns the names of the sharded layers. Parameters must be on the process's
    device already (or on the meta device, for a process that receives its shards)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cpu = device is not None and torch.device(device).type == "cpu"
    dtypes = {"bf16": torch.bfloat16} if cpu else {"bf16": torch.bfloat16, "fp16": torch.float16}
    policy = MixedPrecisionPolicy(param_dtype=dtypes.get(mixed_precision), reduce_dtype=torch.float32)
    scalars = {n: p for n, p in model.named_parameters() if p.ndim == 0}  # fully_shard cannot shard a 0-d tensor
    trained = sorted(n for n, p in scalars.items() if p.requires_grad)
    if trained:
        raise ValueError(f"train.strategy=fsdp: cannot shard the trained scalar parameters {trained}")
    ignored = set(scalars.values())  # frozen (a dual encoder's logit_scale): kept whole on every process, never synced
    layers = shard_layers(model)
    modules = dict(model.named_modules())
    for name in layers:  # a layer reshards after its forward (gathered again for its backward)
        fully_shard(modules[name], mp_policy=policy, ignored_params=ignored or None, reshard_after_forward=True)
    # the root keeps its parameters gathered from its forward to its backward (FSDP2's default for a root)
    fully_shard(model, mp_policy=policy, ignored_params=ignored or None, reshard_after_forward=False)
    return layers


def receives_weights(strategy: str, processes: int) -> bool:
    """Whether the processes other than the main one build their model without weights and receive their shards from
    it (:func:`receive_weights`): ``train.strategy=fsdp`` with several processes."""
    return strategy == "fsdp" and processes > 1


def match_main(model: nn.Module) -> None:
    """Before sharding a model that the main process loaded and the others built on the meta device: every process
    must shard the same parameters, of the same shapes, dtypes and ties. The main process sends its parameters'
    names, shapes, dtypes, ties and ``requires_grad``; another process casts a meta parameter of another dtype to the
    main one's (a config build can differ from a loaded checkpoint there, e.g. ``model.dtype=auto``), takes the main
    one's ``requires_grad`` (which weights train is found by a forward pass that a meta build cannot run) and refuses
    any other difference in one line.
    Every process must call it."""
    import torch.distributed as dist

    own = _described(model)
    sent = [own if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(sent, src=0)
    main = sent[0]
    if dist.get_rank() == 0:
        return
    # adapters on modules the main process found unreached (lora.drop_adapters; a meta build cannot probe that)
    extra = {n.split(".lora_", 1)[0] for n in set(own) - set(main) if ".lora_" in n}
    extra -= {n.split(".lora_", 1)[0] for n in main if ".lora_" in n}
    if extra:
        lora.drop_adapters(model, sorted(extra))
        own = _described(model)
    differ = sorted(set(main) ^ set(own))
    differ += [n for n in main if n in own and (main[n][0], main[n][2]) != (own[n][0], own[n][2])]
    if differ:
        raise RuntimeError(f"train.strategy=fsdp: process {dist.get_rank()} built a model whose parameters differ "
                           f"from the main process's loaded one: {differ[:5]}")  # fmt: skip
    for name, p in model.named_parameters():
        if p.dtype != main[name][1]:
            if not p.is_meta:
                raise RuntimeError(f"train.strategy=fsdp: {name} is {p.dtype} on process {dist.get_rank()}, "
                                   f"{main[name][1]} on the main process")  # fmt: skip
            p.data = p.data.to(main[name][1])
        # what trains is the main process's: a meta build cannot run the probes that find the weights a part's output
        # reaches (finecap.models.vision.reached_parameters), and every process must train the same parameters
        p.requires_grad_(main[name][3])


def _described(model: nn.Module) -> dict[str, tuple]:
    """Every name of every parameter of ``model``: its shape, dtype, the first name of the tensor (ties) and
    ``requires_grad`` (what :func:`match_main` compares)."""
    first: dict[int, str] = {}
    return {n: (tuple(p.shape), p.dtype, first.setdefault(id(p), n), p.requires_grad)
            for n, p in model.named_parameters(remove_duplicate=False)}  # fmt: skip


def receive_weights(model: nn.Module, state: dict[str, torch.Tensor], device: torch.device | str) -> None:
    """Give every process of a sharded ``model`` (:func:`shard_captioner`) the main process's weights: ``state`` is
    the main process's full state dict taken before sharding (``model.state_dict()``; an empty dict on the others).
    Another process's parameters still on the meta device are first materialised on ``device`` (``to_empty``: the
    sharded ``DTensor`` parameters keep their identity, and so their ties), its buffers (rotary frequencies, which no
    state dict holds) kept as they were computed; then each tensor is broadcast from the main process and each
    process keeps its shard (``set_model_state_dict`` with ``full_state_dict`` and ``broadcast_from_rank0``,
    strict: the keys must match). Every process must call it."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if dist.get_rank() != 0 and any(p.is_meta for p in model.parameters()):
        buffers = {name: b for name, b in model.named_buffers()}
        model.to_empty(device=device)
        for name, b in buffers.items():
            parent, _, attr = name.rpartition(".")
            model.get_submodule(parent)._buffers[attr] = b.to(device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state if dist.get_rank() == 0 else {}, options=options)


_GATHERED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""The sharded roots whose :func:`decoding` block is open (their parameters gathered)."""


@contextlib.contextmanager
def decoding(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, ``model`` holds full parameters on every process and runs no collective (module docstring);
    yields the model to decode with. Every process of a sharded run must enter it together (it gathers on entry).
    Without sharding: the model itself, nothing done.

    **Nested blocks do nothing.** A block opened inside another on the same model (training's evaluation holds one
    for all of its validation; a validator's :func:`finecap.caption.generate_captions` opens its own) neither gathers
    nor reshards: were the inner one to reshard on exit, the rest of the outer block would run the layers' forward
    hooks again, and those all-gather, a collective that only the processes decoding at that moment enter (the main
    process's sample captions): the run deadlocked there (issue 48; tests/train/test_fsdp_validation.py)."""
    modules = fsdp_modules(model)
    if not modules or modules[0] in _GATHERED:
        yield model
        return
    # FSDP2 takes the first module whose forward runs as its root; decoding calls the layers directly, so the root
    # (the captioner) is initialised as such first (torch's private _lazy_init: fully_shard has no public call for it)
    modules[0]._get_fsdp_state()._lazy_init()
    for m in modules:
        m.set_reshard_after_forward(False)  # a forward inside the block must not reshard (and regather: a collective)
    for m in modules:
        m.unshard()
    _GATHERED.add(modules[0])
    try:
        yield model
    finally:
        _GATHERED.discard(modules[0])
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(m is not model)  # what shard_captioner set: layers true, the root false


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a sharded ``model`` as plain CPU tensors on the main process (an empty dict on the
    others; every process must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state of a sharded ``model`` keyed by parameter names, plain CPU tensors on the main process
    (every process must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def is_named_optimizer_state(state: dict[str, Any]) -> bool:
    """Whether an optimizer state dict is keyed by parameter names (:func:`optimizer_state`) rather than by
    torch's parameter indices."""
    return any(isinstance(k, str) for k in state.get("state", {}))


def named_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """Torch's own optimizer state (keyed by the positions of the parameters in the optimizer's groups: what an
    unsharded run saves, under DDP or in one process) keyed by the names of ``optimizer``'s parameters in ``model``
    instead, group by group and position by position, so that a sharded run loads it (:func:`load_optimizer_state`).
    The two optimizers must hold their parameters in the same order, as :func:`finecap.train.engine.build_optimizer`
    makes them from the same model; a ``ValueError`` when the groups differ in number or size."""
    names = {id(p): name for name, p in model.named_parameters()}
    saved_groups = state.get("param_groups", [])
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"it has {len(saved_groups)} parameter groups, this run's optimizer "
                         f"{len(optimizer.param_groups)}")  # fmt: skip
    out: dict[str, Any] = {"state": {}, "param_groups": []}
    for k, (saved, current) in enumerate(zip(saved_groups, optimizer.param_groups, strict=True)):
        if len(saved["params"]) != len(current["params"]):
            raise ValueError(f"its parameter group {k} holds {len(saved['params'])} parameters, this run's "
                             f"{len(current['params'])}")  # fmt: skip
        fqns = [names[id(p)] for p in current["params"]]
        for index, name in zip(saved["params"], fqns, strict=True):
            if index in state.get("state", {}):
                out["state"][name] = state["state"][index]
        out["param_groups"].append({**saved, "params": fqns})
    return out


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full, name-keyed optimizer state (:func:`optimizer_state`) into ``optimizer`` of ``model``, sharded or
    not; every process passes the whole state and keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
