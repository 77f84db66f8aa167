"""Write the world data set: images, Karpathy-style captions, dense captions and scene graphs (``finecap world make``,
:mod:`finecap.app.world`, calls :func:`make_world`).

Layout of ``out``::

    dataset.json    {"dataset": "world", "images": [{"filename": "000000.png", "filepath": "train", "split",
                     "imgid", "sentids", "sentences": [{"raw", "tokens", "imgid", "sentid"}]}]}
    dense.json      {str(imgid): dense caption}
    scenes.jsonl    {"imgid", "split", "family", "variant", "scene": Scene.to_dict()} per line
    world.json      {"key", "version", "config", "counts", "vocabulary"}; written last, marks a complete world
    images/<split>/<imgid:06d>.png
    .finecap-world  {"key", "version", "config"}; written first, marks the folder as finecap's (MARKER)

``out`` defaults to :func:`finecap.home.world_path`: ``world.out``, or ``<finecap home>/worlds/<world key>``.
:func:`make_world` writes only into a missing or empty folder or a finecap world (the marker), replaces another
finecap world only when asked (``world.overwrite``; then it removes only the files that world's record lists) and
refuses every other folder (:class:`WorldFolderError`).

``imgid`` runs over train, then val, then test. Everything is a function of the world config: scene ``imgid`` of a
split is drawn from ``random.Random(f"{seed}-{split}-{index}")`` (families: one generator per family), captions
from ``random.Random(f"{seed}-captions-{imgid}")``. ``family`` is null when families are off; otherwise scenes of
one family share the id and lie in one split (the last family of a split may be smaller).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from finecap.config import Config, WorldConfig
from finecap.home import world_path
from finecap.locks import waiting_lock
from finecap.utils.files import (
    atomic_write_bytes,
    atomic_write_text,
    is_temporary_of,
    png_bytes,
    remove_temporaries_of,
    write_json,
)
from finecap.utils.reading import read_json, read_lines
from finecap.utils.system import progress_enabled
from finecap.utils.text import karpathy_tokens, shell_command
from finecap.world.captions import dense_caption, reference_captions, vocabulary
from finecap.world.key import WORLD_VERSION, world_key
from finecap.world.key import content_config as _content_config
from finecap.world.render import render
from finecap.world.scene import Scene, sample_family, sample_scene
from finecap.world.shift import scene_settings

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
MARKER = ".finecap-world"
"""Written first when finecap starts a world in a folder (``{"key", "version", "config"}``): a folder holding it (or
the ``world.json`` of a world made before markers existed) is a finecap world. Any other non-empty folder is the
user's, and finecap never writes into it."""
FILES = ("dataset.json", "dense.json", "scenes.jsonl", "world.json")
"""The files of a world besides its images and the marker."""


def generate_scenes(cfg: WorldConfig) -> list[dict[str, Any]]:
    """Scene records ``{"imgid", "split", "family", "variant", "scene"}`` of the whole world (no rendering)."""
    records: list[dict[str, Any]] = []
    family_id = 0
    min_objects, max_objects, pattern_prob, tag = scene_settings(cfg)  # the shifted domain's, if world.shift says so
    for split in SPLITS:
        n = getattr(cfg, f"n_{split}")
        if cfg.families == 0:
            for j in range(n):
                rng = random.Random(f"{cfg.seed}-{tag}{split}-{j}")
                scene = sample_scene(rng, len(records), min_objects, max_objects, pattern_prob)
                records.append({"imgid": scene.id, "split": split, "family": None, "variant": None, "scene": scene})
            continue
        made = 0
        while made < n:
            rng = random.Random(f"{cfg.seed}-{tag}{split}-family-{family_id}")
            members = sample_family(rng, cfg.families, len(records), min_objects, max_objects,
                                    pattern_prob)  # fmt: skip
            for scene, variant in members[: n - made]:
                records.append({"imgid": scene.id, "split": split, "family": family_id, "variant": variant,
                                "scene": scene})  # fmt: skip
                made += 1
            family_id += 1
    return records


