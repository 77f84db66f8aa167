"""A report removes the plot files an earlier report wrote into its plots folder and no longer draws, and only those
(finecap.report.plot_files): never a file of the user's there, a plot they changed, a copy of one, nor a file a
planted list names."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from finecap.app.report import check_plot_files
from finecap.outputs import OutputRefused, digest
from finecap.report.plot_files import PLOT_LIST, read_plot_list, write_plots
from finecap.utils.files import FSYNC_ENV
from helpers.durable_syncs import Recorder

PRECIOUS = b"\x89PNG\r\n\x1a\nthe user's own figure\n"


def drawn(tmp_path: Path, plots: dict[str, bytes]) -> Path:
    """A scratch folder holding ``plots`` as a report's drawing leaves them (``{name: bytes}``)."""
    folder = tmp_path / f"drawn{len(list(tmp_path.glob('drawn*')))}"
    folder.mkdir()
    for name, data in plots.items():
        (folder / name).write_bytes(data)
    return folder


def test_a_report_removes_the_plots_of_an_earlier_one_it_no_longer_draws_and_nothing_else(tmp_path):
    # a stage removed: its curves stayed in plots/ beside the new report's, the folder mixing two reports
    folder = tmp_path / "plots"
    first = {
        "curves_mle.png": b"mle 1",
        "curves_old.png": b"old",
        "smile_length.png": b"smile",
        "rl_x.png": b"rl",
        "bag_recall.png": b"bags",
    }
    assert write_plots(drawn(tmp_path, first), folder) == []
    assert read_plot_list(folder) == {name: digest(data) for name, data in first.items()}
    (folder / "mine.png").write_bytes(PRECIOUS)  # a figure of the user's
    (folder / "fig1.png").write_bytes(first["curves_old.png"])  # the user's copy of a plot of finecap's
    (folder / "smile_length.png").write_bytes(b"smile, touched up")  # a plot of finecap's the user changed
    (folder / "bag_recall.png").write_bytes(first["curves_mle.png"])  # ... or put another of finecap's plots at
    os.unlink(folder / "rl_x.png")  # one the user removed: nothing to do
    second = {"curves_mle.png": b"mle 2"}
    assert write_plots(drawn(tmp_path, second), folder) == ["curves_old.png"]
    assert sorted(p.name for p in folder.iterdir()) == [PLOT_LIST, "bag_recall.png", "curves_mle.png", "fig1.png",
                                                        "mine.png", "smile_length.png"]  # fmt: skip
    assert (folder / "mine.png").read_bytes() == PRECIOUS and (folder / "fig1.png").read_bytes() == b"old"
    assert (folder / "smile_length.png").read_bytes() == b"smile, touched up"
    assert read_plot_list(folder) == {"curves_mle.png": digest(b"mle 2")}  # this report's plots alone


def test_a_listed_plot_made_a_link_or_a_folder_is_kept(tmp_path):
    folder = tmp_path / "plots"
    write_plots(drawn(tmp_path, {"a.png": b"a", "b.png": b"b"}), folder)
    target = tmp_path / "precious.png"
    target.write_bytes(b"a")  # the listed bytes, behind a link: the link is not finecap's file
    os.unlink(folder / "a.png")
    os.symlink(target, folder / "a.png")
    os.unlink(folder / "b.png")
    (folder / "b.png").mkdir()
    assert write_plots(drawn(tmp_path, {"c.png": b"c"}), folder) == []
    assert (folder / "a.png").is_symlink() and target.read_bytes() == b"a" and (folder / "b.png").is_dir()


def test_a_planted_list_removes_nothing_finecap_did_not_write(tmp_path):
    # a run folder shared with a list naming files of the user's, with their bytes' digests, and a path outside
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "mine.png").write_bytes(PRECIOUS)
    outside = tmp_path / "results.png"
    outside.write_bytes(PRECIOUS)
    planted = {"finecap": "report plots", "plots": {"mine.png": digest(PRECIOUS)}}
    (folder / PLOT_LIST).write_text(json.dumps(planted))
    assert write_plots(drawn(tmp_path, {"a.png": b"a"}), folder) == []
    assert (folder / "mine.png").read_bytes() == PRECIOUS
    planted["plots"] = {"../results.png": digest(PRECIOUS)}  # not a plot file's name: the list is not read
    (folder / PLOT_LIST).write_text(json.dumps(planted))
    assert read_plot_list(folder) == {}
    assert write_plots(drawn(tmp_path, {"a.png": b"a"}), folder) == [] and outside.read_bytes() == PRECIOUS


