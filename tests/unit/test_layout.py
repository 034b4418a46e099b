"""The package's layout holds: no import circle (imports inside functions and under ``if TYPE_CHECKING:`` count), no
module imports the package root, at most 8 modules loose at its top and at the analysis' top, no source file over 600
lines, the core is torch-free, and the analysis' stages import only the stages before them."""

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


def imports(path: Path, name: str, known: set[str], typing: bool = True) -> set[str]:
    """The package's modules ``path`` imports: ``from pkg import sub`` is ``pkg.sub`` when that is a module, else
    ``pkg`` (its ``__init__``). Imports inside functions count, and so do those under ``if TYPE_CHECKING:`` unless
    ``typing`` is False: a circle that only a type checker sees is still one for a reader, who cannot understand
    one file without the other."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if not typing and id(node) in typing_only:
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
    # The root's lazy exports name the public classes for type checkers only; nothing imports the root back.
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
    for folder in (PACKAGE, PACKAGE / "analysis"):
        loose = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
        assert len(loose) <= 8, (folder, loose)
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


ANALYSIS_STAGES = ("options", "results", "read", "rank", "across", "whatif", "judge", "tell")
"""``analyze`` from disk to the box, in order: the options and the plain results every stage hands on, then reading
the files, each rank on its own (in the workers), the ranks together, the what-if replay, the findings, the text.
``api``, ``merge`` and the package's ``__init__`` are the front: they may use every stage."""


def stage_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["hf_distprof", "analysis"] or len(parts) < 3:
        return None
    return ANALYSIS_STAGES.index(parts[2]) if parts[2] in ANALYSIS_STAGES else None


def test_the_analysis_stages_import_only_the_stages_before_them():
    mods = modules()
    folders = sorted(p.name for p in (PACKAGE / "analysis").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(ANALYSIS_STAGES[1:])
    front = {"hf_distprof.analysis", "hf_distprof.analysis.api", "hf_distprof.analysis.merge"}
    loose = {module_name(p) for p in (PACKAGE / "analysis").glob("*.py")}
    assert loose == front | {"hf_distprof.analysis.options"}
    later: list[tuple[str, str]] = []
    for name, path in mods.items():
        stage = stage_of(name)
        if stage is None:
            continue
        later += [(name, m) for m in imports(path, name, set(mods))
                  if m in front or (stage_of(m) is not None and stage_of(m) > stage)]  # type: ignore[operator]
    assert later == []
    # The results are data: they import nothing of the analysis but each other and the options.
    results = {n: imports(p, n, set(mods)) for n, p in mods.items() if stage_of(n) == 1}
    assert {m for deps in results.values() for m in deps if m.startswith("hf_distprof.analysis")
            and stage_of(m) not in (0, 1)} == set()


def _stage_imports(stage: str, typing: bool = True) -> dict[str, set[str]]:
    """module of the stage -> the analysis stages (by folder name) it imports, itself and the options left out."""
    mods = modules()
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        if stage_of(name) != ANALYSIS_STAGES.index(stage):
            continue
        used = {ANALYSIS_STAGES[s] for m in imports(path, name, set(mods), typing=typing)
                if (s := stage_of(m)) is not None}
        out[name] = used - {stage, "options"}
    return out


def test_each_stage_imports_only_what_its_job_needs():
    # read/ turns files into results: it imports the results and the core only.
    assert {n: used for n, used in _stage_imports("read").items() if used - {"results"}} == {}
    # judge/ decides: it never reaches for the words.
    assert {n: used for n, used in _stage_imports("judge").items() if "tell" in used} == {}
    # tell/ only formats: no stage but the results (and the judge, for types only).
    assert {n: used for n, used in _stage_imports("tell", typing=False).items() if used - {"results"}} == {}
    assert {n: used for n, used in _stage_imports("tell").items() if used - {"results", "judge"}} == {}


def test_the_analysis_package_imports_nothing_eagerly_and_a_reader_loads_no_judge_or_words():
    tree = ast.parse((PACKAGE / "analysis" / "__init__.py").read_text(encoding="utf-8"))
    eager = [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
             and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
    # Names resolve on first use (__getattr__); no module of the package is imported at the top.
    assert eager == ["import importlib", "from typing import TYPE_CHECKING, Any"]
    # What a training rank imports to write its compact file: the reader, never the judge, the words or the plots.
    code = ("import sys, hf_distprof.analysis.read.compact; "
            "print(sorted(m for m in sys.modules if m.startswith(('hf_distprof.analysis.judge', "
            "'hf_distprof.analysis.tell', 'hf_distprof.analysis.across', 'hf_distprof.analysis.whatif', "
            "'hf_distprof.analysis.api', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_analysis_front_imports_the_later_stages_only_while_the_workers_run():
    # api.analyze_paths forks its worker processes before it imports across/, whatif/, judge/ and tell/ (it imports them
    # while the workers read the traces): imported at api's top, they would be imported before the fork, in series.
    code = ("import sys, hf_distprof.analysis.api; "
            "print(sorted({m.split('.')[2] for m in sys.modules if m.startswith(('hf_distprof.analysis.judge', "
            "'hf_distprof.analysis.tell', 'hf_distprof.analysis.across', 'hf_distprof.analysis.whatif'))}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