def is_complete(out: Path, key: str) -> bool:
    """Whether ``out`` holds the complete world of content key ``key`` (``world.json`` is written last)."""
    meta = out / "world.json"
    if not meta.exists() or not (out / "dataset.json").exists() or not (out / "scenes.jsonl").exists():
        return False
    try:
        return read_json(meta).get("key") == key
    except ValueError:
        return False


class WorldFolderError(ValueError):
    """``world.out`` names a folder finecap may not write the world into: a folder finecap did not make, or another
    finecap world (other settings) without ``world.overwrite``."""


def world_record(out: Path) -> dict[str, Any] | None:
    """What finecap recorded about the world in ``out`` (``{"key", "version", "config", ...}``: the marker
    :data:`MARKER`, or ``world.json`` of a world made before markers existed), or ``None`` when ``out`` is not a
    finecap world."""
    for name in (MARKER, "world.json"):
        path = out / name
        if not path.is_file():
            continue
        try:
            record = read_json(path)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("key"), str) and isinstance(record.get("config"), dict):
            return record
    return None


def recorded_settings(out: Path) -> WorldConfig | None:
    """The world settings of the finecap world in ``out`` (:func:`world_record`, with ``world.out`` = ``out``) when
    they give its recorded key, else ``None`` (not a finecap world, or one of another world code version)."""
    record = world_record(out)
    if record is None:
        return None
    names = {f.name for f in dataclasses.fields(WorldConfig)}
    try:
        cfg = WorldConfig(**{k: v for k, v in record["config"].items() if k in names}, out=str(out))
    except (TypeError, ValueError):
        return None
    return cfg if world_key(cfg) == record["key"] else None


def setting_changes(record: dict[str, Any], cfg: WorldConfig) -> list[str]:
    """``"key: old -> new"`` for every world setting (and the world code version) that differs between the world
    ``record`` (:func:`world_record`) and ``cfg``; settings the record lacks count as their defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(WorldConfig)}
    old = {"version": record.get("version"), **record["config"]}
    new = {"version": WORLD_VERSION, **_content_config(cfg)}
    changes = []
    for key in sorted(set(old) | set(new), key=lambda k: (k != "version", k)):
        a, b = old.get(key, defaults.get(key)), new.get(key, defaults.get(key))
        if a != b:
            changes.append(f"{'world.' if key != 'version' else 'world code '}{key}: {a!r} -> {b!r}")
    return changes


def check_world_folder(cfg: WorldConfig, out: Path | str, overwrite: bool | None = None) -> bool:
    """Whether ``out`` already holds the complete world of ``cfg`` (reuse it); ``False`` when :func:`make_world` may
    write it there: a missing or empty folder, the unfinished world of ``cfg``, or (``overwrite``, default
    ``cfg.overwrite``) another finecap world. Raises :class:`WorldFolderError` for every other folder: one that
    finecap did not make (never written), or another finecap world without ``overwrite`` (the message lists the
    settings that differ and the two ways out)."""
    out = Path(out)
    overwrite = cfg.overwrite if overwrite is None else overwrite
    key = world_key(cfg)
    if not out.exists():
        return False
    if not out.is_dir():
        raise WorldFolderError(f"world.out={out}: a file, not a folder; give a folder for the world")
    record = world_record(out)
    if record is None:
        if not any(p for p in out.iterdir() if not _being_made(p.name)):  # empty, or a world just begun
            return False
        raise WorldFolderError(
            f"world.out={out}: this folder is not empty and is not a finecap world (no {MARKER} marker); finecap "
            "never writes into a folder it did not make. Give a new or empty folder (world.out=DIR), or leave "
            "world.out empty to keep the world in the finecap home"
        )
    if record["key"] == key and is_complete(out, key):
        edited = edited_files(out)
        if edited and not overwrite:
            raise WorldFolderError(
                f"world.out={out}: {', '.join(edited)} changed since finecap made this world (its content no longer "
                "matches the SHA-256 in world.json), so it is not the world of its key; make it again in another "
                "folder (world.out=DIR, or leave world.out empty for the finecap home), or replace it with "
                "`finecap world make --force` (world.overwrite=true)"
            )
        if not edited:
            return True
    if record["key"] == key or overwrite:  # to be written: never through a link into another folder
        for folder in image_folders(out):
            if folder.is_symlink():
                raise WorldFolderError(
                    f"world.out={out}: an images folder is a link ({folder} -> {folder.resolve()}: a `finecap boost` "
                    "copy of a world, or a planted link?); finecap writes and removes a world's files only in a "
                    "folder of its own. Give another folder (world.out=DIR), or leave world.out empty to keep the "
                    "world in the finecap home"
                )
        return False
    changes = setting_changes(record, cfg) or [f"world key: {record['key']} -> {key}"]
    raise WorldFolderError(
        f"world.out={out} holds another finecap world (key {record['key']}) than the one asked for (key {key}); "
        f"settings that differ (there -> asked): {'; '.join(changes)}. Either give another folder (world.out=DIR, "
        "or leave world.out empty to keep each world in the finecap home), or replace that world: "
        "`finecap world make --force` / world.overwrite=true (removes only the files finecap made there)"
    )


LOCK = ".finecap-world.lock"
"""The lock file in a world's folder that the one process writing the world holds (:func:`making_lock`)."""


