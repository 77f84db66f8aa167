"""``finecap caption``: caption a data split, or image files, with a trained checkpoint and write COCO results.

``finecap caption --checkpoint CKPT --split test --out results.json [RECIPE] [decode.beam_size=3 ...]`` calls
:func:`main`. ``CKPT`` is a checkpoint folder (``runs/x/checkpoints/best``), a run directory (its best checkpoint,
else its last), a checkpoint's ``model/`` folder (its checkpoint: the configuration stored beside it is used) or a
bare model folder; any other folder is an error naming the folder to pass
(:func:`finecap.runs.find_checkpoint`). A relative ``CKPT`` that is not in the working directory is looked for
under the runs root, as ``train.init_from`` is (:func:`finecap.inference.checkpoint_where`): ``--checkpoint demo/mle``
is the run ``finecap train demo/mle`` wrote.

``finecap caption --checkpoint CKPT --images DIR_OR_FILE ... --out results.json`` captions images that belong to no
data set (no references needed): every image file under the folders (recursive) and the files named, with the ids of
:mod:`finecap.inference` (integers when every file name is a number, as COCO's, else relative paths), through
:func:`finecap.inference.caption_images`, the function the Python API (:class:`finecap.api.Captioner`) uses too.
``--skip-bad-images`` (``data.skip_bad_images=true``) leaves out the images that do not decode, and those the
model's preprocessing refuses (:class:`~finecap.data.images.ImageRefused`: Mistral 3 an image of one image token),
and counts them; every one, with its reason, is listed in ``<out>.skipped.json`` (:func:`write_skipped`), for
``--images`` and a split alike.

What it decodes with, lowest layer first:

1. the checkpoint's own configuration (its ``config.yaml``, else its run's): the data the model was trained on
   (``data.*``, ``world.out``) and the decoding settings it was evaluated with (``decode.*``: beam 5 in the demo);
2. a recipe given on the command line, then the ``section.key=value`` overrides: only the keys actually given
   replace the checkpoint's (``decode.strategy=greedy`` alone keeps the checkpoint's ``decode.max_length``);
3. ``--data FILE`` replaces the data set (its format detected, :func:`finecap.data.formats.detect_format`).

A bare model folder has no configuration: the library defaults, the recipe and the overrides apply, as for training;
captioning a split then needs the data named (``--data``, a recipe, ``data.*`` or ``world.*``), or ``--images``.

Before decoding, the checkpoint's recorded fingerprints (:mod:`finecap.train.fingerprint`) are checked: the
captioner's vision encoder it refers to must be the one it was trained with, and, unless the data was chosen on the
command line (``--data``, a recipe, ``data.*`` or ``world.*`` overrides), the data must be the run's; otherwise
it stops with an error naming both fingerprints (exit 2). Decoding is :func:`finecap.caption.generate_captions`
(frozen encoders read images through the image-feature cache), by finecap's decoder or, with ``--engine vllm``
(``decode.engine=vllm``), by a vLLM engine serving the captioner (:mod:`finecap.engines.vllm`; docs/scaling.md).

A run still training may swap a new ``best`` in while it is captioned: the checkpoint is read under one hold of the
run's swap guard (:func:`finecap.runs.reading_checkpoint`), from its ``config.yaml`` and fingerprints to its weights,
so the captions are one save's, decoded with that save's settings; the hold ends once the model is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finecap.app.caption_partial import PartialResults, beside, kept_where
from finecap.caption import generate_captions
from finecap.config import Config, DataConfig, HfDataConfig, load_stored, masked_url_values, parse_override
from finecap.data.datasets import load_records, split_places, whole_split
from finecap.data.formats import data_format, detect_format
from finecap.data.images import ImageLimits
from finecap.data.loading import encoder_draft
from finecap.data.records import DataError
from finecap.data.references import MissingSplit
from finecap.data.results import empty_captions_note, write_results
from finecap.engines import engine_class, open_engine
from finecap.errors import elsewhere_by, relayed, together
from finecap.home import world_path
from finecap.inference import caption_images, checkpoint_where, describe_skipped, image_files, load_for_captioning
from finecap.outputs import (
    check_not_among,
    check_not_input,
    check_output_file,
    check_writable,
    digest,
    made_by_finecap,
    write_output_json,
)
from finecap.recipes import resolve_recipe
from finecap.runs import find_checkpoint, model_dir, reading_checkpoint, stored_config
from finecap.train.checkpoint import folder_config
from finecap.train.engine import make_accelerator
from finecap.train.fingerprint import check_run

log = logging.getLogger(__name__)


@dataclass
class CaptionSetup:
    """What :func:`main` decodes with: the checkpoint, its configuration with the command line's changes on top,
    where that configuration came from, and whether the data was chosen on the command line."""

    checkpoint: Path
    cfg: Config
    config_file: Path | None
    data_from_command_line: bool


SPLIT_OPTIONS = ("val_fraction", "test_fraction", "split_seed")
"""The ``data`` options that split a data set's images without a split of their own (:mod:`finecap.data.splits`)."""


