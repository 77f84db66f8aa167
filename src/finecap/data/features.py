"""The image-feature cache: features of a list of images under an encoder, computed once and stored as safetensors.

One cache serves every frozen encoder of the package: the captioner's vision encoder (:func:`model_features`, the
frozen-feature training path and :func:`finecap.caption.generate_captions`) and the CLIP retriever
(:meth:`finecap.models.retriever.Retriever.image_features`, for self-retrieval, CLIPScore, TrueMatch bags and the
retrieval reward). A file is keyed by three things, so a different encoder or a changed data set never reuses it:

- the **model fingerprint** (:func:`fingerprint_module`): every tensor of the encoder's ``state_dict`` (name, dtype,
  shape and bytes) plus its preprocessing settings. Hashing the weights themselves, rather than a checkpoint name,
  covers every way an encoder can be obtained (a Hub name, a local folder, the cached world encoder, a captioner
  checkpoint) and an encoder fine-tuned in place. It costs about a second per 500 MB of weights per call;
- the **data fingerprint** (:func:`fingerprint_data`): the ordered images (image id, resolved path, file size and
  modification time). The data set file itself is not hashed: captions do not change image features, and any change
  of which images there are, their order or their files changes the fingerprint;
- the **split**: a readable label (``train``, ``test``, ...; the retriever uses the records' common split, or
  ``mixed``) that starts the file name.

Text embeddings of the retriever (:meth:`finecap.models.retriever.Retriever.text_embeddings`; CLIPScore's references,
which are the same for every system scored on a data set) use the same files with the split ``texts`` and, as the
data fingerprint, the SHA-256 of the ordered texts (:func:`text_cache_file`).

File: ``<cache_dir>/features/<split>-<hash16>.safetensors`` with one tensor ``features (N, D)`` (float32, row ``i``
belongs to record ``i``) and the metadata ``encoder``, ``data``, ``split``, ``n``, checked on load: a file whose
metadata disagree, or that cannot be read (truncated, foreign), is recomputed, never trusted. Files are written
atomically (:func:`finecap.utils.atomic_write_bytes`).

Example::

    >>> import torch
    >>> a = fingerprint_module(torch.nn.Linear(2, 2))
    >>> len(a)
    64
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open
from safetensors.torch import save as save_safetensors
from tqdm.auto import tqdm

from finecap.data.formats import load_record_image
from finecap.home import cache_dir as resolve_cache_dir
from finecap.utils import atomic_write_bytes, progress_enabled

CACHE_SUBDIR = "features"
"""Folder under the cache directory (``run.cache_dir``) holding the feature files."""


def fingerprint_module(module: torch.nn.Module, extra: dict[str, Any] | None = None) -> str:
    """SHA-256 of a module's state dict (names, dtypes, shapes, bytes) and of ``extra`` (JSON, e.g. preprocessing)."""
    h = hashlib.sha256()
    h.update(json.dumps(extra or {}, sort_keys=True, default=str).encode())
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint_data(records: Sequence[Any]) -> str:
    """SHA-256 of the ordered images of ``records`` (objects with ``image_id`` and ``path``): id, resolved path, file
    size and modification time. A missing image raises ``FileNotFoundError`` naming its record."""
    h = hashlib.sha256()
    for r in records:
        path = Path(r.path)
        if getattr(r, "image_bytes", None) is not None:  # embedded image (Hugging Face data set): hash its bytes
            digest = hashlib.sha256(r.image_bytes).hexdigest()
            h.update(json.dumps([str(r.image_id), str(path), digest]).encode() + b"\n")
            continue
        try:
            st = path.stat()
        except OSError:
            raise FileNotFoundError(f"image of record {r.image_id!r} not found: {path}") from None
        h.update(json.dumps([str(r.image_id), str(path.resolve()), st.st_size, st.st_mtime_ns]).encode() + b"\n")
    return h.hexdigest()


