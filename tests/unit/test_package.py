"""The package root: public names, and the analysis side staying free of transformers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import hf_distprof

PACKAGE = Path(hf_distprof.__file__).parent


def test_every_public_name_resolves():
    assert sorted(hf_distprof.__all__) == sorted([*hf_distprof._LAZY, "__version__"])
    for name in hf_distprof._LAZY:
        assert getattr(hf_distprof, name).__name__ in (name, "MemoryLoggerCallback")


def test_analysis_and_cli_never_import_transformers():
    code = (
        "import sys, hf_distprof.analysis, hf_distprof.cli.main as m; m.build_parser(); "
        "import hf_distprof.analysis.report, hf_distprof.core.verdicts, hf_distprof.core.names; "
        "print('transformers' in sys.modules, 'accelerate' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False"]  # torch too: seconds of import for a JSON reader


def test_no_module_imports_the_package_root():
    # The root resolves its public names lazily from the modules: a module importing it back makes a circle.
    submodules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name == "hf_distprof" for a in node.names):
                offenders.append(f"{path.relative_to(PACKAGE)}: import hf_distprof")
            if isinstance(node, ast.ImportFrom) and node.module == "hf_distprof" and node.level == 0:
                roots = [a.name for a in node.names if a.name not in submodules]
                offenders += [f"{path.relative_to(PACKAGE)}: from hf_distprof import {name}" for name in roots]
    assert offenders == []


def test_core_imports_neither_torch_nor_transformers():
    code = (
        "import importlib, pkgutil, sys, hf_distprof.core as core; "
        "[importlib.import_module('hf_distprof.core.' + m.name) for m in pkgutil.iter_modules(core.__path__)]; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_help_screen_renders(capsys):
    import argparse

    import pytest

    from hf_distprof.cli.main import SUBCOMMANDS, main
    from hf_distprof.config import add_profiling_args

    # Module names use underscores, commands dashes (hang_report -> hang-report).
    for argv in [["--help"], *[[name.replace("_", "-"), "--help"] for name in SUBCOMMANDS]]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0, argv
        assert "usage: hf-distprof" in capsys.readouterr().out
    parser = argparse.ArgumentParser()
    add_profiling_args(parser)
    assert "--profiler-active-steps" in parser.format_help()