def _being_made(name: str) -> bool:
    """Whether ``name`` is a file finecap makes in a world's folder before its marker stands there: the lock, and the
    marker's temporary file (:func:`finecap.utils.files.atomic_write_bytes`) while it is written."""
    return name == LOCK or is_temporary_of(name, MARKER)


@contextlib.contextmanager
def making_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s :data:`LOCK` for the block, waiting for another process that holds it
    (:func:`finecap.locks.waiting_lock`): two commands making a world into one folder at once (two terminals, a job
    array on a fresh home) write it one after the other, the second finding the first's world (or refusing another
    one) instead of mixing their files."""
    with waiting_lock(out / LOCK, log=log.info, waiting=f"world: another finecap is making the world in {out}; "
                      "waiting for it"):  # fmt: skip
        yield


def image_folders(out: Path) -> list[Path]:
    """The folders a world's images are written to (and removed from): ``images`` and ``images/<split>``."""
    return [out / "images", *(out / "images" / split for split in SPLITS)]


def remove_world_files(out: Path, record: dict[str, Any]) -> None:
    """Remove the files finecap wrote for the world ``record`` in ``out`` (:func:`world_record`): its listed files and
    the ``images/<split>/<imgid>.png`` of its counts; folders only when that leaves them empty; the marker last, so
    an interrupted removal can be repeated. Every other file stays."""
    imgid = 0
    for split in SPLITS:
        n = int(record["config"].get(f"n_{split}", 0))
        folder = out / "images" / split
        for i in range(imgid, imgid + n):
            (folder / f"{i:06d}.png").unlink(missing_ok=True)
        imgid += n
        _remove_if_empty(folder)
    _remove_if_empty(out / "images")
    for name in FILES:
        (out / name).unlink(missing_ok=True)
    (out / MARKER).unlink(missing_ok=True)


IMAGE_NAME = re.compile(r"\d{6}\.png")
"""The name of a world's image in ``images/<split>/`` (``<imgid>.png``, six digits)."""


def remove_temporaries(out: Path) -> None:
    """Remove what a process killed while writing the world in ``out`` (``SIGKILL``, a job's time limit, a power
    cut) left behind: the temporary files of the world's own files (:func:`finecap.utils.files.atomic_write_bytes`'s
    ``.<name>.<random>.tmp`` of the marker, :data:`FILES` and the ``images/<split>/<imgid>.png``), which no rename
    will ever claim (:func:`finecap.utils.files.remove_temporaries_of`). Only with ``out``'s :func:`making_lock` held
    (no other process is writing them); any other file, and a link, stays."""
    remove_temporaries_of(out, lambda name: name in (MARKER, *FILES))
    for folder in image_folders(out)[1:]:
        remove_temporaries_of(folder, lambda name: IMAGE_NAME.fullmatch(name) is not None)


