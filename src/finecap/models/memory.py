"""The memory and precision levers of every captioner, written once over the captioner contract
(:class:`finecap.models.base.CaptionerBase`, which saves and loads through this module: a ``model`` here is a
captioner typed ``nn.Module``, as naming the base would make an import circle): a captioner's *parts* are
``model.lora_module(part)`` for ``part`` in :data:`~finecap.models.captioner.PARTS` (the language model and the
vision side); everything else (ClipCap's mapper, a VLM's projector and output head) is its *rest*. No function here
knows a backbone; the backbones call :class:`LoadOptions` where they load or build their models, and
:func:`prepare_training` finishes a captioner for training. What each lever saves, and how to set it:
``docs/memory.md``.

- **Weights' dtype** (``model.dtype``: ``auto`` = the checkpoint's own, ``float32`` = the default, ``bfloat16``,
  ``float16``): passed to every ``from_pretrained`` of a captioner (:meth:`LoadOptions.pretrained`) and applied to
  the models built here with random weights (:meth:`LoadOptions.fresh`).
- **Trainable dtype** (``model.trainable_dtype``, default ``float32``): the parameters that learn are cast to it by
  :func:`apply_dtypes`, so AdamW updates float32 master weights while frozen parts stay in ``model.dtype`` (``same``
  leaves them in ``model.dtype``). Where parts of different dtypes meet, the first module of each part casts its
  floating-point inputs to its own dtype (:func:`install_bridges`), as the part would see them in a model of one
  dtype. A checkpoint keeps the trained weights' float32 values in ``float32_weights/model.safetensors``
  (:func:`save_float32_masters`), which a run resuming in a 16-bit ``model.dtype`` reads back
  (:func:`load_float32_masters`), so resuming never rounds master weights.
- **Gradient checkpointing** (``train.gradient_checkpointing``): the layers of every part are recomputed in the
  backward pass with ``torch.utils.checkpoint``'s *non-reentrant* variant, which gives adapters behind a frozen
  embedding their gradient (the reentrant variant does not when no input of a checkpoint requires grad: the
  VLM-R1 / open-r1-multimodal report). It is switched on only for the duration of the captioner's ``forward`` (the
  one differentiable entry point), so decoding (``start`` / ``step`` with the KV cache, which ``transformers`` drops
  in a checkpointed layer in training mode) never runs checkpointed (:func:`enable_gradient_checkpointing`); a VLM's
  shared prompt pass, which hands its KV cache to the captions after it, is checkpointed by hand
  (:func:`checkpointing_with_cache`).
- **Attention implementation** (``model.attn_implementation``): passed through to ``from_pretrained`` (``sdpa``,
  ``eager``, ``flash_attention_2``), or set on the config of a model built here.
- **Quantization** (``model.quantization``: ``4bit`` NF4 with double quantization, or ``8bit``, through
  ``bitsandbytes``, the ``quant`` extra): the language model's base weights are loaded quantized; the vision side,
  the projector and the output head are not. A quantized part trains only through LoRA adapters (float32): QLoRA
  (:func:`check_quantized_training`). A checkpoint stores the quantized base as ``transformers`` does; loading it
  with ``model.quantization=none`` dequantizes it (an unquantised base with the trained adapters).
- **Where the weights load** (:func:`loading_onto`): a training process on a CUDA device, and every inference entry
  point loading a captioner or a retriever for one (:func:`finecap.inference.load_for_captioning`, the retriever's
  ``device``), reads each pretrained checkpoint's weights straight onto that device (``device_map={"": device}``,
  :func:`placement`), so host memory never holds the whole model; on the CPU (and outside :func:`loading_onto`)
  ``from_pretrained`` loads on the CPU as it always did. Under ``train.strategy=fsdp`` the processes other than the
  main one read no weights at all: their model is built on the meta device (:meth:`LoadOptions.empty`) and receives
  its shards from the main process (:func:`finecap.models.sharding.receive_weights`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.metadata
import inspect
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.checkpoint import checkpoint

from finecap.config import AttnImplementation, Quantization, TrainableDtype, WeightsDtype
from finecap.models import strict
from finecap.models.captioner import PARTS
from finecap.models.peft_import import is_peft
from finecap.utils.system import MissingExtra

if TYPE_CHECKING:
    from finecap.config import Config

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""``model.dtype`` / ``model.trainable_dtype`` names and their torch dtypes (``auto`` and ``same`` are not dtypes)."""
HALF = (torch.bfloat16, torch.float16)
MASTERS = "float32_weights/model.safetensors"
"""Where a captioner checkpoint keeps the float32 values of its trained weights when its weights are 16-bit: in a
folder of its own, not beside the model's weights, where a loader of the folder (vLLM reads every ``*.safetensors``
at the top of a folder without a shard index) would take it for a shard of the model."""
OLD_MASTERS = "float32_weights.safetensors"
"""Where checkpoints written before 2026-11-27 kept them (still read)."""
QUANT_EXTRA = "pip install 'finecap[quant]'"
_BRIDGES = "_finecap_dtype_bridges"
_CHECKPOINTING = "_finecap_checkpointing"


