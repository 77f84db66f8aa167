"""What training refuses of a run's settings and of this machine before it reads, makes or removes anything
(:func:`check_settings`): the one home of those refusals, which :func:`finecap.train.run.train` makes first and the
stage runner makes before it changes a stage's old run (:meth:`finecap.stages.StageRunner.train_stage`), so that a
forced retrain refused for a setting leaves the finished stage as it was. What training refuses of the files already
in its run folder is :func:`finecap.train.state.check_run_folder`."""

from __future__ import annotations

from finecap.config import Config
from finecap.home import run_path, world_path
from finecap.models.memory import check_attention
from finecap.outputs import check_not_input, check_writable
from finecap.runs import CONFIG_FILE
from finecap.train.setup import resolve_start
from finecap.train.state import find_resumable
from finecap.utils.files import check_fsync_setting


def check_settings(cfg: Config, *, resume: bool, option: str = "run.dir") -> Config:
    """``cfg`` with its start resolved (:func:`finecap.train.setup.resolve_start`), once what training refuses of its
    settings has passed, each an error naming the setting: ``model.attn_implementation`` naming a kernel this machine
    lacks (:func:`finecap.models.memory.check_attention`); a mistyped ``$FINECAP_FSYNC``
    (:func:`finecap.utils.files.check_fsync_setting`); a run folder inside the data it reads (the data set or world,
    ``data.images``), one naming a file or a path through one, or a folder where nothing can be written
    (:func:`finecap.outputs.check_not_input`, :func:`finecap.outputs.check_writable`); a ``train.init_from`` found
    nowhere, unless the run resumes from a checkpoint of its own (``resume`` and one is resumable: it never reads
    its start again). Reads nothing of the data and leaves nothing written (the trial file of ``check_writable`` is
    removed at once). ``option``: what the errors about the run folder name (``run.dir``, or the command line's
    ``--out``)."""
    check_attention(cfg.model.attn_implementation)  # a kernel this machine lacks stops it before anything is made
    check_fsync_setting()  # a mistyped $FINECAP_FSYNC, not at the first checkpoint's save
    run_dir = run_path(cfg.run)
    # a run folder inside the data it reads (a data set folder, the world, data.images), as caption and eval refuse
    inputs = {
        "data set": cfg.data.path or world_path(cfg.world),
        "image folder (data.images)": cfg.data.images or None,
    }
    check_not_input(run_dir, inputs, option=option)
    # a run.dir naming a file (or a path through one), or a folder where nothing can be written, said as the option's
    # error before anything is read or made (it was mkdir's bare FileExistsError / NotADirectoryError)
    check_writable(run_dir / CONFIG_FILE, option=option)
    # train.init_from found (working directory, else the runs root) before anything is made; a run resuming from a
    # checkpoint of its own reads its weights from there, so its start may have moved since
    return resolve_start(cfg, must_exist=not (resume and find_resumable(run_dir) is not None))
