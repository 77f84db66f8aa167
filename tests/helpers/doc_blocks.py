"""The code blocks of the Markdown pages, and the ``docs-test`` markers that say which of them a test may not run here
(CONTRIBUTING.md, "The docs execute"): the parser tests/repo/test_docs_execute.py runs the pages with. Plain Python,
no Markdown library.

A fenced block (a line of three backticks and a language, up to the closing backticks, indented or not) is:

- *runnable*: ``bash``, ``sh``, ``shell`` or ``console`` (its ``$ `` lines) hold shell commands; ``python`` a Python
  snippet (``>>>`` lines: a doctest);
- *prose*: a language of :data:`PROSE` (an output, a file's contents, a tree);
- *unrecognised*: no language, or any other; :func:`problems` names it, so no command escapes by its fence.

A line starting ``$ `` outside any fence is a one-line shell block too. An HTML comment right before a block (blank
lines and other comments between allowed) marks it: ``<!-- docs-test: skip KIND: why -->`` with a KIND of
:data:`SKIPS` (``skip KIND 2,3: why``: only the block's 2nd and 3rd commands), or ``<!-- docs-test: error -->`` for
a console transcript of commands that must fail with the error the page shows. A comment ``<!-- docs-test: setup
COMMAND -->`` on a line of its own is a shell command the test runs there, in the page's order (what the page assumes
was done before, e.g. a run it captions from).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

SHELL = frozenset({"bash", "sh", "shell", "console"})
"""Fence languages holding shell commands."""
PYTHON = frozenset({"python", "py", "pycon"})
"""Fence languages holding a Python snippet."""
PROSE = frozenset({"text", "json", "jsonl", "yaml", "yml", "toml", "html", "diff", "csv", "ini", "markdown"})
"""Fence languages of what is shown, never run: outputs, file contents, trees."""
SKIPS = {
    "gpu": "needs a CUDA GPU",
    "download": "needs a model, data set or package from the network (the Hub, COCO, pip)",
    "vllm": "needs vLLM (make vllm: .venv-vllm)",
    "long": "a job of minutes or hours; the marker names what covers it",
    "server": "starts a server that runs until stopped",
    "external": "needs another program or framework than finecap's test venv holds (verl, ms-swift, jq, ...)",
    "fragment": "not whole: placeholders (...), names or files the page only describes",
    "covered": "run by the test the marker names (a tests/ file that names this page)",
}
"""``<!-- docs-test: skip KIND: why -->``'s kinds and what each means."""
NOTE_REQUIRED = frozenset({"long", "covered"})
"""Kinds whose marker must say more (``skip long: make demo; tests/app/test_demo.py runs --quick``)."""

FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
COMMENT = re.compile(r"^\s*<!--.*-->\s*$")


@dataclass
class Mark:
    """One ``<!-- docs-test: TEXT -->`` marker of a block: ``skip KIND [N,M]: note`` or ``error``."""

    text: str

    @property
    def kind(self) -> str | None:
        """The KIND of ``skip KIND``, ``error`` for an error transcript, else ``None`` (not a marker)."""
        words = self.text.split(":", 1)[0].split()
        if words == ["error"]:
            return "error"
        return words[1] if len(words) > 1 and words[0] == "skip" else None

    @property
    def only(self) -> set[int] | None:
        """The commands a partial marker skips (``skip download 2,4: ...``: the block's 2nd and 4th commands, counted
        from 1), ``None`` when it skips the whole block."""
        words = self.text.split(":", 1)[0].split()
        if len(words) > 2 and re.fullmatch(r"\d+(,\d+)*", words[2]):
            return {int(n) for n in words[2].split(",")}
        return None

    @property
    def target(self) -> str:
        """What ``skip covered PATH`` names (``PATH``), else empty."""
        words = self.text.split(":", 1)[0].split()
        return words[2] if self.kind == "covered" and len(words) > 2 else ""

    @property
    def note(self) -> str:
        """What the marker says after its colon."""
        return self.text.split(":", 1)[1].strip() if ":" in self.text else ""


@dataclass
class Block:
    """One code block of ``page`` (its fence, or its ``$ `` line, at 1-based ``line``)."""

    page: str
    line: int
    lang: str
    text: str
    marks: list[Mark] = field(default_factory=list)
    """The ``docs-test:`` markers right before it."""
    setup: bool = False
    """A ``<!-- docs-test: setup COMMAND -->`` line: ``text`` is the command."""
    fenced: bool = True
    """Between fences (its text starts the line after ``line``), else one line (a ``$ `` line, a setup comment)."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        """``shell``, ``python``, ``prose`` or ``unknown``."""
        if self.lang in SHELL:
            return "shell"
        if self.lang in PYTHON:
            return "python"
        return "prose" if self.lang in PROSE else "unknown"

    @property
    def error(self) -> bool:
        """Marked ``error``: a transcript of commands that must fail as shown."""
        return any(m.kind == "error" for m in self.marks)

    @property
    def skipped(self) -> bool:
        """Wholly skipped by a ``skip KIND`` marker naming no commands."""
        return any(m.kind in SKIPS and m.only is None for m in self.marks)

    def skips(self, number: int) -> bool:
        """Whether the block's ``number``-th command (from 1) is skipped by a marker."""
        return self.skipped or any(m.kind in SKIPS and number in (m.only or ()) for m in self.marks)


