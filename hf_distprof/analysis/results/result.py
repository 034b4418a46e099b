"""The whole answer of ``analyze``: every stage's result in one object that serialises to JSON."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.across import (
    Alignment,
    BandwidthStat,
    BandwidthVsReference,
    CrossRankResult,
    LatePeer,
    ReferenceTotals,
)
from hf_distprof.analysis.results.findings import Finding, Undecided, WindowNote
from hf_distprof.core.names import SCHEMA_VERSION
from hf_distprof.analysis.results.rank import CommKindStat, FileError, ModuleCommStat, RankResult
from hf_distprof.analysis.results.run import RunSummary
from hf_distprof.analysis.results.whatif import CriticalSegment, WhatIfModel, WhatIfScenario
from hf_distprof.core.stats import mean


@dataclass
class AnalysisResult:
    """The result of ``analyze_paths``: per-rank results, the cross-rank view, findings, bad files."""

    ranks: list[RankResult]
    cross_rank: CrossRankResult | None
    findings: list[Finding]
    errors: list[FileError]
    options: AnalysisOptions
    comm_by_kind: list[CommKindStat] = field(default_factory=list)
    """Communication per collective kind, per step, mean over the ranks."""
    comm_by_module: list[ModuleCommStat] = field(default_factory=list)
    """FSDP's collectives per unit, kind and phase, per step, mean over the ranks (empty without FSDP)."""
    undecided: list[Undecided] = field(default_factory=list)
    """Questions the run is too short to answer ("not enough evidence"), and findings withheld: never findings."""
    profiler_slowdown: dict[str, Any] | None = None
    """Steps inside the trace against the run's other steps: ``timing_summary.json``'s, else judged from the
    ``timing_rank*.jsonl`` beside the traces (:func:`hf_distprof.analysis.judge.slowdown.slowdown_of`); None without
    them."""
    bandwidth: list[BandwidthStat] = field(default_factory=list)
    """Collective bandwidth per kind, group size and message size (empty when no collective has a size)."""
    unsized_collectives: int = 0
    """Collectives (counted on every rank) without a size: without ``record_param_comms`` sizes (newer
    PyTorch with NCCL) they need recorded shapes, read on NCCL traces with ``message_sizes="shapes"``."""
    bandwidth_reference: list[BandwidthVsReference] = field(default_factory=list)
    """``bandwidth`` rows against ``analyze --bandwidth-ref``'s CSV (empty without it)."""
    bandwidth_reference_file: str | None = None
    """That CSV; None without ``--bandwidth-ref``."""
    run: RunSummary | None = None
    """The run manifest beside the traces (hosts, each window and why it was taken, files it lists that are
    missing); None without one."""
    what_if: list[WhatIfScenario] = field(default_factory=list)
    """What one fix would save, the steps replayed across ranks, largest saving first
    (:mod:`hf_distprof.analysis.whatif.model`)."""
    critical_path: list[CriticalSegment] = field(default_factory=list)
    """The chain of work and transfers that sets the median traced step's time."""
    what_if_model: WhatIfModel | None = None
    """The replay behind them: its residual (the error bar), the median step and its lanes; None without one."""

    window_notes: list[WindowNote] = field(default_factory=list)
    """Where the traced window's own slow-rank verdict disagrees with the run's, which the answer follows."""
    alignment: Alignment | None = None
    """The ranks on one clock (matched collectives, clock offsets, arrivals), as the cross-rank stages used it; not in
    ``to_dict`` (its figures are each rank's ``clock_offset_us`` and ``matched_collectives``). ``merge`` reuses it."""
    late_peers: dict[int, list[LatePeer]] = field(default_factory=dict)
    """Waiting rank -> the peers it waits for, longest first; not in ``to_dict`` (each rank's ``peer_waits`` are)."""
    reference_totals: ReferenceTotals | None = None
    """The ``bandwidth_reference`` rows added up per rank; not in ``to_dict``."""
    common_steps: list[int] = field(default_factory=list)
    """The steps every rank traced, in order; not in ``to_dict``."""
    slowdown_line: str | None = None
    """The profiler's slowdown when it raised no finding, in words (its ratio and the run's noise, or why there is no
    ratio); None when it raised one, or without one. Not in ``to_dict`` (``profiler_slowdown`` has its figures)."""
    unread_ranks: list[int] = field(default_factory=list)
    """The ranks whose traces the run's manifest lists and the analysis did not read (not given, or unreadable): the
    findings that weigh the ranks against each other and the what-if are withheld. Not in ``to_dict`` (``undecided``
    names them)."""
    unmeasured_waits: list[int] = field(default_factory=list)
    """Ranks the others wait for whose traces were not read (not given, or no profiler window): the late-peer figures
    (``wait_us``, ``wait_pct``, ``waited_for``, ``peer_waits``) are null or empty in ``to_dict``, n/a in the text."""

    @property
    def gpu(self) -> bool:
        """Whether any rank's trace holds GPU events (the GPU's figures and advice apply, not the training thread's)."""
        return any(r.device == "gpu" for r in self.ranks)

    @property
    def exposed_comm_pct(self) -> float:
        """Headline: exposed communication as % of step time, mean over ranks."""
        return mean([r.exposed_comm_pct for r in self.ranks])

    @property
    def imbalance_pct(self) -> float | None:
        """Headline: load imbalance across ranks in %; None with one rank's trace (no peer to compare with)."""
        return self.cross_rank.imbalance_pct if self.cross_rank is not None else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with the headline numbers and per-rank derived values included."""
        out = _asdict(self)
        for name in _NOT_IN_JSON:
            out.pop(name)
        out["exposed_comm_pct"] = self.exposed_comm_pct
        out["imbalance_pct"] = self.imbalance_pct
        out = {"schema_version": SCHEMA_VERSION, **out}  # first: what a reader checks before anything else
        for rank_out, rank in zip(out["ranks"], self.ranks):
            rank_out["mean_step_us"] = rank.mean_step_us
            rank_out["exposed_comm_pct"] = rank.exposed_comm_pct
            rank_out["busy_us"] = rank.busy_us
            rank_out.pop("collectives")  # matched in cross_rank; too long to be useful in the output
            rank_out.pop("timeline")  # the what-if model's input; its answer is what_if and critical_path
            if not rank.memory:
                rank_out.pop("memory")  # only traces recorded with profile_memory have the key
            _add_hidden_pct(rank_out["comm_by_kind"], rank.comm_by_kind)
            if self.unmeasured_waits:
                _no_late_peer_figures(rank_out)
        _add_hidden_pct(out["comm_by_kind"], self.comm_by_kind)
        if self.unmeasured_waits:
            _no_late_peer_figures(out)
        for row_out, row in zip(out["bandwidth"], self.bandwidth):
            row_out["wait_pct"] = row.wait_pct
        return out

    def to_json(self) -> bytes:
        """The result as indented JSON bytes."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

