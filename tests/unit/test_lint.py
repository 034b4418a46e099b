"""The tree passes the project's ruff configuration (pyproject.toml), so style drift fails CI."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from ..conftest import REPO_ROOT, require


def test_ruff_is_clean():
    # ruff comes with the dev extra, which CI installs: there a missing ruff fails instead of skipping.
    require(importlib.util.find_spec("ruff") is not None, "ruff is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
