"""The process's surroundings: usable CPUs, loopback hosts, optional extras, progress bars, a launch's rank,
leaving a launch's process group, environment variables set for a while, a hang-up stopping a server."""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (every address it resolves to is a loopback address)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


class MissingExtra(ImportError):
    """An option needs a package of one of finecap's extras that is not installed (``model.quantization`` needs
    bitsandbytes, ``data.format=hf`` datasets); the message names the option and the ``pip install``; the command
    line prints it and exits with code 2."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, the machine's CPUs elsewhere), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


PROGRESS_ENV = "TQDM_DISABLE"


"""The environment variable that turns progress bars off: ``finecap -q`` sets it (unless the user did)."""


NOT_SET = ("", "0", "false", "no", "off")


def progress_enabled(wanted: bool = True) -> bool:
    """Whether to show a progress bar the caller wants (``wanted``): not when :data:`PROGRESS_ENV` is set to
    anything but :data:`NOT_SET` (``finecap -q`` sets it, a user may too). Read at each call: tqdm reads its
    ``TQDM_*`` variables only once, when it is imported, and lets an explicit ``disable=`` win over them, so every
    finecap bar is made with ``disable=not progress_enabled(...)``."""
    return wanted and os.environ.get(PROGRESS_ENV, "").strip().lower() in NOT_SET


@contextlib.contextmanager
def environment_defaults(
    values: Mapping[str, str], *, empty_is_unset: bool = False, override: bool = False
) -> Iterator[dict[str, str]]:
    """Within the block, each variable of ``values`` that ``os.environ`` lacks is set to its value (one already set,
    the user's, is left as it is); when the block ends, each it set is put back as it was (removed, or its earlier
    value), unless something changed it since (then its value is not this block's to take). Blocks may overlap in
    any order (two engines of one process): only the block that set a variable puts it back. Yields the variables
    the block set, with their values.

    ``empty_is_unset``: a variable set to the empty string counts as unset (set within the block, empty again after),
    for variables whose readers read an empty value so (mlflow's ``MLFLOW_TRACKING_URI``, ``TQDM_DISABLE``:
    :func:`progress_enabled`); not for those where it means something (``CUDA_VISIBLE_DEVICES=""``: no GPU).
    ``override``: every variable is set, the user's value too, and put back after (a launched process's silence:
    :func:`finecap.app.cli.configured_logging`). Where an ``override`` block and another block set one variable, the
    one entered later must end first (nested, as ``with`` nests them): each puts back the value it found, so ended
    the other way round they leave the earlier block's value, not the one there before both (the user's lost). Its
    one caller is a ``with`` around a whole command; the blocks over its variables nest inside it.

    >>> with environment_defaults({"FINECAP_DOCTEST_VARIABLE": "1"}) as added:
    ...     os.environ["FINECAP_DOCTEST_VARIABLE"], added
    ('1', {'FINECAP_DOCTEST_VARIABLE': '1'})
    >>> "FINECAP_DOCTEST_VARIABLE" in os.environ
    False
    """
    before = {name: os.environ.get(name) for name in values}
    added = set_defaults(values, empty_is_unset=empty_is_unset, override=override)
    try:
        yield dict(added)
    finally:
        for name, value in added.items():
            if os.environ.get(name) != value:
                continue
            if before[name] is None:
                del os.environ[name]
            else:
                os.environ[name] = before[name]


def set_defaults(values: Mapping[str, str], *, empty_is_unset: bool = False, override: bool = False) -> dict[str, str]:
    """Set each variable of ``values`` that ``os.environ`` lacks (``empty_is_unset`` and ``override`` as
    :func:`environment_defaults` reads them) and return those set, with their values: :func:`environment_defaults`
    without the putting back, for a process that never gives them back (a spawned stage worker,
    :func:`finecap.stages.pool.worker_setup`).

    >>> os.environ["FINECAP_DOCTEST_VARIABLE"] = ""  # inherited empty: read as unset
    >>> set_defaults({"FINECAP_DOCTEST_VARIABLE": "1"}, empty_is_unset=True), os.environ["FINECAP_DOCTEST_VARIABLE"]
    ({'FINECAP_DOCTEST_VARIABLE': '1'}, '1')
    >>> set_defaults({"FINECAP_DOCTEST_VARIABLE": "2"})  # set: the value there is kept
    {}
    >>> del os.environ["FINECAP_DOCTEST_VARIABLE"]
    """
    free = (None, "") if empty_is_unset else (None,)
    added = {name: str(value) for name, value in values.items() if override or os.environ.get(name) in free}
    os.environ.update(added)
    return added


def launched_rank() -> int:
    """This process's rank under ``accelerate launch`` / ``torchrun`` (``RANK``), 0 otherwise: a note or error every
    process of a launch meets alike (the same data, the same configuration) is said by rank 0 alone."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def launched_processes() -> int:
    """How many processes ``accelerate launch`` / ``torchrun`` started (``WORLD_SIZE``), 1 otherwise."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def leave_process_group() -> None:
    """Destroy this process's process groups, if a command started them (``accelerate launch`` of several
    processes), and collect the garbage that still holds them (a sharded model's device meshes, in reference cycles),
    so that each gloo group's destructor joins its worker threads while Python still runs.

    Without it a launched process sometimes aborts after its work is done ("terminate called without an active
    exception", SIGABRT; the launcher reports a failed run): a gloo worker thread drops the last reference to a
    finished collective after the main thread has begun to shut Python down, needs the GIL to release a Python object
    of the collective's saved thread-local state, and is ended inside a destructor (a core dump read with gdb, torch
    2.13). Every ``finecap`` command calls it last; a script of one's own that trains through :func:`finecap.train`
    under ``accelerate launch`` should too.
    Measured on a loaded 2-core machine: a 2-process launch that all-reduces and exits aborted 6 times in 25, 0 in 25
    after ``destroy_process_group``; with FSDP2 sharding the destroy alone is not enough (the meshes keep the group
    alive; docs/benchmarks.md). Local to the process (no collective), so safe after another rank failed."""
    dist = sys.modules.get("torch.distributed")  # a command that never imported torch started no group
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


@contextlib.contextmanager
def hangup_as_sigterm() -> Iterator[None]:
    """While the block runs, SIGHUP (the terminal or SSH session of a server started without ``nohup`` or ``tmux``
    closed) does what SIGTERM does then: the handler SIGTERM has when the hang-up comes is called as for SIGTERM (a
    server's clean stop: :class:`finecap.serve.app.Server`, ``finecap bags review``), instead of the process dying at
    once with what it holds (a judge's vLLM engine). With SIGTERM's default or ignored, the hang-up has its own
    default (the process dies by SIGHUP, as before). Left alone where SIGHUP already has a handler other than the
    default (``nohup`` ignores it: the server keeps running), off the main thread (signal handlers are the main
    thread's) and where there is no SIGHUP (Windows); put back afterwards."""
    hup = getattr(signal, "SIGHUP", None)
    if (
        hup is None
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(hup) != signal.SIG_DFL
    ):
        yield
        return

    def hung_up(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            handler(signal.SIGTERM, frame)
            return
        signal.signal(hup, signal.SIG_DFL)  # SIGTERM's default: die by the hang-up, as without this block
        signal.raise_signal(hup)

    signal.signal(hup, hung_up)
    try:
        yield
    finally:
        signal.signal(hup, signal.SIG_DFL)
