"""Frozen-feature cache: encoder features of a data split, computed once and stored as safetensors.

The cache file name is a hash of everything the features depend on, so a different encoder or data set never
reuses a stale file:

- the encoder: a hash of its weights (every tensor of its ``state_dict``: name, dtype, shape and bytes) plus its
  preprocessing settings. Hashing the weights themselves (rather than checkpoint file names) covers every way the
  encoder can be obtained: a Hugging Face name, a local folder, the cached world encoder, or a captioner checkpoint;
- the data: a hash of the data set file's bytes, the split, and the ordered list of images (id, path, file size and
  modification time).

File: ``<cache_dir>/features/<split>-<hash16>.safetensors`` with one tensor ``features (N, D)`` (float32, row ``i``
belongs to record ``i``) and the metadata ``encoder``, ``data``, ``split``, ``n``. Written through a temporary file
and renamed, so an interrupted computation leaves no half file.

Example::

    >>> import torch
    >>> a = fingerprint_module(torch.nn.Linear(2, 2))
    >>> len(a)
    64
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, safe_open, save_file
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from finecap.data.formats import Record


def fingerprint_module(module: torch.nn.Module, extra: dict[str, Any] | None = None) -> str:
    """SHA-256 of a module's state dict (names, dtypes, shapes, bytes) and of ``extra`` (JSON, e.g. preprocessing)."""
    h = hashlib.sha256()
    h.update(json.dumps(extra or {}, sort_keys=True, default=str).encode())
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint_data(records: Sequence[Record], data_file: str | Path | None, split: str) -> str:
    """SHA-256 of the data set file's bytes, the split and the ordered images (id, path, size, mtime)."""
    h = hashlib.sha256(f"split={split}|".encode())
    if data_file is not None:
        with open(data_file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    for r in records:
        try:
            st = os.stat(r.path)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        h.update(f"{r.image_id}|{r.path}|{stamp}\n".encode())
    return h.hexdigest()


def cache_file(cache_dir: str | Path, encoder_key: str, data_key: str, split: str) -> Path:
    key = hashlib.sha256(f"{encoder_key}|{data_key}|{split}".encode()).hexdigest()[:16]
    return Path(cache_dir) / "features" / f"{split}-{key}.safetensors"


def compute_features(
    records: Sequence[Record],
    encode: Callable[[list], torch.Tensor],
    *,
    batch_size: int = 64,
    desc: str = "features",
    progress: bool = True,
) -> torch.Tensor:
    """``encode(list of PIL images) -> (b, D)`` over all records in batches; returns ``(N, D)`` float32 on the CPU."""
    from finecap.data.datasets import load_image

    out = []
    with torch.no_grad():
        for start in tqdm(range(0, len(records), batch_size), desc=desc, disable=not progress, unit="batch"):
            images = [load_image(r.path) for r in records[start : start + batch_size]]
            out.append(encode(images).detach().float().cpu())  # (b, D)
    return torch.cat(out)  # (N, D)


def cached_features(
    records: Sequence[Record],
    encode: Callable[[list], torch.Tensor],
    *,
    cache_dir: str | Path,
    encoder_key: str,
    data_key: str,
    split: str,
    batch_size: int = 64,
    progress: bool = True,
) -> torch.Tensor:
    """Features ``(N, D)`` of ``records``: loaded from the cache when its key matches, else computed and stored."""
    path = cache_file(cache_dir, encoder_key, data_key, split)
    if path.exists():
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        wanted = {"encoder": encoder_key, "data": data_key, "n": str(len(records))}
        if all(meta.get(k) == v for k, v in wanted.items()):
            return load_file(str(path))["features"]
    features = compute_features(records, encode, batch_size=batch_size, desc=f"features [{split}]", progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        meta = {"encoder": encoder_key, "data": data_key, "split": split, "n": str(len(records))}
        save_file({"features": features.contiguous()}, tmp, metadata=meta)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return features


def model_features(
    model: torch.nn.Module, records: Sequence[Record], cfg: Any, split: str, *, progress: bool = True
) -> torch.Tensor:
    """Cached frozen features ``(N, D)`` of ``records`` from the captioner's vision encoder (``model.encoder``).

    The encoder key hashes the encoder's weights and its image-processor settings; the data key hashes the data set
    file of ``cfg`` (:func:`finecap.data.datasets.data_file`) and the records. Stored under ``run.cache_dir``.
    """
    from finecap.data.datasets import data_file

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
            cache_dir=cfg.run.cache_dir,
            encoder_key=fingerprint_module(encoder, extra),
            data_key=fingerprint_data(records, data_file(cfg), split),
            split=split,
            batch_size=cfg.retriever.batch_size_eval,
            progress=progress,
        )
    finally:
        encoder.train(was_training)
