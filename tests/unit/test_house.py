"""The shape of the house: the import graph of every import statement (function-level ones and
``TYPE_CHECKING`` blocks included) has no cycle, imports run downward through the layers, no package
reaches into another's underscored names, modules stay under 500 lines, and the words users read speak
of the product only.

Built with ``ast`` from the source, nothing imported: a cycle hidden inside a function is still a cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from _paths import ROOT

SRC = ROOT / "src" / "kernelgraft"

# Packages from the top floor down. A module may import its own package's modules and anything on a
# lower floor; one on a floor above is an upward import. Modules directly under kernelgraft/ (the
# package face, __main__, errors) are placed by name.
FLOORS = [
    ("__main__",),
    ("cli", "examples"),
    ("__init__", "wiring"),
    ("bench",),
    ("graft", "check"),
    ("aot",),
    ("tune",),
    ("op",),
    ("native", "runtime"),
    ("backends",),
    ("symbolic", "driver", "spec", "verify"),
    ("cache", "timing", "errors", "version", "admit"),
]
MAX_UPWARD = 2
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(current: str, level: int, module: str | None) -> str:
    base = current.split(".")
    if not _is_package(current):
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + (module.split(".") if module else []))


def _target(name: str) -> str | None:
    """The module file a dotted name lands on (a name inside a module lands on the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str):
    """(imported module, imported attribute names, line) for every import statement of a module."""
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kernelgraft":
                    yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve(name, node.level, node.module)
            elif (node.module or "").split(".")[0] == "kernelgraft":
                base = node.module
            else:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:
                    yield sub, (), node.lineno
                else:
                    yield base, (alias.name,), node.lineno


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name in MODULES:
        for module, _, _ in _imports(name):
            target = _target(module)
            if target is not None and target != name:
                graph[name].add(target)
                # importing a package's submodule runs the package's __init__ first
                parts = target.split(".")
                for i in range(2, len(parts)):
                    parent = ".".join(parts[:i])
                    if parent in MODULES and parent != name and not name.startswith(parent + "."):
                        graph[name].add(parent)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _floor(name: str) -> int:
    parts = name.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(FLOORS):
        if key in names:
            return i
    raise AssertionError(f"{name}: its package {key!r} has no floor in FLOORS; place it")


def test_the_import_graph_has_no_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (every import statement counted):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_every_package_has_a_floor_and_imports_run_downward():
    upward = []
    for name, targets in _graph().items():
        for target in targets:
            if _floor(target) < _floor(name) and not target.startswith(name.rpartition(".")[0] + "."):
                upward.append(f"{name} -> {target}")
    assert len(upward) <= MAX_UPWARD, "imports that run upward:\n" + "\n".join(sorted(upward))


def test_no_package_imports_another_packages_underscored_names():
    bad = []
    for name in MODULES:
        package = ".".join(name.split(".")[:2])
        for module, attrs, line in _imports(name):
            other = ".".join(module.split(".")[:2])
            if other == package or module == "kernelgraft":
                continue
            private = [p for p in module.split(".")[1:] if p.startswith("_") and p != "__init__"]
            private += [a for a in attrs if a.startswith("_") and not a.startswith("__")]
            if private:
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line}: {module} {attrs or ''}")
    assert not bad, "imports of another package's underscored names:\n" + "\n".join(bad)


def test_no_module_over_500_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


_LAB_WORDS = re.compile(r"\b(sessions?|issues?) (\d+|#\d+)\b", re.IGNORECASE)


@pytest.mark.parametrize("where", ["README.md", "CONTRIBUTING.md", "docs", "src", "benchmarks"])
def test_docs_and_code_speak_of_the_product(where):
    path = ROOT / where
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and p.suffix in
                                           (".md", ".py", ".cpp", ".h", ".sh", ".yml")]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p in files
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if _LAB_WORDS.search(line)]
    assert not hits, "lines that speak of the project's history, not the product:\n" + "\n".join(hits)


def test_the_product_never_imports_research_or_benchmarks():
    bad = []
    for name in MODULES:
        tree = ast.parse(MODULES[name].read_text())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{name}: {m}" for m in mods if m.split(".")[0] in ("research", "benchmarks")]
    assert not bad, "\n".join(bad)


def test_every_test_module_is_in_a_suite_folder():
    """Test modules live in tests/unit (in-process), tests/integration (processes, toolchains,
    bundles) or tests/gpu (GPU only); tests/ itself holds conftest.py and the shared helpers."""
    tests = ROOT / "tests"
    stray = sorted(p.name for p in tests.glob("test_*.py"))
    assert not stray, f"test modules directly in tests/: {stray}; move each into unit/, integration/ or gpu/"
    folders = {p.parent.name for p in tests.rglob("test_*.py") if "fixtures" not in p.parts}
    assert folders <= {"unit", "integration", "gpu"}, folders


def test_the_eager_hot_path_stays_within_six_files():
    """A warm eager call (a plan already made for its key) runs code of at most 6 kernelgraft
    modules, the kernel's own module aside: the path a call takes every time stays small enough
    to read, and new concerns (admission, tuning, checks) stay off it or inside its key."""
    import os
    import sys

    import torch

    import kernelgraft as kg
    from kernelgraft.examples.add_relu import add_relu
    from kernelgraft.examples.rmsnorm import rmsnorm

    package = os.path.dirname(kg.__file__)
    cases = [(add_relu, (torch.randn(1000), torch.randn(1000))),
             (rmsnorm, (torch.randn(8, 64), torch.randn(64), 1e-6))]
    for op, args in cases:
        with kg.tune("off"):
            for _ in range(3):
                op(*args)
            seen: set[str] = set()

            def profile(frame, event, arg):
                path = frame.f_code.co_filename
                if event == "call" and path.startswith(package + os.sep):
                    seen.add(os.path.relpath(path, package))

            sys.setprofile(profile)
            try:
                op(*args)
            finally:
                sys.setprofile(None)
        modules = sorted(m for m in seen if not m.startswith("examples" + os.sep))
        assert modules and len(modules) <= 6, f"{op.name}: a warm eager call runs {len(modules)} modules: {modules}"


def test_importing_kernelgraft_leaves_sympy_and_dynamo_unimported():
    """``import kernelgraft`` (and an example op's module) in a fresh process imports neither
    sympy (through ``torch.fx.experimental.symbolic_shapes``) nor ``torch._dynamo``: seconds of
    import that a process calling ops eagerly never needs. Where a graft, a shape environment or
    compile needs them, they are imported there."""
    import subprocess
    import sys

    code = ("import sys, kernelgraft, kernelgraft.examples.add_relu; "
            "print(sorted(m for m in ('sympy', 'torch._dynamo', 'torch.fx.experimental.symbolic_shapes') "
            "if m in sys.modules))")
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
