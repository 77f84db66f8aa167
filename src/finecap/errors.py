"""One-line messages for the errors a command meets on users' inputs and disks: ``finecap.app.cli.main`` prints them
and exits with code 2 (``--debug`` shows the traceback instead).

A known error is one the user can act on: a bad configuration value or data record (``ValueError``: finecap's own
errors name the key, file or record), a missing, unreadable, damaged or oddly typed file, a full or read-only disk.
:func:`explain` gives its message, naming the file at fault and what to do about it; anything else is a bug and keeps
its traceback.

Libraries do not always say which file they were reading or writing: a write that fills the disk raises
``OSError(ENOSPC)`` without a file name, safetensors ``SafetensorError("Error while deserializing header: ...")`` and
``json.loads`` a bare ``RecursionError``. The file is then taken from the failing call's own arguments
(:func:`culprit_path`): the innermost frame of the traceback holding a path in a variable named like one
(``filename``, ``path``, ...), as a debugger would show it.

Example::

    >>> import errno
    >>> explain(OSError(errno.ENOSPC, "No space left on device", "runs/x/config.yaml"))
    'runs/x/config.yaml: no space left on device (the disk is full); free space or write elsewhere (--out)'
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, TypeVar

from finecap.utils.system import MissingExtra

if TYPE_CHECKING:
    from accelerate import PartialState

T = TypeVar("T")

PATH_NAMES = ("filename", "path", "file", "save_directory", "folder")
"""Local variable names holding the file a failing call was reading or writing, most specific first."""

RECOVER_CHECKPOINT = (
    "the file is damaged (truncated, or not what its name says): copy it again from where it came from, or use "
    "another checkpoint of the run (checkpoints/best, checkpoints/last, checkpoints/last.old)"
)

OS_REASONS = {
    errno.ENOSPC: "no space left on device (the disk is full); free space or {elsewhere}",
    errno.EDQUOT: "disk quota exceeded; free space or {elsewhere}",
    errno.EROFS: "read-only file system; {elsewhere}",
    errno.EACCES: "permission denied (read-only file or folder); {elsewhere} or change its permissions",
    errno.EPERM: "operation not permitted (read-only file or folder); {elsewhere}",
    errno.EISDIR: "is a directory, but a file is expected here",
    errno.ENOTDIR: "not a directory (a file is in the way), but a folder is expected here",
    errno.ENOENT: "no such file or directory",
    errno.ENAMETOOLONG: "file name too long",
    errno.ELOOP: "too many levels of symbolic links",
}
"""What an errno means for the user (the others keep the system's wording); ``{elsewhere}`` is the way to write
elsewhere (:func:`elsewhere`)."""

HUB_ID_ERRORS = ("Repo id must be", "is not a local folder and is not a valid model identifier",
                 "Incorrect path_or_model_id", "not a valid model identifier")  # fmt: skip
"""transformers / huggingface_hub messages for a name that is neither a local folder nor a Hub id."""


def _frames(exc: BaseException) -> list[FrameType]:
    """The frames of ``exc``'s traceback, outermost first."""
    frames = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def culprit_path(exc: BaseException) -> str | None:
    """The path held by the innermost frame of ``exc``'s traceback that has one (see :data:`PATH_NAMES`)."""
    for frame in reversed(_frames(exc)):
        for name in PATH_NAMES:
            value = frame.f_locals.get(name)
            if isinstance(value, str | os.PathLike) and str(value):
                return str(value)
    return None


def configured_folders(exc: BaseException) -> dict[str, str]:
    """The folders the failing command configured outside ``--out``, by setting: ``run.cache_dir`` (the caches) and
    ``world.out`` (the world), each taken as :func:`culprit_path` takes the file: from the innermost frame of
    ``exc``'s traceback holding a configuration (a :class:`finecap.config.Config`, or the section of that setting) in
    a local variable. A setting no frame holds, or left empty (that folder is then in the finecap home, which
    :func:`finecap.home.settings_moving` knows without it), is not among them."""
    from finecap.config import Config, RunConfig, WorldConfig

    sections = {"run.cache_dir": (RunConfig, "run", "cache_dir"), "world.out": (WorldConfig, "world", "out")}
    found: dict[str, str] = {}
    decided: set[str] = set()
    for frame in reversed(_frames(exc)):
        for value in frame.f_locals.values():
            for setting, (kind, section, key) in sections.items():
                part = getattr(value, section) if isinstance(value, Config) else value
                if setting not in decided and isinstance(part, kind):
                    decided.add(setting)  # the innermost holder decides, set or not
                    if getattr(part, key):
                        found[setting] = str(getattr(part, key))
    return found


TEMPORARY = re.compile(r"^\.(?P<name>.+?)(?:\.[A-Za-z0-9_]{8})?\.tmp$")
"""The temporary names finecap writes under before renaming into place (``.NAME.tmp``, ``.NAME.<8 random>.tmp``:
:func:`finecap.utils.files.atomic_write_bytes`, :func:`finecap.utils.files.make_temporary_dir`)."""


def shown_path(path: str) -> str:
    """``path`` with each temporary name replaced by the name it was being written as: the user knows
    ``checkpoints/last/state/main.safetensors``, not ``checkpoints/.last.tmp/state/.main.safetensors.tmp``.

    Example::

        >>> shown_path("runs/x/checkpoints/.last.tmp/state/.main.safetensors.k3j_9qz1.tmp")
        'runs/x/checkpoints/last/state/main.safetensors'
    """
    parts = Path(path).parts
    return str(Path(*[m.group("name") if (m := TEMPORARY.match(part)) else part for part in parts])) if parts else path


def _prefix(path: str | None) -> str:
    return f"{shown_path(path)}: " if path else ""


def elsewhere(path: str | None, folders: Mapping[str, str] | None = None) -> str:
    """How to write ``path``'s file elsewhere: ``write elsewhere (--out)``, but inside the finecap home or under one
    of ``folders`` (the configured ``run.cache_dir`` and ``world.out``: :func:`configured_folders`), which ``--out``
    does not move, the settings that do (:func:`finecap.home.settings_moving`): ``set FINECAP_HOME (or run.cache_dir)
    to a folder of yours``, ``set world.out to a folder of yours``. ``path`` may be a temporary name
    (:func:`shown_path`).

    Example::

        >>> elsewhere("runs/x/config.yaml"), elsewhere("/scratch/w/images/1.png", {"world.out": "/scratch/w"})
        ('write elsewhere (--out)', 'set world.out to a folder of yours')
    """
    from finecap.home import settings_moving

    settings = settings_moving(shown_path(path), folders) if path else []
    if not settings:
        return "write elsewhere (--out)"
    more = f" (or {' or '.join(settings[1:])})" if settings[1:] else ""
    return f"set {settings[0]}{more} to a folder of yours"


WAY_ELSEWHERE = "finecap_elsewhere"
"""The attribute of an ``OSError`` holding how to write its file elsewhere, when the command that wrote it knows a
truer way than :func:`elsewhere`'s (:func:`elsewhere_by`)."""


def elsewhere_by(exc: OSError, way: str) -> OSError:
    """Have :func:`explain` say ``way`` as how to write ``exc``'s file elsewhere, in place of :func:`elsewhere`'s:
    for a file whose command knows a truer way than ``write elsewhere (--out)``, such as ``finecap caption``'s
    results, whose captions kept beside ``--out`` a new ``--out`` finds only when they are copied beside it
    (docs/caption.md#a-stopped-run-resumes). Returns ``exc``.

    Example::

        >>> way = "write elsewhere (--out NEW), after copying r.json.partial.jsonl to NEW.partial.jsonl"
        >>> explain(elsewhere_by(OSError(errno.EROFS, "Read-only file system", "r.json"), way))  # doctest: +ELLIPSIS
        'r.json: read-only file system; write elsewhere (--out NEW), after copying r.json.partial.jsonl to NEW...'
    """
    setattr(exc, WAY_ELSEWHERE, way)
    return exc


def denied_reason(
    path: str | None, folders: Mapping[str, str] | None = None, way_out: str | None = None
) -> str | None:
    """What a permission error on ``path`` means, from what this user may do there: a file it cannot reach (a
    folder above it is closed to this user), read (a recipe, a data file: read, not written), or write, or a folder
    it cannot create or replace a file in (finecap writes a file anew beside its name, then renames it); inside the
    finecap home, the way out is ``FINECAP_HOME``, under one of ``folders`` (the configured ``run.cache_dir``,
    ``world.out``) that setting (:func:`elsewhere`: ``--out`` moves none of them), unless ``way_out`` says it
    (:func:`elsewhere_by`). ``None`` without a path. A guess from ``os.access``, which allows everything to root: then
    the folder is named."""
    if path is None:
        return None
    target = Path(shown_path(path))  # a temporary name's: the file it was being written as
    try:
        os.stat(target)
        exists = True
    except PermissionError:  # a folder above cannot be searched (os.stat, not Path.exists: whose answer varies)
        return "permission denied: this user cannot reach it (a folder above it is closed to this user)"
    except OSError:
        exists = False
    way_out = way_out or elsewhere(path, folders)
    if exists and not os.access(target, os.R_OK):
        return "permission denied: this user cannot read it; change its permissions (or run as its owner)"
    if exists and not os.access(target, os.W_OK):
        return f"permission denied: this user cannot write it; {way_out} or change its permissions"
    verb = "replace" if exists else "create"
    return f"permission denied: this user cannot {verb} it in its folder; {way_out} or change the folder's rights"


def os_message(exc: OSError, folders: Mapping[str, str] | None = None) -> str:
    """``PATH: what it means``; the path of a failed rename is its target (``filename2``). ``folders``: the
    configured ``run.cache_dir`` and ``world.out`` (:func:`explain` passes the failing command's:
    :func:`configured_folders`), whose setting an error about a file under it names as the way to write elsewhere
    (:func:`elsewhere`), unless the command gave its own way (:func:`elsewhere_by`)."""
    path = exc.filename2 or exc.filename
    if path is None:
        path = culprit_path(exc)
    shown = None if path is None else str(path)
    way = getattr(exc, WAY_ELSEWHERE, None)
    reason = denied_reason(shown, folders, way) if exc.errno in (errno.EACCES, errno.EPERM) else None
    if exc.errno == errno.EEXIST and shown is not None and Path(shown).is_file():
        reason = "a file, but a folder is expected here"
    if reason is None and exc.errno in OS_REASONS:
        reason = OS_REASONS[exc.errno].format(elsewhere=way or elsewhere(shown, folders))
    return _prefix(shown) + (reason or (exc.strerror or str(exc)).rstrip("."))


def _hub_id_message(exc: OSError) -> str | None:
    """A local path that does not exist, which transformers took for a Hub model id."""
    text = str(exc)
    if not any(marker in text for marker in HUB_ID_ERRORS):
        return None
    for candidate in re.findall(r"'([^']+)'", text):  # the quoted name that is a path into an existing folder
        path = Path(candidate)
        if os.sep in candidate and (path.is_absolute() or path.parent.is_dir()) and not path.exists():
            return (
                f"{candidate}: no such folder (a missing local model folder is read as a Hugging Face Hub model id, "
                "which this is not); check the path, or copy the checkpoint again"
            )
    return None


def _text_errno(text: str) -> int | None:
    """The OS error number a library's message names (Rust's ``(os error 28)``, C's ``[Errno 28]``)."""
    if "No space left on device" in text:
        return errno.ENOSPC
    found = re.search(r"os error (\d+)|\[Errno (\d+)\]", text)
    return int(found.group(1) or found.group(2)) if found else None


def _is_weights_error(exc: BaseException) -> bool:
    """safetensors' errors, and torch's on damaged or unwritable weight files."""
    if type(exc).__name__ == "SafetensorError" or type(exc).__module__.startswith("safetensors"):
        return True
    markers = ("unexpected pos", "PytorchStreamReader", "PytorchStreamWriter", "invalid load key",
               "Weights only load failed")  # fmt: skip
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in markers)


