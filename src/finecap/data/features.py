"""The image-feature cache: features of a list of images under an encoder, computed once and stored as safetensors.

One cache serves every frozen encoder of the package: the captioner's vision encoder (:func:`model_features`, the
frozen-feature training path and :func:`finecap.caption.generate_captions`) and the CLIP retriever
(:meth:`finecap.models.retriever.Retriever.image_features`, for self-retrieval, CLIPScore, TrueMatch bags and the
retrieval reward). A file is keyed by three things, so a different encoder or a changed data set never reuses it:

- the **model fingerprint** (:func:`fingerprint_module`): every tensor of the encoder's state dict (name, dtype,
  shape and bytes) plus its preprocessing settings. Hashing the weights themselves, rather than a checkpoint name,
  covers every way an encoder can be obtained (a Hub name, a local folder, the cached world encoder, a captioner
  checkpoint) and an encoder fine-tuned in place. It costs about a second per 500 MB of weights per call;
- the **data fingerprint** (:func:`fingerprint_data`): the ordered images (image id, resolved path, file size,
  modification time and change time: an image rewritten in place whose times were set back, ``os.utime``, still
  changes its change time, which no call sets; an image embedded in a memory-mapped Hugging Face data set: the
  Arrow files' paths, sizes and modification times and its row, so that its bytes are not read for the key, a file
  written before those files last changed being computed again (:func:`data_changed_ns`); other embedded bytes:
  their SHA-256). The data set file itself is not hashed: captions do not change image features,
  and any change of which images there are, their order or their files changes the fingerprint;
- the **split**: a readable label (``train``, ``test``, ...; the retriever uses the records' common split, or
  ``mixed``) that starts the file name.

Text embeddings of the retriever (:meth:`finecap.models.retriever.Retriever.text_embeddings`; CLIPScore's references,
which are the same for every system scored on a data set) use the same files with the split ``texts`` and, as the
data fingerprint, the SHA-256 of the ordered texts (:func:`text_cache_file`).

File: ``<cache_dir>/features/<split>-<hash16>.safetensors`` with one tensor ``features (N, D)`` (float32, row ``i``
belongs to record ``i``) and the metadata ``encoder``, ``data``, ``split``, ``n``, checked on load: a file whose
metadata disagree, or that cannot be read (truncated, foreign), is recomputed, never trusted. Files are written
atomically (:func:`finecap.utils.files.atomic_write_bytes`), and a missing file is computed under a lock of its own
(:func:`making`, ``<cache_dir>/features/.<file name>.lock``): two commands sharing a cache that need the same file
compute it once, the second waiting and then reading the first's file; the one holding the lock first removes the
temporary files of that file that a writer killed before its rename left (``.<file name>.<random>.tmp``).

Building a file: images are decoded and preprocessed in DataLoader workers (``data.num_workers``,
:mod:`finecap.data.loading`), the encoder runs in the calling process. Under several processes (``accelerate
launch``) every process builds its contiguous part and the parts are gathered (:func:`cached_features`,
:class:`Ranks`): N processes build a file about N times faster than one, and no file is half-written by anyone.

Example::

    >>> import torch
    >>> a = fingerprint_module(torch.nn.Linear(2, 2))
    >>> len(a)
    64
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open
from safetensors.torch import save as save_safetensors
from tqdm.auto import tqdm

from finecap.data.images import DEFAULT_LIMITS, RGB_CONVERSION, ImageLimits
from finecap.data.loading import LoaderSettings, Preprocess, RecordImages, chunks, encoder_draft
from finecap.data.samplers import process_slice
from finecap.home import cache_dir as resolve_cache_dir
from finecap.locks import waiting_lock
from finecap.utils.files import atomic_write_bytes, remove_temporaries_of
from finecap.utils.system import progress_enabled

CACHE_SUBDIR = "features"
"""Folder under the cache directory (``run.cache_dir``) holding the feature files."""

log = logging.getLogger(__name__)


def state_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors ``module.state_dict()`` holds (parameters and persistent buffers, by the same dotted names, a
    shared module under each of its names), read from the modules themselves rather than through ``state_dict()``:
    a module sharded with FSDP2 registers a state-dict hook that reshards it, which inside
    :func:`finecap.models.sharding.decoding` (where training's validators run) would take away the full parameters
    the block holds and leave the next forward to gather them again, on whichever processes run it (a deadlock)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, p in m._parameters.items():
            if p is not None:
                out[dot + name] = p
        for name, b in m._buffers.items():
            if b is not None and name not in m._non_persistent_buffers_set:
                out[dot + name] = b
    return out


def fingerprint_module(module: torch.nn.Module, extra: dict[str, Any] | None = None) -> str:
    """SHA-256 of a module's state tensors (:func:`state_tensors`: names, dtypes, shapes, bytes) and of ``extra``
    (JSON, e.g. preprocessing). A sharded tensor (an FSDP2 ``DTensor``, outside a decoding block) is hashed whole,
    gathered from every process: all of them must call it then, in the same order."""
    h = hashlib.sha256()
    h.update(json.dumps(extra or {}, sort_keys=True, default=str).encode())
    for name, tensor in sorted(state_tensors(module).items()):
        if hasattr(tensor, "full_tensor"):  # torch.distributed.tensor.DTensor
            tensor = tensor.full_tensor()
        # a copy, hashed through the buffer protocol (no second copy): numpy() marks the storage it shares
        # non-resizable, and FSDP2 frees a gathered parameter by resizing its storage to 0
        t = tensor.detach().to("cpu", copy=True).contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def image_encoder_key(module: torch.nn.Module, processor: Any, draft: int | None) -> str:
    """What an image-feature cache is keyed by (the captioner's frozen features, the retriever's image embeddings):
    :func:`fingerprint_module` of ``module`` with its class, the image ``processor``'s settings, how images become
    RGB (:data:`~finecap.data.images.RGB_CONVERSION`) and the JPEG ``draft`` size when there is one."""
    extra = {"class": type(module).__name__, "processor": processor.to_dict() if processor is not None else None,
             "rgb": RGB_CONVERSION}  # fmt: skip
    if draft is not None:
        extra["jpeg_draft"] = draft
    return fingerprint_module(module, extra)


def fingerprint_data(records: Sequence[Any]) -> str:
    """SHA-256 of the ordered images of ``records`` (objects with ``image_id`` and ``path``): id, resolved path, file
    size, modification time and change time (``st_ctime_ns``: an in-place edit moves it whatever ``os.utime`` sets
    back; a ``chmod`` moves it too, and costs a recompute, never a stale feature). A missing image raises
    ``FileNotFoundError`` naming its record."""
    h = hashlib.sha256()
    for r in records:
        path = Path(r.path)
        ref = getattr(r, "image_ref", None)
        stored = ref.key() if ref is not None else None
        if stored is not None:  # embedded in a memory-mapped data set: its files and row, as a file's stat
            h.update(json.dumps([str(r.image_id), str(path), stored]).encode() + b"\n")
            continue
        data = r.encoded_image() if hasattr(r, "encoded_image") else getattr(r, "image_bytes", None)
        if data is not None:  # embedded bytes with nothing else identifying them: hash them
            digest = hashlib.sha256(data).hexdigest()
            h.update(json.dumps([str(r.image_id), str(path), digest]).encode() + b"\n")
            continue
        try:
            st = path.stat()
        except OSError:
            raise FileNotFoundError(f"image of record {r.image_id!r} not found: {path}") from None
        row = [str(r.image_id), str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        h.update(json.dumps(row).encode() + b"\n")
    return h.hexdigest()


def data_changed_ns(records: Sequence[Any]) -> int | None:
    """The latest change time (``st_ctime_ns``) of the files that key ``records``' embedded images without one
    (:meth:`finecap.data.formats.hf.ArrowImage.changed_ns`: a data set's Arrow files), or ``None`` when there are
    none. A cache file keyed by them that was written before it is recomputed (:func:`cached_features`,
    :func:`cached_tensor`): the files were replaced or rewritten since, keeping their sizes and modification times
    (``cp -p``, ``rsync -t``), or changed otherwise (a ``chmod``: a recompute, never a stale feature). The key itself
    keeps no change time: it is the key of the features users have cached, which they would all compute again."""
    latest = None
    for r in records:
        changed = getattr(getattr(r, "image_ref", None), "changed_ns", None)
        when = changed() if changed is not None else None
        if when is not None and (latest is None or when > latest):
            latest = when
    return latest


def cache_file(cache_dir: str | Path, encoder_key: str, data_key: str, split: str) -> Path:
    """Where the features of (encoder, data, split) are stored."""
    key = hashlib.sha256(f"{encoder_key}|{data_key}|{split}".encode()).hexdigest()[:16]
    return Path(cache_dir) / CACHE_SUBDIR / f"{split}-{key}.safetensors"


def compute_features(
    records: Sequence[Any],
    encode: Callable[[Any], torch.Tensor],
    *,
    batch_size: int = 64,
    desc: str = "features",
    progress: bool = True,
    preprocess: Callable[[list], Any] | None = None,
    loader: LoaderSettings | None = None,
    draft: int | None = None,
    limits: ImageLimits = DEFAULT_LIMITS,
) -> torch.Tensor:
    """``encode(batch) -> (b, D)`` over all records in batches, without gradient; returns ``(N, D)`` float32 on the
    CPU (``(0, 0)`` for no records). A batch is ``preprocess(images)`` (e.g. pixel values), or the list of PIL
    images without ``preprocess``; images are decoded (``draft`` and the image budget ``limits``:
    :func:`finecap.data.images.load_image`) and preprocessed in the DataLoader workers of ``loader``
    (:mod:`finecap.data.loading`; default: in this process)."""
    if not records:
        return torch.zeros(0, 0)
    settings = loader or LoaderSettings()
    batches = chunks(range(len(records)), batch_size)
    out = []
    with torch.no_grad():
        data = settings.loader(RecordImages(records, draft, limits), batches, Preprocess(preprocess))
        for batch in tqdm(data, total=len(batches), desc=desc, disable=not progress_enabled(progress), unit="batch"):
            out.append(encode(batch).detach().float().cpu())  # (b, D)
    return torch.cat(out)  # (N, D)


@dataclass(frozen=True)
class Ranks:
    """The processes that build a cache file together (:func:`cached_features`): this one is ``rank`` of ``world``;
    ``all_gather(obj)`` is a collective returning every process's ``obj`` in rank order; ``writes``: this process
    writes the file when it lacks it (the main process of each machine: a cache folder may be local to a machine).
    The default is a single process. :meth:`of` takes them from accelerate."""

    rank: int = 0
    world: int = 1
    all_gather: Callable[[Any], list[Any]] | None = None
    writes: bool = True

    @classmethod
    def of(cls, state: Any) -> Ranks:
        """The processes of an ``accelerate`` ``Accelerator`` or ``PartialState`` (``None``: this one alone)."""
        if state is None or state.num_processes == 1:
            return cls()
        from accelerate.utils import gather_object

        return cls(state.process_index, state.num_processes, lambda obj: gather_object([obj]),
                   writes=state.is_local_main_process)  # fmt: skip


def _load(path: Path, wanted: dict[str, str], written_after: int | None = None) -> torch.Tensor | None:
    """The tensor of the cache file ``path`` when its metadata hold ``wanted`` and it was written after
    ``written_after`` (a change time of the data, :func:`data_changed_ns`; within the same tick of the clock is not
    after), else ``None``."""
    if not path.exists():
        return None
    try:
        if written_after is not None and path.stat().st_mtime_ns <= written_after:
            return None
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if any(meta.get(k) != v for k, v in wanted.items()):
            return None
        return load_file(str(path))["features"]
    except (OSError, SafetensorError, KeyError):  # truncated or foreign file: recompute, never trust it
        return None


def lock_file(path: Path) -> Path:
    """The lock under which the cache file ``path`` is made (:func:`making`): ``.<name>.lock`` beside it."""
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def making(path: Path) -> Iterator[None]:
    """Hold the cache file ``path``'s own lock (:func:`lock_file`, :func:`finecap.locks.waiting_lock`: released when
    its holder dies, however it dies) for the block that computes and writes it, waiting while another process holds
    it; the caller then reads ``path`` again, which the other may have written meanwhile. With the lock held, the
    temporary files of ``path`` left by a writer killed before its rename are removed
    (:func:`finecap.utils.files.remove_temporaries_of`); every other file in the folder stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    waiting = f"features: another process is computing {path}; waiting for it"
    with waiting_lock(lock_file(path), waiting=waiting, log=log.info):
        remove_temporaries_of(path.parent, lambda name: name == path.name)
        yield


