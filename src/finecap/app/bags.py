"""``finecap bags build``: TrueMatch bags of similar images (NDLB Algorithms 1-2) for one split of a data set.

``finecap bags build --data DATA --split test --sizes 3,5,7 --out bags.json`` calls :func:`main`: it embeds the split
with the configured retriever (``retriever.checkpoint``, or the trained world encoder), builds and curates the bags
(:mod:`finecap.data.truematch`, where the JSON layout is described) and writes them; ``finecap eval --bags`` reads
them back (:func:`finecap.data.bags_file.read_bags`). The file names the data set by its absolute path (``"data"``)
and records its fingerprint (``"fingerprint"``: content, caption field ``bags.text_from``, split), so readers find
the data from any directory and refuse other data (:func:`finecap.train.fingerprint.bags_file_data`).
With ``bags.keep_hardest`` below 1 it keeps only that share of each size's curated bags, the most similar first
(NDLB's filter, automated: :func:`finecap.data.truematch.keep_hardest`). On a world
with scene families it also reports how often a bag lies within one family, next to random bags of the same size.

The file records what built it (:func:`built_from`): the data's fingerprint, the retriever's
(``"retriever_fingerprint"``: its weights, :func:`finecap.train.fingerprint.bags_retriever_fingerprint`), the sizes,
``eval.bag_similarity``, ``bags.keep_hardest`` and the three settings that change the embeddings the bags are built
from: ``retriever.long_text`` (how captions longer than the text window are embedded), ``data.jpeg_draft`` (how
JPEGs are decoded) and ``retriever.batch_size_eval`` (the batches they are embedded in: another batch shape is other
float rounding, so other similarities). The image budget (``data.max_image_pixels``, ``data.max_aspect_ratio``) is
not recorded: it refuses an image, failing the build, and changes no pixel of an image it admits
(:class:`finecap.data.images.ImageLimits`), so bags built under another budget are the bags it builds. A pipeline
that builds its bags once and reads them back (the demo's report, scene-family, transfer and VCB stages) goes through
:func:`reuse_bags`: a file whose record differs from what would build it now is built again, or, when the user made
it, refused and never replaced.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finecap.config import Config
from finecap.data.caption_fields import select_captions
from finecap.data.formats import format_options
from finecap.data.references import data_source, load_references, require_captions
from finecap.data.truematch import Bag, build_bags, family_purity, keep_hardest, random_bag_purity, record_embeddings
from finecap.home import cache_dir, world_path
from finecap.models.retriever import load_retriever
from finecap.models.world_encoder_cache import encoder_dir
from finecap.outputs import OutputRefused, check_not_among, check_output_file, made_by_finecap, write_output_json
from finecap.train.fingerprint import bags_data_fingerprint, bags_retriever_fingerprint, differences
from finecap.train.prepare import prepare
from finecap.utils.files import refuse_link
from finecap.utils.reading import DATA_FILE, read_json

log = logging.getLogger(__name__)


def parse_sizes(sizes: str | Sequence[int]) -> list[int]:
    """``"3,5,7"`` or ``[3, 5, 7]`` -> ``[3, 5, 7]`` (each >= 2, sorted, without repeats). An empty item
    (``"3,,2"``, ``"3,5,"``) is a ``ValueError`` naming ``--sizes``: a size typed and lost would otherwise be
    dropped without a word.

    Example::

        >>> parse_sizes("7,3, 5,3")
        [3, 5, 7]
    """
    if isinstance(sizes, str):
        items = sizes.split(",")
        if any(not s.strip() for s in items):
            raise ValueError(f"--sizes: {sizes!r} has an empty item (two commas in a row, or one at an end); give "
                             "comma-separated bag sizes, e.g. 3,5,7")  # fmt: skip
        try:
            values = [int(s) for s in items]
        except ValueError:
            raise ValueError(f"--sizes: expected comma-separated integers, got {sizes!r}") from None
    else:
        values = [int(s) for s in sizes]
    if not values or min(values) < 2:
        raise ValueError(f"--sizes: need bag sizes >= 2, got {sizes!r}")
    return sorted(set(values))


FINGERPRINTS = ("fingerprint", "retriever_fingerprint")
"""The keys of :func:`built_from` that are fingerprints, compared as such (a recorded ``None`` is unknown, the path
where the input was is not compared: :func:`finecap.train.fingerprint.differences`)."""


def built_from(cfg: Config, *, data: str | Path | None, split: str, sizes: str | Sequence[int]) -> dict[str, Any]:
    """What a bags file of ``split`` of ``data`` (default: the configured data set) in ``sizes`` built with ``cfg``
    records about what built it (:func:`main` writes these keys): the data's fingerprint (with the caption field
    ``bags.text_from`` and the split), the retriever's (its weights), the sizes, ``eval.bag_similarity``,
    ``bags.keep_hardest``, ``retriever.long_text`` (a caption longer than the text window cut, refused or pooled over
    windows: :meth:`finecap.models.retriever.Retriever.text_features`), ``data.jpeg_draft`` (a JPEG draft-decoded
    or decoded at full size: :attr:`finecap.models.retriever.Retriever.draft`) and ``retriever.batch_size_eval`` (the
    batches images and captions are embedded in: other batch shapes round otherwise, and the embeddings differ in
    their last bits), the last three as the embeddings :func:`main` builds the bags from depend on them. The image
    budget is not among them (module docstring). A world encoder not trained yet has no weights to fingerprint
    (``None``: not compared)."""
    fmt, path = data_source(cfg, data)
    fingerprint = bags_data_fingerprint(fmt, path, captions=cfg.bags.text_from, split=split,
                                        options=format_options(fmt, cfg))  # fmt: skip
    return {"fingerprint": fingerprint, "retriever_fingerprint": bags_retriever_fingerprint(cfg),
            "sizes": parse_sizes(sizes), "similarity": cfg.eval.bag_similarity,
            "keep_hardest": cfg.bags.keep_hardest, "long_text": cfg.retriever.long_text,
            "jpeg_draft": cfg.data.jpeg_draft, "batch_size_eval": cfg.retriever.batch_size_eval}  # fmt: skip


def built_differently(path: str | Path, now: dict[str, Any]) -> list[str]:
    """How the bags file ``path`` was built otherwise than ``now`` (:func:`built_from`), one ``"key: recorded -> now"``
    per difference; a key the file does not record (a bags file built before finecap recorded it, or not one of
    ``finecap bags build``) is one, as is a file that is no JSON object. Empty: built from the same inputs."""
    try:
        raw = read_json(path, DATA_FILE)
    except (ValueError, OSError, RecursionError) as e:
        return [f"not readable as a bags file ({e})"]
    if not isinstance(raw, dict):
        return ["not a bags file of `finecap bags build` (no JSON object)"]
    out = []
    for key, value in now.items():
        if key not in raw:
            out.append(f"{key}: not recorded")
        elif key in FINGERPRINTS and isinstance(raw[key], dict):
            out += [f"{key} {d}" for d in differences(raw[key], value)]
        elif raw[key] != value:
            out.append(f"{key}: {raw[key]!r} -> {value!r}")
    return out


def reuse_bags(cfg: Config, *, out: str | Path, data: str | Path | None = None, split: str = "test",
               force: bool = False) -> Path:  # fmt: skip
    """The bags file ``out`` of ``split`` of ``data`` (default: the configured data set) in sizes ``eval.bag_sizes``,
    built once and read back by a pipeline (the demo): built by :func:`main` when missing, when ``force``, or when what
    built it differs from what would build it now (:func:`built_differently`: another data set or world, another
    retriever, other sizes, ``eval.bag_similarity``, ``bags.keep_hardest``, ``retriever.long_text``,
    ``data.jpeg_draft`` or ``retriever.batch_size_eval``; a file recording none of it). Only a
    bags file finecap made (:func:`finecap.outputs.made_by_finecap`) is built again over: a file of the user's there
    that would be is refused (:class:`~finecap.outputs.OutputRefused` naming it, what differs and the way out) and
    never replaced, ``force`` or not. Returns ``out``."""
    out = Path(out)
    refuse_link(out)  # never read through, never written through
    sizes = cfg.eval.bag_sizes
    now = None  # what would build it, computed once (it hashes the retriever's weights) and handed to main
    if out.exists():
        if force:
            why = ["made again on request (--force)"]
        else:
            now = built_from(cfg, data=data, split=split, sizes=sizes)
            why = built_differently(out, now)
            if not why:
                log.info("%s: bags built from the same inputs; reused", out)
                return out
        if not made_by_finecap(out, ("bags",)):
            raise OutputRefused(
                f"{out}: bags finecap did not make (or changed since) would be built again here ({'; '.join(why)}); "
                "finecap never replaces them: move the file away for finecap to build its own, or use another run "
                "directory"
            )
        log.info("%s: building the bags again (%s)", out, "; ".join(why))
    main(cfg, data=data, split=split, sizes=sizes, out=out, made=now)
    return out


def mean_similarity(bags: Sequence[Bag]) -> float:
    """Mean intra-bag similarity ``alpha`` of ``bags`` (at least one)."""
    return sum(b.similarity for b in bags) / len(bags)


def main(
    cfg: Config, *, data: str | Path | None = None, split: str = "test", sizes: str | Sequence[int] = "3,5,7",
    out: str | Path, force: bool = False, recipe: str | Path | None = None, made: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Bags of ``split`` of ``data`` (default: the configured data set / world), written to ``out``; returns the
    JSON written and logs one line per size (with family purity on a world with families). ``out`` may not be the
    data set or one of its images (nor ``recipe``, the file the configuration came from, nor a file of the retriever
    checkpoint, or of the world encoder's folder when ``retriever.checkpoint`` is empty and that is the retriever),
    nor an existing file finecap did not make unless ``force``. Every image of the split needs a reference caption
    (of ``bags.text_from``): its text embedding is half of the image's multimodal embedding. ``made``: what built the
    bags (:func:`built_from` of the same arguments), when the caller computed it already (:func:`reuse_bags`); it
    hashes the retriever's weights, so it is computed once."""
    size_list = parse_sizes(sizes)
    data_set = data or cfg.data.path or world_path(cfg.world)
    inputs = {"--data": data_set, "image folder (data.images)": cfg.data.images or None, "recipe": recipe,
              "retriever.checkpoint": cfg.retriever.checkpoint or None,  # the retriever read: this, or else ...
              "world encoder (retriever.checkpoint is empty)": None if cfg.retriever.checkpoint else encoder_dir(cfg),
              }  # fmt: skip
    check_output_file(out, inputs, force=force, kind="bags")
    if data is None:
        prepare(cfg, {"data"}, make=False)  # the world checked (never made here) when it is the data
    refs = load_references(cfg, data, split=split, check_images=True)
    check_not_among(out, [r.path for r in refs.records if not r.embedded], what=f"an image of {refs.path}",
                    option="--out")  # fmt: skip
    records = select_captions(refs.records, cfg.bags.text_from, refs.path, key="bags.text_from")
    require_captions(records, refs.path, refs.format, f"split {split!r}")  # a folder's images may have none
    if size_list[-1] > len(records):  # said before the split is embedded, naming the option and the split
        raise ValueError(f"--sizes: a bag of {size_list[-1]} needs {size_list[-1]} images; split {split!r} of "
                         f"{refs.path} holds {len(records)}")  # fmt: skip
    retriever = load_retriever(cfg)
    emb = record_embeddings(retriever, records, cache_dir(cfg.run))
    ids = [r.image_id for r in records]
    curated = build_bags(emb, size_list, ids, similarity=cfg.eval.bag_similarity, device=retriever.device)
    bags = {s: keep_hardest(curated[s], cfg.bags.keep_hardest) for s in size_list}
    if made is None:
        made = built_from(cfg, data=data, split=split, sizes=size_list)  # the data as load_references read it
    result: dict[str, Any] = {
        "split": split,
        "data": made["fingerprint"]["path"],  # absolute (a Hub name as given)
        "fingerprint": made["fingerprint"],
        "n_images": len(records),
        "similarity": made["similarity"],
        "retriever": retriever.name,
        "retriever_fingerprint": made["retriever_fingerprint"],
        "sizes": made["sizes"],
        "bags": {str(s): [b.to_dict() for b in bags[s]] for s in size_list},
        "keep_hardest": made["keep_hardest"],
        "long_text": made["long_text"],
        "jpeg_draft": made["jpeg_draft"],
        "batch_size_eval": made["batch_size_eval"],
        "curated": {str(s): len(curated[s]) for s in size_list},
        "alpha_curated": {str(s): mean_similarity(curated[s]) for s in size_list if curated[s]},
    }
    families = refs.families
    largest_family = 0
    if families and any(f is not None for f in families.values()):
        sizes_of = Counter(families.get(i) for i in ids if families.get(i) is not None)
        largest_family = max(sizes_of.values(), default=0)
        result["family_purity"] = {str(s): family_purity(bags[s], families) if bags[s] else 0.0 for s in size_list}
        result["family_purity_random"] = {
            str(s): random_bag_purity(ids, families, s, cfg.eval.seed) for s in size_list
        }
    write_output_json(out, result, "bags")
    for s in size_list:
        sims = [b.similarity for b in bags[s]]
        line = f"bags of {s}: {len(bags[s])} (covering {len(bags[s]) * s} of {len(records)} images)"
        if len(bags[s]) < len(curated[s]):
            line += f", the hardest {cfg.bags.keep_hardest:.0%} of {len(curated[s])} curated (bags.keep_hardest)"
        if sims:
            line += f", similarity {max(sims):.3f} .. {min(sims):.3f} (mean {mean_similarity(bags[s]):.3f})"
        if "family_purity" in result:
            line += (f", within one family {result['family_purity'][str(s)]:.1%} "
                     f"(random bags {result['family_purity_random'][str(s)]:.1%})")  # fmt: skip
            if s > largest_family:
                line += f" [bags larger than the largest family ({largest_family}) cannot be pure]"
        log.info(line)
    log.info("wrote %s", out)
    return result