PICKLED = "the weights are a pickle (e.g. pytorch_model.bin), which can run code when loaded"
REMOTE_CODE = "the checkpoint asks to run its own Python code (an auto_map in its config.json)"


def pickled_message(path: str | None) -> str:
    """The one line refusing the pickled weights file ``path`` (``None``: unknown) of a checkpoint or run folder."""
    return (
        f"{_prefix(path)}{PICKLED}: finecap never unpickles a file of a checkpoint or run folder, so it is not "
        "loaded; use the checkpoint's safetensors weights (model.safetensors)"
    )


def _is_pickle_error(exc: BaseException) -> bool:
    """torch's refusal to unpickle more than tensors (``weights_only=True``), whose message advises
    ``weights_only=False``: finecap names the file and never repeats that advice."""
    return type(exc).__name__ == "UnpicklingError" or "Weights only load failed" in str(exc)


def _is_remote_code_error(exc: BaseException) -> bool:
    """transformers' refusal to import a checkpoint's own code (finecap passes ``trust_remote_code=False``)."""
    return isinstance(exc, ValueError) and "trust_remote_code" in str(exc)


WORKER = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback")
"""How torch re-raises an error of a DataLoader worker: the same class, its message the worker's whole traceback."""


def worker_message(exc: BaseException) -> str | None:
    """The original message of an error a DataLoader worker raised (torch re-raises it with the worker's traceback
    as its message), or ``None`` for any other error. Decoding a bad image in a worker then reads as in the main
    process: ``PATH: damaged image (...)``."""
    text = str(exc)
    if not WORKER.match(text):
        return None
    kind = type(exc)
    for prefix in (f"\n{kind.__module__}.{kind.__qualname__}: ", f"\n{kind.__qualname__}: "):
        at = text.rfind(prefix)
        if at >= 0:
            return text[at + len(prefix) :].strip()
    return None