_STORED_QUANTIZATION = r"You passed `quantization_config` or equivalent parameters to `from_pretrained` but the model"
"""The start of transformers' warning when a checkpoint stored quantized is loaded with a quantization config:
the stored one is used (:meth:`LoadOptions.load` silences it; :meth:`LoadOptions.loaded` settles the dtype)."""


def _check(value: str, allowed: Any, key: str) -> None:
    if value not in get_args(allowed):
        raise ValueError(f"{key}={value!r}; valid: {', '.join(get_args(allowed))}")


# --------------------------------------------------------------------------------------------------------------------
# Loading and building: dtype, attention, quantization
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadOptions:
    """How a backbone loads its pretrained models and builds fresh ones: the ``model`` keys ``dtype``,
    ``attn_implementation`` and ``quantization`` (:meth:`of`). The defaults load as finecap always did for VLMs:
    float32, transformers' attention, no quantization."""

    dtype: WeightsDtype = "float32"
    attn_implementation: AttnImplementation = "auto"
    quantization: Quantization = "none"

    def __post_init__(self) -> None:
        _check(self.dtype, WeightsDtype, "model.dtype")
        _check(self.attn_implementation, AttnImplementation, "model.attn_implementation")
        _check(self.quantization, Quantization, "model.quantization")
        check_attention(self.attn_implementation)

    @classmethod
    def of(cls, model_cfg: Any) -> LoadOptions:
        """The options of a ``model`` section (:class:`finecap.config.ModelConfig`)."""
        return cls(model_cfg.dtype, model_cfg.attn_implementation, model_cfg.quantization)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The weights' torch dtype (``None`` for ``auto``)."""
        return DTYPES.get(self.dtype)

    def pretrained(self, *, quantize: bool = False, skip: Sequence[str] | None = None) -> dict[str, Any]:
        """Keyword arguments of a ``from_pretrained`` call: ``dtype`` (``"auto"``: the checkpoint's), the attention
        implementation unless ``auto``, and with ``quantize`` (the language model's load) and ``model.quantization``
        set, a ``BitsAndBytesConfig`` keeping ``skip`` (module names or prefixes; ``None``: transformers' default,
        the output head) unquantised. Inside :func:`loading_onto` a CUDA device, ``device_map={"": device}`` loads
        the weights straight onto it (transformers builds the model on the meta device and materialises each
        tensor where the map puts it: no full copy in host memory); a quantized load is placed there too, on the CPU
        inside the block of the CPU, else on the current CUDA device (bitsandbytes quantizes there) or the CPU."""
        kwargs: dict[str, Any] = {"dtype": self.torch_dtype or "auto"}
        if self.attn_implementation != "auto":
            kwargs["attn_implementation"] = self.attn_implementation
        placed = placement()
        if quantize and self.quantization != "none":
            kwargs["quantization_config"] = bnb_config(self.quantization, self.torch_dtype, skip)
            if not placed:  # the CPU, outside the block, or meta (a quantized load reads its weights: :meth:`load`)
                device = _LOAD_DEVICE.get()
                on_cpu = device is not None and device.type not in ("cuda", "meta")  # a CPU run on a GPU machine too
                cuda = torch.cuda.is_available() and not on_cpu
                placed = {"device_map": {"": torch.cuda.current_device() if cuda else "cpu"}}
        return {**kwargs, **placed}

    def load(self, auto_cls: Any, name: str | Path, what: str, skip: Sequence[str] | None = None,
             checkpoint: bool = False) -> nn.Module:  # fmt: skip
        """``auto_cls.from_pretrained(name)`` with these options (:meth:`pretrained`, quantizing all but ``skip``),
        never running code from the checkpoint (``trust_remote_code=False``), then :meth:`loaded` (``what``: the
        option and value that named it, for errors). ``checkpoint``: ``name`` is a folder of a captioner checkpoint,
        loaded strictly (:func:`finecap.models.strict.load_pretrained`: its weights must fit the model exactly).
        Inside :func:`loading_onto` the meta device, no weight is read: :meth:`empty` (a quantized load reads them)."""
        device = _LOAD_DEVICE.get()
        if device is not None and device.type == "meta" and self.quantization == "none":
            return self.empty(auto_cls, name)
        kwargs = {"trust_remote_code": False, **self.pretrained(quantize=True, skip=skip)}
        with warnings.catch_warnings():
            # a checkpoint stored quantized keeps its own quantization_config, as transformers warns it does:
            # :meth:`loaded` then puts it in model.dtype, or refuses another quantization, so the warning says nothing
            warnings.filterwarnings("ignore", message=_STORED_QUANTIZATION, category=UserWarning)
            model = (
                strict.load_pretrained(auto_cls, name, **kwargs)
                if checkpoint
                else auto_cls.from_pretrained(name, **kwargs)
            )
        return self.loaded(model, what)

    def empty(self, auto_cls: Any, name: str | Path) -> nn.Module:
        """The model ``auto_cls.from_pretrained(name)`` would load, built from the checkpoint's config with its
        parameters on the meta device (no weight read: a sharded run's other processes, which receive their shards
        from the main process, :func:`finecap.models.sharding.receive_weights`) and its buffers computed on the CPU
        (rotary frequencies, which no state dict holds), its tied weights tied; in ``model.dtype`` (``auto``: the
        config's) with the attention implementation; the checkpoint's generation config when it has one."""
        from accelerate import init_empty_weights
        from transformers import AutoConfig, GenerationConfig

        config = AutoConfig.from_pretrained(name, trust_remote_code=False)
        kwargs: dict[str, Any] = {"dtype": self.torch_dtype or getattr(config, "dtype", None) or torch.float32}
        if self.attn_implementation != "auto":
            kwargs["attn_implementation"] = self.attn_implementation
        build = getattr(auto_cls, "from_config", None) or auto_cls._from_config  # an Auto class, or a model class
        with init_empty_weights(include_buffers=False):
            model = build(config, **kwargs)
        model.tie_weights()  # from_config leaves a meta model's tied head untied (transformers 5.x)
        with contextlib.suppress(OSError):
            model.generation_config = GenerationConfig.from_pretrained(name)
        return model

    def loaded(self, model: nn.Module, what: str) -> nn.Module:
        """A model just loaded with :meth:`pretrained` (``what``: its option and value, for errors): a checkpoint
        stored quantized is dequantized when ``model.quantization=none`` (into ``model.dtype``, GPT-2's ``Conv1D``
        layers restored), kept quantized in ``model.dtype`` when it was quantized so (:func:`_quantized_in`), and
        refused when it was quantized otherwise; 4-bit layers keep their training layout on the
        CPU (:func:`keep_cpu_layout`); the model saves again (:func:`_reversible_conversions`)."""
        stored = quantization_of(model)
        if stored is not None and self.quantization == "none":
            dequantize = model.dequantize
            dtype = self.torch_dtype
            model = dequantize(dtype=dtype) if "dtype" in inspect.signature(dequantize).parameters else dequantize()
            _restore_conv1d(model)
            if dtype is not None:
                model.to(dtype)
        elif stored is not None and stored != self.quantization:
            raise ValueError(
                f"{what}: the checkpoint is stored quantized in {stored}, not model.quantization={self.quantization}; "
                f"set model.quantization={stored} (or none, to dequantize it)"
            )
        elif stored is not None and self.torch_dtype is not None:
            _quantized_in(model, self.torch_dtype)
        keep_cpu_layout(model)
        _reversible_conversions(model)
        return model

    def check_fresh(self, what: str) -> None:
        """Refuse ``model.quantization`` for a model built here with random weights (``what``: the option)."""
        if self.quantization != "none":
            raise ValueError(
                f"model.quantization={self.quantization} quantizes a pretrained checkpoint as it loads, but {what} is "
                "built here with random weights: name a checkpoint, or set model.quantization=none"
            )

    def fresh(self, model: nn.Module, what: str) -> nn.Module:
        """A model built here with random weights (``what``: the option that asked for it): cast to ``model.dtype``
        (``auto``: left in float32) and given the attention implementation; quantization is refused (it quantizes a
        checkpoint as it loads: :meth:`check_fresh`)."""
        self.check_fresh(what)
        if self.torch_dtype is not None:
            model.to(self.torch_dtype)
        if self.attn_implementation != "auto":
            set_attn_implementation(model, self.attn_implementation)
        return model