_ATOMS = frozenset({str, int, float, bool, type(None)})
_NOT_IN_JSON = ("alignment", "late_peers", "reference_totals", "common_steps", "slowdown_line", "unread_ranks")

def _asdict(obj: Any) -> Any:
    """``dataclasses.asdict(obj)``, the same dict, without copying each rank's collectives and timeline
    (``to_dict`` drops them: an empty list stands in) and without deep-copying numbers and strings (asdict's cost
    is nearly all in those two)."""
    kind = type(obj)
    if kind in _ATOMS:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        skip = ("collectives", "timeline") if kind is RankResult else _NOT_IN_JSON if kind is AnalysisResult else ()
        return {
            f.name: [] if f.name in skip else _asdict(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
        }
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple, rebuilt field by field as asdict does
        return kind(*[_asdict(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return kind(_asdict(v) for v in obj)
    if isinstance(obj, dict):
        return kind((_asdict(k), _asdict(v)) for k, v in obj.items())
    return copy.deepcopy(obj)

def _no_late_peer_figures(out: dict[str, Any]) -> None:
    """Null where the text says n/a: a peer waited for is in no trace read, so the time in collectives cannot be told
    apart into the wait for it and the transfer (``unmeasured_waits`` names the ranks)."""
    for row in out["comm_by_kind"]:
        row["wait_us"] = row["wait_pct"] = None
        row["waited_for"] = []
    if "peer_waits" in out:
        out["peer_waits"] = []


def _add_hidden_pct(rows_out: list[dict[str, Any]], rows: list[CommKindStat]) -> None:
    for row_out, row in zip(rows_out, rows):
        row_out["hidden_pct"] = row.overlap_pct
