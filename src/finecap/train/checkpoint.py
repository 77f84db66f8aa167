"""Checkpoints of a training run, written atomically (temporary folder, then rename).

The run-directory layout (checkpoint folder names, :func:`~finecap.runs.model_dir`,
:func:`~finecap.runs.find_checkpoint`) is :mod:`finecap.runs`, which every reader of a run imports; this module writes
checkpoints. A folder is first written as ``checkpoints/.<name>.tmp`` (:func:`~finecap.runs.temporary_dir`) and then
swapped in by :func:`finecap.utils.folders.atomic_replace_dir` (which gives its files the user's umask), so a run
killed while saving keeps its previous checkpoint. Each checkpoint folder holds finecap's folder mark
(:data:`finecap.utils.folders.FOLDER_MARK`): only a folder holding it (or one that reads as a checkpoint,
:func:`finecap.train.state.is_checkpoint_folder`) is ever replaced or removed; anything else at ``<name>``,
``<name>.old`` or ``.<name>.tmp`` is refused and kept.

``generation_config.json`` (:func:`generation_config`) holds the decoding settings the run evaluates with, so that
``transformers``' ``generate`` on the saved model (a BLIP folder, or ClipCap's ``lm/`` given the prefix) decodes as
``finecap caption`` does: ``num_beams``, ``max_new_tokens`` (``decode.max_length``, EOS included), ``length_penalty``,
``early_stopping``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``num_return_sequences`` and the stop / pad
ids. Beam search is ``generate``'s only with ``decode.finished_beams=set_aside``: under the default ``keep`` (ClipCap's
rule, :mod:`finecap.decode`) ``generate`` can choose other captions once a hypothesis ends early. It is
written into the model folder and into every sub-folder holding a transformers model's ``generation_config.json``
(ClipCap's ``lm/``), keeping that file's other settings (BLIP's start token).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers.utils import logging as hf_logging

from finecap.locks import command_argv
from finecap.runs import (
    CAPTIONER_FILE,
    CONFIG_FILE,
    FINGERPRINTS_FILE,
    GENERATION_CONFIG,
    INFO_FILE,
    MODEL_SUBDIR,
    decode_event,
    encode_event,
    run_dir_of,
    temporary_dir,
)
from finecap.train.model_card import CARD_NAME, model_card
from finecap.train.state import (
    CHECKPOINT_KIND,
    is_checkpoint_folder,
    new_checkpoint_folder,
    remove_checkpoints,
    remove_unfinished_checkpoint,
    replace_checkpoint,
)
from finecap.utils.files import refuse_link, sync_to_disk, write_json
from finecap.utils.folders import check_swap, prepare_swap
from finecap.utils.reading import read_json

if TYPE_CHECKING:
    from transformers import GenerationConfig

    from finecap.config import Config, DecodeConfig

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' per-save "Writing model shards" progress bar (restored afterwards)."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def generation_config(
    decode: DecodeConfig,
    tokenizer: Any = None,
    base: GenerationConfig | None = None,
    ends: Sequence[int] | None = None,
) -> GenerationConfig:
    """``decode`` as a ``transformers.GenerationConfig`` (``base``'s other settings kept): the strategy's own
    settings only (``length_penalty`` and ``early_stopping`` for beam search, ``temperature`` / ``top_k`` / ``top_p``
    for sampling, the others unset, as transformers requires; greedy decoding returns one caption, finecap refuses
    more; ``base``'s settings of what finecap's decoder does not do, :data:`NOT_DECODED`, turned off), and with
    ``tokenizer`` the stop ids (``ends``, the captioner's :attr:`~finecap.models.base.CaptionerBase.end_token_ids`,
    default the tokenizer's EOS, and with ``decode.stop_at_period`` the period tokens:
    :func:`finecap.decode.stop_token_ids`) and the pad id finecap's decoder uses. ``generate`` reproduces finecap's
    beam search only under ``decode.finished_beams=set_aside`` (:mod:`finecap.decode`)."""
    from transformers import GenerationConfig

    from finecap.decode import stop_token_ids

    # a copy, base left as it is; the constructor, which from_dict calls: from_dict also renders the whole config for
    # a log line (an f-string, at every log level), a serialisation a save paid for nothing
    gen = GenerationConfig(**base.to_dict()) if base is not None else GenerationConfig()
    beam, sample = decode.strategy == "beam", decode.strategy == "sample"
    gen.update(
        max_new_tokens=decode.max_length,
        max_length=None,
        num_beams=decode.beam_size if beam else 1,
        num_return_sequences=decode.num_return_sequences if beam or sample else 1,
        do_sample=sample,
        length_penalty=decode.length_penalty if beam else None,
        early_stopping=decode.early_stopping if beam else None,
        temperature=decode.temperature if sample else None,
        top_k=decode.top_k if sample else None,
        top_p=decode.top_p if sample else None,
    )
    gen.update(**{key: off for key, off in NOT_DECODED.items() if hasattr(gen, key)})
    # what transformers has no name for, so that finecap decodes a saved folder exactly as the run did
    gen.finecap_decode = {key: getattr(decode, key) for key in FINECAP_ONLY}
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        stops = stop_token_ids(tokenizer, decode.stop_at_period, ends)
        gen.eos_token_id = stops[0] if len(stops) == 1 else stops
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        gen.pad_token_id = int(pad)
    return gen


NOT_DECODED: dict[str, Any] = {
    **dict.fromkeys(("repetition_penalty", "encoder_repetition_penalty", "typical_p"), 1.0),
    **dict.fromkeys(("no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "min_length"), 0),
    **dict.fromkeys(("epsilon_cutoff", "eta_cutoff", "diversity_penalty"), 0.0),
    "renormalize_logits": False,
    "num_beam_groups": 1,
    **dict.fromkeys(
        ("min_new_tokens", "bad_words_ids", "sequence_bias", "suppress_tokens", "begin_suppress_tokens",
         "forced_bos_token_id", "forced_eos_token_id", "exponential_decay_length_penalty", "min_p", "top_h",
         "penalty_alpha", "dola_layers", "guidance_scale", "constraints", "force_words_ids", "stop_strings",
         "max_time", "token_healing", "watermarking_config"),
    ),
}  # fmt: skip
"""``GenerationConfig`` settings that change what ``generate`` writes and finecap's decoder has no counterpart for,
with the value that turns each off: a base model's own (Qwen2-VL-Instruct ships ``repetition_penalty`` 1.05) would
make ``generate`` with the saved file write other captions than the run's, so :func:`generation_config` writes these
values (explicit where transformers has one, since ``generate(generation_config=...)`` fills a ``None`` from the
model's own settings)."""

TRANSFORMERS_TOP_K = 50
"""The ``top_k`` transformers' ``generate`` samples with when a generation config does not set one."""

FINECAP_ONLY = ("finished_beams", "stop_at_period", "batch_size")
"""``decode`` settings with no ``GenerationConfig`` name, kept in ``generation_config.json`` under
``finecap_decode`` (transformers keeps and ignores an unknown key)."""


def decode_of_folder(model_folder: str | Path) -> dict[str, Any]:
    """The ``decode`` settings a model folder's ``generation_config.json`` holds (:func:`generation_config`'s
    inverse), for a folder with no run configuration beside it (an export, a bare model folder): what a user loading
    it as its model card says gets the run's decoding, and an edited ``generation_config.json`` is honoured where
    finecap's decoder has the setting (one of :data:`NOT_DECODED` set on is named in a warning). ``{}`` without the
    file. A file written by other tools (no ``finecap_decode``) gives transformers' beam rule
    (``finished_beams=set_aside``), which is what ``generate`` with it does."""
    from transformers import GenerationConfig

    folder = Path(model_folder)
    if not (folder / GENERATION_CONFIG).is_file():
        return {}
    try:
        gen = GenerationConfig.from_pretrained(folder)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{folder / GENERATION_CONFIG}: cannot read the decoding settings: {e}") from None
    beams, sample = int(gen.num_beams or 1), bool(gen.do_sample)
    strategy = "beam" if beams > 1 else "sample" if sample else "greedy"
    out: dict[str, Any] = {"strategy": strategy, "finished_beams": "set_aside"}
    if gen.max_new_tokens is not None:
        out["max_length"] = int(gen.max_new_tokens)
    if strategy == "beam":
        out["beam_size"] = beams
        if gen.length_penalty is not None:
            out["length_penalty"] = float(gen.length_penalty)
        if gen.early_stopping is not None:
            out["early_stopping"] = gen.early_stopping
    if strategy == "sample":
        out["temperature"] = float(gen.temperature) if gen.temperature is not None else 1.0
        # a file without top_k samples with generate's default, 50 (finecap's own file writes its top_k, 0 included)
        out["top_k"] = int(gen.top_k) if gen.top_k is not None else TRANSFORMERS_TOP_K
        out["top_p"] = float(gen.top_p) if gen.top_p is not None else 1.0
    if strategy != "greedy" and gen.num_return_sequences:
        out["num_return_sequences"] = int(gen.num_return_sequences)
    extras = getattr(gen, "finecap_decode", None)
    if isinstance(extras, dict):
        out.update({k: extras[k] for k in FINECAP_ONLY if k in extras})
    unread = {k: v for k, off in NOT_DECODED.items() if (v := getattr(gen, k, None)) is not None and v != off}
    if unread:  # an edited or another tool's file: generate would apply these, finecap's decoder cannot
        log.warning("%s: finecap's decoder does not apply %s (transformers' generate with this file would); its "
                    "captions follow the file's other settings", folder / GENERATION_CONFIG,
                    ", ".join(f"{k}={v!r}" for k, v in sorted(unread.items())))  # fmt: skip
    return out


def folder_config(model_folder: str | Path, recipe: str | None = None, overrides: Sequence[str] = (),
                  labels: dict[str, str] | None = None) -> Config:  # fmt: skip
    """The configuration to caption with from a model folder that has no run configuration beside it (an export, a
    bare model folder): ``recipe`` and ``overrides`` over the defaults, the decoding of its ``generation_config.json``
    (:func:`decode_of_folder`) for every ``decode`` key neither the recipe nor the overrides set, and ``model.dtype``
    as saved unless they set it (:func:`saved_dtype`): the folder loads in the dtype it was saved in (a bfloat16
    run's export in bfloat16, computing as the run did), as transformers' ``from_pretrained`` loads it. ``labels``: the
    command-line options some overrides stand for, which errors about them name (:func:`finecap.config.load`)."""
    from finecap.config import ConfigError, load, parse_override
    from finecap.config.loading import renamed_keys
    from finecap.recipes import resolve_recipe
    from finecap.utils.reading import read_yaml_mapping

    cfg = load(recipe, list(overrides), labels=labels)  # a recipe that does not load is refused here, naming it
    given = {tuple(parse_override(o)[0][:2]) for o in overrides}
    if recipe is not None:
        written = renamed_keys(read_yaml_mapping(resolve_recipe(recipe), "a recipe must be a mapping of sections"))
        given |= {(section, key) for section in ("decode", "model") for key in written.get(section) or {}}
    saved = {k: v for k, v in decode_of_folder(model_folder).items() if ("decode", k) not in given}
    try:
        decode = dataclasses.replace(cfg.decode, **saved)  # the section's checks run again
    except (ConfigError, TypeError) as e:
        raise ValueError(f"{Path(model_folder) / GENERATION_CONFIG}: {e}") from None
    model = (
        cfg.model if ("model", "dtype") in given else dataclasses.replace(cfg.model, dtype=saved_dtype(model_folder))
    )
    return dataclasses.replace(cfg, decode=decode, model=model)


def saved_dtype(model_folder: str | Path) -> str:
    """The ``model.dtype`` a bare model folder was saved in: the one dtype of its frozen weights that its
    ``captioner.json`` records (``dtypes``: a ClipCap's frozen encoder is loaded from its source, which the folder's
    own files do not say), else ``auto`` (each model in the dtype of its files, as transformers loads them)."""
    from finecap.models.memory import DTYPES

    meta_file = Path(model_folder) / CAPTIONER_FILE
    meta = read_json(meta_file) if meta_file.is_file() else {}
    recorded = meta.get("dtypes") if isinstance(meta, dict) else None
    frozen = {roles.get("frozen") for roles in (recorded or {}).values() if isinstance(roles, dict)} - {None}
    return frozen.pop() if len(frozen) == 1 and next(iter(frozen)) in DTYPES else "auto"


def read_generation_config(folder: str | Path) -> GenerationConfig:
    """``folder``'s ``generation_config.json`` as ``GenerationConfig.from_pretrained`` reads a local folder's (its
    JSON given to the constructor, as ``from_dict`` does), less the two serialisations of the whole config that
    ``from_pretrained`` adds and :func:`write_generation_config` does not use: ``from_dict``'s log line (an f-string,
    rendered at every log level) and the hash it keeps to tell ``save_pretrained`` whether the config was modified
    (:func:`generation_config` copies the config, and the copy drops that hash). A ``ValueError`` naming the file
    when it is not JSON (:func:`finecap.utils.reading.read_json`)."""
    from transformers import GenerationConfig

    return GenerationConfig(**read_json(Path(folder) / GENERATION_CONFIG))


def write_generation_config(model_folder: str | Path, decode: DecodeConfig, tokenizer: Any = None,
                            ends: Sequence[int] | None = None) -> list[Path]:  # fmt: skip
    """Write :func:`generation_config` (``ends``: the captioner's end tokens) into ``model_folder`` and every
    sub-folder that already holds a ``generation_config.json`` (a transformers model saved inside, e.g. ClipCap's
    ``lm/``, whose settings are kept); returns the files written."""
    model_folder = Path(model_folder)
    folders = [model_folder, *sorted(p.parent for p in model_folder.glob(f"*/{GENERATION_CONFIG}"))]
    written = []
    for folder in folders:
        base = read_generation_config(folder) if (folder / GENERATION_CONFIG).exists() else None
        generation_config(decode, tokenizer, base, ends).save_pretrained(folder)
        written.append(folder / GENERATION_CONFIG)
    return written


def save_checkpoint(
    path: str | Path,
    *,
    model: Any,
    cfg: Config,
    info: dict[str, Any],
    state_dict: dict[str, Any] | None = None,
    keep_tmp_contents: bool = False,
    fingerprints: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (via ``model.save``; with ``state_dict``, those weights, e.g. gathered from a sharded model),
    its ``generation_config.json`` (``cfg.decode``, :func:`write_generation_config`), its model card (``README.md``,
    :mod:`finecap.train.model_card`), ``cfg`` and ``info`` (JSON) to
    ``path``, atomically: the folder replaces the previous one only once complete. ``keep_tmp_contents``: files
    already written into :func:`temporary_dir` (e.g. ``accelerate/``) are kept. ``fingerprints`` (default: the run's
    ``fingerprints.json``, when ``path`` is ``<run_dir>/checkpoints/<name>`` and the run recorded them) are written
    as the checkpoint's ``fingerprints.json``. ``trainer_state.json`` (``info``), which marks the folder complete
    (:func:`finecap.train.state.is_complete`: a resume may pick an unswapped ``.<name>.tmp`` by it), is written last,
    once everything else in the folder is on the disk (:func:`finecap.utils.files.sync_to_disk`): a power loss never
    leaves a folder marked complete with weights that read back empty."""
    path = Path(path)
    if fingerprints is None:
        run_dir = run_dir_of(path)
        if run_dir is not None and (run_dir / FINGERPRINTS_FILE).is_file():
            fingerprints = read_json(run_dir / FINGERPRINTS_FILE)
    tmp = temporary_dir(path)
    for folder in (tmp, path):
        refuse_link(folder)  # a link planted at .<name>.tmp or <name> is named, never deleted or written through
    check_swap(path, CHECKPOINT_KIND, is_checkpoint_folder)  # before the work: a folder of the user's there stops it
    if not keep_tmp_contents:
        remove_unfinished_checkpoint(tmp)  # only a checkpoint folder of finecap's is removed
    new_checkpoint_folder(tmp)
    try:
        with _quiet_transformers():
            model.save(tmp / MODEL_SUBDIR, state_dict=state_dict)
            write_generation_config(
                tmp / MODEL_SUBDIR, cfg.decode, model.tokenizer, getattr(model, "end_token_ids", None)
            )
        meta_file = tmp / MODEL_SUBDIR / CAPTIONER_FILE
        meta = read_json(meta_file) if meta_file.is_file() else {}  # a captioner's save writes it
        card = model_card(cfg, info, meta, fingerprints, command_argv(), which=path.name)
        (tmp / MODEL_SUBDIR / CARD_NAME).write_text(card, encoding="utf-8")
        cfg.save(tmp / CONFIG_FILE)
        if fingerprints is not None:
            write_json(tmp / FINGERPRINTS_FILE, fingerprints)
        prepare_swap(tmp, CHECKPOINT_KIND)  # the swap's own changes (the modes) now, for the sync below to hold
        sync_to_disk(tmp)  # all of it on the disk before the file that says it is complete (a power loss)
        write_json(tmp / INFO_FILE, encode_event(info))  # a best's non-finite values named, as metrics.jsonl's
        replace_checkpoint(tmp, path, synced=True)  # synced above, and trainer_state.json by its atomic write
    except BaseException:  # trainer_state.json (written above) goes first: killed meanwhile, tmp is no resume's
        remove_checkpoints([tmp], ignore_errors=True)
        raise
    return path


def load_info(path: str | Path) -> dict[str, Any]:
    return decode_event(read_json(Path(path) / INFO_FILE))