_LOAD_DEVICE: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("finecap_load_device", default=None)
"""The device :meth:`LoadOptions.pretrained` places pretrained weights on, set by :func:`loading_onto`: a CUDA device,
``meta``, the CPU (a run on the CPU: transformers' default placement, and a quantized load quantizes there), or
``None`` outside any block (transformers' default; a quantized load goes to the current CUDA device if any)."""


def load_device(device: torch.device | str) -> torch.device | None:
    """Where a training process loads pretrained weights (:func:`loading_onto`): ``device`` itself when it is a CUDA
    device (its index resolved, ``cuda`` = the current one), ``None`` (the CPU, ``from_pretrained``'s default) for
    any other but ``meta`` (no weights read: :meth:`LoadOptions.empty`). A CUDA process then holds the weights on
    its device only: under ``train.strategy=ddp`` its full copy; under ``fsdp`` the main process holds the full model
    there until :func:`finecap.models.sharding.shard_captioner` keeps its shard, the others load onto ``meta``
    (``docs/memory.md``, "Loading")."""
    device = torch.device(device)
    if device.type == "meta":
        return device
    if device.type != "cuda":
        return None
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def eval_device(cfg: Any) -> torch.device:
    """Where ``finecap eval`` runs its models (the CLIP retriever, the perplexity LM): the machine's accelerator
    (``torch.accelerator``: a GPU), as accelerate would choose it for training, unless ``train.cpu`` is set; else
    the CPU. Also where the Python API's :class:`~finecap.api.Captioner` and boost's in-process ``transformers``
    backend run, so that all three follow one rule (here, beside the other placement helpers, for each of them)."""
    if cfg.train.cpu or not torch.accelerator.is_available():
        return torch.device("cpu")
    return torch.accelerator.current_accelerator()


