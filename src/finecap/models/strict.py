"""Strict loading of a captioner checkpoint's weights: every tensor a file holds is one the model has, of the model's
shape and kind, and finite; no tensor of the model is missing from it.

Why: transformers' ``from_pretrained`` only *warns* about a tensor the checkpoint lacks (it keeps its random
initialisation) or holds besides the model's (it is dropped), and peft's adapter loading does the same, so a
damaged or tampered folder loads as a captioner with random weights, or without the adapters it was trained with,
and captions. finecap wrote every file of a checkpoint folder from the model it reloads, so anything but an exact
fit means the folder is not what it claims, and it is refused with one :class:`~finecap.runs.CheckpointError` naming
the file and the first offending tensors:

- missing and unexpected tensors, and tensors of another shape (transformers is asked with
  ``ignore_mismatched_sizes=True`` to report them rather than raise without names);
- tensors of another kind (an integer or boolean tensor where the model holds floating point, or the reverse:
  transformers and ``load_state_dict`` cast it silently). A floating-point tensor of another precision is accepted:
  a checkpoint saved in bfloat16 is loaded in ``model.dtype``, as intended; so is one where the model holds a
  bitsandbytes-quantized weight (``model.quantization``: transformers quantizes it as it loads, as it does a Hub
  model's, so that an unquantised checkpoint starts a QLoRA run), whose only other accepted kind is its own packed
  one;
- NaN or infinity in a floating-point tensor (a diverged run's weights caption nothing, silently):
  :func:`check_finite`, the one check ``finecap caption``, ``finecap export`` and ``train.init_from`` rely on.

Ties the model declares (a language model's head tied to its embeddings) are transformers' own business: a tied
tensor is neither saved nor reported missing (checked on the tiny GPT-2 and VLMs in
``tests/models/test_strict_loading.py``). Base models loaded by name from outside a checkpoint (``clipcap.lm``,
``vlm.name``, a frozen encoder a checkpoint refers to) are loaded as transformers loads them; only their finiteness
is checked when a checkpoint refers to them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from finecap.errors import pickled_message
from finecap.runs import CheckpointError
from finecap.utils.reading import read_json

NAMED = 3
"""Offending tensors named per kind of problem; the rest are counted."""
RECOVER = ("refused, as a tensor the model lacks keeps random weights and one it does not take is dropped: copy the "
           "checkpoint again from where it came from, or use another checkpoint of the run")  # fmt: skip
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
"""The weight files of a ``save_pretrained`` folder: one file, or shards listed in an index."""
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
"""transformers' names of pickled weights (one file, or an index of shards), which a checkpoint folder's load never
reads (:func:`load_pretrained`)."""
ADAPTER_CONFIG = "adapter_config.json"


def listed(names: Iterable[str], limit: int = NAMED) -> str:
    """The first ``limit`` of ``names``, sorted, and how many more there are.

    Example::

        >>> listed(["d", "c", "b", "a"])
        'a, b, c and 1 more'
    """
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def refuse_misfit(where: str | Path, problems: Mapping[str, Iterable[str]]) -> None:
    """A :class:`CheckpointError` naming ``where`` and the first tensors of each problem (``{"missing": names,
    "unexpected": names, ...}``), when there is any."""
    found = {kind: list(names) for kind, names in problems.items() if names}
    if found:
        what = "; ".join(f"{kind}: {listed(names)}" for kind, names in found.items())
        raise CheckpointError(f"{where}: the weights do not fit the model ({what}); {RECOVER}")


def is_float_name(dtype: str) -> bool:
    """Whether a safetensors dtype name (``F32``, ``BF16``, ``F8_E4M3``; not ``I64``, ``BOOL``, ``U8``) is a
    floating-point one."""
    return dtype.startswith(("F", "BF"))


def kind_misfits(stored: Mapping[str, str], model: Mapping[str, torch.Tensor],
                 quantized: Collection[str] = ()) -> list[str]:  # fmt: skip
    """``name (stored I32, the model's float32)`` for each tensor of ``stored`` (name -> safetensors dtype name) whose
    kind (floating point or not) differs from the model's tensor of that name. ``quantized``: names of the model's
    bitsandbytes-quantized weights (:func:`quantized_weights`), which take a floating-point tensor (quantized as it
    loads) or one of their own packed dtype, and nothing else. transformers may store a tensor under another name
    than the model's (its checkpoint conversions: a VLM's ``language_model.lm_head.weight`` is the model's
    ``lm_head.weight``), so when every tensor of the model is floating point, every stored one must be too, whatever
    its name.

    Example::

        >>> packed = {"w": torch.zeros(2, dtype=torch.uint8)}
        >>> kind_misfits({"w": "F32"}, packed, quantized={"w"}), kind_misfits({"w": "U8"}, packed, quantized={"w"})
        ([], [])
        >>> kind_misfits({"w": "I64"}, packed, quantized={"w"}), kind_misfits({"w": "F32"}, packed)
        (["w (stored I64, the model's uint8)"], ["w (stored F32, the model's uint8)"])
    """
    all_float = all(t.is_floating_point() for t in model.values())
    out = []
    for name, dtype in stored.items():
        tensor = model.get(name)
        own = None if tensor is None else str(tensor.dtype).removeprefix("torch.")
        if name in quantized and tensor is not None:
            if not is_float_name(dtype) and SAFETENSORS_NAMES.get(dtype) != own:
                out.append(f"{name} (stored {dtype}, the model's {own})")
        elif tensor is not None and is_float_name(dtype) != tensor.is_floating_point():
            out.append(f"{name} (stored {dtype}, the model's {own})")
        elif tensor is None and all_float and not is_float_name(dtype):
            out.append(f"{name} (stored {dtype}, the model's floating point)")
    return out


SAFETENSORS_NAMES = {"U8": "uint8", "I8": "int8"}
"""The torch dtype of the safetensors dtype names a bitsandbytes-quantized weight is stored in (4-bit packed in
``uint8``, LLM.int8() in ``int8``)."""


QUANTIZED_PARAMS = {"Params4bit": "4bit", "Int8Params": "8bit"}
"""bitsandbytes' parameter classes of a quantized weight, and the ``model.quantization`` each is."""


