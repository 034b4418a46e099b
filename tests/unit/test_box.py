"""The box at the end of ``analyze``: verdict, why (the numbers), what to try; the all-clear with the figures; the
undecided question with what would decide it. Exact text on the committed traces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_box
from hf_distprof.analysis.tell.box import MAX_LINES, WIDTH
from hf_distprof.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data"
OPTS = AnalysisOptions(workers=1, what_if_pct=100)  # diagnose()'s findings (the what-if finding has its own tests)


def box(name: str, **opts: float) -> str:
    return format_box(analyze_paths([DATA / name], AnalysisOptions(workers=1, what_if_pct=100, **opts)))


def test_the_slow_ranks_chain_is_the_verdict() -> None:
    assert box("slow_rank1").splitlines() == [
        "+- hf-distprof: in short " + "-" * 74 + "+",
        "| Verdict: Rank 1 holds the others back: its compute (forward, backward and optimizer)             |",
        "| Why:     compute (forward, backward and optimizer) takes 29.3 ms more per step than on its       |",
        "|          peers, who wait 46.4% of their step for it at the collectives in the traced steps       |",
        "|          (confidence 0.98)                                                                       |",
        "| Try:     Rank 1: its compute is slower: check for uneven sequence lengths across ranks (pad to a |",
        "|          fixed length or use --group_by_length), and that rank's host for other processes        |",
        "|          sharing its cores                                                                       |",
        "+" + "-" * 98 + "+",
    ]


def test_a_clean_run_says_so_with_its_figures() -> None:
    text = box("clean")
    assert ("| Verdict: no finding: nothing crosses its threshold in most steps, beyond the run's own noise"
            in re.sub(r"\s*\|\n\|\s+", " ", text))
    assert "verdicts: straggler quiet, imbalance quiet" in re.sub(r"\s*\|\n\|\s+", " ", text)
    # The what-if's largest saving is named, and why it is no finding (here: under the threshold worth fixing).
    assert ("Try:     nothing worth fixing: the largest saving the what-if predicts, exposed communication hidden "
            "(transfers fully overlapped), is 7.8% of the step, under the 100% worth fixing") in re.sub(
        r"\s*\|\n\|\s+", " ", text)
    flat = re.sub(r"\s*\|\n\|\s+", " ", text)
    # The rank the what-if replays at its peers' pace (no step timer records: the latest at the collectives).
    assert "slowest rank 1 (+0.1% median lateness per step, under the 10% threshold)" in flat
    # The headline's figure, and whose: another measure, another rank.
    assert "load imbalance 1.6% (rank 0's busy time, traced steps)" in flat


def test_other_findings_are_listed_and_the_fields_stay_short() -> None:
    text = box("fsdp2")
    assert text.splitlines()[1].startswith("| Verdict: Exposed FSDP all-gather before forward (ranks 0-1)")
    assert "| Also:    2 more finding(s): Communication-bound; Reduce-scatter not overlapped with backward" in text
    for name in ("slow_rank1", "clean", "fsdp2", "slow_data"):
        lines = box(name).splitlines()
        assert all(len(line) == WIDTH for line in lines), name
        sizes: list[int] = []
        for line in lines[1:-1]:
            if line[2:10].strip():  # a field's first line carries its name
                sizes.append(0)
            sizes[-1] += 1
        assert sizes and max(sizes) <= MAX_LINES, name


def test_an_undecided_question_says_what_would_decide_it(tmp_path: Path) -> None:
    # The slow_rank1 traces cut to 3 steps and no step timer beside them: the window alone cannot decide.
    from .test_analysis_cross_rank import rank as cpu_rank
    from hf_distprof.analysis import analyze_ranks

    result = analyze_ranks([cpu_rank(0, 0.0, steps=3), cpu_rank(1, 30_000.0, steps=3)], OPTS)
    text = re.sub(r"\s*\|\n\|\s+", " ", format_box(result))  # the fields' lines joined
    assert "| Verdict: not enough evidence for a slow-rank verdict" in text
    assert ("Try:     trace at least 6 steps (--profiler-active-steps 6) or keep the step timer on "
            "(--enable-step-timing, on with --enable-profiling) over more steps") in text


def test_analyze_ends_with_the_box_and_json_has_none(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(DATA / "slow_rank1"), "--findings"]) == 0
    out = capsys.readouterr().out.rstrip("\n").splitlines()
    assert out[-1] == "+" + "-" * 98 + "+" and any(line.startswith("| Verdict: Rank 1 holds") for line in out[-9:])
    assert main(["analyze", str(DATA / "slow_rank1")]) == 0
    assert capsys.readouterr().out.rstrip("\n").endswith("+" + "-" * 98 + "+")
    assert main(["analyze", str(DATA / "slow_rank1"), "--json"]) == 0
    assert "hf-distprof: in short" not in capsys.readouterr().out


def test_the_box_renders_the_findings_fields_never_their_sentences() -> None:
    for name in ("slow_rank1", "fsdp2", "slow_data"):
        result = analyze_paths([DATA / name], OPTS)
        assert result.findings, name
        before = format_box(result)
        for f in result.findings:  # the sentences the text and the report show: the box must not need them
            f.evidence, f.recommendation = "(evidence)", "(recommendation)"
        assert format_box(result) == before, name


def test_every_finding_and_question_carries_its_fields_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    import orjson

    bases = {"trace", "trace + step timer", "replay", "step timer"}
    phases = {None, "data", "forward", "backward", "optimizer", "compute", "communication", "memory", "profiler"}
    seen: set[str] = set()
    for name in ("slow_rank1", "fsdp2", "slow_data", "clean"):
        assert main(["analyze", str(DATA / name), "--json", "--workers", "1"]) == 0
        doc = orjson.loads(capsys.readouterr().out)
        for f in doc["findings"]:
            seen.add(f["kind"])
            assert f["why"] and f["action"] and f["basis"] in bases and f["phase"] in phases, (name, f["kind"])
            assert f["recommendation"].startswith(f["action"]), (name, f["kind"])
        for u in doc["undecided"]:
            assert set(u) == {"question", "reason", "why", "to_decide", "ranks", "basis", "steps"}
    assert {"slow_rank", "communication_bound", "fsdp_exposed_all_gather", "data_loading_bound"} <= seen
    # An undecided question as data (3 traced steps, no step timer's records: the verdicts cannot decide).
    from .test_analysis_cross_rank import rank as cpu_rank
    from hf_distprof.analysis import analyze_ranks

    doc = orjson.loads(analyze_ranks([cpu_rank(0, 0.0, steps=3), cpu_rank(1, 30_000.0, steps=3)], OPTS).to_json())
    assert [u["question"] for u in doc["undecided"]] == ["straggler"]  # the ranks' busy time is even: no candidate
    for u in doc["undecided"]:
        assert set(u) == {"question", "reason", "why", "to_decide", "ranks", "basis", "steps"}
        assert u["ranks"] == [1] and u["steps"] == 3 and u["to_decide"].startswith("trace at least 6 steps")


def test_a_slowest_rank_no_verdict_names_says_what_names_it() -> None:
    result = analyze_paths([DATA / "clean"], AnalysisOptions(workers=1))
    result.cross_rank.slowest_by = "run"
    flat = re.sub(r"\s*\|\n\|\s+", " ", format_box(result))
    assert "slowest rank 1 (the most own work over the run's judged steps, no verdict)" in flat
