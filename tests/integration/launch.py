"""Run the project's launcher for real: 2 CPU ranks on gloo through accelerate."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from ..conftest import REPO_ROOT

LAUNCHER = REPO_ROOT / "local_scripts" / "train_lambda.sh"
DEMO = REPO_ROOT / "local_scripts" / "train_lambda_with_profiling.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_lambda(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 600,
                 script: Path = LAUNCHER) -> subprocess.CompletedProcess[str]:
    """``NPROC=2 train_lambda.sh args...`` in ``cwd``; returns the finished process (output captured)."""
    full_env = {**os.environ, "NPROC": "2", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO_ROOT),
                **(env or {})}
    full_env.pop("TENSORBOARD_LOGGING_DIR", None)
    return subprocess.run(["bash", str(script), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