class AnotherProcessFailed(Exception):
    """A process of an ``accelerate launch``-ed command stops because another process met an error it relayed
    (:func:`relayed`, :func:`together`): the main process prints the one line, the others exit 2 silently, so the
    command says it once, not once per process plus each process's traceback."""


class ProcessFailed(Exception):
    """The main process of an ``accelerate launch``-ed command stops because another process met an error
    (:func:`together`): its message is that process's one line, named by its rank (``process 1 of 2: PATH: no space
    left on device ...``), which the main process prints as the command's error (:func:`explain`), since the launcher
    stops the other processes once the main one ends."""


def relayed(processes: PartialState, work: Callable[[], T]) -> T:
    """``work()`` run on the main process of ``processes`` alone, its value returned on every process (broadcast:
    every process calls this, the others waiting for the main one's outcome). What the main process alone reads or
    checks, which every process then goes on with: training's preparation of its data
    (:func:`finecap.train.prepare.prepare_needs`), the partial results a resumed ``finecap caption`` read. An
    ``Exception`` that stops the main process there stops the others too (:func:`together`): the command says it
    once."""
    if processes.num_processes == 1:
        return work()
    from accelerate.utils import broadcast_object_list

    value = together(processes, work if processes.is_main_process else lambda: None)
    return broadcast_object_list([value])[0]


