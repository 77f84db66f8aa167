"""`finecap report` writes only its page and plots (issue 32): never through a link planted at `plots/*.png` or at
`--out`, never over a file of the run it reads, never over a file of the user's without `--force`; with `--out` the
page alone (its plots inlined), unless `--plots DIR` asks for the plot files."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image, PngImagePlugin

from finecap.app.demo import write_demo_report
from finecap.app.report import main as write_report
from finecap.outputs import OutputRefused, digest
from finecap.report.plot_files import PLOT_LIST
from finecap.report.plots import length_curves
from finecap.utils.files import FSYNC_ENV, is_temporary_of
from helpers.cli import refused, run_cli

PRECIOUS = b"the user's own file\n"


@pytest.fixture()
def run(fabricated_run, tmp_path) -> Path:
    return shutil.copytree(fabricated_run, tmp_path / "run")


@pytest.mark.slow
def test_report_never_draws_a_plot_through_a_link(run, tmp_path):
    first = write_report(shutil.copytree(run, tmp_path / "first"), retrieval=False)
    plots = sorted(p.name for p in (first.parent / "plots").glob("*.png"))
    assert plots  # the fabricated run has training curves and lengths to draw
    target = tmp_path / "precious.png"
    target.write_bytes(PRECIOUS)
    for name in plots:
        (run / "plots").mkdir(exist_ok=True)
        link = run / "plots" / name
        link.unlink(missing_ok=True)  # drawn by the previous round, before it met its link
        os.symlink(target, link)
        with pytest.raises(OutputRefused, match=f"{link}: is a symbolic link"):
            write_report(run, retrieval=False)
        assert target.read_bytes() == PRECIOUS
        link.unlink()


@pytest.mark.slow
def test_report_never_draws_a_plot_over_a_users_file(run, tmp_path):
    # plots/*.png were written over whatever was there (atomically, but a user's figure of that name was lost)
    first = write_report(shutil.copytree(run, tmp_path / "first"), retrieval=False)
    name = sorted(p.name for p in (first.parent / "plots").glob("*.png"))[0]
    (run / "plots").mkdir(exist_ok=True)
    mine = run / "plots" / name
    mine.write_bytes(b"\x89PNG\r\n\x1a\n" + PRECIOUS)  # an image of the user's (not matplotlib's) by that name
    with pytest.raises(OutputRefused, match=f"{mine}: a file in the run folder's plots/, where the report writes its "
                                            "plots, that finecap did not draw"):  # fmt: skip
        write_report(run, retrieval=False)
    assert mine.read_bytes() == b"\x89PNG\r\n\x1a\n" + PRECIOUS
    mine.unlink()
    write_report(run, retrieval=False)
    write_report(run, retrieval=False, force=True)  # its own plots are drawn again


def matplotlib_figure(path: Path, text: str) -> bytes:
    """A figure of the user's drawn with matplotlib and saved at ``path`` (a PNG holding matplotlib's ``Software``
    text, as finecap's plots do); its bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [2, 0, 1])
    ax.set_title(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path.read_bytes()


@pytest.mark.slow
def test_report_keeps_a_users_matplotlib_figure_by_a_plots_name(run):
    # any PNG matplotlib wrote was taken for a plot of an earlier report and drawn over: the user's figure was lost
    write_report(run, retrieval=False)  # finecap's own page and plots, then the user's figure by a plot's name
    mine = run / "plots" / "length_hist.png"
    figure = matplotlib_figure(mine, "my own figure")
    assert b"Matplotlib" in figure[:256]
    refusal = (f"{mine}: a file in the run folder's plots/, where the report writes its plots, that finecap did not "
               "draw (or that changed since); move it away, pass --force to replace it")  # fmt: skip
    with pytest.raises(OutputRefused, match=re.escape(refusal)):
        write_report(run, retrieval=False)
    assert mine.read_bytes() == figure
    # nor beside the page, where the demo draws its smile_length.png
    beside = run / "smile_length.png"
    beside_figure = matplotlib_figure(beside, "mine too")
    with pytest.raises(OutputRefused, match=re.escape(f"{beside} exists and finecap did not make it as a plot file")):
        length_curves({"smile": run / "smile", "random": run / "smile_random"}, beside)
    assert beside.read_bytes() == beside_figure


@pytest.mark.slow
def test_report_draws_again_the_plots_of_a_report_written_before_finecap_remembered_them(run, tmp_path):
    # a report folder of a finecap that recorded no plot and kept no list of them, or one copied from another machine
    # (its plots recorded in another finecap home): its own page shows them, and they are drawn again
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINECAP_HOME", str(tmp_path / "another-home"))
        page = write_report(run, retrieval=False)
    (run / "plots" / PLOT_LIST).unlink()
    before = {p.name: p.read_bytes() for p in (run / "plots").glob("*.png")}
    assert len(before) >= 5 and all(b"Matplotlib" in data[:256] for data in before.values())
    assert write_report(run, retrieval=False) == page  # not refused: each plot is one the page shows
    assert (run / "plots" / PLOT_LIST).is_file() and {p.name for p in (run / "plots").glob("*.png")} == set(before)
    # the page shows a plot by its pixels: one saved again with other bytes (not remembered) but the same image
    plot = run / "plots" / "length_hist.png"
    with Image.open(plot) as image:
        image.load()
        image.save(plot, pnginfo=_matplotlib_info())
    assert plot.read_bytes() != before["length_hist.png"]
    assert write_report(run, retrieval=False) == page
    # ... and a figure the page does not show is the user's, however it was drawn
    figure = matplotlib_figure(plot, "mine")
    with pytest.raises(OutputRefused, match=re.escape(f"{plot}: a file in the run folder's plots/")):
        write_report(run, retrieval=False)
    assert plot.read_bytes() == figure


def _matplotlib_info() -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    info.add_text("Software", "Matplotlib version3.9.0, https://matplotlib.org/")
    return info


@pytest.mark.slow
def test_the_demos_report_stage_says_what_helps_with_a_users_file_not_its_own_force(run, tmp_path):
    # `finecap demo` stopped at its report stage with the report's "pass --force": the demo's --force trains every
    # stage again. write_demo_report is what the stage calls, after results.json
    page = write_report(run, retrieval=False)
    edited = page.read_text() + "<!-- my notes -->"
    page.write_text(edited)
    with pytest.raises(OutputRefused) as refusal:
        write_demo_report(run)
    said = str(refusal.value)
    assert said.startswith(f"{page} exists and finecap did not make it as a report file (or it was changed since); ")
    assert f"move it away and run `finecap report {run}`, or replace it with `finecap report {run} --force`" in said
    assert "would train every stage again" in said and "pass --force" not in said and "--out" not in said
    assert page.read_text() == edited
    # a figure of the user's by a plot's name: the same advice, naming that file
    shutil.move(page, tmp_path / "my-notes.html")
    mine = run / "plots" / "length_hist.png"
    figure = matplotlib_figure(mine, "my own figure")
    with pytest.raises(OutputRefused) as refusal:
        write_demo_report(run)
    said = str(refusal.value)
    assert said.startswith(f"{mine}: a file in the run folder's plots/") and f"finecap report {run} --force" in said
    assert "pass --force" not in said and "--plots DIR" not in said
    assert mine.read_bytes() == figure and not page.exists()


@pytest.mark.slow
def test_report_checks_every_plot_file_before_writing_any(run, tmp_path):
    # a figure of the user's at plots/length_hist.png stopped the report after plots/curves_*.png were written, with
    # "plots: ... choose another plots" (no such option) and --force of no help
    names = sorted(p.name for p in (write_report(shutil.copytree(run, tmp_path / "first"), retrieval=False).parent
                                    / "plots").glob("*.png"))  # fmt: skip
    assert "curves_mle.png" in names and "length_hist.png" in names  # the curves are drawn before the histogram
    (run / "plots").mkdir()
    mine = run / "plots" / "length_hist.png"
    mine.write_bytes(PRECIOUS)
    line = refused(["report", str(run), "--no-bag-outcomes"], f"{mine}: ", "the run folder's plots/", "--force",
                   "--out (one HTML file, no plot files)", "--plots DIR")  # fmt: skip
    assert "choose another plots" not in line
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["length_hist.png"]  # nothing else written
    assert mine.read_bytes() == PRECIOUS and not (run / "report.html").exists()
    # --force replaces it; --plots DIR refuses a file of the user's there naming --plots
    assert run_cli(["report", str(run), "--no-bag-outcomes", "--force"])[0] == 0
    assert sorted(p.name for p in (run / "plots").iterdir()) == sorted([PLOT_LIST, *names])  # the plots and their list
    assert mine.read_bytes() != PRECIOUS
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / names[-1]).write_bytes(PRECIOUS)
    refused(["report", str(run), "--no-bag-outcomes", "--out", str(tmp_path / "page.html"), "--plots", str(figures)],
            f"--plots: {figures / names[-1]}: ", "choose another --plots")  # fmt: skip
    assert sorted(p.name for p in figures.iterdir()) == [names[-1]] and not (tmp_path / "page.html").exists()