def placement() -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments that read a model's weights where :func:`loading_onto` puts them:
    ``{"device_map": {"": device}}`` inside the block of a CUDA device; none on the CPU, on ``meta`` and outside any
    block (``from_pretrained``'s default, the CPU). :meth:`LoadOptions.pretrained` adds it to a captioner's loads;
    the pretrained models loaded without :class:`LoadOptions` call it themselves: a ClipCap's frozen dual encoder
    (:func:`finecap.models.vision.load_dual_encoder`), the retriever
    (:meth:`finecap.models.retriever.Retriever.from_pretrained`), ``finecap eval``'s perplexity language model."""
    device = _LOAD_DEVICE.get()
    return {"device_map": {"": device}} if device is not None and device.type == "cuda" else {}


@contextlib.contextmanager
def loading_onto(device: torch.device | str | None) -> Iterator[None]:
    """Within the block, every ``from_pretrained`` of a captioner (:meth:`LoadOptions.pretrained`), and of the other
    pretrained models that load with :func:`placement` (the retriever), reads its weights straight onto
    :func:`load_device` of ``device`` (``None``, or a non-CUDA device: the CPU, as outside the block; ``meta``: none
    read, the model's parameters left on the meta device, :meth:`LoadOptions.load`; torch's warning that loading a
    state dict into them, e.g. a checkpoint's LoRA adapters, does nothing is silenced).
    Models built here with random weights are not affected (they are small, or built on the CPU and moved)."""
    placed = None if device is None else (load_device(device) or torch.device(device))  # the CPU: said, not None
    token = _LOAD_DEVICE.set(placed)
    try:
        with warnings.catch_warnings():
            if placed is not None and placed.type == "meta":  # a checkpoint's adapters loaded into meta layers
                warnings.filterwarnings("ignore", message=r".*copying from a non-meta parameter.*meta parameter")
            yield
    finally:
        _LOAD_DEVICE.reset(token)


def _restore_conv1d(model: nn.Module) -> None:
    """transformers dequantizes every 4/8-bit layer into an ``nn.Linear``, also those that were GPT-2's ``Conv1D``
    (weights stored in x out): put those back as ``Conv1D`` (the architecture's own, found on an empty copy of the
    model on the meta device), so that the model saves as its architecture loads."""
    from transformers.pytorch_utils import Conv1D

    linear = {n for n, m in model.named_modules() if type(m) is nn.Linear}
    if not linear:
        return
    with torch.device("meta"):
        reference = type(model)(model.config)
    for name, module in reference.named_modules():
        if not (isinstance(module, Conv1D) and name in linear):
            continue
        old = model.get_submodule(name)
        conv = Conv1D(old.out_features, old.in_features)  # Conv1D(nf, nx): weight (nx, nf)
        conv.weight = nn.Parameter(old.weight.detach().t().contiguous(), requires_grad=old.weight.requires_grad)
        if old.bias is not None:
            conv.bias = old.bias
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, conv)