def together(processes: PartialState, work: Callable[[], T]) -> T:
    """``work()`` run on every process of ``processes``, each process's own value returned; every process calls this,
    and none goes on before each has run it (every process's outcome is gathered: a collective). The rule of a launched
    command's errors: a process that stops while the others go on would leave them waiting at their next collective
    until the launcher ends them, killed, their clean-up undone. So an ``Exception`` that stops one process here stops
    every process, and the command says it once, by the main process: the main process raises its own error, else
    :class:`ProcessFailed` with the first failing process's one-line message (:func:`explain`, else its ``repr``),
    named by its rank; another process raises :class:`AnotherProcessFailed` (quiet), but a bug of its own (an error
    :func:`explain` does not know) keeps its traceback."""
    if processes.num_processes == 1:
        return work()
    from accelerate.utils import gather_object

    value, failed = None, None
    try:
        value = work()
    except Exception as e:  # gathered below: the other processes would otherwise wait at their next collective
        failed = e
    said = gather_object([None if failed is None else (explain(failed) or repr(failed))])
    if failed is not None and (processes.is_main_process or explain(failed) is None):
        raise failed
    first = next(((rank, message) for rank, message in enumerate(said) if message is not None), None)
    if first is None:
        return value  # type: ignore[return-value]  # work() returned it: no process failed
    rank, message = first
    if processes.is_main_process:
        raise ProcessFailed(f"process {rank} of {processes.num_processes}: {message}")
    raise AnotherProcessFailed(message) from failed


def explain(exc: BaseException) -> str | None:
    """The one-line message of a known error, or ``None`` for a bug (to be shown with its traceback)."""
    original = worker_message(exc)
    if original is not None and isinstance(exc, ValueError | OSError):  # others stay bugs, with their traceback
        return explain(ValueError(original) if isinstance(exc, ValueError) else OSError(original))
    if isinstance(exc, ProcessFailed):  # another process's one line, said by the main one
        return str(exc)
    if isinstance(exc, RecursionError):
        return _prefix(culprit_path(exc)) + "nested too deeply to read (a file thousands of levels deep?)"
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return os_message(exc, configured_folders(exc))
        return _hub_id_message(exc) or " ".join(str(exc).split()) or type(exc).__name__
    if _is_pickle_error(exc):
        return pickled_message(culprit_path(exc))
    if _is_remote_code_error(exc):
        return (
            f"{_prefix(culprit_path(exc))}{REMOTE_CODE}; finecap never runs code from a checkpoint "
            "(trust_remote_code=False): use a checkpoint of an architecture transformers ships"
        )
    if _is_weights_error(exc):
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        path = culprit_path(exc)
        code = _text_errno(str(exc))
        if code is not None:
            return os_message(OSError(code, os.strerror(code), path), configured_folders(exc))
        return f"{_prefix(path)}cannot read the weights ({text}); {RECOVER_CHECKPOINT}"
    if isinstance(exc, UnicodeError):
        return f"{_prefix(culprit_path(exc))}not UTF-8 text ({exc})"
    if isinstance(exc, ValueError | MissingExtra):  # finecap's ConfigError, DataError, ...: name what is at fault
        return capped(str(exc))
    return None


MAX_MESSAGE = 2000
"""Characters of an error message printed at most: finecap shortens the values it quotes
(:func:`finecap.utils.text.short_repr`), but a library's message may repeat a whole input."""


def capped(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to ``limit`` characters, saying how many were left out.

    Example::

        >>> capped("x" * 30, limit=10)
        'xxxxxxxxxx... (20 more characters)'
    """
    return message if len(message) <= limit else f"{message[:limit]}... ({len(message) - limit} more characters)"
