"""The run manifest: clock offsets, parts assembled into one manifest, what analyze and merge take from it."""

from __future__ import annotations

import gzip
import json
import logging
import queue
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof import ProfilerCallback, ProfilingArguments
from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_findings, format_summary
from hf_distprof.analysis.read.manifest import ManifestError, assemble, load_manifest, missing_files
from hf_distprof.analysis.merge import merge_traces
from hf_distprof.analysis.tell.report import write_report
from hf_distprof.callbacks.profiler.capture import CapturePlan, Note, Window
from hf_distprof.cli.main import main
from hf_distprof.callbacks.profiler.manifest import (
    ClockOffset,
    RunManifest,
    host_leaders,
    ntp_estimate,
    ping,
    pong,
    rank_clocks,
    window_reasons,
)

from . import fake_trainer

DATA = Path(__file__).resolve().parents[1] / "data"
HOST = "node-0"


def part(rank: int, host: str, windows: list[dict[str, Any]], status: str = "finished", offset: float = 0.0,
         world: int = 4) -> dict[str, Any]:
    return {"format": "hf_distprof.manifest.part", "version": 1, "rank": rank, "world_size": world, "host": host,
            "local_rank": rank % 2, "pid": 100 + rank, "run_name": "run", "profile_ranks": "all",
            "versions": {"python": "3.12.0", "torch": "2.13.0+cpu"}, "started_at": 1.0, "status": status,
            "clock": {"offset_us": offset, "uncertainty_us": 40.0 if offset else 0.0,
                      "measured_on_rank": 0 if rank < 2 else 2},
            "windows": windows, "files": [f"rank{rank}.log"], "failed_exports": 0}


def window(rank: int, host: str, first: int, last: int, reasons: list[str], cut: bool = False) -> dict[str, Any]:
    stem = f"rank{rank}_{host}_step{first}-{last}"
    return {"first": first, "last": last, "reasons": reasons, "detail": "", "cut_short": cut,
            "files": [f"{stem}.pt.trace.json.gz", f"{stem}_summary.txt"]}


def two_host_parts(status: str = "finished") -> list[dict[str, Any]]:
    """Ranks 0-1 on hostA, 2-3 on hostB (clock 1500 us ahead); a scheduled window 3-4, an anomaly window 12-13
    cut short on rank 3."""
    out = []
    for rank in range(4):
        host = "hostA" if rank < 2 else "hostB"
        ws = [window(rank, host, 3, 4, ["schedule"]), window(rank, host, 12, 13, ["anomaly"], cut=rank == 3)]
        out.append(part(rank, host, ws, status, offset=1500.0 if rank >= 2 else 0.0))
    return out


# ---- clock offsets ------------------------------------------------------------------------------------------


def test_the_round_with_the_shortest_trip_sets_the_offset_within_half_that_trip():
    # The peer's clock runs 5 ms ahead. Round 1: 100 us each way, 10 us inside the peer -> exact, trip 200 us.
    # Round 2: 1000 us out, 100 us back (asymmetric) -> off by 450 us, trip 1100 us: not the one kept.
    quick = (0, 5_100_000, 5_110_000, 210_000)
    lopsided = (1_000_000, 7_000_000, 7_000_000, 2_100_000)
    assert ntp_estimate([lopsided, quick]) == ClockOffset(offset_us=5000.0, uncertainty_us=100.0, rounds=2)
    # Alone, the lopsided round is off by 450 us, within its own bound of 550 us.
    assert ntp_estimate([lopsided]) == ClockOffset(offset_us=5450.0, uncertainty_us=550.0, rounds=1)
    with pytest.raises(ValueError, match="no ping-pong round"):
        ntp_estimate([])


class _Link:
    """One direction of a simulated network: each message costs ``delay_ns`` of the shared virtual time."""

    def __init__(self, clock: list[int], delay_ns: int, out: queue.Queue[list[int]],
                 inbox: queue.Queue[list[int]]) -> None:
        self.clock, self.delay_ns, self.out, self.inbox = clock, delay_ns, out, inbox

    def send(self, values: list[int]) -> None:
        self.clock[0] += self.delay_ns
        self.out.put(values)

    def recv(self) -> list[int]:
        return self.inbox.get(timeout=10)


