"""The tree passes the project's ruff configuration (pyproject.toml), so style drift fails CI."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ..conftest import REPO_ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the dev extra: pip install -e '.[dev]')")
    proc = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