@dataclass
class Command:
    """One shell command of a block: ``words`` (shell-split, comments dropped) from 1-based page ``line``."""

    line: int
    source: str
    words: list[str] = field(default_factory=list)


def blocks(page: Path, root: Path) -> list[Block]:
    """Every code block, ``$ `` line and setup comment of ``page``, in order (``page`` named relative to ``root``)."""
    name = page.relative_to(root).as_posix()
    lines = page.read_text().split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        marker = MARKER.match(text)
        if marker and marker.group(1).startswith("setup "):
            out.append(Block(name, i + 1, "bash", marker.group(1)[len("setup ") :], setup=True, fenced=False))
        fence = FENCE.match(text)
        if fence:
            indent, ticks, lang = fence.group(1), fence.group(2), fence.group(3).lower()
            body = []
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(ticks):
                body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            out.append(Block(name, i + 1, lang, "\n".join(body), marks_before(lines, i)))
            i = j + 1
            continue
        if text.startswith("$ "):
            out.append(Block(name, i + 1, "console", text, marks_before(lines, i), fenced=False))
        i += 1
    return out


def marks_before(lines: list[str], i: int) -> list[Mark]:
    """The ``docs-test:`` markers among the comment and blank lines right above line index ``i`` (setups aside)."""
    out = []
    j = i - 1
    while j >= 0 and (not lines[j].strip() or COMMENT.match(lines[j])):
        found = MARKER.match(lines[j])
        if found and not found.group(1).startswith("setup "):
            out.insert(0, Mark(found.group(1)))
        j -= 1
    return out


def problems(block: Block) -> list[str]:
    """What is wrong with a block's fence or markers: an unrecognised language, ``$ `` lines outside ``console``, a
    marker of no known kind, without its note or naming commands the block lacks. Empty when the block may be run or
    skipped as marked."""
    where = block.where
    if block.setup:
        return []
    if block.kind == "unknown":
        return [f"{where}: a block of language {block.lang or '(none)'!r}: give it one of bash, console, python or "
                f"{', '.join(sorted(PROSE))}"]  # fmt: skip
    if block.kind == "prose":
        out = [f"{where}: a marker on a {block.lang!r} block, which is never run"] if block.marks else []
        if any(line.startswith("$ ") for line in block.text.split("\n")):
            out.append(f"{where}: `$ ` command lines in a {block.lang!r} block: make it ```console")
        return out
    out = []
    for mark in block.marks:
        kind = mark.kind
        if kind == "error":
            errors = [line for line in block.text.split("\n") if line.startswith("finecap: error:")]
            if block.lang != "console" or len(errors) != len(commands(block)):
                out.append(f"{where}: `error` marks a console transcript of commands, each with its error line")
        elif kind not in SKIPS:
            out.append(f"{where}: unknown marker {mark.text!r}: expected `skip KIND` (KIND one of "
                       f"{', '.join(SKIPS)}) or `error`")  # fmt: skip
        elif mark.only is not None and (block.kind != "shell" or max(mark.only) > len(commands(block))):
            out.append(f"{where}: {mark.text!r} names commands the block does not have")
        elif kind in NOTE_REQUIRED and not mark.note:
            out.append(f"{where}: `skip {kind}` must say after a colon what runs it instead")
        elif kind == "covered" and not mark.target:
            out.append(f"{where}: `skip covered` names the test file that runs the block (skip covered PATH: ...)")
    if block.kind == "shell" and not block.error:
        for number, command in enumerate(commands(block), 1):
            if not block.skips(number) and any(w.startswith("/tmp") or "=/tmp" in w for w in command.words):
                out.append(
                    f"{block.page}:{command.line}: a command the test runs names a path under /tmp: it would "
                    "write outside the page's folder (and meet the last run's files); use a relative path"
                )
    return out


def commands(block: Block) -> list[Command]:
    """The shell commands of a shell block: lines joined at a trailing backslash, ``#`` comments dropped, each split
    as the shell splits words; in a ``console`` block only the ``$ `` lines (the rest is output)."""
    out: list[Command] = []
    pending, start = "", 0
    for k, line in enumerate(block.text.split("\n")):
        if block.lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not pending:
            start = block.line + block.fenced + k
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        source = (pending + line).strip()
        pending = ""
        words = shlex.split(source, comments=True)
        if words:
            out.append(Command(start, source, words))
    return out