@pytest.mark.slow
def test_report_out_writes_one_html_file_and_plots_only_where_asked(run, tmp_path):
    # --out elsewhere wrote plots/ into the run folder too, where the docs promise one HTML file
    page = tmp_path / "page" / "report.html"
    page.parent.mkdir()
    assert write_report(run, page, retrieval=False) == page
    assert not (run / "plots").exists() and sorted(p.name for p in page.parent.iterdir()) == ["report.html"]
    assert page.read_text().count('src="data:image/png;base64,') >= 7  # the plots are in the page
    figures = tmp_path / "figures"
    write_report(run, page, retrieval=False, plots=figures)
    assert sorted(p.name for p in figures.glob("*.png")) and not (run / "plots").exists()
    # a --plots that names what the report reads is refused, as --out is
    with pytest.raises(OutputRefused, match="--plots: .*results.json is also the command's"):
        write_report(run, page, retrieval=False, plots=run / "results.json")


@pytest.mark.slow
def test_report_out_never_over_what_it_reads_nor_a_users_file(run, tmp_path):
    captions = run / "captions" / "mle.json"
    before = captions.read_bytes()
    with pytest.raises(OutputRefused, match="is also the command's"):
        write_report(run, captions, retrieval=False, force=True)
    assert captions.read_bytes() == before
    mine = tmp_path / "page.html"
    mine.write_bytes(PRECIOUS)
    with pytest.raises(OutputRefused, match="finecap did not make it"):
        write_report(run, mine, retrieval=False)
    assert mine.read_bytes() == PRECIOUS
    link = tmp_path / "link.html"
    os.symlink(mine, link)
    with pytest.raises(OutputRefused, match="symbolic link"):
        write_report(run, link, retrieval=False, force=True)
    assert mine.read_bytes() == PRECIOUS
    # its own page is replaced when the report is drawn again; a user's file only when asked
    out = write_report(run, retrieval=False)
    assert write_report(run, retrieval=False) == out
    # a page of finecap's edited by hand since is the user's (it was replaced: still a report page by its content)
    edited = out.read_text() + "<!-- my notes -->"
    out.write_text(edited)
    refusal = f"{out} exists and finecap did not make it as a report file (or it was changed since); pass --force"
    with pytest.raises(OutputRefused, match=re.escape(refusal)):
        write_report(run, retrieval=False)
    assert out.read_text() == edited
    assert write_report(run, retrieval=False, force=True) == out and "my notes" not in out.read_text()
    # its own unedited page is known by the page itself, whatever finecap home wrote it (a run copied from another
    # machine, a home emptied since): the page's last line holds the SHA-256 of the rest
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINECAP_HOME", str(tmp_path / "another-home"))
        assert write_report(run, retrieval=False) == out
        out.write_text(edited)
        with pytest.raises(OutputRefused, match=re.escape(refusal)):
            write_report(run, retrieval=False)
        assert out.read_text() == edited
        out.write_text(out.read_text().replace("<!-- my notes -->", "").replace("</body>", "<p>mine</p></body>", 1))
        with pytest.raises(OutputRefused, match=re.escape(refusal)):
            write_report(run, retrieval=False)
    assert write_report(run, mine, retrieval=False, force=True) == mine and b"finecap report" in mine.read_bytes()
    # every file the report reads is refused, with --force too (vcb_results.json was replaced by the page)
    vcb = run / "vcb_results.json"
    made = not vcb.exists()
    if made:
        vcb.write_text("{}")
    try:
        with pytest.raises(OutputRefused, match="is also the command's"):
            write_report(run, vcb, retrieval=False, force=True)
    finally:
        if made:
            vcb.unlink()


