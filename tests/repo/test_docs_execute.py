"""The docs execute (issue 64): every shell command and Python snippet of README.md and docs/ runs here, as written,
or its page marks it as needing what this machine lacks (a GPU, a download, vLLM, ...; CONTRIBUTING.md, "The docs
execute"). A command that fails fails the page's test, naming the page and line; a block with no language or an
unknown marker fails :func:`test_every_block_is_runnable_or_marked`, so a new page cannot escape.

Each page runs in an empty working directory of its own, its blocks in the page's order (a run trained by one block
is there for the next), with a finecap home of its own that holds the tiny world and its encoder (made once, copied).
The sizes are the test's: ``FINECAP_OVERRIDES`` (docs/configuration.md, "Overrides from the environment") appends
:data:`TINY`, a 56-image world of 32 px, one retriever epoch, a 1-layer ClipCap and 2 training steps, to every
command; each command says so on stderr and writes them into its run's config.yaml. ``finecap`` commands run in this
process (its imports paid once); any other command in ``bash -e``. The parser is tests/helpers/doc_blocks.py.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finecap.app.cli import OVERRIDES_ENV, main
from helpers.doc_blocks import Block, blocks, commands, problems

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TINY = (
    "world.n_train=40 world.n_val=8 world.n_test=8 world.image_size=32 retriever.epochs=1 clipcap.tiny_layers=1 "
    "clipcap.tiny_hidden=32 clipcap.tiny_heads=2 clipcap.prefix_length=2 train.batch_size=16 train.max_steps=2 "
    "train.warmup_steps=1 train.eval_every=2 train.eval_samples=8 decode.max_length=10 decode.batch_size=16 "
    "eval.n_distractors=7"
)
"""What the test appends to every command (:data:`finecap.app.cli.OVERRIDES_ENV`): a tiny world and model."""


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page, ROOT)]


def runnable_pages() -> list[str]:
    """The pages with a block to run (unmarked shell or Python, a setup line or an ``error`` transcript)."""
    return sorted({b.page for b in all_blocks() if runs(b)})


def runs(block: Block) -> bool:
    """Whether the test runs (some of) ``block``: a shell or Python block not wholly skipped, or a setup line."""
    return block.kind in ("shell", "python") and not block.skipped


def test_every_block_is_runnable_or_marked():
    found = [p for b in all_blocks() for p in problems(b)]
    assert found == [], "\n".join(found)
    # the `covered` marker names a test file that exists and reads the page
    for b in all_blocks():
        for mark in b.marks:
            if mark.kind == "covered":
                test = ROOT / mark.target
                assert test.is_file() and b.page in test.read_text(), f"{b.where}: {mark.text!r}: no test of the page"


def test_the_parser_finds_what_it_must(tmp_path):
    # a page of each case: the parser's own check, on a page written here
    page = tmp_path / "p.md"
    page.write_text(
        "text\n$ finecap recipes\n\n<!-- docs-test: skip gpu -->\n\n```bash\nfinecap train a \\\n  b=1  # c\n```\n"
        "```\nplain\n```\n<!-- docs-test: setup finecap config -->\n```console\n$ finecap x\nout\n```\n"
        "<!-- docs-test: skip nothing -->\n```python\n1\n```\n```text\n$ ls\n```\n"
    )
    found = blocks(page, tmp_path)
    assert [(b.line, b.lang, [m.text for m in b.marks]) for b in found] == [
        (2, "console", []), (6, "bash", ["skip gpu"]), (10, "", []), (13, "bash", []), (14, "console", []),
        (19, "python", ["skip nothing"]), (22, "text", []),
    ]  # fmt: skip
    assert [(c.line, c.words) for c in commands(found[1])] == [(7, ["finecap", "train", "a", "b=1"])]
    assert [(c.line, c.words) for c in commands(found[4])] == [(15, ["finecap", "x"])]
    assert [bool(problems(b)) for b in found] == [False, False, True, False, False, True, True]


def test_markers_are_checked(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- docs-test: skip gpu 1 -->\n<!-- docs-test: skip external 3: jq -->\n```bash\na\nb\nc\n```\n"
        "<!-- docs-test: skip download 3: x -->\n```bash\na\nb\n```\n"
        "<!-- docs-test: skip long -->\n```bash\na\n```\n"
        "<!-- docs-test: skip covered: no path -->\n```python\na\n```\n"
        "<!-- docs-test: error -->\n```console\n$ finecap x\nfinecap: error: x ...\n```\n"
        "<!-- docs-test: error -->\n```console\n$ finecap x\n```\n"
    )
    found = blocks(page, tmp_path)
    assert [found[0].skips(n) for n in (1, 2, 3)] == [True, False, True] and not found[0].skipped
    assert [bool(problems(b)) for b in found] == [False, True, True, True, False, True]


def finecap(words: list[str]) -> tuple[int, str]:
    """``finecap WORDS`` in this process: (exit code, what it printed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(words)
        except SystemExit as e:  # --help, argparse's usage errors
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue()


def run_shell(block: Block, cwd: Path) -> None:
    """Run a shell block's commands in ``cwd``: each must exit 0 (a ``docs-test: error`` transcript: exit 2 with the
    error line the page shows, up to its ``...``)."""
    shown = [line for line in block.text.split("\n") if line.startswith("finecap: error:")]
    for k, cmd in enumerate(commands(block)):
        if block.skips(k + 1):
            continue
        where = f"{block.page}:{cmd.line}: {cmd.source}"
        env = {}
        words = list(cmd.words)
        while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value finecap ...
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if words and words[0] == "finecap" and not any(w in ("|", "&&", ";", ">", "&") for w in words):
            with pytest.MonkeyPatch.context() as mp:
                for key, value in env.items():
                    mp.setenv(key, value)
                code, printed = finecap(words[1:])
        else:
            proc = subprocess.run(["bash", "-ec", cmd.source], cwd=cwd, capture_output=True, text=True, timeout=300)
            code, printed = proc.returncode, proc.stdout + proc.stderr
        if block.error:
            assert code == 2, f"{where}: expected exit 2, got {code}:\n{printed[-3000:]}"
            expected = shown[k].split("...")[0]
            got = [line for line in printed.splitlines() if line.startswith("finecap: error:")]
            assert got and got[0].startswith(expected), f"{where}: the page shows\n{shown[k]}\nthe command says\n{got}"
        else:
            assert code == 0, f"{where}: exit {code}:\n{printed[-3000:]}"


def run_python(block: Block) -> None:
    """Run a Python block (``>>>`` lines: as a doctest) in a fresh namespace."""
    name = f"{block.page}:{block.line}"
    if block.text.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(block.text, {}, name, block.page, block.line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        out = io.StringIO()
        runner.run(test, out=out.write)
        assert runner.failures == 0, f"{name}:\n{out.getvalue()}"
        return
    try:
        exec(compile(block.text, name, "exec"), {"__name__": "__docs__"})
    except Exception as e:
        raise AssertionError(f"{name}: {type(e).__name__}: {e}") from e


@pytest.fixture(scope="module")
def seeded_home(tmp_path_factory):
    """A finecap home holding the tiny world and its world encoder (what a first command makes), copied into each
    page's own home: each page runs as on a machine where only those were made, its runs its own."""
    home = tmp_path_factory.mktemp("docs-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINECAP_HOME", str(home))
        mp.setenv(OVERRIDES_ENV, TINY)
        mp.chdir(home)
        for words in (["world", "make"], ["retriever", "train"]):
            code, printed = finecap(words)
            assert code == 0, printed
    return home


@pytest.mark.slow  # every page's commands at the tiny size: about a minute in all, most of it the first world
@pytest.mark.parametrize("page", runnable_pages())
def test_page_executes(page, seeded_home, tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(seeded_home, home)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("FINECAP_HOME", str(home))
    monkeypatch.setenv(OVERRIDES_ENV, TINY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.chdir(cwd)
    for block in [b for b in blocks(ROOT / page, ROOT) if runs(b)]:
        if block.kind == "shell":
            run_shell(block, cwd)
        else:
            run_python(block)
