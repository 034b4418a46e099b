"""``hf-distprof doctor``'s pure parts: pairing schedule, clock offsets, fault injection, and rank 0's judging."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from hf_distprof.core.clock import ntp_offset
from hf_distprof.core.text import format_ranks
from hf_distprof.doctor import checks, judge, runner


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9])
def test_round_robin_meets_every_pair_once_and_no_rank_twice_per_round(n):
    rounds = checks.round_robin_rounds(n)
    pairs = [pair for rnd in rounds for pair in rnd]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    for rnd in rounds:
        ranks = [r for pair in rnd for r in pair]
        assert len(ranks) == len(set(ranks))
        assert all(a < b for a, b in rnd)


def test_round_robin_of_one_rank_has_no_rounds():
    assert checks.round_robin_rounds(1) == []


def test_clock_offset_takes_the_shortest_round_trip():
    # Peer 2.0 s ahead. A 10 ms round trip with the peer reading its clock (once) at the midpoint, and a 100 ms
    # one whose reply was delayed by 90 ms on the way back (which alone would say 1.955 s).
    samples = [(100.0, 102.010, 102.010, 100.100), (200.0, 202.005, 202.005, 200.010)]
    offset, rtt = ntp_offset(samples)
    assert offset == pytest.approx(2.0)
    assert rtt == pytest.approx(0.010)


def test_clock_offset_is_negative_for_a_peer_behind():
    assert ntp_offset([(10.0, 9.5015, 9.5015, 10.003)])[0] == pytest.approx(-0.5)


def test_format_ranks_compresses_runs():
    assert format_ranks([3]) == "rank 3"
    assert format_ranks([5, 0, 1, 2, 7, 8]) == "ranks 0-2, 5, 7-8"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", None), ("all_reduce:1", runner.Injection("all_reduce", 1, "wrong")),
     ("barrier:0:hang", runner.Injection("barrier", 0, "hang"))],
)
def test_parse_injection(value, expected):
    assert runner.parse_injection(value, world=2) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [("all_reduce", "expected <check>:<rank>[:hang]"), ("all_reduce:x", "expected <check>:<rank>[:hang]"),
     ("all_reduce:1:slow", "expected <check>:<rank>[:hang]"), ("barrier:1", "mode 'wrong' applies to p2p"),
     ("memory:0:hang", "mode 'hang' applies to init"), ("all_reduce:2", "rank must be in 0..1")],
)
def test_parse_injection_names_what_is_wrong(value, message):
    with pytest.raises(ValueError, match="HF_DISTPROF_DOCTOR_INJECT") as exc:
        runner.parse_injection(value, world=2)
    assert message in str(exc.value)


def _doc(world: int = 2, **args: float) -> SimpleNamespace:
    flags = {"min_free_gb": 1.0, "max_skew_ms": 500.0, **args}
    return SimpleNamespace(world=world, expected_world=world, backend="gloo", args=SimpleNamespace(**flags))


def test_all_reduce_with_a_wrong_result_on_rank_1_fails_naming_rank_1():
    per_rank = {0: {"ms": [1.0, 2.0, 3.0]}, 1: {"ms": [1.0, 1.0, 5.0], "wrong": "element 0 is 4, expected 3"}}
    outcome = judge.JUDGE["all_reduce"](_doc(), per_rank)
    assert (outcome.status, outcome.bad_ranks) == ("fail", [1])
    assert outcome.summary.startswith("wrong result on rank 1; median 1.50 ms of 1 MiB over 3 runs, slowest rank 0")
    assert outcome.details == ["rank 1: element 0 is 4, expected 3"]


def test_a_collective_every_rank_refuses_is_skipped_as_unsupported():
    per_rank = {r: {"unsupported": "RuntimeError: ProcessGroupGloo does not support reduce_scatter"} for r in (0, 1)}
    outcome = judge.JUDGE["reduce_scatter"](_doc(), per_rank)
    assert (outcome.status, outcome.summary) == ("skip", "not supported by gloo")


def test_p2p_names_the_failed_pair_and_the_rank_that_saw_it():
    per_rank = {
        0: {"pairs": [{"peer": 1, "ms": 1.0}, {"peer": 2, "ms": 3.0}]},
        1: {"pairs": [{"peer": 0, "ms": 1.0}, {"peer": 2, "error": "TimeoutError: not finished"}],
            "error": "with rank 2: TimeoutError: not finished"},
        2: {"pairs": [{"peer": 0, "ms": 3.0}, {"peer": 1, "wrong": "from rank 1: element 0 is 6"}]},
    }
    outcome = judge.JUDGE["p2p"](_doc(world=3), per_rank)
    assert outcome.status == "fail"
    assert outcome.summary.startswith("1 of 3 pair(s) failed: 1<->2; 3 pair(s) in 3 round(s)")
    assert "slowest 0<->2 3.00 ms" in outcome.summary
    assert outcome.details == ["rank 1: TimeoutError: not finished", "rank 2: from rank 1: element 0 is 6"]
    assert outcome.bad_ranks == [1, 2]


def test_environment_fails_only_on_the_variables_that_must_agree():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    per_rank = {0: {"env": {**env, "RANK": "0"}}, 1: {"env": {**env, "RANK": "1"}}}
    outcome = judge.JUDGE["environment"](_doc(), per_rank)
    assert outcome.status == "pass"
    assert outcome.summary == "MASTER_ADDR=10.0.0.1, MASTER_PORT=29500, WORLD_SIZE=2 on ranks 0-1"
    assert outcome.details == ["same on ranks 0-1: MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 OMP_NUM_THREADS=1 "
                               "WORLD_SIZE=2", "RANK: '0' on rank 0; '1' on rank 1"]
    per_rank[1]["env"]["MASTER_PORT"] = "29501"
    outcome = judge.JUDGE["environment"](_doc(), per_rank)
    assert (outcome.status, outcome.summary, outcome.bad_ranks) == ("fail", "ranks disagree on MASTER_PORT", [1])


def test_versions_list_the_disagreeing_package_per_rank():
    same = {"python": "3.11.7", "torch": "2.13.0"}
    per_rank = {0: same, 1: same, 2: {**same, "torch": "2.12.1"}}
    outcome = judge.JUDGE["versions"](_doc(world=3), per_rank)
    assert (outcome.status, outcome.bad_ranks) == ("fail", [2])
    assert outcome.details == ["torch: '2.13.0' on ranks 0-1; '2.12.1' on rank 2"]


def test_memory_below_the_threshold_fails_on_that_rank():
    per_rank = {r: {"kind": "host memory", "free_gb": free, "total_gb": 8.0} for r, free in ((0, 4.0), (1, 0.5))}
    outcome = judge.JUDGE["memory"](_doc(min_free_gb=1.0), per_rank)
    assert (outcome.status, outcome.bad_ranks) == ("fail", [1])
    assert outcome.summary == "least free: 0.50 of 8.00 GB host memory on rank 1 (--min-free-gb 1)"


def test_clock_skew_fails_above_the_threshold_naming_the_rank():
    peers = [{"rank": 1, "offset_ms": 3.0, "rtt_ms": 0.4}, {"rank": 2, "offset_ms": -750.0, "rtt_ms": 0.2}]
    outcome = judge.JUDGE["clock_skew"](_doc(world=3), {0: {"peers": peers}, 1: {}, 2: {}})
    assert (outcome.status, outcome.bad_ranks, outcome.details) == ("fail", [2], ["rank 2: -750.0 ms"])
    assert outcome.summary.startswith("largest offset from rank 0: -750.00 ms on rank 2 (± 0.10 ms")


class _Work:
    def __init__(self, error: BaseException | None = None, result: object = True) -> None:
        self.error, self.result = error, result

    def wait(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.result


def _doctor(backend: str) -> runner.Doctor:
    import torch

    doc = object.__new__(runner.Doctor)
    doc.timeout, doc.backend, doc.device = 5.0, backend, torch.device("cpu")
    return doc


@pytest.mark.parametrize(("backend", "message", "aborted"), [
    ("gloo", "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv "
             "operation to complete", False),
    ("gloo", "Operation timed out!", False),
    ("nccl", "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, "
             "NumelIn=1, NumelOut=1, Timeout(ms)=5000) ran for 5003 milliseconds before timing out.", True),
])
def test_a_backend_s_timeout_is_a_timeout_naming_the_flag(backend, message, aborted):
    import time

    with pytest.raises(TimeoutError, match="not finished within --timeout 5 s") as caught:
        _doctor(backend).wait(_Work(RuntimeError(message)), time.monotonic() + 5)
    assert ("NCCL aborted its communicators" in str(caught.value)) is aborted


def test_another_backend_failure_stays_what_it_is():
    import time

    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        _doctor("gloo").wait(_Work(RuntimeError("Connection reset by peer")), time.monotonic() + 5)
    with pytest.raises(TimeoutError):
        _doctor("gloo").wait(_Work(result=False), time.monotonic() + 5)
    _doctor("gloo").wait(_Work(), time.monotonic() + 5)  # done in time: nothing raised


def test_what_makes_the_run_impossible_is_said_before_any_check(tmp_path, capsys):
    # A trial: --backend nccl without CUDA ended in a traceback (AttributeError from torch._C); --json to a folder or a
    # missing folder was found only after every check ran.
    import torch

    from hf_distprof.cli.main import main

    if not torch.cuda.is_available():  # (on a GPU machine nccl is there to use)
        assert main(["doctor", "--backend", "nccl"]) == 2
        assert capsys.readouterr().err == ("hf-distprof doctor: error: --backend nccl needs CUDA GPUs, and this "
                                           "machine has none (torch sees no CUDA device): use gloo\n")
    for out, why in ((tmp_path, "Is a directory"), (tmp_path / "no" / "r.json", "No such directory")):
        assert main(["doctor", "--json", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"hf-distprof doctor: error: --json {out}: {why}\n" and captured.out == ""
