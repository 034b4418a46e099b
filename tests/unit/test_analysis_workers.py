"""The analysis's process-wide settings: the cyclic garbage collector is paused only on the main thread and restored
as it was; a training rank's analysis thread leaves it alone."""

from __future__ import annotations

import gc
import threading

import pytest

from hf_distprof.analysis.rank import workers


@pytest.fixture(autouse=True)
def _collector_as_it_was():
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


@pytest.mark.parametrize("before", [True, False])
def test_the_main_thread_pauses_the_collector_and_restores_it_as_it_was(before):
    (gc.enable if before else gc.disable)()
    with workers.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is before


def test_the_collector_is_restored_when_the_analysis_raises():
    gc.enable()
    with pytest.raises(ValueError), workers.collector_paused():
        raise ValueError("a bad trace")
    assert gc.isenabled()


def test_another_thread_leaves_the_collector_as_the_user_set_it():
    gc.enable()
    seen = []

    def analyse():
        with workers.collector_paused():
            seen.append(gc.isenabled())

    thread = threading.Thread(target=analyse)
    thread.start()
    thread.join()
    assert seen == [True] and gc.isenabled()


def test_a_worker_process_runs_without_the_collector():
    gc.enable()
    workers._worker_init()
    assert not gc.isenabled()


def _collector_state(path, options, read_compact, write_compact):
    return (path, gc.isenabled())


def test_ranks_analysed_in_this_process_run_without_the_collector(monkeypatch):
    gc.enable()
    monkeypatch.setattr(workers, "analyze_file", _collector_state)
    got = workers.run_all(["a.json", "b.json"], workers.AnalysisOptions(workers=1, progress=False))
    assert got == [("a.json", False), ("b.json", False)] and gc.isenabled()


def test_ranks_analysed_in_worker_processes_run_without_the_collector(monkeypatch):
    gc.enable()
    monkeypatch.setattr(workers, "analyze_file", _collector_state)
    got = workers.run_all(["a.json", "b.json", "c.json"], workers.AnalysisOptions(workers=2, progress=False))
    assert sorted(got) == [("a.json", False), ("b.json", False), ("c.json", False)] and gc.isenabled()