DATA_SET_OPTIONS = (*SPLIT_OPTIONS, "allow_outside_paths")
"""``data`` options that describe the training data set, reset to their defaults when ``--data`` names another (the
``data.hf`` columns too), unless given on the command line."""


def resolve(
    checkpoint: str | Path,
    *,
    data: str | Path | None = None,
    recipe: str | None = None,
    overrides: Sequence[str] = (),
    skip_bad_images: bool = False,
    labels: dict[str, str] | None = None,
) -> CaptionSetup:
    """The checkpoint meant by ``checkpoint`` and the configuration to caption with (module docstring);
    ``skip_bad_images`` (``--skip-bad-images``) sets ``data.skip_bad_images`` without counting as choosing the data;
    ``labels``: the command-line options some ``overrides`` stand for (``{"decode.engine=x": "--engine x"}``), which
    an error about one names (:func:`finecap.config.load`)."""
    overrides = list(overrides)
    ckpt = find_checkpoint(checkpoint_where(checkpoint, given_root(overrides)))
    stored = stored_config(ckpt)
    if stored is not None:
        cfg = load_stored(stored, overrides, recipe=recipe, labels=labels)
        if data is None:
            check_same_splits(load_stored(stored), cfg)
    else:  # an export or bare model folder: its generation_config.json gives the decoding
        cfg = folder_config(model_dir(ckpt), recipe, overrides, labels)
    given = {parse_override(item)[0][0] for item in overrides}
    if data is not None:
        named = any(parse_override(o)[0] == ["data", "format"] for o in overrides)
        if named and not Path(data).exists() and data_format(cfg.data.format).hub_names:  # a Hub name (hf)
            fmt, path = cfg.data.format, Path(data)
        else:
            fmt, path = detect_format(data)
        fmt = cfg.data.format if named else fmt
        # the new data set's images, not the training data's: an image folder is its own root, a file's relative paths
        # read from its own folder, unless data.images is given here. Only the command line's data.* count: a recipe's
        # describe the data set it trains on (a coco/* recipe's data.images is COCO's), as the checkpoint's do
        keys = [parse_override(o)[0] for o in overrides]
        images_given = ["data", "images"] in keys
        folder = {} if images_given and not data_format(fmt).own_image_root else {"images": ""}
        # the training data set's split fractions (own/mle holds 10 % out for validation) and columns are not the new
        # data set's: defaults unless given here (a folder's images are all in its one split)
        fresh = {k: DataConfig.__dataclass_fields__[k].default for k in DATA_SET_OPTIONS if ["data", k] not in keys}
        columns = {f.name: f.default for f in dataclasses.fields(HfDataConfig)  # given as data.hf.X or data.X
                   if ["data", "hf", f.name] not in keys and ["data", f.name] not in keys}  # fmt: skip
        data_cfg = dataclasses.replace(cfg.data, format=fmt, path=str(path), hf=dataclasses.replace(cfg.data.hf,
                                       **columns), **folder, **fresh)  # fmt: skip
        cfg = dataclasses.replace(cfg, data=data_cfg)
    if skip_bad_images:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, skip_bad_images=True))
    from_command_line = data is not None or recipe is not None or bool(given & {"data", "world"})
    return CaptionSetup(ckpt, cfg, stored, from_command_line)


def given_root(overrides: Sequence[str]) -> str:
    """The runs root ``overrides`` give (``run.root=...``), where a relative checkpoint is looked for; ``""``: the
    home's (:func:`finecap.inference.checkpoint_where`)."""
    return next((str(v) for k, v in map(parse_override, overrides) if k == ["run", "root"]), "")