def test_ping_and_pong_measure_a_peer_clock_7_ms_ahead_over_a_lopsided_link():
    # Virtual time: 300 us to the peer, 100 us back; the peer's clock reads 7 ms more than the reference's.
    clock = [1_000_000_000]
    to_peer: queue.Queue[list[int]] = queue.Queue()
    to_ref: queue.Queue[list[int]] = queue.Queue()
    peer = threading.Thread(target=pong, args=(_Link(clock, 100_000, to_ref, to_peer), lambda: clock[0] + 7_000_000))
    peer.start()
    result = ping(_Link(clock, 300_000, to_peer, to_ref), lambda: clock[0])
    peer.join(timeout=10)
    # Off by half the asymmetry (100 us), within half the round trip (200 us).
    assert result == ClockOffset(offset_us=7100.0, uncertainty_us=200.0, rounds=8)


def test_one_rank_per_host_measures_and_rank_0s_host_is_exactly_0():
    hosts = ["a", "a", "b", "b", "c"]
    assert host_leaders(hosts) == {"a": 0, "b": 2, "c": 4}
    clocks = rank_clocks(hosts, {2: ClockOffset(1500.0, 40.0, 8)})
    assert clocks == [
        {"offset_us": 0.0, "uncertainty_us": 0.0, "measured_on_rank": 0, "rounds": 0},
        {"offset_us": 0.0, "uncertainty_us": 0.0, "measured_on_rank": 0, "rounds": 0},
        {"offset_us": 1500.0, "uncertainty_us": 40.0, "measured_on_rank": 2, "rounds": 8},
        {"offset_us": 1500.0, "uncertainty_us": 40.0, "measured_on_rank": 2, "rounds": 8},
        {"offset_us": None, "uncertainty_us": None, "measured_on_rank": None, "rounds": 0},  # host c: not measured
    ]


# ---- why a window was taken ---------------------------------------------------------------------------------


def test_window_reasons_schedule_first_then_the_capture_window_that_holds_the_step():
    plan = CapturePlan(1, 2, 40, lambda step: False, on_demand=True, max_anomaly_captures=1)
    from hf_distprof.callbacks.profiler.capture import Anomaly

    plan.agree(10, [Note(0, ("PROFILE_NOW",)), Note(1, anomaly=Anomaly(9, 3.0, 1.0))])
    plan.agree(20, [Note(1, ("SIGUSR1",))])
    assert [w.causes for w in plan.windows] == [("on_demand", "anomaly"), ("on_demand",)]
    assert window_reasons(12, False, plan.windows) == (["on_demand", "anomaly"], plan.windows[0].reason)
    assert plan.windows[0].reason.startswith("on demand: PROFILE_NOW on rank 0; --profile-on-anomaly")
    assert window_reasons(22, False, plan.windows) == (["on_demand"], "on demand: SIGUSR1 on rank 1")
    assert window_reasons(22, True, plan.windows) == (["schedule"], "")
    assert window_reasons(30, False, plan.windows) == ([], "")
    assert Window(1, 2, 3, 0, "x").causes == ()


# ---- assembling the parts -----------------------------------------------------------------------------------


