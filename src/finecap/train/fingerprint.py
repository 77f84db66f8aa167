"""Fingerprints of a run's inputs, its data and its encoders, so that nothing reads a run against other inputs.

A training run records them in ``<run_dir>/fingerprints.json`` (:func:`write_fingerprints`; its checkpoints carry
a copy, :func:`finecap.train.checkpoint.save_checkpoint`), a bags file records the fingerprint of the data it was
built on, and every command that reads a run or a bags file recomputes them from the configuration it reads with
and stops (:class:`FingerprintMismatch`, a ``ValueError``: ``finecap`` exits 2) when they differ, naming both and
what differs (:func:`check_fingerprints`).

**Data** (:func:`data_fingerprint`), with the format (``data.format``), the caption field (``data.captions``) and,
for a bags file, the split:

- the world: its content key (``world.json``'s ``key``, :func:`finecap.world.make.world_key`), which fixes every
  image, caption and scene graph, and the SHA-256 of its ``dataset.json``, so a world copy whose captions were
  edited is another data set (fingerprints recorded before the hash was added compare the key alone);
- a data-set file (Karpathy, COCO, JSONL): the SHA-256 of the file's bytes; image files are not hashed (a COCO
  copy holds 120k of them), so replacing an image under the same name goes unnoticed;
- an image folder (``data.format=folder``): its images' relative paths and sizes, and the SHA-256 of its caption
  files (``captions.jsonl`` / ``captions.csv``, the ``.txt`` next to each image);
- with ``data.val_fraction`` / ``data.test_fraction`` set, the fractions and ``data.split_seed`` (``split_fractions``):
  they place the images that name no split (:mod:`finecap.data.splits`);
- ``data.format=hf``: the ``datasets`` fingerprint of every split of a ``save_to_disk`` folder (``state.json``'s
  ``_fingerprint``), the SHA-256 of parquet / arrow files, or for a Hub name the name and the revision in the local
  Hugging Face cache; with the column options (``data.hf.*_column``; ``data.hf.questions_column`` and
  ``data.hf.image_folder_column`` only when set, so runs recorded before they existed still match).

**Encoders**: ``captioner`` is the vision encoder the run's checkpoints load from outside their folder
(:func:`captioner_fingerprint`: ``model.encoder``, ``world`` = the trained world encoder, or the encoder of the
``train.init_from`` checkpoint; ``{"kind": "in-checkpoint"}`` when the checkpoint holds it: a trained encoder, a
pretrained BLIP), seen from the configuration when the run starts and from the checkpoint's ``captioner.json`` when
``finecap caption`` reads it; ``retriever`` is ``retriever.checkpoint``, or the world encoder of a world run
(:func:`retriever_fingerprint`). A local checkpoint is the SHA-256 of its weight files (``*.safetensors``, ``*.bin``,
``*.pt``, ``*.pth``) and ``config.json`` files (optimizer state folders skipped), a trained world encoder also by its
key; a Hub name is the name and the revision in the local Hugging Face cache (``None`` when not cached: then only
the name is compared).

**Bags files** (``finecap bags build``) store the data set's absolute path and its fingerprint with the caption field
of the bag embeddings and the split; :func:`bags_file_data` gives readers the data set (a relative path read from the
bags file's folder) after checking it.

**Why in** :mod:`finecap.train`: a fingerprint pins a run to its inputs, and computing one reads every layer below
training: the data (:mod:`finecap.data.references`, :mod:`finecap.data.formats`), the captioner's encoder as its
backbone records it (:mod:`finecap.models.backbones`) and the world encoder's cache key
(:mod:`finecap.models.world_encoder_cache`, no torch: ``finecap report`` checks a world run without it).
Placed in ``data/`` it reached up into ``models/`` and, for the run layout, into ``train/``; here every import points
down, and the run-directory names it reads come from :mod:`finecap.runs`. Its readers (``finecap caption``,
``report``, ``bags``, the demo, :meth:`finecap.api.Captioner.from_pretrained`) are all above training.

Each fingerprint is a JSON object; its ``id`` is a short hash of its content (everything but ``path``, which says
where the input was and is not compared: a data set moved elsewhere with the same content is the same data). A value
recorded as ``None`` (unknown when the run started, e.g. a world encoder not trained yet) is not compared. Files are
hashed once per process and version (path, :func:`finecap.data.hashing.file_version`).

Example::

    >>> a = {"kind": "file", "format": "jsonl", "captions": "original", "sha256": "ab", "path": "/a/data.jsonl"}
    >>> differences(a, {**a, "sha256": "cd", "path": "/b/data.jsonl"})
    ["sha256: 'ab' -> 'cd'", "path: '/a/data.jsonl' -> '/b/data.jsonl'"]
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.data.hashing import hub_revision, sha256_file, sha256_files
from finecap.data.records import DataError
from finecap.models.world_encoder_cache import encoder_dir, encoder_key
from finecap.registry import TRUST_ENV, untrusted_code
from finecap.runs import CAPTIONER_FILE, FINGERPRINTS_FILE, model_dir, run_dir_of
from finecap.utils.files import write_json
from finecap.utils.reading import DATA_FILE, read_json

if TYPE_CHECKING:
    from finecap.config import Config

__all__ = ["FingerprintMismatch", "bags_data_fingerprint", "bags_file_data", "bags_retriever_fingerprint",
           "check_bags_data", "check_fingerprints", "check_run", "check_run_dir", "data_fingerprint",
           "dataset_fingerprint", "run_fingerprints", "stored_path",
           "write_fingerprints"]  # fmt: skip

VERSION = 1
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
SKIPPED_DIRS = ("accelerate", "state")
"""Sub-folders of a checkpoint that hold optimizer and loop state, not the model."""
INFO_KEYS = ("id", "path")
"""Fields of a fingerprint that are not compared."""
PARTS = ("data", "captioner", "retriever")
"""What :func:`check_fingerprints` can compare: the data and the two encoders."""


class FingerprintMismatch(ValueError):
    """A run (or bags file) was made from other inputs than the ones a command is about to read."""


# --------------------------------------------------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------------------------------------------------


def checkpoint_files(folder: Path) -> list[Path]:
    """The files that make a model checkpoint folder what it is: weights and ``config.json`` files, anywhere below
    ``folder`` except in optimizer / loop state folders (:data:`SKIPPED_DIRS`)."""
    out = []
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in files:
            if name.endswith(WEIGHT_SUFFIXES) or name == "config.json":
                out.append(Path(dirpath) / name)
    return out


def content_id(fingerprint: dict[str, Any]) -> str:
    """Short hash of a fingerprint's compared fields (everything but :data:`INFO_KEYS`)."""
    content = {k: v for k, v in fingerprint.items() if k not in INFO_KEYS}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _with_id(fingerprint: dict[str, Any]) -> dict[str, Any]:
    return {"id": content_id(fingerprint), **fingerprint}