def quantized_weights(model: nn.Module) -> set[str]:
    """The names of ``model``'s bitsandbytes-quantized weights (:data:`QUANTIZED_PARAMS`; its state dict holds them
    as plain tensors of their packed dtype)."""
    return {name for name, p in model.named_parameters(remove_duplicate=False)
            if type(p).__name__ in QUANTIZED_PARAMS}  # fmt: skip


def check_finite(tensors: Iterable[tuple[str, torch.Tensor]], where: str | Path) -> None:
    """A :class:`CheckpointError` naming ``where`` and the first tensors of ``tensors`` (name, tensor) holding NaN or
    infinity: a diverged run's weights decode empty captions, silently."""
    bad = [name for name, t in tensors if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise CheckpointError(f"{where}: the weights hold non-finite values ({listed(bad)}); the run diverged or the "
                              "file was altered: use an earlier checkpoint")  # fmt: skip


def check_finite_weights(model: nn.Module, where: str | Path) -> None:
    """:func:`check_finite` of every floating-point tensor of ``model`` (its state dict)."""
    check_finite(model.state_dict().items(), where)


# --------------------------------------------------------------------------------------------------------------------
# A plain module from one safetensors file (ClipCap's mapper, the float32 master weights, adapters)
# --------------------------------------------------------------------------------------------------------------------


def read_tensors(file: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (loaded on the CPU)."""
    return load_file(str(file))


def fit_state(file: str | Path, model: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor],
              partial: bool = False) -> None:  # fmt: skip
    """Refuse ``tensors`` (read from ``file``) unless they fit ``model`` (the state dict they go into): the same names
    (``partial``: a subset), shapes and kinds, and finite."""
    shapes = [f"{k} (stored {tuple(v.shape)}, the model's {tuple(model[k].shape)})" for k, v in tensors.items()
              if k in model and tuple(v.shape) != tuple(model[k].shape)]  # fmt: skip
    kinds = [f"{k} (stored {str(v.dtype).removeprefix('torch.')}, the model's "
             f"{str(model[k].dtype).removeprefix('torch.')})" for k, v in tensors.items()
             if k in model and v.is_floating_point() != model[k].is_floating_point()]  # fmt: skip
    refuse_misfit(file, {"missing": [] if partial else [k for k in model if k not in tensors],
                         "unexpected": [k for k in tensors if k not in model], "of another shape": shapes,
                         "of another kind": kinds})  # fmt: skip
    check_finite(tensors.items(), file)


def load_module_state(module: nn.Module, file: str | Path) -> None:
    """Load the safetensors ``file`` into ``module`` strictly (:func:`fit_state`)."""
    tensors = read_tensors(file)
    fit_state(file, module.state_dict(), tensors)
    module.load_state_dict(tensors)


# --------------------------------------------------------------------------------------------------------------------
# A transformers model from a save_pretrained folder
# --------------------------------------------------------------------------------------------------------------------


def weight_files(folder: Path) -> dict[str, Path]:
    """``{tensor name: its file}`` of a ``save_pretrained`` folder's safetensors weights (one file or an index of
    shards); empty when it has neither (transformers then names what is missing). An index naming a shard outside
    the folder (an absolute path, ``..``), which transformers would read, is refused naming the entry: a checkpoint
    refers only to files it holds (a shard that is a link, as in a Hugging Face cache's snapshot, is the folder's)."""
    if (folder / INDEX).is_file():
        index = read_json(folder / INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{folder / INDEX}: no weight_map of tensor names to files")
        for name, shard in weight_map.items():
            written = os.path.normpath(str(shard))
            if os.path.isabs(written) or written.split(os.sep)[0] == os.pardir:
                raise CheckpointError(
                    f"{folder / INDEX}: weight_map[{str(name)!r}] names {str(shard)!r}, outside the checkpoint folder "
                    f"{folder}; refused (a checkpoint refers only to files it holds): copy the checkpoint again"
                )
        return {str(k): folder / str(v) for k, v in weight_map.items()}
    file = folder / SINGLE  # named ``file``: a damaged header is reported with this file (finecap.errors)
    if file.is_file():
        with safe_open(str(file), framework="pt") as f:
            return dict.fromkeys(f.keys(), file)
    return {}


def stored_dtypes(files: Mapping[str, Path]) -> dict[str, str]:
    """The safetensors dtype name of each tensor, read from the files' headers (no tensor is read)."""
    out: dict[str, str] = {}
    for file in sorted(set(files.values())):
        with safe_open(str(file), framework="pt") as f:
            out.update({name: f.get_slice(name).get_dtype() for name in f.keys()})  # noqa: SIM118 (no __iter__)
    return out


class _DropLoadReport(logging.Filter):
    """transformers' load report (a table of missing / unexpected tensors, logged as a warning), which a strict load
    replaces by its one-line error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()


@contextmanager
def _without_load_report() -> Iterator[None]:
    logger = logging.getLogger("transformers.modeling_utils")
    drop = _DropLoadReport()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def load_pretrained(auto_cls: Any, folder: str | Path, **kwargs: Any) -> nn.Module:
    """``auto_cls.from_pretrained(folder, **kwargs)`` of a folder a checkpoint holds, refused unless its weights fit
    the model exactly (module docstring): missing, unexpected, mismatched tensors and transformers' own loading
    errors, tensors of another kind, non-finite values. Only safetensors weights are read (``use_safetensors=True``):
    a pickled ``pytorch_model.bin`` in their place is refused, naming it, and never unpickled. A peft adapter at the
    top of the folder (``adapter_config.json``), which transformers would load into the model unasked, is refused
    too: finecap keeps adapters in subfolders and loads them itself (:mod:`finecap.models.lora`)."""
    folder = Path(folder)
    if (folder / ADAPTER_CONFIG).exists():
        raise CheckpointError(
            f"{folder / ADAPTER_CONFIG}: a peft adapter at the top of a model folder, which transformers would load "
            "into the model unasked; finecap never writes one there (its adapters are in lm_lora/, encoder_lora/): "
            "remove it, or copy the checkpoint again"
        )
    files = weight_files(folder)
    pickled = [folder / name for name in PICKLED_WEIGHTS if (folder / name).exists()]
    if not files and pickled:  # transformers would unpickle it (torch.load, weights_only=True): never
        raise CheckpointError(pickled_message(str(pickled[0])))
    try:
        with _without_load_report():
            model, info = auto_cls.from_pretrained(folder, output_loading_info=True, ignore_mismatched_sizes=True,
                                                   use_safetensors=True, **kwargs)  # fmt: skip
    except RuntimeError as e:  # transformers' errors while loading tensors: the first line of their details
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        if not lines or not lines[0].startswith(("Error(s) in loading state_dict", "We encountered some issues")):
            raise
        raise CheckpointError(f"{folder}: cannot load the weights ({lines[-1] if len(lines) > 1 else lines[0]}); "
                              f"{RECOVER}") from None  # fmt: skip
    where = next(iter(set(files.values()))) if len(set(files.values())) == 1 else folder
    state, quantized = model.state_dict(), quantized_weights(model)
    mismatched = [f"{name} (stored {tuple(stored)}, the model's {tuple(own)})"
                  for name, stored, own in info.get("mismatched_keys") or ()]  # fmt: skip
    refuse_misfit(where, {"missing": info.get("missing_keys") or (), "unexpected": info.get("unexpected_keys") or (),
                          "of another shape": mismatched,
                          "of another kind": kind_misfits(stored_dtypes(files), state, quantized)})  # fmt: skip
    bad = [name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        shown = {files.get(name, where) for name in bad}
        check_finite(((name, state[name]) for name in bad), next(iter(shown)) if len(shown) == 1 else where)
    return model


# --------------------------------------------------------------------------------------------------------------------
# Paths a checkpoint names
# --------------------------------------------------------------------------------------------------------------------


def inside(folder: str | Path, name: str, what: str) -> Path:
    """``folder / name`` when it lies inside ``folder`` once ``..`` and links are resolved (the file or folder itself
    may be a link, as long as it leads inside), else a :class:`CheckpointError` naming ``what`` (the file and entry
    that named it): a checkpoint refers only to what it holds."""
    path = Path(folder) / name
    real, root = os.path.realpath(path), os.path.realpath(folder)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise CheckpointError(
            f"{what}: {name!r} resolves to {real}, outside the checkpoint folder {root}; refused (a checkpoint refers "
            "only to files it holds): copy the checkpoint again"
        )
    return path