def test_parts_of_two_hosts_assemble_into_hosts_ranks_windows_and_files():
    m = assemble(list(reversed(two_host_parts())), combined=True)
    assert m["complete"] is True and m["world_size"] == 4 and m["source"] == "combined by rank 0 at train end"
    assert m["hosts"] == [{"host": "hostA", "ranks": [0, 1]}, {"host": "hostB", "ranks": [2, 3]}]
    assert [(r["rank"], r["host"], r["clock_offset_us"], r["clock_measured_on_rank"]) for r in m["ranks"]] == [
        (0, "hostA", 0.0, 0), (1, "hostA", 0.0, 0), (2, "hostB", 1500.0, 2), (3, "hostB", 1500.0, 2)]
    assert [(w["first"], w["last"], w["reasons"], w["ranks"], w["cut_short_ranks"]) for w in m["windows"]] == [
        (3, 4, ["schedule"], [0, 1, 2, 3], []), (12, 13, ["anomaly"], [0, 1, 2, 3], [3])]
    assert m["absent_ranks"] == [] and m["unfinished_ranks"] == [] and m["versions_differ"] == []
    assert [f["name"] for f in m["files"] if f["rank"] == 2] == [
        "rank2.log", "rank2_hostB_step3-4.pt.trace.json.gz", "rank2_hostB_step3-4_summary.txt",
        "rank2_hostB_step12-13.pt.trace.json.gz", "rank2_hostB_step12-13_summary.txt"]
    assert len({(f["name"]) for f in m["files"]}) == len(m["files"]) == 20


def test_a_killed_rank_leaves_an_incomplete_manifest_that_says_which_rank():
    parts = two_host_parts(status="running")
    del parts[3]  # rank 3 never wrote a part
    parts[2]["windows"] = parts[2]["windows"][:1]  # rank 2 was killed before its second window
    m = assemble(parts)
    assert m["complete"] is False and m["source"] == "assembled from 3 part(s)"
    assert m["absent_ranks"] == [3] and m["unfinished_ranks"] == [0, 1, 2]
    assert [(w["first"], w["ranks"]) for w in m["windows"]] == [(3, [0, 1, 2]), (12, [0, 1])]
    with pytest.raises(ValueError, match="two manifest parts for rank 1"):
        assemble([*parts, parts[1]])
    with pytest.raises(ValueError, match="no manifest part"):
        assemble([])


def test_auto_rank_choices_attach_to_the_window_they_chose_for():
    records = [{"window_first": 2, "ranks": [1, 3], "reason": "rank 3 slowest, rank 1 median"},
               {"window_first": 11, "ranks": [0, 3], "reason": "rank 3 slowest, rank 0 median"}]
    m = assemble(two_host_parts(), combined=True, rank_choices=records)
    assert [(w["reasons"], w["rank_choice"]["ranks"]) for w in m["windows"]] == [
        (["schedule", "auto_ranks"], [1, 3]), (["anomaly", "auto_ranks"], [0, 3])]
    assert assemble(two_host_parts())["windows"][0]["rank_choice"] is None


def write_parts(folder: Path, parts: list[dict[str, Any]]) -> None:
    for p in parts:
        (folder / f"manifest_rank{p['rank']}_{p['host']}.json").write_text(json.dumps(p))


