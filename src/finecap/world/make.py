"""Write the world data set: images, Karpathy-style captions, dense captions and scene graphs (``finecap world make``,
:mod:`finecap.app.world`, calls :func:`make_world`).

Layout of ``out``::

    dataset.json    {"dataset": "world", "images": [{"filename": "000000.png", "filepath": "train", "split",
                     "imgid", "sentids", "sentences": [{"raw", "tokens", "imgid", "sentid"}]}]}
    dense.json      {str(imgid): dense caption}
    scenes.jsonl    {"imgid", "split", "family", "variant", "scene": Scene.to_dict()} per line
    world.json      {"key", "version", "config", "counts", "vocabulary"}; written last, marks a complete world
    images/<split>/<imgid:06d>.png

``imgid`` runs over train, then val, then test. Everything is a function of the world config: scene ``imgid`` of a
split is drawn from ``random.Random(f"{seed}-{split}-{index}")`` (families: one generator per family), captions
from ``random.Random(f"{seed}-captions-{imgid}")``. ``family`` is null when families are off; otherwise scenes of
one family share the id and lie in one split (the last family of a split may be smaller).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

from tqdm import tqdm

from finecap.config import WorldConfig
from finecap.utils import atomic_write_text, read_json, write_json
from finecap.world.captions import dense_caption, reference_captions, vocabulary
from finecap.world.render import render
from finecap.world.scene import Scene, sample_family, sample_scene
from finecap.world.shift import scene_settings

WORLD_VERSION = 2
"""Bump when scenes, rendering or captions change, so cached worlds (and everything keyed on them) are rebuilt."""
SPLITS = ("train", "val", "test")


def world_key(cfg: WorldConfig) -> str:
    """Content hash of everything that determines the world's files (all config fields except ``out``)."""
    content = {"version": WORLD_VERSION, **_content_config(cfg)}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def _content_config(cfg: WorldConfig) -> dict[str, Any]:
    d = {k: v for k, v in vars(cfg).items() if k != "out"}
    if d.get("shift") == "none":  # the training domain keeps the key it had before world.shift existed
        d.pop("shift")
    return d


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


def make_world(cfg: WorldConfig, out: Path | str | None = None, progress: bool = True) -> Path:
    """Write the world of ``cfg`` to ``out`` (default ``cfg.out``); skip when it is already there. Returns ``out``."""
    out = Path(out if out is not None else cfg.out)
    key = world_key(cfg)
    if is_complete(out, key):
        return out
    (out / "world.json").unlink(missing_ok=True)
    if (out / "images").exists():
        shutil.rmtree(out / "images")
    for split in SPLITS:
        (out / "images" / split).mkdir(parents=True, exist_ok=True)

    records = generate_scenes(cfg)
    images, dense, lines = [], {}, []
    sentid = 0
    for r in tqdm(records, desc=f"world -> {out}", unit="img", disable=not progress, mininterval=0.5):
        scene: Scene = r["scene"]
        imgid, split = r["imgid"], r["split"]
        filename = f"{imgid:06d}.png"
        render(scene, cfg.image_size).save(out / "images" / split / filename, compress_level=1)
        tag = scene_settings(cfg)[3]
        caps = reference_captions(scene, random.Random(f"{cfg.seed}-{tag}captions-{imgid}"), style=cfg.shift)
        sentences = []
        for c in caps:
            sentences.append({"raw": c, "tokens": c.split(), "imgid": imgid, "sentid": sentid})
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
                                    "counts": counts, "vocabulary": vocabulary()})  # fmt: skip
    return out


def load_scene_records(out: Path | str) -> list[dict[str, Any]]:
    """The lines of ``out/scenes.jsonl`` with ``"scene"`` parsed into :class:`Scene`."""
    path = Path(out) / "scenes.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no scene graphs here; run `finecap world make --out {out}` first")
    records = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                r["scene"] = Scene.from_dict(r["scene"])
            except (json.JSONDecodeError, KeyError, ValueError) as e:
                raise ValueError(f"{path}, line {lineno}: invalid scene record: {e}") from None
            records.append(r)
    return records


def load_scenes(out: Path | str) -> dict[int, Scene]:
    """``{imgid: Scene}`` of the world at ``out``."""
    return {r["imgid"]: r["scene"] for r in load_scene_records(out)}