def _remove_if_empty(folder: Path) -> None:
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def make_world(
    cfg: WorldConfig, out: Path | str | None = None, progress: bool = True, overwrite: bool | None = None
) -> Path:
    """Write the world of ``cfg`` to ``out`` (default :func:`finecap.home.world_path`: ``world.out``, or the world's
    folder in the finecap home); returns ``out``.

    A complete world with the same key is reused as it is. A missing or empty folder, or the unfinished world of
    ``cfg``, is written. Another finecap world is replaced only with ``overwrite`` (default ``cfg.overwrite``), and
    then only the files finecap made there are removed (:func:`remove_world_files`). Any other folder is refused
    (:func:`check_world_folder` raises :class:`WorldFolderError`): finecap never deletes or overwrites a file it did
    not make.
    """
    return make_world_said(cfg, out, progress, overwrite)[0]


def make_world_said(
    cfg: WorldConfig, out: Path | str | None = None, progress: bool = True, overwrite: bool | None = None
) -> tuple[Path, bool]:
    """:func:`make_world`, and whether this call wrote the world (``False``: it was there, or another process made
    it while this one waited for the folder's :func:`making_lock`)."""
    out = Path(out) if out is not None else world_path(cfg)
    if check_world_folder(cfg, out, overwrite):
        return out, False
    out.mkdir(parents=True, exist_ok=True)
    with making_lock(out):  # one writer at a time; what another wrote meanwhile is checked again
        if check_world_folder(cfg, out, overwrite):
            return out, False
        return _write_world(cfg, out, progress), True


def _write_world(cfg: WorldConfig, out: Path, progress: bool) -> Path:
    """Write the world of ``cfg`` into ``out``, which :func:`check_world_folder` allowed (:func:`make_world`, with
    ``out``'s :func:`making_lock` held)."""
    key = world_key(cfg)
    record = world_record(out) if out.exists() else None
    if record is not None and record["key"] != key:
        remove_world_files(out, record)
    remove_temporaries(out)  # of a process killed while writing here: this one holds the folder's lock
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MARKER, {"key": key, "version": WORLD_VERSION, "config": _content_config(cfg)})  # first
    (out / "world.json").unlink(missing_ok=True)  # an unfinished world of this key: complete again only at the end
    for split in SPLITS:
        (out / "images" / split).mkdir(parents=True, exist_ok=True)

    records = generate_scenes(cfg)
    images, dense, lines = [], {}, []
    sentid = 0
    for r in tqdm(
        records, desc=f"world -> {out}", unit="img", disable=not progress_enabled(progress), mininterval=0.5
    ):
        scene: Scene = r["scene"]
        imgid, split = r["imgid"], r["split"]
        filename = f"{imgid:06d}.png"
        image = png_bytes(render(scene, cfg.image_size), compress_level=1)
        atomic_write_bytes(out / "images" / split / filename, image)  # never through a link planted there
        tag = scene_settings(cfg)[3]
        caps = reference_captions(scene, random.Random(f"{cfg.seed}-{tag}captions-{imgid}"), style=cfg.shift)
        sentences = []
        for c in caps:
            sentences.append({"raw": c, "tokens": karpathy_tokens(c), "imgid": imgid, "sentid": sentid})
            sentid += 1
        images.append({"filename": filename, "filepath": split, "split": split, "imgid": imgid,
                       "sentids": [s["sentid"] for s in sentences], "sentences": sentences})  # fmt: skip
        dense[str(imgid)] = dense_caption(scene)
        lines.append(json.dumps({"imgid": imgid, "split": split, "family": r["family"], "variant": r["variant"],
                                 "scene": scene.to_dict()}))  # fmt: skip

    write_json(out / "dataset.json", {"dataset": "world", "images": images}, indent=None)
    write_json(out / "dense.json", dense, indent=None)
    atomic_write_text(out / "scenes.jsonl", "\n".join(lines) + ("\n" if lines else ""))
    counts = {s: getattr(cfg, f"n_{s}") for s in SPLITS}
    write_json(out / "world.json", {"key": key, "version": WORLD_VERSION, "config": _content_config(cfg),
                                    "counts": counts, "vocabulary": vocabulary(),
                                    "sha256": content_hashes(out)})  # fmt: skip
    return out