def test_report_never_writes_bag_outcomes_over_a_users_file(run, tmp_path):
    # bag_outcomes.json was rewritten in the run folder whatever it held (session 33's note)
    from finecap.app.report import check_bag_outcomes_file
    from finecap.outputs import write_output_json

    mine = run / "bag_outcomes.json"
    mine.write_bytes(PRECIOUS)
    with pytest.raises(OutputRefused, match=f"{mine}: a file finecap did not write .* pass --force to replace it, or "
                                            "--no-bag-outcomes"):  # fmt: skip
        write_report(run)  # refused before any work: no page either
    assert mine.read_bytes() == PRECIOUS and not (run / "report.html").exists()
    assert check_bag_outcomes_file(run, force=True) == mine
    write_output_json(mine, {"bags": "b.json", "retriever": "world", "outcomes": {}}, "bag-outcomes")  # finecap's
    assert check_bag_outcomes_file(run, force=False) == mine
    os.unlink(mine)
    os.symlink(tmp_path / "precious.json", mine)
    with pytest.raises(OutputRefused, match="is a symbolic link"):
        check_bag_outcomes_file(run, force=True)
    os.unlink(mine)
    mine.mkdir()
    with pytest.raises(OutputRefused, match="not a regular file"):
        check_bag_outcomes_file(run, force=True)


