"""The training script imported once per session as a module, to check its flags in-process.

A subprocess per bad flag pays the transformers import (~8 s on 2 cores) each time; the exit path is the same
function (``parse_args``), and one subprocess test per module still runs the real command line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import sys
from types import ModuleType

from ..conftest import REPO_ROOT

NAME = "train_modernBERT_in_process"


@functools.lru_cache(maxsize=1)
def load() -> ModuleType:
    """The script as a module (its dataclasses need it in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(NAME, REPO_ROOT / "hf_distprof" / "recipe" / "train_mlm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module


def parse(*args: str) -> tuple[int, str]:
    """``train_modernBERT.py args`` up to the end of its flag checks: (exit status, stderr); 0 when accepted."""
    script = load()
    err = io.StringIO()
    argv = sys.argv
    sys.argv = ["train_modernBERT.py", *args]
    try:
        with contextlib.redirect_stderr(err):
            script.parse_args(script.build_parser())
    except SystemExit as exc:
        return int(exc.code or 0), err.getvalue()
    finally:
        sys.argv = argv
    return 0, err.getvalue()
