"""Checkpoints of a training run, written atomically (temporary folder, then rename).

Layout of a run directory::

    <run_dir>/
      config.yaml                 the resolved configuration of the run (paths absolute: Config.save)
      fingerprints.json           the fingerprints of its data and encoders (finecap.data.fingerprint)
      metrics.jsonl               one JSON per log / evaluation event
      checkpoints/
        last/                     resumable: every train.save_every steps (or at each evaluation) and at the end
          model/                  the captioner (ClipCap.save: safetensors weights, tokenizer, model config) and
                                  generation_config.json: the run's decode.* as transformers' GenerationConfig
          config.yaml             the resolved configuration
          fingerprints.json       a copy of the run's
          state/                  optimizer, scheduler, the loop's counters, every process's RNG, objective and
                                  pending-log state: JSON + safetensors, never pickle (finecap.train.state)
          trainer_state.json      step/epoch/position/best, human-readable; written last (marks it complete)
        best/                     the best evaluation so far on train.best_metric (no optimizer state)
          model/  config.yaml  fingerprints.json  trainer_state.json

A folder is first written as ``checkpoints/.<name>.tmp`` and then swapped in by
:func:`finecap.utils.atomic_replace_dir` (which gives its files the user's umask), so a run killed while saving keeps
its previous checkpoint. :func:`model_dir` accepts either a checkpoint folder or a bare model folder, so both
``--checkpoint runs/x/checkpoints/best`` and ``train.init_from=runs/x/checkpoints/best`` work; :func:`find_checkpoint`
also takes a run directory (its best checkpoint, else its last) and a checkpoint's ``model/`` folder (its checkpoint,
so that the configuration stored beside it is found: :func:`stored_config`), and names the folder to pass when given
another one (:func:`not_a_checkpoint`).

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
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers.utils import logging as hf_logging

from finecap.locks import command_line
from finecap.models.base import CONFIG_NAME
from finecap.train.model_card import CARD_NAME, model_card
from finecap.utils import atomic_replace_dir, read_json, refuse_link, write_json

if TYPE_CHECKING:
    from transformers import GenerationConfig

    from finecap.config import Config, DecodeConfig

LAST, BEST = "last", "best"
MODEL_SUBDIR = "model"
INFO_FILE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
FINGERPRINTS_FILE = "fingerprints.json"
GENERATION_CONFIG = "generation_config.json"


def checkpoint_dir(run_dir: str | Path, which: str) -> Path:
    """``<run_dir>/checkpoints/<which>`` (``which`` is ``"last"`` or ``"best"``)."""
    return Path(run_dir) / "checkpoints" / which


def model_dir(path: str | Path) -> Path:
    """The model folder of a checkpoint (``<path>/model``), or ``path`` itself when it is a bare model folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    return path / MODEL_SUBDIR if (path / MODEL_SUBDIR).is_dir() else path


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint meant by ``path``: a run directory gives its best checkpoint, else its last; a checkpoint's
    ``model/`` folder gives that checkpoint (``RUN/checkpoints/best/model`` -> ``RUN/checkpoints/best``); a checkpoint
    folder (holding ``model/``, or ``config.yaml``) or a bare model folder (holding ``captioner.json``) is
    returned as it is. Any other folder is a ``FileNotFoundError`` naming the folder to pass
    (:func:`not_a_checkpoint`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint or run directory not found")
    if (path / "checkpoints").is_dir():
        for which in (BEST, LAST):
            if (checkpoint_dir(path, which) / MODEL_SUBDIR).is_dir():
                return checkpoint_dir(path, which)
        raise FileNotFoundError(f"{path}: a run directory without a saved checkpoint (no checkpoints/best or /last)")
    if _is_checkpoint(path) or (path / CONFIG_FILE).is_file():  # a damaged one too: its config.yaml is read first
        return path
    if _is_model(path):
        return path.parent if path.name == MODEL_SUBDIR and _is_checkpoint(path.parent) else path
    raise FileNotFoundError(not_a_checkpoint(path))


def _is_model(path: Path) -> bool:
    return (path / CONFIG_NAME).is_file()


def _is_checkpoint(path: Path) -> bool:
    return _is_model(path / MODEL_SUBDIR)


def _is_run(path: Path) -> bool:
    return any(_is_checkpoint(checkpoint_dir(path, which)) for which in (BEST, LAST))


def not_a_checkpoint(path: str | Path) -> str:
    """Why ``path`` (an existing file or folder) is none of the folders a checkpoint is loaded from, and which folder
    to pass instead: the run, checkpoint or model folder that holds it (a file of a model folder, ClipCap's ``lm/``, a
    run's ``checkpoints/``), else those below it (a folder of runs), else what each kind of folder holds."""
    path = Path(path)
    kinds = ("a run directory (holding checkpoints/best), a checkpoint folder (holding model/ and config.yaml) or "
             "a model folder (holding captioner.json)")  # fmt: skip
    held = [c for c in (BEST, LAST) if _is_checkpoint(path / c)]
    if held:  # a run's checkpoints/ folder
        return (f"{path}: a run's checkpoints folder; pass the run directory {path.parent} or one checkpoint, "
                f"{path / held[0]}")  # fmt: skip
    for up in list(path.parents)[:3]:  # the run, checkpoint or model folder holding it
        if _is_run(up) or _is_checkpoint(up) or _is_model(up):
            return f"{path}: not a checkpoint folder; pass {_loadable_name(up)}, which holds it"
    below = _loadable_below(path) if path.is_dir() else []
    if below:
        shown = ", ".join(map(str, below[:5])) + (", ..." if len(below) > 5 else "")
        return f"{path}: not a checkpoint folder, but it holds {len(below)}: pass one of {shown}"
    return f"{path}: not a checkpoint folder; pass {kinds}"


def _loadable_name(path: Path) -> str:
    """``path`` described as what it is (a run directory, a checkpoint folder, a model folder)."""
    if _is_run(path):
        return f"the run directory {path}"
    if _is_checkpoint(path):
        return f"the checkpoint folder {path}"
    return f"the model folder {path}"


def _loadable_below(path: Path, depth: int = 3, visits: int = 1000) -> list[Path]:
    """Run, checkpoint and model folders under ``path`` (the outermost of each), at most ``depth`` levels down and
    ``visits`` folders listed per level (a home folder named by mistake is not walked whole), sorted; hidden folders
    (``.last.tmp``) skipped."""
    found: list[Path] = []
    level = [path]
    for _ in range(depth):
        below = []
        for folder in level[:visits]:
            try:
                children = sorted(c for c in folder.iterdir() if c.is_dir() and not c.name.startswith("."))
            except OSError:
                continue
            for child in children:
                if _is_run(child) or _is_checkpoint(child) or _is_model(child):
                    found.append(child)
                else:
                    below.append(child)
        level = below
    return sorted(found)


def stored_config(checkpoint: str | Path) -> Path | None:
    """The ``config.yaml`` stored with the checkpoint :func:`find_checkpoint` gives (its own, else its run's), or
    ``None`` (a bare model folder: no configuration)."""
    checkpoint = Path(checkpoint)
    run_dir = run_dir_of(checkpoint)
    for folder in (checkpoint, run_dir):
        if folder is not None and (folder / CONFIG_FILE).is_file():
            return folder / CONFIG_FILE
    return None


def run_dir_of(checkpoint: str | Path) -> Path | None:
    """The run directory of a checkpoint folder ``<run_dir>/checkpoints/<name>``, else None."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


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


def temporary_dir(path: str | Path) -> Path:
    """Where the checkpoint ``path`` is written before it is swapped in (``<parent>/.<name>.tmp``)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def generation_config(
    decode: DecodeConfig, tokenizer: Any = None, base: GenerationConfig | None = None
) -> GenerationConfig:
    """``decode`` as a ``transformers.GenerationConfig`` (``base``'s other settings kept): the strategy's own
    settings only (``length_penalty`` and ``early_stopping`` for beam search, ``temperature`` / ``top_k`` / ``top_p``
    for sampling, the others unset, as transformers requires; greedy decoding returns one caption, finecap refuses
    more), and with ``tokenizer`` the stop ids (EOS, and with ``decode.stop_at_period`` the period tokens) and the
    pad id finecap's decoder uses. ``generate`` reproduces finecap's beam search only under
    ``decode.finished_beams=set_aside`` (:mod:`finecap.decode`)."""
    from transformers import GenerationConfig

    from finecap.decode import stop_token_ids

    gen = GenerationConfig.from_dict(base.to_dict()) if base is not None else GenerationConfig()
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
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        stops = stop_token_ids(tokenizer, decode.stop_at_period)
        gen.eos_token_id = stops[0] if len(stops) == 1 else stops
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        gen.pad_token_id = int(pad)
    return gen


def write_generation_config(model_folder: str | Path, decode: DecodeConfig, tokenizer: Any = None) -> list[Path]:
    """Write :func:`generation_config` into ``model_folder`` and every sub-folder that already holds a
    ``generation_config.json`` (a transformers model saved inside, e.g. ClipCap's ``lm/``, whose settings are
    kept); returns the files written."""
    from transformers import GenerationConfig

    model_folder = Path(model_folder)
    folders = [model_folder, *sorted(p.parent for p in model_folder.glob(f"*/{GENERATION_CONFIG}"))]
    written = []
    for folder in folders:
        base = GenerationConfig.from_pretrained(folder) if (folder / GENERATION_CONFIG).exists() else None
        generation_config(decode, tokenizer, base).save_pretrained(folder)
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
    as the checkpoint's ``fingerprints.json``."""
    path = Path(path)
    if fingerprints is None:
        run_dir = run_dir_of(path)
        if run_dir is not None and (run_dir / FINGERPRINTS_FILE).is_file():
            fingerprints = read_json(run_dir / FINGERPRINTS_FILE)
    tmp = temporary_dir(path)
    for folder in (tmp, path):
        refuse_link(folder)  # a link planted at .<name>.tmp or <name> is named, never deleted or written through
    if tmp.exists() and not keep_tmp_contents:
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        with _quiet_transformers():
            model.save(tmp / MODEL_SUBDIR, state_dict=state_dict)
            write_generation_config(tmp / MODEL_SUBDIR, cfg.decode, model.tokenizer)
        meta_file = tmp / MODEL_SUBDIR / CONFIG_NAME
        meta = read_json(meta_file) if meta_file.is_file() else {}  # a captioner's save writes it
        card = model_card(cfg, info, meta, fingerprints, command_line())
        (tmp / MODEL_SUBDIR / CARD_NAME).write_text(card, encoding="utf-8")
        cfg.save(tmp / CONFIG_FILE)
        if fingerprints is not None:
            write_json(tmp / FINGERPRINTS_FILE, fingerprints)
        write_json(tmp / INFO_FILE, info)
        atomic_replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_info(path: str | Path) -> dict[str, Any]:
    return read_json(Path(path) / INFO_FILE)
