"""The Python examples of the README and of the docs site (``docs/**/*.md``) run as written.

Every fenced ```` ```python ```` block runs, on the CPU (Triton kernels through the interpreter), in
the order it appears; the blocks of one page share one namespace, as the page reads (a later block
may use what an earlier one defined), and each page is one test. A block that cannot run here (it
needs a GPU, the network or more than a few seconds) is marked by an HTML comment on the line just
before its fence, which the rendered page does not show:

    <!-- norun: builds a bundle of every backend (a minute on a CPU) -->
    ```python
    ...
    ```

The comment says why; ``norun`` alone is accepted too. Other languages (```` ```bash ````,
```` ```cpp ````) never run. Each block is written to a file of its own, padded so that its lines
keep their line numbers in the page (``triton.jit`` reads its kernel's source from that file, and a
traceback points at the page's line).
"""

import re
from pathlib import Path

import pytest

from _paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", flags=re.S | re.M)
_NORUN = re.compile(r"<!--\s*norun\b[^>]*-->\s*$")


def blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each block of ``page`` that runs (line: the page's line of the code's
    first line)."""
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].splitlines()
        if before and _NORUN.search(before[-1]):
            continue
        found.append((text.count("\n", 0, match.start(1)) + 1, match.group(1)))
    return found


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


RUNNABLE = [page for page in PAGES if blocks(page)]


def test_pages_found():
    assert ROOT / "README.md" in RUNNABLE and len(PAGES) > 5, [_name(p) for p in PAGES]


def test_norun_marks_a_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- norun: needs a GPU -->\n```python\nraise SystemExit\n```\n\n"
                    "```python\nx = 1\n```\n<!-- norun -->\n\n```python\ny = 2\n```\n")
    assert blocks(page) == [(8, "x = 1\n"), (13, "y = 2\n")]


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    stem = re.sub(r"\W", "_", _name(page).removesuffix(".md"))
    namespace = {"__name__": f"docs_{stem}"}
    for line, code in blocks(page):
        path = tmp_path / f"{stem}_L{line}.py"
        padded = "\n" * (line - 1) + code
        path.write_text(padded)
        exec(compile(padded, str(path), "exec"), namespace)