def test_readers_take_the_combined_file_else_assemble_the_parts_and_name_a_bad_file(tmp_path):
    assert load_manifest(tmp_path) is None
    write_parts(tmp_path, two_host_parts(status="running"))
    (tmp_path / ".manifest_rank9_hostB.json.x.tmp").write_text("{half")  # a killed write: ignored
    assembled = load_manifest(tmp_path)
    assert assembled is not None and assembled["complete"] is False and assembled["world_size"] == 4
    (tmp_path / "profile_ranks.json").write_text(json.dumps({"world_size": 4, "windows": [
        {"window_first": 3, "ranks": [2, 3], "reason": "r"}]}))
    assert load_manifest(tmp_path)["windows"][0]["rank_choice"]["ranks"] == [2, 3]
    combined = assemble(two_host_parts(), combined=True)
    (tmp_path / "manifest.json").write_text(json.dumps(combined))
    assert load_manifest(tmp_path) == combined
    (tmp_path / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(ManifestError, match=r"manifest.json: not a hf_distprof.manifest document"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "manifest_rank1_hostA.json").write_text("{not json")
    with pytest.raises(ManifestError, match=r"manifest_rank1_hostA.json: not valid JSON"):
        load_manifest(tmp_path)


def test_a_listed_file_that_is_gone_is_one_sentence(tmp_path):
    m = assemble([part(0, "hostA", [window(0, "hostA", 3, 4, ["schedule"])], world=1)], combined=True)
    for f in m["files"]:
        (tmp_path / f["name"]).write_text("x")
    assert missing_files(m, tmp_path) == []
    (tmp_path / "rank0_hostA_step3-4.pt.trace.json.gz").unlink()
    assert missing_files(m, tmp_path) == [
        f"the run manifest lists rank0_hostA_step3-4.pt.trace.json.gz (rank 0 on host hostA, steps 3-4) but "
        f"{tmp_path} does not hold it: a lost trace (or one left in another host's node-local folder)"]
    # A JSON file of no window is no trace (a trial's "parallelism.json ... a lost trace").
    m["files"].append({"name": "parallelism.json", "rank": 0, "host": "hostA", "window": None})
    assert missing_files(m, tmp_path)[-1] == (
        f"the run manifest lists parallelism.json (rank 0 on host hostA) but {tmp_path} does not hold it: a lost file "
        "(or one left in another host's node-local folder)")
    # A compact file is its trace's cache (a trial: deleting them was "a lost file", twice): never lost.
    m["files"].append({"name": "rank0_hostA_step3-4.pt.trace.json.gz.compact.msgpack", "rank": 0, "host": "hostA",
                       "window": [3, 4]})
    assert len(missing_files(m, tmp_path)) == 2


# ---- analyze and merge --------------------------------------------------------------------------------------


def run_with_manifest(tmp_path: Path, source: str, offset_us: float, lost: bool) -> Path:
    """A copy of a committed 2-rank set with a manifest: rank 1 on hostB (clock ``offset_us`` ahead); ``lost``
    lists a third rank's trace that is not there."""
    folder = tmp_path / "run"
    folder.mkdir()
    parts = [part(0, "hostA", [], world=2), part(1, "hostB", [], world=2, offset=offset_us)]
    for p in parts:
        trace = f"rank{p['rank']}_{p['host']}_step1-5.pt.trace.json.gz"
        shutil.copy(DATA / source / f"rank-{p['rank']}.json.gz", folder / trace)
        p["windows"] = [{"first": 1, "last": 5, "reasons": ["anomaly"], "detail": "rank 1's step 9 took 3 s",
                         "cut_short": False, "files": [trace]}]
        p["files"] = []
    if lost:
        parts[1]["windows"][0]["files"].append("rank1_hostB_step6-7.pt.trace.json.gz")
    (folder / "manifest.json").write_text(json.dumps(assemble(parts, combined=True)))
    return folder


def test_analyze_reports_hosts_and_why_each_window_was_taken_and_warns_of_a_lost_trace(tmp_path, capsys):
    folder = run_with_manifest(tmp_path, "clean", 1500.0, lost=True)
    result = analyze_paths([folder], AnalysisOptions(workers=1))
    assert result.run is not None and result.run.hosts == [{"host": "hostA", "ranks": [0]},
                                                           {"host": "hostB", "ranks": [1]}]
    assert len(result.run.missing_files) == 1 and "rank1_hostB_step6-7.pt.trace.json.gz" in result.run.missing_files[0]
    text = format_summary(result)
    assert f"Run manifest ({folder / 'manifest.json'}), complete: 2 rank(s) on 2 host(s): hostA: ranks 0; " \
           "hostB: ranks 1" in text
    assert "  clocks at start: largest offset from rank 0 +1500 us (rank 1, +/- 40 us)" in text
    (tmp_path / "near").mkdir()
    near = format_summary(analyze_paths([run_with_manifest(tmp_path / "near", "clean", -0.11, lost=False)],
                                        AnalysisOptions(workers=1)))
    assert "largest offset from rank 0 +0 us (rank 1" in near  # (it read "-0 us")
    assert "  window steps 1-5 on ranks 0-1, taken by anomaly: rank 1's step 9 took 3 s" in text
    assert "  1 file(s) listed in the manifest are missing from the folder" in text
    assert format_findings(result).splitlines()[-1] == f"Warning: {result.run.missing_files[0]}"
    assert orjson.loads(result.to_json())["run"]["clocks"][1] == {"rank": 1, "host": "hostB", "offset_us": 1500.0,
                                                                  "uncertainty_us": 40.0}
    assert main(["analyze", str(folder), "--workers", "1", "--findings"]) == 0
    assert f"hf-distprof analyze: warning: {result.run.missing_files[0]}" in capsys.readouterr().err


def test_the_report_has_a_run_section_from_the_manifest(tmp_path):
    folder = run_with_manifest(tmp_path, "clean", 1500.0, lost=True)
    result = analyze_paths([folder], AnalysisOptions(workers=1))
    write_report(result, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    head = text.split("## Findings")[0]
    section = head.split("## Run\n\n")[1].splitlines()
    assert section == [
        f"Run manifest ({folder / 'manifest.json'}), complete: 2 rank(s) on 2 host(s): hostA: ranks 0; hostB: ranks 1",
        "",
        "- clocks at start: largest offset from rank 0 +1500 us (rank 1, +/- 40 us)",
        "- window steps 1-5 on ranks 0-1, taken by anomaly: rank 1's step 9 took 3 s",
        "- 1 file(s) listed in the manifest are missing from the folder",
        f"- Missing: {result.run.missing_files[0]}",
        "",
    ]
    # Without a manifest there is no such section.
    bare = analyze_paths([DATA / "clean"], AnalysisOptions(workers=1))
    write_report(bare, tmp_path / "bare")
    assert "## Run" not in (tmp_path / "bare" / "report.md").read_text()


def test_analyze_skips_a_broken_manifest_with_its_name_and_still_analyses(tmp_path):
    folder = run_with_manifest(tmp_path, "clean", 0.0, lost=False)
    (folder / "manifest.json").write_text("[]")
    result = analyze_paths([folder], AnalysisOptions(workers=1))
    assert len(result.ranks) == 2 and result.run is None
    assert [(e.path, e.reason) for e in result.errors] == [
        (str(folder / "manifest.json"), "not a hf_distprof.manifest document (its \"format\" must be "
                                        "'hf_distprof.manifest')")]


def test_merge_by_clock_shifts_each_rank_by_its_measured_offset(tmp_path, monkeypatch):
    folder = run_with_manifest(tmp_path, "slow_rank1", 2500.0, lost=False)
    by_clock = merge_traces([folder], tmp_path / "c.json.gz", align="clock", options=AnalysisOptions(workers=1))
    # Same baseTimeNanoseconds on both ranks: rank 1's events move back by its offset alone.
    assert by_clock.align == "clock" and by_clock.shifts_us == {0: 0.0, 1: -2500.0}
    assert by_clock.clock_uncertainty_us == 40.0
    src = orjson.loads(gzip.decompress((DATA / "slow_rank1" / "rank-1.json.gz").read_bytes()))["traceEvents"]
    merged = orjson.loads(gzip.decompress((tmp_path / "c.json.gz").read_bytes()))["traceEvents"]
    first_x = min(e["ts"] for e in src if e.get("ph") == "X")
    assert min(e["ts"] for e in merged if e.get("ph") == "X" and e["pid"] == 1) == pytest.approx(first_x - 2500.0)
    # Collectives matched: they decide; none matched: the manifest's clocks, not the raw wall clocks.
    assert merge_traces([folder], tmp_path / "m.json.gz", options=AnalysisOptions(workers=1)).align == "collectives"
    monkeypatch.setattr("hf_distprof.analysis.across.align.match_collectives", lambda ranks: {})
    fallback = merge_traces([folder], tmp_path / "f.json.gz", options=AnalysisOptions(workers=1))
    assert fallback.align == "clock" and fallback.shifts_us == {0: 0.0, 1: -2500.0}
    (folder / "manifest.json").unlink()
    assert merge_traces([folder], tmp_path / "n.json.gz", align="clock",
                        options=AnalysisOptions(workers=1)).align == "none"


# ---- the callback's side ------------------------------------------------------------------------------------


def test_a_profiled_run_writes_its_part_per_window_and_the_combined_manifest_at_the_end(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    cb = ProfilerCallback(ProfilingArguments(
        enable_profiling=True, profiler_output_dir=str(tmp_path / "traces"), profiler_record_shapes=False,
        profiler_wait_steps=1, profiler_warmup_steps=0, profiler_active_steps=2, profiler_repeat=2))
    fake_trainer.run([cb], 5, tmp_path, end=False)  # windows 2-3 and 5 (cut by the end of training)
    assert cb.run_dir is not None
    running = json.loads((cb.run_dir / f"manifest_rank0_{HOST}.json").read_text())
    assert running["status"] == "running" and [(w["first"], w["last"]) for w in running["windows"]] == [(2, 3), (5, 5)]
    assert not (cb.run_dir / "manifest.json").exists()
    cb.on_train_end(fake_trainer.training_args(tmp_path), fake_trainer.TrainerState(), fake_trainer.TrainerControl())
    m = json.loads((cb.run_dir / "manifest.json").read_text())
    assert m["complete"] is True and m["hosts"] == [{"host": HOST, "ranks": [0]}]
    assert m["ranks"][0]["clock_offset_us"] == 0.0 and m["ranks"][0]["status"] == "finished"
    assert [(w["first"], w["last"], w["reasons"], w["cut_short_ranks"]) for w in m["windows"]] == [
        (2, 3, ["schedule"], []), (5, 5, ["schedule"], [0])]
    assert m["windows"][0]["detail"] == ("--profiler-skip-first 0 --profiler-wait-steps 1 --profiler-warmup-steps 0 "
                                         "--profiler-active-steps 2 --profiler-repeat 2")
    assert sorted(m["versions"]) == ["accelerate", "hf_distprof", "python", "torch", "transformers"]
    listed = [f["name"] for f in m["files"]]
    assert f"rank0_{HOST}_step2-3.pt.trace.json.gz" in listed and f"rank0_{HOST}_step5-5_summary.txt" in listed
    assert "rank0.log" in listed and "parallelism.json" in listed
    assert all((cb.run_dir / name).is_file() for name in listed)


def test_a_manifest_that_cannot_be_written_is_one_warning(tmp_path, caplog):
    manifest = RunManifest(tmp_path / "gone", ProfilingArguments(), ["h"], [{"offset_us": 0.0}], {})
    with caplog.at_level(logging.WARNING):
        manifest.write_part()
        manifest.window_written(1, 2, ["schedule"], "", False)
    warnings = [r.getMessage() for r in caplog.records if "run manifest: could not write" in r.getMessage()]
    assert len(warnings) == 1 and "manifest_rank0_h.json" in warnings[0] and "training goes on" in warnings[0]


def test_a_failed_clock_exchange_leaves_that_host_unmeasured_and_still_reaches_the_broadcast(monkeypatch, caplog):
    import hf_distprof.callbacks.profiler.manifest as manifest_module

    broadcasts: list[Any] = []

    def failing_ping(transport, rounds):
        raise RuntimeError("gloo: connection reset")

    monkeypatch.setattr(manifest_module.dist, "is_distributed", lambda: True)
    monkeypatch.setattr(manifest_module.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(manifest_module.torch_dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(manifest_module, "ping", failing_ping)
    monkeypatch.setattr(manifest_module.dist, "broadcast_object", lambda obj: broadcasts.append(obj) or obj)
    with caplog.at_level(logging.WARNING):
        clocks = manifest_module.measure_clocks(["a", "a", "b", "b"])
    assert broadcasts == [{}]
    assert [c["offset_us"] for c in clocks] == [0.0, 0.0, None, None]
    assert [r.getMessage() for r in caplog.records] == [
        "[RANK 0] clock offset of rank 2 against rank 0 not measured: RuntimeError('gloo: connection reset')"
    ]