HASHED = ("dataset.json", "dense.json", "scenes.jsonl")
"""The files whose SHA-256 ``world.json`` records (``"sha256"``): the captions, dense captions and scene graphs."""


def content_hashes(out: Path) -> dict[str, str]:
    """``{file: sha256}`` of the world's :data:`HASHED` files in ``out``."""
    return {name: _sha256(out / name) for name in HASHED if (out / name).is_file()}


def _sha256(path: Path) -> str:
    with path.open("rb") as f:  # in chunks: a world's files are as large as its splits
        return hashlib.file_digest(f, "sha256").hexdigest()


def edited_files(out: Path) -> list[str]:
    """The :data:`HASHED` files of the complete world in ``out`` whose content is no longer what ``world.json``
    recorded when finecap made it (a world made before hashes were recorded: none)."""
    recorded = read_json(out / "world.json").get("sha256")
    if not isinstance(recorded, dict):
        return []
    now = content_hashes(out)
    return [name for name in HASHED if name in recorded and recorded[name] != now.get(name)]


def load_scene_records(out: Path | str) -> list[dict[str, Any]]:
    """The lines of ``out/scenes.jsonl`` with ``"scene"`` parsed into :class:`Scene`."""
    path = Path(out) / "scenes.jsonl"
    if not path.exists():
        make = shell_command(["finecap", "world", "make", "--out", out])
        raise FileNotFoundError(f"{path}: no scene graphs here; run `{make}` first")
    records = []
    for lineno, line in enumerate(read_lines(path), 1):  # each line within LINE
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if not isinstance(r, dict) or type(r.get("imgid")) is not int:
                raise ValueError(f"a JSON object with an integer 'imgid' and a 'scene' expected, not {line[:80]}")
            r["scene"] = Scene.from_dict(r["scene"])
        except (json.JSONDecodeError, KeyError, ValueError) as e:
            raise ValueError(f"{path}, line {lineno}: invalid scene record: {e}") from None
        records.append(r)
    return records


def load_scenes(out: Path | str) -> dict[int, Scene]:
    """``{imgid: Scene}`` of the world at ``out``."""
    return {r["imgid"]: r["scene"] for r in load_scene_records(out)}


def ensure_world(cfg: Config, make: bool, progress: bool = True) -> Path:
    """The folder of the complete world of ``cfg.world`` (:func:`finecap.home.world_path`), made first when it is
    missing and ``make``, with one logged line saying so and where; otherwise a missing world raises
    ``FileNotFoundError`` naming ``finecap world make``. A folder finecap may not write raises
    :class:`~finecap.world.make.WorldFolderError` (before anything is written)."""
    w = cfg.world
    path = world_path(w)
    if check_world_folder(w, path):
        log.debug("world: the world %s is complete: %s", world_key(w), path)
        return path
    if not make:
        raise FileNotFoundError(
            f"{path}: no complete world of world.* here (finecap makes it only for a command that trains on the "
            "world); make it with `finecap world make` and the same world.* settings"
        )
    record = world_record(path) if path.is_dir() else None
    replacing = ""
    if record is not None and record["key"] != world_key(w):
        replacing = f", replacing the finecap world {record['key']} there (world.overwrite)"
    log.info("world: making the world %s (%d train / %d val / %d test images, %d px) in %s%s", world_key(w),
             w.n_train, w.n_val, w.n_test, w.image_size, path, replacing)  # fmt: skip
    return make_world(w, path, progress=progress)
