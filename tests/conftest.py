"""Shared test fixtures and helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"


def require(present: bool, what: str) -> None:
    """Skip a test whose input is missing, saying what is missing; under CI (``CI=true``) fail instead.

    CI runs on a clean clone with ``../shared`` beside it and the dev extra installed, so there a missing
    input means the test silently stopped running, which must not pass as green.
    """
    if present:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} (CI=true: this test must run in CI)", pytrace=False)
    pytest.skip(what)


@pytest.fixture(autouse=True)
def _no_log_records_of_earlier_tests() -> None:
    """Records of ours kept for a rank log not yet open (hf_distprof.logs) are the test's that made them: without
    this, the first rank0.log a later test opens would start with them."""
    from hf_distprof import logs

    logs.discard_pending()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests import reliability

    if reliability.ROWS:
        terminalreporter.section("reliability: faults injected and what they cost")
        terminalreporter.write_line(reliability.table(reliability.ROWS))
