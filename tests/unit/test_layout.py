"""The package's layout holds: no import circle (imports inside functions count), no module imports the package
root, at most 8 modules loose at its top, no source file over 600 lines, and the core is torch-free."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "hf_distprof"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "pythonpath" not in p.parts}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules ``path`` imports when it runs: ``from pkg import sub`` is ``pkg.sub`` when that is a
    module, else ``pkg`` (its ``__init__``). Imports under ``if TYPE_CHECKING:`` are for type checkers only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "hf_distprof")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "hf_distprof":
                continue
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def test_no_import_circle_and_nothing_imports_the_package_root():
    mods = modules()
    graph = {name: imports(path, name, set(mods)) for name, path in mods.items()}
    assert sorted(m for m, deps in graph.items() if "hf_distprof" in deps) == []
    # Tarjan's strongly connected components: any with 2+ modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_at_most_8_modules_at_the_top_and_no_file_over_600_lines():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 8, loose
    long = {str(p.relative_to(REPO_ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}


def test_the_core_imports_no_torch_and_nothing_above_it():
    core = {name: path for name, path in modules().items() if name.startswith("hf_distprof.core")}
    for name, path in core.items():
        above = sorted(m for m in imports(path, name, set(modules()))
                       if not m.startswith("hf_distprof.core") and m != "hf_distprof._version")  # a leaf
        assert above == [], (name, above)
    code = f"import sys; {'; '.join(f'import {name}' for name in sorted(core))}; " \
           "print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_the_offline_side_never_imports_the_training_side():
    # analyze, compare, scaling's tables and hang-report read files: none of it needs a callback or the recipe.
    mods = modules()
    for name, path in mods.items():
        if name.startswith(("hf_distprof.analysis", "hf_distprof.runs")):
            training = sorted(m for m in imports(path, name, set(mods))
                              if m.startswith(("hf_distprof.callbacks", "hf_distprof.recipe", "hf_distprof.timing")))
            assert training == [], (name, training)
