"""The package root: public names, and the analysis side staying free of transformers."""

from __future__ import annotations

import subprocess
import sys

import hf_distprof


def test_every_public_name_resolves():
    assert sorted(hf_distprof.__all__) == sorted([*hf_distprof._LAZY, "__version__"])
    for name in hf_distprof._LAZY:
        assert getattr(hf_distprof, name).__name__ in (name, "MemoryLoggerCallback")


def test_analysis_and_cli_never_import_transformers():
    code = (
        "import sys, hf_distprof.analysis, hf_distprof.cli.main as m; m.build_parser(); "
        "import hf_distprof.analysis.tell.report, hf_distprof.core.verdicts, hf_distprof.core.names; "
        "print('transformers' in sys.modules, 'accelerate' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False"]  # torch too: seconds of import for a JSON reader


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