def check_same_splits(run: Config, cfg: Config) -> None:
    """Refuse to caption the data set a run trained on (``run``: its stored configuration) split otherwise (``cfg``:
    with the command line's changes): other fractions or seed move images the run trained or validated on into the
    split captioned, and their scores would be those of training images. Another data set (``data.path``) is free."""
    if (cfg.data.format, cfg.data.path) != (run.data.format, run.data.path):
        return
    for key in SPLIT_OPTIONS:
        theirs, ours = getattr(run.data, key), getattr(cfg.data, key)
        if theirs != ours:
            raise ValueError(
                f"data.{key}={ours}: the run was trained on this data set split with data.{key}={theirs}; split "
                "otherwise, the split captioned would hold images the run trained or validated on. Caption images "
                "it never saw: --images FOLDER, or --data FILE of captions it was not trained on"
            )


def describe_decoding(cfg: Config) -> str:
    """The decoding settings that matter for ``decode.strategy``, e.g. ``beam (beam_size=3, length_penalty=1.0,
    finished_beams=keep, max_length=24)``."""
    d = cfg.decode
    aside = ["early_stopping"] if d.finished_beams == "set_aside" else []
    keys = {"greedy": [], "beam": ["beam_size", "length_penalty", "finished_beams", *aside],
            "sample": ["temperature", "top_k", "top_p"]}  # fmt: skip
    shown = [*keys[d.strategy], "max_length"] + (["num_return_sequences"] if d.num_return_sequences != 1 else [])
    return f"{d.strategy} ({', '.join(f'{k}={getattr(d, k)}' for k in shown)})"


def decode_changes(recipe: str | None, overrides: Sequence[str]) -> str:
    """What the command line put on top of the checkpoint's decoding settings, as the status line says it: the
    recipe and the ``decode.*`` overrides, e.g. ``", with decode.beam_size=3 from the command line"``; ``""`` when
    neither.

    Example::

        >>> decode_changes(None, ["decode.beam_size=3", "data.images=x"]), decode_changes(None, ["data.images=x"])
        (', with decode.beam_size=3 from the command line', '')
        >>> decode_changes("demo/mle", [])
        ', with the recipe demo/mle on top'
    """
    decode = [item for item in overrides if parse_override(item)[0][0] == "decode"]
    given = ([f"the recipe {recipe}"] if recipe else []) + ([", ".join(decode)] if decode else [])
    if not given:
        return ""
    return f", with {' and '.join(given)} {'from the command line' if decode else 'on top'}"


SKIPPED_SUFFIX = ".skipped.json"
"""What the list of the images ``--skip-bad-images`` left out of ``--out X`` is named: ``X.skipped.json`` beside it
(docs/caption.md)."""


def write_skipped(out: Path, images: int, skipped: Sequence[tuple[Any, Any, str]]) -> Path | None:
    """Write every image left out of the ``images`` asked for (``skipped``: ``(image_id, path, reason)``; the files
    of ``--images`` or the records of a split) to ``out``'s :data:`SKIPPED_SUFFIX` file (:func:`beside`) as strict
    JSON ``{"results": OUT, "images": N, "skipped": [{"image_id", "path", "reason"}, ...]}``, atomically; return its
    path. Nothing skipped: nothing written, and such a file an earlier run left there (finecap's own, by content)
    removed, so that it never describes other results; ``None``."""
    path = beside(out, SKIPPED_SUFFIX)
    if not skipped:
        if path.is_file() and not path.is_symlink() and made_by_finecap(path, ("skipped",)):
            path.unlink()
            log.info("caption: removed %s (an earlier run's list of skipped images; none skipped now)", path)
        return None
    rows = [{"image_id": image_id, "path": str(where), "reason": reason} for image_id, where, reason in skipped]
    write_output_json(path, {"results": str(out), "images": images, "skipped": rows}, "skipped")
    return path


def listed_images(images: Sequence[tuple[Any, str]]) -> dict[str, Any]:
    """What identifies the images a run captions, for its header (:func:`caption_header`): their count and a digest
    of their ids and files in their order (``id<TAB>file`` lines), ``{"images": N, "files": SHA256}``; ``images``:
    ``(image_id, file)`` pairs, the files absolute (an embedded image: its name). A digest, not the list: a split of
    100k images would make the header megabytes. The files are their paths, not their bytes: an image rewritten in
    place under the same path is not seen (docs/caption.md#a-stopped-run-resumes)."""
    listed = "\n".join(f"{image_id}\t{path}" for image_id, path in images)
    return {"images": len(images), "files": digest(listed.encode("utf-8", "surrogateescape"))}


