"""The report's plot files in a folder (``<run_dir>/plots/``, or ``--plots DIR``): written, and those an earlier report
wrote there that this one no longer draws (a stage removed, a metric gone) removed, so that the folder holds one
report's plots, and never a file of the user's removed.

How finecap knows which files it wrote there: the folder's list, :data:`PLOT_LIST` (``{"finecap": "report plots",
"plots": {"<name>.png": "<sha256>"}}``), names each plot file the latest report wrote into it with the SHA-256 of the
bytes it wrote; it is written atomically and recorded as finecap's (:func:`finecap.outputs.write_output`). A file is
removed only when all of these hold: this report does not write it, the list names it, it is a regular file (not a
link) still holding exactly the bytes listed, and finecap's record of outputs knows those bytes as a plot it wrote
(:func:`finecap.outputs.made_by_finecap`, so a list planted in a shared run folder removes nothing of the user's).
A figure of yours in the folder, a plot of finecap's you changed, a copy of one under another name, and the plots
of a report written before finecap kept the list are kept.

Example::

    >>> import tempfile
    >>> drawn, folder = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    >>> _ = (drawn / "a.png").write_bytes(b"one"), (drawn / "b.png").write_bytes(b"two")
    >>> write_plots(drawn, folder)
    []
    >>> (drawn / "b.png").unlink(); _ = (folder / "mine.png").write_bytes(b"the user's")
    >>> write_plots(drawn, folder), sorted(p.name for p in folder.glob("*.png"))
    (['b.png'], ['a.png', 'mine.png'])
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

from finecap.outputs import digest, file_digest, recorded_as, write_output, write_output_json
from finecap.utils.files import one_folder_sync
from finecap.utils.reading import read_json

log = logging.getLogger(__name__)

PLOT_LIST = ".finecap-plots.json"
"""The list of the plot files the latest report wrote into a plots folder, kept in that folder."""
LIST_KIND = "plot-list"
"""The list's kind in finecap's record of outputs (:data:`finecap.outputs.KINDS`)."""
MARK = "report plots"
"""The list's ``finecap`` entry, by which :func:`is_plot_list` recognises one."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _plot_name(name: object) -> bool:
    """Whether ``name`` is a plot file's name in the folder: a ``.png`` name with no folder part (never ``..``)."""
    return (isinstance(name, str) and name.endswith(".png") and name == os.path.basename(name) and "\0" not in name
            and (os.altsep is None or os.altsep not in name))  # fmt: skip


def _listed(value: object) -> dict[str, str] | None:
    """The plots a list's JSON ``value`` names (``{name: sha256}``), or None when it is not a list of this layout."""
    if not isinstance(value, dict) or value.get("finecap") != MARK or not isinstance(value.get("plots"), dict):
        return None
    plots = value["plots"]
    ok = all(_plot_name(k) and isinstance(v, str) and _SHA256.fullmatch(v) for k, v in plots.items())
    return dict(plots) if ok else None


def _read(path: Path) -> dict[str, str] | None:
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return _listed(read_json(path))
    except (OSError, ValueError):
        return None


def is_plot_list(path: str | Path) -> bool:
    """Whether ``path`` is a regular file holding a plot list of this layout (finecap's, by its content: a run folder
    copied from another machine holds one its finecap home never recorded), which a report may replace."""
    return _read(Path(path)) is not None


def read_plot_list(folder: str | Path) -> dict[str, str]:
    """The plot files the folder's list names, ``{name: sha256}``; empty when there is no list, or none of this
    layout (nothing is removed on its word)."""
    return _read(Path(folder) / PLOT_LIST) or {}


def _write_list(folder: Path, plots: dict[str, str]) -> None:
    write_output_json(folder / PLOT_LIST, {"finecap": MARK, "plots": dict(sorted(plots.items()))}, LIST_KIND)


def _remove_if_ours(path: Path, listed: str) -> bool:
    """Remove ``path`` when it is a regular file holding the ``listed`` bytes, which finecap wrote as a plot; whether
    it did."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    if file_digest(path) != listed or not recorded_as(listed, ("plot",)):  # the file read once
        log.info("report: kept %s, a plot an earlier report wrote, as it changed since", path)
        return False
    path.unlink()
    return True


def write_plots(drawn: Path, folder: Path) -> list[str]:
    """Write every file of ``drawn`` (the plots this report drew) into ``folder`` as a plot, and remove the plot files
    an earlier report wrote there that this one does not (see the module); returns the names removed. The caller has
    checked every target first (:func:`finecap.app.report.check_plot_files`: no link, no file of the user's at a
    plot's name, nor at :data:`PLOT_LIST`).

    The list is written first as the earlier plots and this report's together, so that a report stopped midway
    leaves every file it may have written listed; then the plots, the removals, and the list of this report's plots
    alone (a changed earlier plot, kept, is no longer listed: it is the user's), when the first list named any other.
    Each plot is written once, atomically and durably, and recorded as finecap's
    (:func:`finecap.outputs.write_output`): ``drawn`` holds drafts (:func:`finecap.report.plots.drafts`), neither
    synced nor recorded. Each plot's data is on the disk before its rename, and ``folder`` is synced once after the
    last (:func:`finecap.utils.files.one_folder_sync`), before this returns and so before the report's page is
    written: a power loss leaves each plot the old file or the complete new one, listed."""
    folder.mkdir(parents=True, exist_ok=True)
    new = {path.name: path.read_bytes() for path in sorted(drawn.iterdir())}
    digests = {name: digest(data) for name, data in new.items()}
    earlier = {name: sha for name, sha in read_plot_list(folder).items() if name not in new}
    _write_list(folder, earlier | digests)  # on the disk before any plot is renamed in: every one of them is listed
    with one_folder_sync(folder):  # each plot's data synced before its rename; the folder's entries once, after all
        for name, data in new.items():
            write_output(folder / name, data, "plot")
    removed = [name for name, sha in earlier.items() if _remove_if_ours(folder / name, sha)]
    if earlier:  # else the list written first is this report's plots alone already
        _write_list(folder, digests)
    return removed
