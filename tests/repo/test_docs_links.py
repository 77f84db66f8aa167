"""Every relative link and #anchor in README.md, CONTRIBUTING.md and docs/**/*.md resolves.

A link is relative when it has no scheme (``https:``, ``mailto:``) and is not protocol-relative. Its file or folder
must exist inside the repository; an ``#anchor`` into a Markdown page must name one of that page's headings, slugged
as GitHub does (lower case; letters, digits, marks, ``-``, ``_`` and spaces kept, everything else dropped; spaces
become ``-``; a repeated heading gets ``-1``, ``-2``, ...), or an explicit ``<a id=...>``/``<a name=...>``. Links
inside code blocks and code spans are not links. Inline links, images, reference definitions and HTML ``href`` /
``src`` attributes are all checked.

So is every test a page names as the one behind a promise (``tests/x.py::test_y``, or a bare ```test_y```): it must
be a test of that file, or of some test file, or the promise is backed by nothing.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"""<a\b[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's rendered text (github-slugger's rule), before de-duplication.

    Example::

        >>> github_slug("Visual Caption Boosting (`finecap boost`)")
        'visual-caption-boosting-finecap-boost'
    """
    text = heading.lower()
    return "".join(c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LNM").replace(" ", "-")


def rendered_text(markdown: str) -> str:
    """A heading's text as GitHub renders it: code-span backticks, emphasis, link targets and HTML tags gone."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), markdown)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w))", "", text)
    return text


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, fence = [], None
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            continue
        out.append((lineno, line))
    return out


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown page defines."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in _prose_lines(path):
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(rendered_text(m.group(2)))
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in a Markdown page, code excluded."""
    out = []
    for lineno, line in _prose_lines(path):
        prose = CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(prose)]
        targets += REFERENCE_DEF.findall(prose) + HTML_ATTR.findall(prose)
        out += [(lineno, t[1:-1] if t.startswith("<") and t.endswith(">") else t) for t in targets]
    return out


def problems(page: Path, root: Path = ROOT) -> list[str]:
    """One message per relative link of ``page`` that does not resolve."""
    out = []
    cache: dict[Path, set[str]] = {}
    for lineno, target in links(page):
        if SCHEME.match(target) or target.startswith("//"):
            continue
        where = f"{page.relative_to(root)}:{lineno}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(file_part)).resolve() if file_part else page
        if not dest.is_relative_to(root):
            out.append(f"{where}: points outside the repository")
            continue
        if not dest.exists():
            out.append(f"{where}: {dest.relative_to(root)} does not exist")
            continue
        if not anchor:
            continue
        if dest.suffix.lower() != ".md":
            if not (dest.is_file() and LINE_ANCHOR.match(anchor)):
                out.append(f"{where}: #{anchor} into a file that is not Markdown")
            continue
        if dest not in cache:
            cache[dest] = anchors(dest)
        if unquote(anchor) not in cache[dest]:
            near = sorted(a for a in cache[dest] if a[:6] == anchor[:6])[:5]
            out.append(
                f"{where}: no heading #{anchor} in {dest.relative_to(root)}" + (f" (near: {near})" if near else "")
            )
    return out


NAMED_TEST = re.compile(r"(tests/[\w/]+\.py)::(test_\w+)\b(?!\*)")
BARE_TEST = re.compile(r"`(test_\w+)`")


def missing_tests(page: Path, root: Path = ROOT) -> list[str]:
    """One message per test ``page`` names (``tests/x.py::test_y``, or a bare ```test_y```, code blocks excluded)
    that no test file of ``root`` defines (``def test_y``)."""
    defined: dict[Path, str] = {f: f.read_text(encoding="utf-8") for f in (root / "tests").rglob("test_*.py")}
    out = []
    for lineno, line in _prose_lines(page):
        where = f"{page.relative_to(root)}:{lineno}"
        for file, name in NAMED_TEST.findall(line):
            text = defined.get(root / file)
            if text is None or not re.search(rf"^\s*(async )?def {name}\(", text, re.M):
                out.append(f"{where}: {file}::{name}: no such test")
        for name in BARE_TEST.findall(line):
            if not any(re.search(rf"^\s*(async )?def {name}\(", text, re.M) for text in defined.values()):
                out.append(f"{where}: {name}: no test of that name under tests/")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_test_a_page_names_exists(page):
    assert not missing_tests(page), "tests named but missing:\n" + "\n".join(missing_tests(page))


def test_the_checker_finds_tests_that_are_not_there(tmp_path):
    (tmp_path / "tests" / "x").mkdir(parents=True)
    (tmp_path / "tests" / "x" / "test_a.py").write_text("def test_one():\n    pass\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "`tests/x/test_a.py::test_one`, `test_one`, `tests/x/test_a.py::test_some_*`\n"
        "`tests/x/test_a.py::test_two` `tests/x/test_b.py::test_one` (`test_gone`)\n```\n`test_in_code`\n```\n",
        encoding="utf-8",
    )
    found = missing_tests(tmp_path / "README.md", tmp_path)
    assert found == [
        "README.md:2: tests/x/test_a.py::test_two: no such test",
        "README.md:2: tests/x/test_b.py::test_one: no such test",
        "README.md:2: test_gone: no test of that name under tests/",
    ], found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    assert not problems(page), "broken links:\n" + "\n".join(problems(page))


def test_readme_and_docs_are_found():
    assert ROOT / "README.md" in PAGES and ROOT / "CONTRIBUTING.md" in PAGES
    assert any(p.parent.name == "docs" for p in PAGES)


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        # hand-derived from GitHub's rule: lower case, punctuation and symbols dropped, spaces -> "-"
        ("Seeing the results: HTML report and bag review", "seeing-the-results-html-report-and-bag-review"),
        ("Visual Caption Boosting (`finecap boost`)", "visual-caption-boosting-finecap-boost"),
        ("SR + λ·CIDEr", "sr--λcider"),
        (
            "A listener that is not the reward, and a shifted domain",
            "a-listener-that-is-not-the-reward-and-a-shifted-domain",
        ),
        ("BLIP, a second backbone", "blip-a-second-backbone"),
        ("run_dir and `--out`", "run_dir-and---out"),
        ("**Bold** heading", "bold-heading"),
        ("[Linked](https://example.org) heading", "linked-heading"),
    ],
)
def test_github_slugs(heading, slug):
    assert github_slug(rendered_text(heading)) == slug


def test_github_slug_of_raw_markdown():
    # the docstring's example, run here: the doctests are src/finecap's alone (make doctest)
    assert github_slug("Visual Caption Boosting (`finecap boost`)") == "visual-caption-boosting-finecap-boost"


def test_the_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text('# Title\n\n## Same\n\n## Same\n\n<a id="custom"></a>\n', encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "\n".join(
            [
                "# Readme",
                "[ok](docs/a.md) [ok](docs/a.md#title) [ok](docs/a.md#same-1) [ok](docs/a.md#custom) [ok](#readme)",
                "[ok](https://example.org/missing) ![ok](docs/) `[not a link](missing.md)`",
                "[bad file](docs/b.md) [bad anchor](docs/a.md#same-2) [bad self](#nothing)",
                '<img src="missing.png"> [outside](../elsewhere.md)',
                "[ref]: docs/c.md",
                "```",
                "[in a code block](missing.md)",
                "```",
            ]
        ),
        encoding="utf-8",
    )
    found = problems(tmp_path / "README.md", tmp_path)
    assert sorted(p.split(": ", 2)[1] for p in found) == sorted(
        ["docs/b.md", "docs/a.md#same-2", "#nothing", "missing.png", "../elsewhere.md", "docs/c.md"]
    ), found