def caption_header(setup: CaptionSetup, cfg: Config, images: dict[str, Any], fingerprints: Path | None) -> dict:
    """What makes a run's captions, the first line of its partial results file: the checkpoint (its folder, the
    sizes and times of its model files, its recorded fingerprints), the model options, the decoding settings, the
    seed, the data options but ``data.num_workers`` and ``data.skip_bad_images``, and ``images``, what names the
    images (``--images``: :func:`listed_images` of the files; a split: its name, the world options and
    :func:`listed_images` of the split's images in its order, those ``--skip-bad-images`` leaves out too). The
    credentials of any URL in it are masked (:func:`~finecap.config.masked_url_values`): the file is kept when the run
    stops, and an option given as a URL with a password (given again: the stored ``config.yaml`` masks it) wrote it
    there; a resumed run's header is masked the same way, so the two compare."""
    folder = model_dir(setup.checkpoint)
    model_files = sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                         for p in folder.rglob("*") if p.is_file())  # fmt: skip
    # not what makes a caption: the worker count, and whether a bad image stops the run (--skip-bad-images resumes
    # a run a bad image stopped)
    data = {k: v for k, v in dataclasses.asdict(cfg.data).items() if k not in ("num_workers", "skip_bad_images")}
    header = {
        "checkpoint": str(Path(setup.checkpoint).resolve()),
        "model files": digest(json.dumps(model_files).encode()),
        "fingerprints": digest(fingerprints.read_bytes()) if fingerprints is not None else None,
        "model": dataclasses.asdict(cfg.model),
        "mixed_precision": cfg.train.mixed_precision,
        "decode": dataclasses.asdict(cfg.decode),
        "seed": cfg.run.seed,
        "data": data,
        **images,
    }
    return masked_url_values(header)


