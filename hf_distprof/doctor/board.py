"""The results board: each rank's result of each check, and rank 0's verdicts, in the launcher's key-value store.

The results do not travel over the process group under test, which may be what hangs: the store that
``init_process_group`` rendezvouses through carries them, and every wait on it is bounded by a deadline.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

STORE_PREFIX = "hf_distprof_doctor"


class Unreachable(Exception):
    """This rank cannot reach the rendezvous store, so it cannot report to rank 0."""


class NoVerdict(Exception):
    """Rank 0's verdict on a check did not come in time."""


class Board:
    """Each rank's result of each check, and rank 0's verdicts, in the launcher's key-value store."""

    def __init__(self, store: Any, rank: int, world: int) -> None:
        from torch.distributed import PrefixStore

        self._store, self._rank, self._world = PrefixStore(STORE_PREFIX, store), rank, world

    def post(self, check: str, result: dict[str, Any]) -> None:
        """Publish this rank's result of ``check``."""
        self._store.set(f"{check}/{self._rank}", json.dumps(result))

    def _wait(self, keys: list[str], deadline: float) -> bool:
        from torch.distributed import DistError

        remaining = deadline - time.monotonic()
        try:
            self._store.wait(keys, timedelta(seconds=max(remaining, 0.001)))
        except DistError:  # a timeout, or the store's host is gone: either way the keys did not come
            return False
        return True

    def collect(self, check: str, waiting: set[int], deadline: float) -> dict[int, dict[str, Any]]:
        """Wait until every rank in ``waiting`` posted ``check`` or ``deadline`` passed; every result posted."""
        self._wait([f"{check}/{r}" for r in sorted(waiting)], deadline)
        keys = {r: f"{check}/{r}" for r in range(self._world)}
        return {r: json.loads(self._store.get(k)) for r, k in keys.items() if self._store.check([k])}

    def decide(self, check: str, verdict: str) -> None:
        """Rank 0: tell the others how to go on after ``check`` ("go", or why the group is unusable)."""
        self._store.set(f"{check}/verdict", verdict)

    def verdict(self, check: str, deadline: float) -> str:
        """Rank 0's verdict on ``check``.

        Raises:
            NoVerdict: It did not come before ``deadline``.
        """
        key = f"{check}/verdict"
        if not self._wait([key], deadline):
            raise NoVerdict(check)
        return self._store.get(key).decode()