def cached_tensor(path: Path, meta: dict[str, str], compute: Callable[[], torch.Tensor],
                  valid: Callable[[torch.Tensor], bool] | None = None,
                  written_after: int | None = None) -> torch.Tensor:  # fmt: skip
    """The tensor stored in the safetensors file ``path`` when its metadata equal ``meta`` (and ``valid`` accepts
    it, when given, and it was written after ``written_after``: :func:`data_changed_ns`); otherwise ``compute()``,
    written there atomically (with ``meta``) and returned, under the file's lock (:func:`making`: a process that
    needs the same file meanwhile waits, then reads it). Unreadable, mismatching or invalid files are recomputed."""

    def usable(stored: torch.Tensor | None) -> bool:
        return stored is not None and (valid is None or valid(stored))

    stored = _load(path, meta, written_after)
    if usable(stored):
        return stored
    with making(path):
        stored = _load(path, meta, written_after)  # written by another process while this one waited
        if usable(stored):
            return stored
        tensor = compute()
        atomic_write_bytes(path, save_safetensors({"features": tensor.contiguous()}, metadata=meta))
    return tensor


def cached_features(
    records: Sequence[Any],
    encode: Callable[[Any], torch.Tensor],
    *,
    cache_dir: str | Path,
    encoder_key: str,
    split: str,
    data_key: str | None = None,
    batch_size: int = 64,
    progress: bool = True,
    preprocess: Callable[[list], Any] | None = None,
    loader: LoaderSettings | None = None,
    draft: int | None = None,
    limits: ImageLimits = DEFAULT_LIMITS,
    ranks: Ranks | None = None,
) -> torch.Tensor:
    """Features ``(N, D)`` of ``records``: loaded from the cache when its key matches, else computed with ``encode``
    (:func:`compute_features`, with ``preprocess``, ``loader``, ``draft`` and ``limits``) and stored. ``data_key``
    defaults to :func:`fingerprint_data` of ``records``; ``draft`` must be part of ``encoder_key`` (it changes the
    pixels); ``limits`` need not be (it refuses images, and changes no pixel of those it admits).

    With several ``ranks`` every process calls this with the same arguments (a collective): they agree whether every
    one of them can read the file; if any cannot, each computes its contiguous part of the records
    (:func:`finecap.data.samplers.process_slice`), the parts are gathered on every process in rank order, the
    processes that lack the file and ``writes`` write it (atomically: a process killed meanwhile leaves no file, and
    the next run computes it again), and all return the whole tensor. A missing file is computed under its lock
    (:func:`making`), taken by the first process (``rank`` 0) alone, so that another command needing the same file
    waits for this one's and reads it (the other processes of this one wait in the collective meanwhile). Batches
    are those of one process over each part, so a value may differ from a one-process build in the last bits of
    float32 (batched matrix products); ``tests/data/test_features.py`` checks the sharded build against the single
    one."""
    ranks = ranks or Ranks()
    data_key = fingerprint_data(records) if data_key is None else data_key
    path = cache_file(cache_dir, encoder_key, data_key, split)
    meta = {"encoder": encoder_key, "data": data_key, "split": split, "n": str(len(records))}
    changed = data_changed_ns(records)
    stored = _load(path, meta, changed)
    several = ranks.world > 1 and ranks.all_gather is not None
    locks = stored is None and ranks.rank == 0  # one process of a job takes the lock: no two of them wait on it
    with making(path) if locks else contextlib.nullcontext():
        if locks:
            stored = _load(path, meta, changed)  # written by another command while this one waited
        if all(ranks.all_gather(stored is not None)) if several else stored is not None:
            return stored
        mine = process_slice(len(records), ranks.rank, ranks.world) if several else range(len(records))
        if stored is not None:  # another process lacks the file: this one's part is in it
            part = stored[mine.start : mine.stop]
        else:
            part = compute_features([records[i] for i in mine], encode, batch_size=batch_size,
                                    desc=f"features [{split}]", progress=progress, preprocess=preprocess,
                                    loader=loader, draft=draft, limits=limits)  # fmt: skip
        parts = [p for p in ranks.all_gather(part) if len(p)] if several else [part]
        tensor = torch.cat(parts) if parts else torch.zeros(0, 0)  # (N, D)
        if stored is None and ranks.writes:
            atomic_write_bytes(path, save_safetensors({"features": tensor.contiguous()}, metadata=meta))
        if several:
            ranks.all_gather(None)  # a barrier: the file is in place before any process goes on
    return tensor