# --------------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------------


def dataset_fingerprint(
    fmt: str,
    path: str | Path,
    *,
    captions: str = "original",
    split: str | None = None,
    options: dict[str, Any] | None = None,
    split_fractions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fingerprint of the data set file (or world folder, ``hf`` source, image folder) ``path`` of format ``fmt`` read
    with caption field ``captions``; ``split`` when one split is meant (a bags file); ``options``: the format's own
    options (``hf``'s columns); ``split_fractions``: how images naming no split are split (when they are held out).
    What identifies the data itself is the format's to say (:attr:`finecap.data.formats.Format.fingerprint`)."""
    from finecap.data.formats import data_format

    spec = data_format(fmt)
    source = str(path)
    path = spec.locate(Path(path))
    fp: dict[str, Any] = {"kind": "file", "format": fmt, "captions": captions}
    if split is not None:
        fp["split"] = split
    if split_fractions:
        fp["split_fractions"] = split_fractions
    if not spec.hub_names and not path.exists():
        raise FileNotFoundError(f"{path}: data set file not found (data.path / world.out)")
    fp.update(spec.fingerprint(path, source))
    if spec.options:
        given = (options or {}).items()
        fp["options"] = dict(sorted((k, v) for k, v in given if v or k not in spec.fingerprint_if_set))
    fp["path"] = os.path.abspath(path) if path.exists() else source
    return _with_id(fp)


def data_fingerprint(cfg: Config, *, split: str | None = None) -> dict[str, Any]:
    """Fingerprint of the configured data set (``data.*``, default the world at ``world.out``)."""
    from finecap.data.formats import format_options
    from finecap.data.references import data_file

    d = cfg.data
    options = format_options(d.format, cfg)
    held_out = {"val": d.val_fraction, "test": d.test_fraction, "seed": d.split_seed}
    return dataset_fingerprint(d.format, data_file(cfg), captions=d.captions, split=split, options=options,
                               split_fractions=held_out if d.val_fraction or d.test_fraction else None)  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Encoders
# --------------------------------------------------------------------------------------------------------------------


def source_fingerprint(name_or_path: str | Path) -> dict[str, Any]:
    """Fingerprint of a model given as a local folder / file (its weight and config files; a trained world encoder
    also by its key) or a Hub name (name and cached revision)."""
    path = Path(name_or_path)
    if path.is_dir():
        fp: dict[str, Any] = {"kind": "checkpoint", "sha256": sha256_files(path, checkpoint_files(path))}
        if (path / "encoder.json").exists():  # a trained world encoder
            fp.update(kind="world-encoder", world_encoder_key=read_json(path / "encoder.json").get("key"))
        return _with_id({**fp, "path": os.path.abspath(path)})
    if path.is_file():
        return _with_id({"kind": "checkpoint", "sha256": sha256_file(path), "path": os.path.abspath(path)})
    if path.is_absolute() or str(name_or_path).startswith("."):
        raise FileNotFoundError(f"{path}: no such checkpoint (a local path, not a Hub name)")
    return _with_id({"kind": "hub", "name": str(name_or_path), "revision": hub_revision(str(name_or_path))})


def world_encoder_fingerprint(cfg: Config) -> dict[str, Any]:
    """The world encoder of ``cfg``: its key and, once trained, its weights (``None`` before)."""
    folder = encoder_dir(cfg)
    if (folder / "encoder.json").exists():
        return source_fingerprint(folder)
    return _with_id({"kind": "world-encoder", "sha256": None, "world_encoder_key": encoder_key(cfg),
                     "path": os.path.abspath(folder)})  # fmt: skip


def external_encoder(meta: dict[str, Any], trusted: tuple[str, ...] = ()) -> str | None:
    """The vision encoder a saved captioner loads from outside its folder, from its ``captioner.json`` (each backbone
    says: :func:`finecap.models.backbones.external_encoder`; one's own backbone only when ``trusted`` names it);
    None when the checkpoint holds its encoder."""
    from finecap.models.backbones import external_encoder as from_backbone  # deferred: torch, only when reading one

    return from_backbone(meta, trusted)


def captioner_fingerprint(
    cfg: Config, model_folder: str | Path | None = None, start: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The vision encoder the captioner's checkpoints load from outside (:func:`external_encoder`), or
    ``{"kind": "in-checkpoint"}``. From the saved captioner in ``model_folder`` when given (what a reader of the
    checkpoint loads), else from ``cfg`` as training builds it: ``model.encoder`` (``world`` = the world encoder),
    or the ``train.init_from`` checkpoint's encoder; none when ``model.train_encoder`` saves it or a pretrained
    BLIP (``blip.name``) brings its own. ``start``: that checkpoint's ``captioner.json`` as the run read it with its
    weights (:attr:`~finecap.models.base.CaptionerBase.checkpoint_meta`, under its run's swap guard), else it is read
    from the checkpoint now: a start that a run still training has saved again since would give the next save's."""
    from finecap.models.backbones import encoder_source

    if model_folder is not None:
        source = external_encoder(read_json(Path(model_folder) / CAPTIONER_FILE))
    elif cfg.model.train_encoder:
        source = None
    elif cfg.train.init_from:
        meta = start if start is not None else read_json(model_dir(cfg.train.init_from) / CAPTIONER_FILE)
        source = external_encoder(dict(meta), (cfg.model.kind,))
    else:
        source = encoder_source(cfg)  # "world", a CLIP path or name, or None (the model brings its own)
    if source is None:
        return _with_id({"kind": "in-checkpoint"})
    return world_encoder_fingerprint(cfg) if source == "world" else source_fingerprint(source)


def retriever_fingerprint(cfg: Config) -> dict[str, Any] | None:
    """The retriever of the run: ``retriever.checkpoint``, else on the world the world encoder, else none."""
    if cfg.retriever.checkpoint:
        return source_fingerprint(cfg.retriever.checkpoint)
    return world_encoder_fingerprint(cfg) if cfg.data.format == "world" else None


def bags_retriever_fingerprint(cfg: Config) -> dict[str, Any]:
    """The retriever whose embeddings make a bags file's bags (``finecap bags build`` loads
    :func:`finecap.models.retriever.retriever_path`): ``retriever.checkpoint``, else the world encoder, whatever the
    data."""
    return source_fingerprint(cfg.retriever.checkpoint) if cfg.retriever.checkpoint else world_encoder_fingerprint(cfg)


# --------------------------------------------------------------------------------------------------------------------
# A run's record
# --------------------------------------------------------------------------------------------------------------------


def run_fingerprints(
    cfg: Config,
    parts: Sequence[str] = PARTS,
    model_folder: str | Path | None = None,
    start: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``{"version", "data", "captioner", "retriever"}`` of ``cfg`` (only ``parts``; the captioner's from the saved
    captioner in ``model_folder`` when given, else with the ``start``'s ``captioner.json`` as read:
    :func:`captioner_fingerprint`)."""
    out: dict[str, Any] = {"version": VERSION}
    if "data" in parts:
        out["data"] = data_fingerprint(cfg)
    if "captioner" in parts:
        out["captioner"] = captioner_fingerprint(cfg, model_folder, start)
    if "retriever" in parts:
        out["retriever"] = retriever_fingerprint(cfg)
    return out


def write_fingerprints(
    run_dir: str | Path,
    cfg: Config,
    model_folder: str | Path | None = None,
    start: Mapping[str, Any] | None = None,
) -> Path:
    """Record the fingerprints of ``cfg``'s inputs in ``<run_dir>/fingerprints.json``; returns the file. Called by
    training once the run's ``config.yaml`` is written (and the world encoder it uses is trained); ``model_folder``:
    the captioner's from that saved captioner (a resumed run's checkpoint) rather than from ``train.init_from``;
    ``start``: the ``train.init_from`` checkpoint's ``captioner.json`` as the run read it with the weights
    (:func:`captioner_fingerprint`)."""
    path = Path(run_dir) / FINGERPRINTS_FILE
    write_json(path, run_fingerprints(cfg, model_folder=model_folder, start=start))
    return path


def is_fingerprints_file(path: str | Path) -> bool:
    """Whether ``path`` reads as a ``fingerprints.json`` of :func:`write_fingerprints` (a mapping of ``version``,
    ``data`` and the ``captioner`` and ``retriever`` it may hold, nothing else): what a run may replace."""
    try:
        raw = read_json(path)
    except (ValueError, OSError, RecursionError):
        return False
    return isinstance(raw, dict) and {"version", "data"} <= set(raw) <= {"version", "data", "captioner", "retriever"}


def find_fingerprints(folder: str | Path) -> Path | None:
    """The ``fingerprints.json`` of a run directory or a checkpoint folder (its own, else its run's), or None."""
    folder = Path(folder)
    for candidate in (folder, run_dir_of(folder)):
        if candidate is not None and (candidate / FINGERPRINTS_FILE).is_file():
            return candidate / FINGERPRINTS_FILE
    return None


def differences(recorded: dict[str, Any] | None, current: dict[str, Any] | None) -> list[str]:
    """``"field: recorded -> current"`` for every compared field that differs (a recorded ``None`` is unknown and not
    compared); the path is listed too, after them, when something else differs."""
    if recorded is None or current is None:
        return [] if recorded is current else [f"{recorded!r} -> {current!r}"]
    keys = [k for k in dict.fromkeys([*recorded, *current]) if k not in INFO_KEYS]
    out = [f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}" for k in keys
           if recorded.get(k) is not None and recorded.get(k) != current.get(k)]  # fmt: skip
    if out and recorded.get("path") != current.get("path"):
        out.append(f"path: {recorded.get('path')!r} -> {current.get('path')!r}")
    return out


def _describe(fp: dict[str, Any] | None) -> str:
    if fp is None:
        return "none"
    where = f" at {fp['path']}" if fp.get("path") else (f" {fp['name']}" if fp.get("name") else "")
    return f"{fp.get('id', content_id(fp))}{where}"


WHAT = {"data": "data", "captioner": "captioner's vision encoder", "retriever": "retriever"}
HINTS = {
    "data": "read the run with the data it was trained on (the run's data.path / world.out, or pass the data on "
    "purpose: --data / data.path=...), or train again",
    "captioner": "restore the vision encoder the checkpoint was trained with and loads (captioner.json), or train "
    "again",
    "retriever": "restore the retriever the run used (retriever.checkpoint / the world encoder), or train again",
}


def check_fingerprints(
    recorded: dict[str, Any],
    cfg: Config,
    *,
    source: str | Path,
    parts: Sequence[str] = PARTS,
    model_folder: str | Path | None = None,
    hints: Mapping[str, str] = HINTS,
) -> None:
    """Compare the fingerprints ``recorded`` (read from ``source``) with those of ``cfg`` now, for ``parts`` (the
    captioner's from the saved captioner in ``model_folder`` when given); raise :class:`FingerprintMismatch` naming
    both fingerprints and what differs, and for each part what to do (``hints``: :data:`HINTS`, or a caller's own,
    e.g. a demo stage's). A part the record does not hold (a file of an older version) is not checked."""
    problems = []
    for part in parts:
        if part not in recorded:
            continue
        if part == "captioner" and model_folder is not None and not (Path(model_folder) / CAPTIONER_FILE).is_file():
            problems.append(f"{WHAT[part]}: the checkpoint {model_folder} holds no {CAPTIONER_FILE}, which names the "
                            "encoder it loads: not a finecap checkpoint, or an incomplete copy of one (copy the "
                            "whole checkpoint folder)")  # fmt: skip
            continue
        try:
            now = run_fingerprints(cfg, [part], model_folder)[part]
        except FileNotFoundError as e:
            problems.append(f"{WHAT[part]}: the run's {_describe(recorded[part])} is gone ({e}); {hints[part]}")
            continue
        diff = differences(recorded[part], now)
        if diff:
            problems.append(f"{WHAT[part]} fingerprint {_describe(recorded[part])} (recorded) differs from "
                            f"{_describe(now)} (now): {'; '.join(diff)}; {hints[part]}")  # fmt: skip
    if problems:
        raise FingerprintMismatch(f"{source}: the inputs differ from the run's. " + " | ".join(problems))


def check_run(
    folder: str | Path,
    cfg: Config,
    parts: Sequence[str] = PARTS,
    model_folder: str | Path | None = None,
    hints: Mapping[str, str] = HINTS,
) -> Path | None:
    """Check the recorded fingerprints of a run directory or checkpoint folder (:func:`find_fingerprints`) against
    ``cfg`` (:func:`check_fingerprints`, with its ``hints``); returns the file checked, or None when the run recorded
    none (made before finecap recorded them)."""
    path = find_fingerprints(folder)
    if path is not None:
        check_fingerprints(read_json(path), cfg, source=path, parts=parts, model_folder=model_folder, hints=hints)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Bags files
# --------------------------------------------------------------------------------------------------------------------


def stored_path(value: str, stored_in: str | Path) -> str:
    """A path read from the file ``stored_in``: an absolute path as it is, a relative one relative to the file's
    folder (finecap writes absolute paths; a relative one was written by hand). A relative value that names nothing
    there is returned unchanged (a Hub name)."""
    if not value or Path(value).is_absolute():
        return value
    joined = os.path.normpath(os.path.join(os.path.abspath(Path(stored_in).parent), value))
    return joined if os.path.exists(joined) else value


def bags_data_fingerprint(
    fmt: str, path: str | Path, *, captions: str, split: str, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a bags file records about the data set it was built on (``finecap bags build``): the data fingerprint
    with the caption field whose embeddings made the bags (``bags.text_from``) and the split."""
    return dataset_fingerprint(fmt, path, captions=captions, split=split, options=options)


def check_bags_data(bags_path: str | Path, raw: dict[str, Any], fmt: str, data: str | Path) -> None:
    """Check that ``data`` (of format ``fmt``) is the data set the bags file ``bags_path`` (content ``raw``) was built
    on, when the file recorded it (``"fingerprint"``); :class:`FingerprintMismatch` naming both otherwise."""
    recorded = raw.get("fingerprint")
    if not isinstance(recorded, dict):
        return
    now = dataset_fingerprint(fmt, data, captions=recorded.get("captions", "original"), split=recorded.get("split"),
                              options=recorded.get("options"))  # fmt: skip
    diff = differences(recorded, now)
    if diff:
        raise FingerprintMismatch(
            f"{bags_path}: the bags were built on data {_describe(recorded)}, but the data read now is "
            f"{_describe(now)}: {'; '.join(diff)}; read the bags with the data set they were built on, or build them "
            "again (`finecap bags build`)"
        )


def bags_file_data(bags_path: str | Path, raw: dict[str, Any] | None = None) -> str | None:
    """The data set a bags file was built on (its ``"data"``, read with :func:`stored_path`), checked against the
    file's recorded fingerprint (:func:`check_bags_data`); None when the file names none. For readers of bags files
    (``finecap bags review``) that take the data from the file rather than from the user."""
    raw = read_json(bags_path, DATA_FILE) if raw is None else raw
    value = raw.get("data") if isinstance(raw, dict) else None
    if not value:
        return None
    source = stored_path(str(value), bags_path)
    recorded = raw.get("fingerprint")
    if isinstance(recorded, dict):
        fmt = str(recorded.get("format", "world"))
        if untrusted_code(fmt):  # a bags file is data, never code
            raise DataError(f"{bags_path}: its fingerprint names the data format {fmt!r}, code of one's own, which "
                            f"finecap imports only when you name it: pass --data (read with your data.format), or "
                            f"set {TRUST_ENV}={fmt}")  # fmt: skip
        check_bags_data(bags_path, raw, fmt, source)
    return source


def check_run_dir(run_dir: str | Path, cfg: Config, parts: Sequence[str] = ("data", "retriever")) -> list[Path]:
    """Check what ``finecap report`` reads of a run directory against ``cfg`` (the run's configuration): the run's
    own fingerprints (``parts``: the data set whose images and references it shows, the retriever of the bag
    outcomes) and the data of its bags files (``bags*.json``). The training runs of a demo's stages
    (``<run_dir>/<stage>/``) are not compared: a stage may train on other data (a boosted caption field) than the
    test split the report shows. Returns the files checked."""
    from finecap.data.references import data_file

    run_dir = Path(run_dir)
    files = []
    if (run_dir / FINGERPRINTS_FILE).is_file():
        check_fingerprints(read_json(run_dir / FINGERPRINTS_FILE), cfg, source=run_dir / FINGERPRINTS_FILE,
                           parts=parts)  # fmt: skip
        files.append(run_dir / FINGERPRINTS_FILE)
    if "data" in parts:
        for path in sorted(run_dir.glob("bags*.json")):
            raw = read_json(path, DATA_FILE)
            if isinstance(raw, dict) and isinstance(raw.get("fingerprint"), dict):
                check_bags_data(path, raw, cfg.data.format, data_file(cfg))
                files.append(path)
    return files