def test_a_users_file_at_the_plot_list_is_refused_before_any_plot_is_written(tmp_path):
    folder = tmp_path / "plots"
    folder.mkdir()
    mine = folder / PLOT_LIST
    mine.write_bytes(b'{"my": "notes"}')
    with pytest.raises(OutputRefused, match=f"{mine}: a file finecap did not write, .* pass --force to replace it"):
        check_plot_files(folder, ["a.png"], given=False, force=False)
    check_plot_files(folder, ["a.png"], given=False, force=True)
    mine.write_text(json.dumps({"finecap": "report plots", "plots": {}}))  # a list (a run copied from elsewhere)
    check_plot_files(folder, ["a.png"], given=False, force=False)
    mine.unlink()
    os.symlink(tmp_path / "elsewhere.json", mine)
    with pytest.raises(OutputRefused, match="is a symbolic link"):
        check_plot_files(folder, ["a.png"], given=False, force=True)


def test_the_list_is_written_twice_only_when_an_earlier_report_listed_other_plots(tmp_path, monkeypatch):
    # the list of this report's plots was written twice, the second time the same bytes as the first (4 fsyncs each)
    # whenever no earlier plot was listed: the first write already names this report's plots alone
    import finecap.report.plot_files as plot_files

    lists = []
    write = plot_files.write_output_json

    def writing(path, obj, kind):
        lists.append(obj)
        write(path, obj, kind)

    monkeypatch.setattr(plot_files, "write_output_json", writing)
    folder = tmp_path / "plots"
    write_plots(drawn(tmp_path, {"a.png": b"a", "b.png": b"b"}), folder)
    assert [sorted(x["plots"]) for x in lists] == [["a.png", "b.png"]]
    write_plots(drawn(tmp_path, {"a.png": b"a 2", "b.png": b"b"}), folder)  # drawn again: no other plot listed
    assert [sorted(x["plots"]) for x in lists[1:]] == [["a.png", "b.png"]]
    assert write_plots(drawn(tmp_path, {"a.png": b"a"}), folder) == ["b.png"]
    assert [sorted(x["plots"]) for x in lists[2:]] == [["a.png", "b.png"], ["a.png"]]  # b listed until removed
    assert read_plot_list(folder) == {"a.png": digest(b"a")}


def test_the_plots_folder_is_synced_once_after_its_plots_and_after_their_list(tmp_path, monkeypatch):
    # the folder was synced after each plot's rename (a folder fsync a plot: 69 for the quick demo's report); one
    # after the last keeps what a power loss leaves (each plot the old file or the complete new one, listed) and every
    # plot on the disk before the report's page is written
    monkeypatch.setenv(FSYNC_ENV, "1")
    plots = {f"curves_{k}.png": f"plot {k}".encode() for k in range(4)}
    folder = tmp_path / "plots"
    rec = Recorder(monkeypatch)
    write_plots(drawn(tmp_path, plots), folder)
    renames = [rec.replaced_at(folder / name) for name in plots]
    folder_syncs = rec.synced_at(folder)
    # the list's name on the disk before any plot is renamed in: every plot a power loss leaves is listed
    assert any(rec.replaced_at(folder / PLOT_LIST) < i < min(renames) for i in folder_syncs), rec.events
    for name, renamed in zip(plots, renames, strict=True):
        assert any(i < renamed for i in rec.synced_at(folder / name)), (name, rec.events)  # its data before its name
    assert len(folder_syncs) == 2 and folder_syncs[-1] > max(renames), rec.events  # the list's, then all plots'
    assert {name: (folder / name).read_bytes() for name in plots} == plots