def cache_file(cache_dir: str | Path, encoder_key: str, data_key: str, split: str) -> Path:
    """Where the features of (encoder, data, split) are stored."""
    key = hashlib.sha256(f"{encoder_key}|{data_key}|{split}".encode()).hexdigest()[:16]
    return Path(cache_dir) / CACHE_SUBDIR / f"{split}-{key}.safetensors"


def compute_features(
    records: Sequence[Any],
    encode: Callable[[list], torch.Tensor],
    *,
    batch_size: int = 64,
    desc: str = "features",
    progress: bool = True,
) -> torch.Tensor:
    """``encode(list of PIL images) -> (b, D)`` over all records in batches, without gradient; returns ``(N, D)``
    float32 on the CPU (``(0, 0)`` for no records)."""
    out = []
    with torch.no_grad():
        for start in tqdm(
            range(0, len(records), batch_size), desc=desc, disable=not progress_enabled(progress), unit="batch"
        ):
            images = [load_record_image(r) for r in records[start : start + batch_size]]
            out.append(encode(images).detach().float().cpu())  # (b, D)
    return torch.cat(out) if out else torch.zeros(0, 0)  # (N, D)


def _load(path: Path, wanted: dict[str, str]) -> torch.Tensor | None:
    if not path.exists():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if any(meta.get(k) != v for k, v in wanted.items()):
            return None
        return load_file(str(path))["features"]
    except (OSError, SafetensorError, KeyError):  # truncated or foreign file: recompute, never trust it
        return None


def cached_tensor(path: Path, meta: dict[str, str], compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The tensor stored in the safetensors file ``path`` when its metadata equal ``meta``; otherwise ``compute()``,
    written there atomically (with ``meta``) and returned. Unreadable or mismatching files are recomputed."""
    stored = _load(path, meta)
    if stored is not None:
        return stored
    tensor = compute()
    atomic_write_bytes(path, save_safetensors({"features": tensor.contiguous()}, metadata=meta))
    return tensor


def cached_features(
    records: Sequence[Any],
    encode: Callable[[list], torch.Tensor],
    *,
    cache_dir: str | Path,
    encoder_key: str,
    split: str,
    data_key: str | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> torch.Tensor:
    """Features ``(N, D)`` of ``records``: loaded from the cache when its key matches, else computed with ``encode``
    (:func:`compute_features`) and stored. ``data_key`` defaults to :func:`fingerprint_data` of ``records``."""
    data_key = fingerprint_data(records) if data_key is None else data_key
    path = cache_file(cache_dir, encoder_key, data_key, split)
    meta = {"encoder": encoder_key, "data": data_key, "split": split, "n": str(len(records))}

    def compute() -> torch.Tensor:
        return compute_features(records, encode, batch_size=batch_size, desc=f"features [{split}]", progress=progress)

    return cached_tensor(path, meta, compute)


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
    model: torch.nn.Module, records: Sequence[Any], cfg: Any, split: str, *, progress: bool = True
) -> torch.Tensor:
    """Cached frozen features ``(N, D)`` of ``records`` from the captioner's vision encoder (``model.encoder``).

    The model fingerprint hashes the encoder's weights, class and image-processor settings. Stored under
    ``run.cache_dir``; computed with ``retriever.batch_size_eval`` images per forward pass.
    """
    encoder = model.encoder
    processor = getattr(encoder, "image_processor", None)
    extra = {"class": type(encoder).__name__, "processor": processor.to_dict() if processor is not None else None}
    device = next(encoder.parameters()).device

    def encode(images: list) -> torch.Tensor:
        return encoder(encoder.preprocess(images).to(device))  # (b, D)

    was_training = encoder.training
    encoder.eval()
    try:
        return cached_features(
            records,
            encode,
            cache_dir=resolve_cache_dir(cfg.run),
            encoder_key=fingerprint_module(encoder, extra),
            split=split,
            batch_size=cfg.retriever.batch_size_eval,
            progress=progress,
        )
    finally:
        encoder.train(was_training)