def text_cache_file(cache_dir: str | Path, encoder_key: str, texts: Sequence[str]) -> tuple[Path, dict[str, str]]:
    """Where the embeddings of the ordered ``texts`` under an encoder are stored, and the metadata checked on load
    (``<cache_dir>/features/texts-<hash16>.safetensors``)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode() + b"\0")
    data_key = h.hexdigest()
    meta = {"encoder": encoder_key, "data": data_key, "split": "texts", "n": str(len(texts))}
    return cache_file(cache_dir, encoder_key, data_key, "texts"), meta


def model_features(
    model: torch.nn.Module,
    records: Sequence[Any],
    cfg: Any,
    split: str,
    *,
    progress: bool = True,
    processes: Any = None,
) -> torch.Tensor:
    """Cached frozen features ``(N, D)`` of ``records`` from the captioner's vision encoder (``model.encoder``).

    The model fingerprint hashes the encoder's weights, class and image-processor settings, and the JPEG draft size
    (``data.jpeg_draft``, :func:`finecap.data.loading.encoder_draft`) when there is one. Stored under
    ``run.cache_dir``; computed with ``retriever.batch_size_eval`` images per forward pass, the images decoded and
    preprocessed in ``data.num_workers`` DataLoader workers. ``processes`` (an ``Accelerator`` or ``PartialState``):
    every one of them builds its part of a missing file (:func:`cached_features`, :class:`Ranks`); each must call.
    """
    encoder = model.encoder
    processor = getattr(encoder, "image_processor", None)
    draft = encoder_draft(encoder, cfg.data)
    device = next(encoder.parameters()).device

    def encode(pixel_values: torch.Tensor) -> torch.Tensor:
        return encoder(pixel_values.to(device, non_blocking=pixel_values.is_pinned()))  # (b, D)

    was_training = encoder.training
    encoder.eval()
    try:
        return cached_features(
            records,
            encode,
            cache_dir=resolve_cache_dir(cfg.run),
            encoder_key=image_encoder_key(encoder, processor, draft),
            split=split,
            batch_size=cfg.retriever.batch_size_eval,
            progress=progress,
            preprocess=encoder.preprocess,
            loader=LoaderSettings.of(cfg.data, device),
            draft=draft,
            limits=ImageLimits.of(cfg.data),
            ranks=Ranks.of(processes),
        )
    finally:
        encoder.train(was_training)