@pytest.mark.slow
def test_an_out_no_file_can_be_written_at_is_refused_before_any_plot_is(run, tmp_path):
    # --out through a file (a typo: results.json/report.html) was found only when the page was written, last: after
    # every plot file had been written into --plots and bag_outcomes.json into the run folder, then the error.
    (tmp_path / "afile").write_bytes(PRECIOUS)
    figures = tmp_path / "figures"
    with pytest.raises(OutputRefused, match="afile is not a folder"):
        write_report(run, tmp_path / "afile" / "r.html", plots=figures, retrieval=False)
    with pytest.raises(OutputRefused, match="--plots: .*afile is not a folder"):
        write_report(run, tmp_path / "r.html", plots=tmp_path / "afile" / "figures", retrieval=False)
    assert not figures.exists() and not (tmp_path / "r.html").exists() and not (run / "plots").exists()
    assert (tmp_path / "afile").read_bytes() == PRECIOUS


@pytest.mark.slow
def test_a_new_report_removes_the_plots_of_an_earlier_one_it_no_longer_draws(run, tmp_path):
    # the stage smile_random gone from the run: its curves and the SMILE length plot (which needs an ablation) stayed
    # in plots/ beside the new report's, the folder mixing two reports
    write_report(run, retrieval=False)
    before = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert {"curves_smile_random.png", "smile_length.png", "curves_mle.png"} <= set(before)
    (run / "plots" / "mine.png").write_bytes(PRECIOUS)  # a figure of the user's, kept
    shutil.copy(run / "plots" / "smile_length.png", run / "plots" / "fig1.png")  # the user's copy of one, kept
    shutil.rmtree(run / "smile_random")
    write_report(run, retrieval=False)
    after = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert sorted(set(before) - set(after)) == ["curves_smile_random.png", "smile_length.png"]
    assert set(after) - set(before) == {"mine.png", "fig1.png"}
    assert (run / "plots" / "mine.png").read_bytes() == PRECIOUS
    # --plots DIR likewise
    figures = tmp_path / "figures"
    write_report(shutil.copytree(run, tmp_path / "other"), tmp_path / "page.html", retrieval=False, plots=figures)
    shutil.rmtree(tmp_path / "other" / "smile")
    write_report(tmp_path / "other", tmp_path / "page.html", retrieval=False, plots=figures)
    assert not (figures / "curves_smile.png").exists() and (figures / "curves_mle.png").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names each synced file by /proc/self/fd")
def test_a_report_writes_syncs_and_records_each_plot_once(run, tmp_path, monkeypatch):
    # each plot was written twice, durably: drawn into the report's scratch folder through write_output (an atomic
    # write, its fsyncs and a record in the finecap home), then written into plots/ and recorded again: 8 fsyncs a
    # plot, 1,112 for a report of 137. The drawing is a draft now; the plot file is written, synced and recorded once
    monkeypatch.setenv(FSYNC_ENV, "1")
    home = tmp_path / "home"
    monkeypatch.setenv("FINECAP_HOME", str(home))
    synced: list[Path] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))  # the file's name then: the temporary one
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_report(run, retrieval=False)
    plots = {p.name: p.read_bytes() for p in (run / "plots").glob("*.png")}
    assert len(plots) >= 5
    for name, data in plots.items():
        assert [p.parent for p in synced if is_temporary_of(p.name, name)] == [(run / "plots").resolve()], name
        record = f"{digest(data)}.plot"
        assert [p.parent for p in synced if is_temporary_of(p.name, record)] == [(home / "made").resolve()], name
    # what finecap records as a plot is what it left, and nothing it only drew: --out alone leaves no plot file
    assert sorted(p.name for p in (home / "made").glob("*.plot")) == sorted(
        f"{digest(d)}.plot" for d in plots.values()
    )
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "another-home"))
    write_report(run, tmp_path / "page.html", retrieval=False)
    assert not list((tmp_path / "another-home").glob("made/*.plot"))