def _quantized_in(model: nn.Module, dtype: torch.dtype) -> None:
    """A model loaded from a checkpoint stored quantized, kept quantized, in ``dtype`` (``model.dtype``): its
    floating-point parameters cast to it and its 4-bit layers computing in it, as a base quantized as it loads is.
    transformers 5.x leaves such a load half in the dtype the checkpoint was saved in (the weights of the layers it
    does not quantize: embeddings, norms, a VLM's projector and vision tower) and half in ``dtype`` (their biases),
    with the 4-bit layers computing in the saved ``bnb_4bit_compute_dtype``: a bfloat16 QLoRA run's checkpoint then
    fails in its first forward, in bfloat16 as in float32 (tests/models/test_memory.py)."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    for m in model.modules():
        if hasattr(m, "compute_type_is_set") and hasattr(m, "compute_dtype"):  # bitsandbytes' Linear4bit
            m.compute_dtype, m.compute_type_is_set = dtype, True
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    if getattr(config, "load_in_4bit", False):  # what a save records
        config.bnb_4bit_compute_dtype = dtype


def _reversible_conversions(model: nn.Module) -> None:
    """Drop the weight conversions transformers recorded at load that it cannot undo when saving: loading a checkpoint
    stored quantized records bitsandbytes' deserialization, and ``save_pretrained`` of that model (still quantized,
    or dequantized) then fails (transformers 5.x). The state dict a backbone saves is already in the stored form
    (quantization constants included), so only the renamings need undoing."""
    conversions = getattr(model, "_weight_conversions", None)
    if not conversions:
        return
    keep = []
    for conversion in conversions:
        try:
            conversion.reverse_transform()
        except NotImplementedError:
            continue
        keep.append(conversion)
    model._weight_conversions = keep


def set_attn_implementation(model: nn.Module, implementation: str) -> None:
    """Set the attention implementation of a ``transformers`` model built from a config (``set_attn_implementation``
    where transformers has it, else the config's attribute)."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter(implementation)
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = implementation


FLASH_ATTENTION = "flash_attention_2"
FLASH_ATTN_INSTALL = "pip install flash-attn --no-build-isolation"


def check_attention(implementation: str) -> None:
    """A one-line ``ValueError`` when ``model.attn_implementation`` names a kernel this machine cannot run:
    ``flash_attention_2`` needs the flash-attn package (2.3.3 or later) and a CUDA GPU (transformers'
    ``is_flash_attn_2_available``). The message says what is installed, how to install it and the other values.
    Checked when the load options are made (:class:`LoadOptions`), before any model is loaded or built: transformers
    would raise an ``ImportError`` from deep inside ``from_pretrained`` or ``set_attn_implementation``, after the
    world, its encoder and the data were made."""
    if implementation != FLASH_ATTENTION:
        return
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        return
    try:
        installed = f"flash-attn {importlib.metadata.version('flash-attn')} is installed"
    except importlib.metadata.PackageNotFoundError:
        installed = "flash-attn is not installed"
    gpu = "a CUDA GPU is available" if torch.cuda.is_available() else "no CUDA GPU is available"
    others = ", ".join(v for v in get_args(AttnImplementation) if v != FLASH_ATTENTION)
    raise ValueError(
        f"model.attn_implementation={FLASH_ATTENTION} needs the flash-attn package (2.3.3 or later) and a CUDA GPU; "
        f"here {installed} and {gpu}: on a CUDA machine run `{FLASH_ATTN_INSTALL}`, or set "
        f"model.attn_implementation to one of {others} (auto: transformers' default)"
    )


def require_bitsandbytes(kind: str) -> None:
    """A clear one-line error when ``model.quantization`` is set without bitsandbytes installed."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise MissingExtra(f"model.quantization={kind} needs bitsandbytes: {QUANT_EXTRA}") from None


def bnb_config(kind: str, compute_dtype: torch.dtype | None, skip: Sequence[str] | None = None) -> Any:
    """``transformers.BitsAndBytesConfig`` of ``model.quantization``: ``4bit`` = QLoRA's NF4 with double quantization,
    computing in ``compute_dtype`` (float32 when ``None``); ``8bit`` = LLM.int8(). ``skip``: modules kept
    unquantised."""
    require_bitsandbytes(kind)
    from transformers import BitsAndBytesConfig

    keep = list(skip) if skip is not None else None
    if kind == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=compute_dtype or torch.float32,
                                  llm_int8_skip_modules=keep)  # fmt: skip
    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=keep)
    raise ValueError(f"model.quantization={kind!r}; valid: {', '.join(get_args(Quantization))}")


def quantization_of(module: nn.Module) -> str | None:
    """``"4bit"`` / ``"8bit"`` when ``module`` holds bitsandbytes-quantized weights, else ``None``."""
    for p in module.parameters():
        kind = _quantized(p)
        if kind is not None:
            return kind
    return None


def _quantized(p: torch.Tensor) -> str | None:
    return strict.QUANTIZED_PARAMS.get(type(p).__name__)


def keep_cpu_layout(model: nn.Module) -> None:
    """Keep bitsandbytes' 4-bit layers in their training layout on the CPU. bitsandbytes 0.50 repacks a 4-bit weight
    in place for its CPU inference kernel at the first forward in eval mode without grad (with avx512-bf16), after
    which forwards in training mode give the LoRA adapters over that layer no gradient (and layers narrower than its
    block of 64 fail); tested in tests/models/test_memory.py. No effect on CUDA."""
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False


# --------------------------------------------------------------------------------------------------------------------
# Dtypes of the parts
# --------------------------------------------------------------------------------------------------------------------


def apply_dtypes(model: nn.Module, weights: str, trainable: str) -> None:
    """Cast ``model``'s floating-point parameters in place: those that learn (``requires_grad``) to ``trainable``
    (``same``: ``weights``), the frozen ones to ``weights`` (``auto``: left as loaded); quantized weights are never
    touched. Parameters keep their identity (ties and an optimizer built afterwards see the same tensors). Then the
    dtype bridges are (re)installed (:func:`install_bridges`)."""
    _check(weights, WeightsDtype, "model.dtype")
    _check(trainable, TrainableDtype, "model.trainable_dtype")
    low = DTYPES.get(weights)
    learn = low if trainable == "same" else DTYPES[trainable]
    for p in model.parameters():
        if not p.is_floating_point():
            continue
        target = learn if p.requires_grad else low
        if target is not None and p.dtype != target:
            p.data = p.data.to(target)
    install_bridges(model)


def _float_dtypes(module: nn.Module) -> set[torch.dtype]:
    """Dtypes of a module's floating-point parameters, LoRA adapters left out (peft casts a layer's input to its
    adapters' dtype and the result back itself)."""
    return {p.dtype for n, p in module.named_parameters() if p.is_floating_point() and "lora_" not in n}


def _islands(module: nn.Module, out: list[tuple[nn.Module, torch.dtype]]) -> None:
    """The largest submodules of one dtype below ``module`` (which mixes dtypes), in call order of discovery."""
    for child in module.children():
        dtypes = _float_dtypes(child)
        if len(dtypes) > 1:
            _islands(child, out)
        elif dtypes:
            _called(child, next(iter(dtypes)), out)


def _called(module: nn.Module, dtype: torch.dtype, out: list[tuple[nn.Module, torch.dtype]]) -> None:
    """``module``, or the members of a container that is never called itself (``ModuleList``, ``ModuleDict``)."""
    if isinstance(module, nn.ModuleList | nn.ModuleDict):
        for child in module.children():
            if _float_dtypes(child):
                _called(child, dtype, out)
    else:
        out.append((module, dtype))


def _cast_to(dtype: torch.dtype):
    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    return hook


def install_bridges(model: nn.Module) -> int:
    """Where parts of different dtypes meet (a float32 projector between a bfloat16 vision tower and language model,
    a trained float32 tower before a frozen bfloat16 projector), the first module of each one-dtype part casts the
    floating-point tensors it is called with to its own dtype: what that part reads in a model of one dtype. Nothing
    is installed in a model of one dtype. Replaces the bridges of an earlier call; returns how many there are."""
    for handle in getattr(model, _BRIDGES, ()):
        handle.remove()
    islands: list[tuple[nn.Module, torch.dtype]] = []
    if len(_float_dtypes(model)) > 1:
        _islands(model, islands)
    handles = [m.register_forward_pre_hook(_cast_to(dtype), with_kwargs=True) for m, dtype in islands]
    setattr(model, _BRIDGES, handles)
    return len(handles)


def part_dtypes(model: nn.Module) -> dict[str, dict[str, str]]:
    """The resolved dtypes of each part and of the rest (what ``captioner.json`` records under ``"dtypes"`` and a run
    logs at its start): ``{"lm": {"trainable": "float32", "frozen": "bfloat16", "quantized": "4bit"}, ...}``, each
    key only where the part has such parameters (several dtypes joined by ``+``)."""
    order = ("trainable", "frozen", "quantized")
    return {part: {role: "+".join(sorted(roles[role])) for role in order if role in roles}
            for part, roles in parameter_counts(model).items()}  # fmt: skip


def _parts(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Each parameter once, with the part holding it (``lm``, ``encoder``, ... or ``rest``), as :func:`part_dtypes`
    groups them."""
    seen: set[int] = set()
    for name, module in [(part, model.lora_module(part)) for part in PARTS] + [("rest", model)]:
        if module is None:
            continue
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p


def parameter_counts(model: nn.Module) -> dict[str, dict[str, dict[str, int]]]:
    """Parameters by part, role (``trainable``, ``frozen``, ``quantized``) and dtype (``4bit`` / ``8bit`` for
    quantized ones): ``{"lm": {"trainable": {"float32": 124439808}}, ...}`` (``finecap train --dry-run``)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for part, p in _parts(model):
        quantized = _quantized(p)
        if not quantized and not p.is_floating_point():
            continue
        role = "quantized" if quantized else "trainable" if p.requires_grad else "frozen"
        dtype = quantized or str(p.dtype).removeprefix("torch.")
        roles = out.setdefault(part, {}).setdefault(role, {})
        roles[dtype] = roles.get(dtype, 0) + weight_count(p)
    return out


def weight_count(p: torch.Tensor) -> int:
    """The weights a parameter stands for (a bitsandbytes 4-bit parameter stores two per byte)."""
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    return int(torch.Size(shape).numel()) if shape is not None else p.numel()


def quantization_constants(p: torch.Tensor) -> list[torch.Tensor]:
    """The tensors bitsandbytes keeps beside a quantized weight's own data: a 4-bit weight's ``quant_state`` (the
    absmax of each block of 64 weights, uint8 under double quantization, with the nested state's float32 absmax per
    256 of those, its offset and both code books: 16 and 256 float32 values, one of each per layer) and an 8-bit
    weight's ``SCB`` (one float32 scale per output row); ``[]`` for any other parameter."""
    out: list[torch.Tensor] = []
    states = [getattr(p, "quant_state", None)]
    while states:
        state = states.pop()
        if state is None:
            continue
        for value in vars(state).values():
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif type(value).__name__ == "QuantState":  # double quantization: the absmax's own state
                states.append(value)
    scb = getattr(p, "SCB", None) if _quantized(p) == "8bit" else None
    return out + ([scb] if isinstance(scb, torch.Tensor) else [])


def training_memory(model: nn.Module) -> dict[str, int]:
    """Bytes of what training holds besides activations, per process: ``weights`` (every parameter as stored, a
    quantized one with its block scales: :func:`quantization_constants`, each tensor once), ``gradients`` (one per
    trainable parameter, in its dtype) and ``optimizer`` (AdamW's two moments per trainable parameter, in its dtype,
    as ``torch.optim.AdamW`` keeps them), and their ``total``. Under FSDP2 a parameter is a ``DTensor`` whose
    ``numel`` is the whole tensor's: what this process holds is its local shard, counted here (a model sharded over N
    processes was counted N times over); activations depend on the batch and the sequence length, and ``--dry-run``
    measures them with one step."""

    def local_bytes(p: torch.Tensor) -> int:
        local = p.to_local() if hasattr(p, "to_local") else p  # a DTensor: this process's shard
        return local.numel() * local.element_size()

    constants = {id(t): t for _, p in _parts(model) for t in quantization_constants(p)}
    weights = sum(local_bytes(p) for _, p in _parts(model)) + sum(map(local_bytes, constants.values()))
    trainable = sum(local_bytes(p) for _, p in _parts(model) if p.requires_grad)
    out = {"weights": weights, "gradients": trainable, "optimizer": 2 * trainable}
    return {**out, "total": sum(out.values())}


def describe(dtypes: dict[str, dict[str, str]]) -> str:
    """One line of :func:`part_dtypes`: ``lm: trainable float32, frozen bfloat16, quantized 4bit; rest: ...``."""
    return "; ".join(f"{part}: " + ", ".join(f"{k} {v}" for k, v in entry.items()) for part, entry in dtypes.items())


def save_float32_masters(model: nn.Module, out: str | Path, state: dict[str, torch.Tensor] | None = None) -> int:
    """When ``model`` holds 16-bit weights, write the float32 values of its trained weights (LoRA adapters aside:
    peft saves those in their own dtype) to ``<out>/float32_weights/model.safetensors`` (:data:`MASTERS`) under the
    captioner's parameter names, from ``state`` (default: the model's own). A backbone's ``save`` calls it; returns
    how many it wrote."""
    params = dict(model.named_parameters())
    if not any(p.is_floating_point() and p.dtype in HALF for p in params.values()):
        return 0
    names = [n for n, p in params.items() if p.requires_grad and p.dtype == torch.float32 and "lora_" not in n]
    if not names:
        return 0
    state = model.state_dict() if state is None else state
    (Path(out) / MASTERS).parent.mkdir(exist_ok=True)
    save_file({n: state[n].detach().float().contiguous().cpu() for n in names}, str(Path(out) / MASTERS))
    return len(names)


def load_float32_masters(model: nn.Module, path: str | Path) -> int:
    """Put back the float32 trained weights a checkpoint folder ``path`` saved (:func:`save_float32_masters`) into
    ``model`` (just loaded from it, perhaps in a 16-bit ``model.dtype``); returns how many (0 without the file). The
    file must name parameters of the model, of their shapes, finite (:func:`finecap.models.strict.fit_state`)."""
    file = next((f for f in (Path(path) / MASTERS, Path(path) / OLD_MASTERS) if f.exists()), None)
    if file is None:
        return 0
    params = dict(model.named_parameters())
    tensors = strict.read_tensors(file)
    strict.fit_state(file, params, tensors, partial=True)
    for name, tensor in tensors.items():
        params[name].data = tensor.to(params[name].device)
    return len(tensors)


# --------------------------------------------------------------------------------------------------------------------
# Gradient checkpointing
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _Checkpointing:
    layers: list[nn.Module]
    handles: list[Any]


def _enable_layers(module: nn.Module) -> list[nn.Module]:
    """Give the ``transformers`` layers of ``module`` (a part, unwrapped from peft) a non-reentrant checkpoint
    function and return the modules whose ``gradient_checkpointing`` flag that switched on (left off here)."""
    from transformers import PreTrainedModel

    if not isinstance(module, PreTrainedModel):
        return []
    kwargs = {"use_reentrant": False}
    if getattr(module, "supports_gradient_checkpointing", False):
        if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5
            module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:  # pragma: no cover - older transformers
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        module.disable_input_require_grads()  # not needed without reentrant checkpoints
    elif any(hasattr(m, "gradient_checkpointing") for m in module.modules()):
        # e.g. BLIP's text decoder: checkpointing layers, a class that does not declare them
        module._set_gradient_checkpointing(
            enable=True, gradient_checkpointing_func=functools.partial(checkpoint, **kwargs)
        )
    layers = [m for m in module.modules() if getattr(m, "gradient_checkpointing", None) is True]
    for m in layers:
        m.gradient_checkpointing = False
    return layers


def enable_gradient_checkpointing(model: nn.Module) -> dict[str, int]:
    """Non-reentrant gradient checkpointing of every part's layers, on only while ``model``'s ``forward`` runs with
    gradients enabled (a forward pre-hook switches it on, a forward hook that runs even on an exception off), so
    decoding with the KV cache never runs checkpointed. Layers of frozen parts are in eval mode and
    ``transformers`` checkpoints only layers in training mode. Returns the number of checkpointed modules per part
    (0: a part without checkpointing layers, e.g. a ConvNeXt tower, or a frozen part: its layers stay in eval mode,
    :meth:`~finecap.models.base.CaptionerBase.frozen_modules`)."""
    disable_gradient_checkpointing(model)
    counts: dict[str, int] = {}
    layers: list[nn.Module] = []
    frozen = {id(m) for f in getattr(model, "frozen_modules", list)() for m in f.modules()}
    for part in PARTS:
        module = model.lora_module(part)
        if module is None:
            continue
        found = _enable_layers(module.get_base_model() if is_peft(module) else module)
        counts[part] = sum(id(m) not in frozen for m in found)
        layers += found

    def switch_on(_module: nn.Module, _args: Any) -> None:
        if torch.is_grad_enabled():
            for m in layers:
                m.gradient_checkpointing = True

    def switch_off(_module: nn.Module, _args: Any, _out: Any) -> None:
        for m in layers:
            m.gradient_checkpointing = False

    handles = [model.register_forward_pre_hook(switch_on), model.register_forward_hook(switch_off, always_call=True)]
    setattr(model, _CHECKPOINTING, _Checkpointing(layers, handles))
    return counts


def disable_gradient_checkpointing(model: nn.Module) -> None:
    """Undo :func:`enable_gradient_checkpointing` (nothing when it is off)."""
    state = getattr(model, _CHECKPOINTING, None)
    if state is None:
        return
    for handle in state.handles:
        handle.remove()
    for m in state.layers:
        m.gradient_checkpointing = False
    setattr(model, _CHECKPOINTING, None)


def gradient_checkpointing(model: nn.Module) -> bool:
    """Whether :func:`enable_gradient_checkpointing` is in effect on ``model``."""
    return getattr(model, _CHECKPOINTING, None) is not None


@contextlib.contextmanager
def checkpointing_with_cache(model: nn.Module, by_hand: bool = True) -> Iterator[None]:
    """Inside the block, ``model``'s checkpointed layers (:func:`enable_gradient_checkpointing`, those switched on:
    inside the captioner's ``forward`` with gradients enabled) are checkpointed here, non-reentrant, with the KV cache
    they are called with handed through, instead of by ``transformers``; everything is put back on leaving the block,
    even on an exception. Nothing when checkpointing is off.

    Hand-rolled because ``transformers`` drops the cache of a checkpointed layer in training (its
    ``GradientCheckpointingLayer`` sets ``use_cache=False`` and the cache to ``None``; the model's forward turns
    ``use_cache`` off as well): a plain ``DynamicCache`` would be updated a second time when the backward pass
    recomputes the layer. The cache passed in the block must be recomputation-safe: the shared prompt's
    :class:`finecap.models.kvcache.PromptCache` (docs/memory.md#the-prompt-shared-under-checkpointing). A layer in
    eval mode, or called without gradients, runs as is (``transformers``' own rule). Keys and values leaving a
    checkpointed layer through the cache keep their graph (non-reentrant checkpoints recompute the layer when the
    backward pass reaches them), so the gradient of the captions' loss reaches the prompt's layers through them.
    ``by_hand=False``: the layers run without checkpointing in the block (for a cache that is not
    recomputation-safe), as in the forward of a model without it."""
    state = getattr(model, _CHECKPOINTING, None)
    on = [] if state is None else [m for m in state.layers if m.gradient_checkpointing]
    layers = []
    if by_hand and on:
        from transformers.modeling_layers import GradientCheckpointingLayer  # transformers >= 4.52

        layers = [m for m in on if isinstance(m, GradientCheckpointingLayer)]
    try:
        for m in on:
            m.gradient_checkpointing = False
        for m in layers:
            m.forward = functools.partial(_checkpointed, m, m.forward)  # an instance attribute over the class's
        yield
    finally:
        for m in layers:
            m.__dict__.pop("forward", None)
        for m in on:
            m.gradient_checkpointing = True


def _checkpointed(layer: nn.Module, forward: Any, *args: Any, **kwargs: Any) -> Any:
    """``forward(*args, **kwargs)`` (a layer's own, ``transformers``' checkpointing switched off) under a
    non-reentrant checkpoint, when ``layer`` trains and gradients are enabled."""
    if layer.training and torch.is_grad_enabled():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


# --------------------------------------------------------------------------------------------------------------------
# The training model
# --------------------------------------------------------------------------------------------------------------------


def check_quantized_training(model: nn.Module) -> None:
    """A quantized part cannot learn its base weights: it trains through LoRA adapters or stays frozen."""
    for part in PARTS:
        module = model.lora_module(part)
        kind = quantization_of(module) if module is not None else None
        trains = model.train_lm if part == "lm" else model.train_encoder
        if kind is not None and trains and not is_peft(module):
            key = "model.train_lm" if part == "lm" else "model.train_encoder"
            raise ValueError(
                f"model.quantization={kind}: the {part}'s base weights are quantized and cannot be trained fully; "
                f"train it through adapters (lora.{part}=true: QLoRA) or freeze it ({key}=false)"
            )


def prepare_training(model: nn.Module, cfg: Config) -> nn.Module:
    """The last step of building the training model, after :func:`finecap.models.lora.configure_training`: check
    that quantized parts train through adapters, cast what learns to ``model.trainable_dtype`` and what is frozen to
    ``model.dtype`` (with the dtype bridges), switch ``train.gradient_checkpointing``, and log the resolved dtype of
    each part. Returns ``model``."""
    check_quantized_training(model)
    apply_dtypes(model, cfg.model.dtype, cfg.model.trainable_dtype)
    if cfg.train.gradient_checkpointing:
        counts = enable_gradient_checkpointing(model)
        log.info("gradient checkpointing (non-reentrant): %s",
                 ", ".join(f"{part} {n} modules" for part, n in counts.items()))  # fmt: skip
    else:
        disable_gradient_checkpointing(model)
    log.info("model dtypes: %s", describe(part_dtypes(model)))
    return model
