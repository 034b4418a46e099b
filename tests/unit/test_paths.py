"""Output names and atomic writes."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_an_atomic_write_has_the_mode_open_gives_not_mkstemp_s(tmp_path, umask):
    # A run folder on a shared disk: the traces, summaries and analysis, written through a temporary file, were 0600
    # (mkstemp's) while the jsonl files beside them were 0644; colleagues could read the one and not the other.
    import subprocess
    import sys

    # The umask set after the import, as a launcher or the user's script may set it.
    code = (f"import os; from pathlib import Path; from hf_distprof import paths; os.umask({umask}); "
            f"paths.atomic_write_text(Path({str(tmp_path)!r}) / 'a.json', '{{}}'); "
            f"open({str(tmp_path)!r} + '/b.jsonl', 'w').close()")
    subprocess.run([sys.executable, "-c", code], check=True)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"a.json": 0o666 & ~umask, "b.jsonl": 0o666 & ~umask}


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


def test_a_run_folder_is_made_with_its_missing_parents(tmp_path):
    run = paths._claim_new_run_dir(tmp_path / "a" / "b", "exp")
    assert run == tmp_path / "a" / "b" / "exp" and run.is_dir()


def test_ten_thousand_taken_names_are_an_error_naming_the_folder(tmp_path, monkeypatch):
    tries: list[str] = []

    def taken(self, *args, **kwargs):
        if self.parent == tmp_path:
            tries.append(self.name)
            raise FileExistsError(self)

    monkeypatch.setattr(Path, "mkdir", taken)
    with pytest.raises(FileExistsError) as info:
        paths._claim_new_run_dir(tmp_path, "exp")
    assert str(info.value) == f"no free run folder for 'exp' in {tmp_path} after 10000 tries"
    assert len(tries) == 10_000 and tries[:2] == ["exp", "exp-1"] and tries[-1] == "exp-9999"


def test_stale_temp_files_go_young_ones_and_other_hidden_files_stay(tmp_path, monkeypatch):
    assert paths.remove_stale_temp_files(tmp_path / "missing") == []
    run = tmp_path / "run"
    run.mkdir()
    now = 1_000_000.0
    monkeypatch.setattr(paths.time, "time", lambda: now)
    files = {
        ".aaa_hidden_notes": now - 7200,  # hidden but not a temporary file: stays, and the scan goes on
        f".t.json.gz.x{paths.TEMP_MARK}.gz": now - 3600,  # exactly the age limit: stale
        f".young{paths.TEMP_MARK}": now - 3599,
    }
    for name, mtime in files.items():
        (run / name).write_text("x")
        os.utime(run / name, (mtime, mtime))
    assert [p.name for p in paths.remove_stale_temp_files(tmp_path, older_than_s=3600)] == [
        f".t.json.gz.x{paths.TEMP_MARK}.gz"
    ]
    assert sorted(p.name for p in run.iterdir()) == [".aaa_hidden_notes", f".young{paths.TEMP_MARK}"]


def test_a_log_file_that_cannot_be_written_is_said_once_on_stderr(tmp_path, capsys):
    import logging

    run = paths.resolve_run_dir(tmp_path, "full", owner=object())
    log = run / "rank0.log"
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "baseFilename", "") == str(log))
    handler.stream.close()  # every later write fails, as on a full disk
    for _ in range(3):
        logging.getLogger("some.library").warning("dropped")
    err = capsys.readouterr().err
    assert err.count(f"hf_distprof: cannot write {log}: ValueError(") == 1 and "its records are dropped" in err
    assert "Traceback" not in err
    # The next run folder takes the log over although the broken file cannot even be flushed on close.
    nxt = paths.resolve_run_dir(tmp_path, "next", owner=object())
    logging.getLogger("some.library").warning("into the next run's log")
    assert (nxt / "rank0.log").read_text().rstrip().endswith("into the next run's log")


def test_an_output_folder_that_is_a_file_is_one_warning_and_no_run_folder(tmp_path, caplog):
    import logging

    blocker = tmp_path / "out"
    blocker.write_text("a file in the way")
    with caplog.at_level(logging.WARNING):
        assert paths.resolve_run_dir(blocker, "run", owner=object()) is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"[RANK 0] cannot create a run folder in --profiler-output-dir {blocker}: ")
    assert message.endswith("; profiling files are not written, training goes on")
    assert blocker.read_text() == "a file in the way"


def test_the_run_folder_is_named_in_the_file_the_launcher_asked_for(tmp_path, monkeypatch):
    named = tmp_path / "run_dir.txt"
    monkeypatch.setenv(paths.RUN_DIR_FILE_ENV, str(named))
    monkeypatch.setenv("LOCAL_RANK", "0")
    (tmp_path / "out").mkdir()
    first = paths.resolve_run_dir(tmp_path / "out", "exp", owner=object())
    assert named.read_text() == f"{first}\n" and first.is_absolute()
    # A later train() in the same process names its own folder (exp taken: exp-1).
    second = paths.resolve_run_dir(tmp_path / "out", "exp", owner=object())
    assert second.name == "exp-1" and named.read_text() == f"{second}\n"
    # One writer per node: the node's first process.
    named.unlink()
    monkeypatch.setenv("LOCAL_RANK", "1")
    paths.resolve_run_dir(tmp_path / "out", "exp", owner=object())
    assert not named.exists()


def test_a_relative_output_folder_is_named_absolute(tmp_path, monkeypatch):
    named = tmp_path / "run_dir.txt"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(paths.RUN_DIR_FILE_ENV, str(named))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    run = paths.resolve_run_dir("rel", "exp", owner=object())
    assert named.read_text() == f"{tmp_path / 'rel' / 'exp'}\n" == f"{run}\n"


def _two_ranks(monkeypatch, rank: int, broadcasts: list, gathers: list) -> None:
    """This process as ``rank`` of 2: rank 0's broadcasts and the other rank's answers to each gather, in order."""
    from hf_distprof import dist

    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "broadcast_object", lambda obj: broadcasts.pop(0) if rank else obj)
    monkeypatch.setattr(dist, "all_gather_object",
                        lambda obj: [obj, gathers.pop(0)] if rank == 0 else [gathers.pop(0), obj])


def test_a_node_local_folder_holding_an_earlier_run_of_the_name_is_never_written_into(tmp_path, monkeypatch, caplog):
    # A trial: two 2-node jobs on node-local disks, node 1 the same host both times and node 0 not: rank 0 found no
    # "mn" on its disk and kept the name, rank 1 wrote into the first job's "mn" (its trace replaced, its jsonl
    # appended to). Now every rank takes the next name.
    node1 = tmp_path / "node1"
    (node1 / "mn").mkdir(parents=True)
    (node1 / "mn" / "timing_rank1.jsonl").write_text('{"step": 1}\n')
    _two_ranks(monkeypatch, 1, broadcasts=[("mn", None), ("mn-1", None)], gathers=[(None, False, "n0"),
                                                                                  (None, False, "n0")])
    assert paths.resolve_run_dir(node1, "mn", object()) == node1.absolute() / "mn-1"
    assert sorted(p.name for p in node1.iterdir()) == ["mn", "mn-1"]
    assert (node1 / "mn" / "timing_rank1.jsonl").read_text() == '{"step": 1}\n'
    # Rank 0's side: it hears rank 1's answer, takes the next name and removes the empty folder it had made.
    node0 = tmp_path / "node0"
    _two_ranks(monkeypatch, 0, broadcasts=[], gathers=[(None, True, "n1"), (None, False, "n1")])
    with caplog.at_level("WARNING", logger="hf_distprof"):
        assert paths.resolve_run_dir(node0, "mn", object()) == node0.absolute() / "mn-1"
    assert sorted(p.name for p in node0.iterdir()) == ["mn-1"]
    assert ("the run folder mn already holds an earlier run's files on the disk of rank 1 on n1 (a node-local "
            "--profiler-output-dir): this run writes into mn-1 on every rank") in caplog.text
    # On a shared disk the other rank finds rank 0's folder, empty: it is this run's.
    shared = tmp_path / "shared"
    (shared / "mn").mkdir(parents=True)
    _two_ranks(monkeypatch, 1, broadcasts=[("mn", None)], gathers=[(None, False, "n0")])
    assert paths.resolve_run_dir(shared, "mn", object()) == shared.absolute() / "mn"
