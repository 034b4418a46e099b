"""Output names and atomic writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_distprof import paths


def test_trace_and_summary_names_carry_rank_host_and_window():
    assert paths.trace_file_name(3, "node-a", 8, 10) == "rank3_node-a_step8-10.pt.trace.json.gz"
    assert paths.summary_file_name(3, "node-a", 8, 10) == "rank3_node-a_step8-10_summary.txt"


def test_run_dir_is_new_per_owner_and_shared_within_one(tmp_path):
    first_owner, second_owner = object(), object()
    a = paths.resolve_run_dir(tmp_path, "exp", first_owner)
    again = paths.resolve_run_dir(tmp_path, "exp", first_owner)
    b = paths.resolve_run_dir(tmp_path, "exp", second_owner)
    assert a == again == tmp_path.absolute() / "exp"
    assert b == tmp_path.absolute() / "exp-1"
    assert a.is_dir() and b.is_dir()


def test_default_run_name_is_the_start_time(tmp_path):
    run = paths.resolve_run_dir(tmp_path, None, object())
    assert len(run.name) == len("20261121-214701") and run.name[8] == "-" and run.name.replace("-", "").isdigit()


def test_atomic_write_replaces_only_on_success(tmp_path):
    final = tmp_path / "out.txt"
    paths.atomic_write_text(final, "complete")
    with pytest.raises(RuntimeError):
        with paths.atomic_path(final) as tmp:
            tmp.write_text("half written")
            raise RuntimeError("disk full")
    assert final.read_text() == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temp file left behind


def test_atomic_path_keeps_the_writer_suffix(tmp_path):
    with paths.atomic_path(tmp_path / "t.pt.trace.json.gz", suffix=".json.gz") as tmp:
        assert tmp.name.endswith(".json.gz") and tmp.parent == tmp_path
        Path(tmp).write_bytes(b"x")
    assert (tmp_path / "t.pt.trace.json.gz").read_bytes() == b"x"


def test_each_run_folder_gets_this_ranks_log(tmp_path, monkeypatch):
    import logging
    import socket

    from hf_distprof import dist

    monkeypatch.setattr(socket, "gethostname", lambda: "node-0.cluster.local")
    first = paths.resolve_run_dir(tmp_path, "a", owner=object())
    logging.getLogger("some.library").warning("into the first run's log")
    second = paths.resolve_run_dir(tmp_path, "b", owner=object())
    dist.get_logger("hf_distprof.test").warning("into the second")
    host = "node-0"
    first_log = (first / "rank0.log").read_text().splitlines()
    assert len(first_log) == 1
    assert first_log[0].endswith(f" rank 0 {host} WARNING some.library: into the first run's log")
    (line,) = (second / "rank0.log").read_text().splitlines()
    assert line.endswith(f"rank 0 {host} WARNING hf_distprof.test: [RANK 0] into the second")
    assert paths.log_to_run_dir(second) == second / "rank0.log"  # the same folder again: one handler
    assert sum(getattr(h, "baseFilename", "").endswith("rank0.log") for h in logging.getLogger().handlers) == 1