def main(
    cfg: Config | None = None,
    *,
    checkpoint: str | Path,
    split: str | None = None,
    out: str | Path,
    data: str | Path | None = None,
    images: Sequence[str | Path] | None = None,
    recipe: str | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
    skip_bad_images: bool = False,
    labels: dict[str, str] | None = None,
) -> Path:
    """Caption ``split`` (default ``test``), or the image files and folders ``images``, with the captioner of
    ``checkpoint``; write COCO results JSON to ``out`` (the first caption of each image); return ``out``.

    Without ``cfg``, the configuration is the checkpoint's with ``recipe``, ``overrides`` and ``data`` on top (module
    docstring). A ``cfg`` given by a caller is used as it is (its ``data.path`` replaced by ``data`` when given).
    ``skip_bad_images``: ``data.skip_bad_images=true`` (images that do not decode or the model refuses left out and
    counted). Runs on every process of an ``accelerate launch``; only the main process writes. ``labels``: the
    command-line options some ``overrides`` stand for, which an error about one names (:func:`resolve`). ``out`` may
    not be one of the inputs (the checkpoint's folder, the data set or an image it names, the images), nor an
    existing file finecap did not make unless ``force``.

    Captions are kept as they are made in ``<out>.partial.jsonl`` (:class:`PartialResults`; under several
    processes each other process's part in ``<out>.partial.<rank>.jsonl``): a run stopped, or whose ``out`` could not
    be written, says how many, and the same call again, in any number of processes, resumes from them (``force``:
    starts over), writing ``out`` as a run never stopped would, then removing those files
    (docs/caption.md#a-stopped-run-resumes).
    """
    if images is not None and (data is not None or split is not None):
        raise ValueError("--images captions image files, --data and --split a data set's split: give one or the other")
    split_given = split is not None
    split = split or "test"
    root = cfg.run.root if cfg is not None else given_root(overrides)
    # the checkpoint is held from its config.yaml to its weights (finecap.runs.reading_checkpoint): one save's files,
    # never some of the best a run still training swaps in meanwhile; released once the model is loaded
    with contextlib.ExitStack() as hold:
        found = hold.enter_context(reading_checkpoint(checkpoint_where(checkpoint, root)))
        if cfg is None:
            setup = resolve(
                found, data=data, recipe=recipe, overrides=overrides, skip_bad_images=skip_bad_images, labels=labels
            )
        else:
            if data:
                cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(data)))
            if skip_bad_images:
                cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, skip_bad_images=True))
            setup = CaptionSetup(found, cfg, None, True)
        changes = decode_changes(recipe, overrides) if cfg is None else ""  # a caller's cfg is used as it is
        cfg = setup.cfg
        recipe_file = resolve_recipe(recipe) if recipe else None
        if images is not None:
            files = image_files(images, allow_outside=cfg.data.allow_outside_paths)
            named = listed_images([(f.image_id, os.path.abspath(f.path)) for f in files])
            places = None  # a line's KEY is the image's place in the files
            for source in images:  # one by one: each is the command's --images
                check_not_input(out, {"--images": source}, option="--out")
            inputs = {"--checkpoint": setup.checkpoint, "recipe": recipe_file}
        else:
            files = None
            if setup.config_file is None and not setup.data_from_command_line:
                raise ValueError(
                    f"{setup.checkpoint}: a model folder with no stored configuration (no config.yaml beside it or in "
                    "a run directory holding it), so nothing says which data to caption: pass --images DIR_OR_FILE "
                    "..., or --data FILE (or pass the run directory or checkpoint folder the model was saved in)"
                )
            inputs = {"--checkpoint": setup.checkpoint, "data set": cfg.data.path or world_path(cfg.world),
                      "image folder (data.images)": cfg.data.images or None, "recipe": recipe_file}  # fmt: skip
        check_output_file(out, inputs, force=force, kind="results")
        if cfg.data.skip_bad_images:  # the list of the images left out, beside out
            check_output_file(beside(out, SKIPPED_SUFFIX), inputs, force=force, kind="skipped")
        check_writable(out)  # before the model loads and the images decode, not when the captions are written
        kept: list[Any] = []
        undecoded: list[tuple[Any, str]] = []  # said at the end, with the images the model refuses: one warning
        if files is None:
            try:  # the split before the model loads (the reader keeps it); the run's own data is split as it trained
                kept = load_records(cfg, split, captioned=False, left_out=undecoded)
            except MissingSplit as e:
                if setup.data_from_command_line:  # the split asked for (or --split's default) may be what is wrong
                    held = " or ".join(f"--split {s}" for s in e.present)
                    default = "" if split_given else f" (--split defaults to {split})"
                    raise DataError(
                        f"{e.found}; caption a split it holds with {held}{default}, or {e.advice}"
                    ) from None
                raise DataError(
                    f"{e.found}; the run's own data set is split as it was trained (another split would hold images "
                    "it trained or validated on): caption images it never saw with --images FOLDER, or --data FILE"
                ) from None
            # an image beside the data set's file lies in no folder of the inputs checked above
            check_not_among(out, [r.path for r in kept if not r.embedded], what="an image of the data set",
                            option="--out")  # fmt: skip
            # the split's images in its order, those left out too (a run a bad image stopped resumes with
            # --skip-bad-images; one mended meanwhile is captioned): what the partial file's header names
            every = kept if not undecoded else whole_split(cfg, split)
            places = split_places(every)  # what sampling's seeds follow too (finecap.caption.generate_captions)
            named = {"split": split, "world": dataclasses.asdict(cfg.world),
                     **listed_images([(r.image_id, str(r.path) if r.embedded else os.path.abspath(r.path))
                                      for r in every])}  # fmt: skip
        parts = ["captioner"] if setup.data_from_command_line or files is not None else ["captioner", "data"]
        checked = check_run(setup.checkpoint, cfg, parts=parts, model_folder=model_dir(setup.checkpoint))
        accelerator = make_accelerator(cfg.train)
        if setup.config_file:
            source = f"the checkpoint's {setup.config_file}{changes}"
        elif (model_dir(setup.checkpoint) / "generation_config.json").is_file():
            source = (
                f"{model_dir(setup.checkpoint) / 'generation_config.json'} and the command line (no stored config)"
            )
        else:
            source = "the command line (no stored config)"
        if accelerator.is_main_process:
            log.info("caption: %s, decoding %s from %s%s", setup.checkpoint, describe_decoding(cfg), source,
                     "" if checked else "; no fingerprints recorded, inputs not checked")  # fmt: skip
        engine_class(cfg.decode).check_processes(cfg, accelerator.num_processes)  # vLLM: one engine in one process
        # the partial results files (kept when the run stops, resumed by the same command, with any process count):
        # the main process alone holds the lock and checks them, moving every other process's lines into its own;
        # every process gets the captions they hold, the images left are shared among them, and each appends its own
        # part's captions to its own file (docs/caption.md#a-stopped-run-resumes)
        partial: PartialResults | None = None
        if accelerator.is_main_process:
            partial = PartialResults(Path(out), caption_header(setup, cfg, named, checked), places)
        done, header = relayed(accelerator, lambda: (partial.open(force), partial.header))
        if not accelerator.is_main_process:
            partial = PartialResults(Path(out), header, places, rank=accelerator.process_index)
        own = partial
        try:
            # each other process makes its own file; one that cannot (a disk full) stops every process, said once
            # (finecap.errors.together), not the others left waiting at their next collective until the launcher
            # kills them, their clean-up undone
            if not together(accelerator, lambda: accelerator.is_main_process or own.start()):
                partial = None  # a file of its name there: this process's captions are not kept as it makes them
            model = load_for_captioning(setup.checkpoint, cfg, accelerator.device)
            hold.close()  # the checkpoint is read: the run may swap its next one in while this one captions
            with open_engine(cfg, model) as generator:  # the captioner itself, or an engine serving it (decode.engine)
                if files is not None:
                    result = caption_images(generator, [f.path for f in files], cfg.decode,
                                            skip_bad_images=cfg.data.skip_bad_images, num_workers=cfg.data.num_workers,
                                            accelerator=accelerator, limits=ImageLimits.of(cfg.data),
                                            draft=encoder_draft(model.encoder, cfg.data), seed=cfg.run.seed,
                                            done=done, on_batch=partial.add if partial else None)  # fmt: skip
                    paired = zip(files, result.captions, strict=True)
                    captions = {f.image_id: caps for f, caps in paired if caps is not None}
                    what = f"{len(files)} image(s)"
                    if accelerator.is_main_process:
                        listed = write_skipped(Path(out), len(files), [(files[i].image_id, files[i].path, reason)
                                                                       for i, reason in result.skipped])  # fmt: skip
                        if listed is not None:
                            log.warning("caption: %s (data.skip_bad_images=true); every one, with its reason, in %s",
                                        describe_skipped(result.skipped, len(files)), listed)  # fmt: skip
                else:
                    refused: list[tuple[Any, str]] | None = [] if cfg.data.skip_bad_images else None
                    captions = generate_captions(generator, cfg, split, accelerator=accelerator, seed=cfg.run.seed,
                                                 done=done,
                                                 on_batch=partial.add if partial else None,
                                                 refused=refused)  # fmt: skip
                    what = f"split {split!r}"
                    if accelerator.is_main_process:  # refused: every image left out, up front or when preprocessed
                        bad, total = refused or [], len(kept) + len(undecoded)
                        path_of = {r.image_id: r.path for r in [*kept, *(r for r, _ in undecoded)]}
                        listed = write_skipped(Path(out), total, [(i, path_of[i], reason) for i, reason in bad])
                        if listed is not None:
                            log.warning("caption: %s (data.skip_bad_images=true); every one, with its reason, in %s",
                                        describe_skipped(bad, total, f"images of split {split!r}"),
                                        listed)  # fmt: skip
        except BaseException:
            if partial is not None:
                partial.close(remove=partial.kept == 0)  # nothing captioned: not kept
                # the main process says what every process kept, its own file or not (the others' files as they are)
                said = kept_where(partial, accelerator.num_processes) if accelerator.is_main_process else ""
                if said:
                    log.warning("caption: stopped; %s: run the same command again to resume (--force to start "
                                "over)", said)  # fmt: skip
            raise
    out = Path(out)
    if accelerator.is_main_process:
        first = {image_id: caps[0] for image_id, caps in captions.items()}
        try:
            write_results(out, first)
        except BaseException as e:  # a disk full, a folder turned read-only: the captions stay for the same command
            if partial is not None:
                partial.close()
                said = kept_where(partial, accelerator.num_processes)
                if said:
                    log.warning("caption: the results could not be written to %s; %s: run the same command again "
                                "once it can be written, to write them without decoding them again", out,
                                said)  # fmt: skip
                    if isinstance(e, OSError):  # another --out finds the captions kept only copied beside it
                        elsewhere_by(e, partial.elsewhere(accelerator.num_processes))
            raise
        log.info("wrote %d captions of %s to %s", len(captions), what, out)
        empty = empty_captions_note(first, "the captions")
        if empty:
            log.warning("caption: %s (they decoded to no text)", empty)
    accelerator.wait_for_everyone()  # the results written: the other processes' files go first
    if partial is not None and not accelerator.is_main_process:
        partial.close(remove=True)
    accelerator.wait_for_everyone()
    if partial is not None and accelerator.is_main_process:
        partial.close(remove=True)  # removed before the lock is released: a run started now finds none
    return out
