"""The what-if answer in words and in a figure: the terminal lines, the report's section and its plot."""

from __future__ import annotations

from pathlib import Path

from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.analysis.results.whatif import WhatIfModel, WhatIfScenario
from hf_distprof.analysis.tell.document import Blank, Block, Heading, Image, Table, para
from hf_distprof.analysis.tell.plot import pyplot, save

CRITICAL_PATH_PNG = "critical_path.png"
# Links of the critical path listed in the terminal (all of them are in --json and the report).
PATH_ROWS = 24


def _noise(model: WhatIfModel) -> str:
    return "unknown (one step)" if model.noise_ms is None else f"{model.noise_ms:.2f} ms"


def _header(model: WhatIfModel, scenarios: list[WhatIfScenario]) -> str:
    if model.run_noise_ms is not None:
        # A rank's pace without the run's figure: the verdict named it from what those steps do not measure.
        unheld = next((s for s in scenarios if s.scenario == "slow_rank" and s.run_saving_pct is None), None)
        counts = (f"a saving counts when it is larger than the error and the run's step-to-step noise "
                  f"({model.run_noise_ms:.2f} ms over its {model.run_steps} judged steps, the step timer's records), "
                  "and on a rank's pace only when the slow-rank verdict calls that rank's excess real over the run, "
                  "and then as much as that pace saves over the run (run%) when that is less" + (
                      f"; rank {unheld.ranks[0]}'s pace has no run%: the verdict named it from its traced steps, or "
                      "its wait for a CPU, which those steps' own work does not measure" if unheld is not None and
                      unheld.ranks else ""))
    else:
        counts = ("a saving counts when it is larger than the error and the noise (the smaller of the measured steps' "
                  "and the predicted steps'), and on a rank's pace only when the traced window's slow-rank verdict "
                  "names that rank")
    return (
        f"{len(model.steps)} traced step(s) replayed across ranks: measured {model.step_ms_measured:.2f} ms per "
        f"step (mean over steps and ranks; step-to-step noise {_noise(model)}), replayed "
        f"{model.step_ms_replayed:.2f} ms; model error +-{model.error_ms:.2f} ms (the largest replay residual of a "
        f"rank's step); {counts}"
    )


def _row(s: WhatIfScenario) -> tuple[str, ...]:
    noise = "-" if s.noise_ms is None else f"{s.noise_ms:.2f}"
    run = "-" if s.run_saving_pct is None else f"{s.run_saving_pct:.1f}"
    return (s.title, f"{s.step_ms_predicted:.2f}", f"{s.error_ms:.2f}", noise, f"{-s.saving_ms:+.2f}",
            f"{s.saving_pct:.1f}", run, f"{s.hours_per_1000_steps:.3f}",
            "yes" if s.beyond_noise else f"no: {s.not_counted}" if s.not_counted else "no")


def what_if_lines(result: AnalysisResult) -> list[str]:
    """The terminal section: the ranked scenarios, then the critical path of the median step; [] without a model."""
    model = result.what_if_model
    if model is None:
        return []
    width = max([58, *(len(s.title) for s in result.what_if)])  # the titles whole, the columns aligned
    head = (f"{'what if':<{width}} {'step ms':>8} {'+-err ms':>8} {'noise ms':>8} {'change ms':>10} {'saving%':>8} "
            f"{'run%':>6} {'h/1k steps':>10} {'counts':>12}")
    out = ["", f"What if ({_header(model, result.what_if)}):", head, "-" * len(head)]
    for s in result.what_if:
        title, step, error, noise, change, pct, run, hours, beyond = _row(s)
        out.append(f"{title:<{width}} {step:>8} {error:>8} {noise:>8} {change:>10} {pct:>8} {run:>6} {hours:>10} "
                   f"{beyond:>12}")
    out += ["", *critical_path_lines(result)]
    return out


def critical_path_lines(result: AnalysisResult, rows: int = PATH_ROWS) -> list[str]:
    """The median step's critical path, one link per line (at most ``rows``)."""
    model, path = result.what_if_model, result.critical_path
    if model is None or not path:
        return []
    total = sum(seg.ms for seg in path)
    order = _ranks_in_order(result)
    along = f"rank{'s' if len(order) > 1 else ''} {' -> '.join(order)}"
    late = path[0].start_ms  # the path's first rank began the step this late (its wait before the step: no link)
    if late >= max(0.005, 0.01 * total):  # (a start 20 us apart is noise: not said)
        out = [f"Critical path of step {model.median_step} (the median step, {late + total:.2f} ms from the earliest "
               f"rank's start to the last rank's end: rank {path[0].rank} began it {late:.2f} ms after the earliest "
               f"rank, then {total:.2f} ms along {along}):"]
    else:
        out = [f"Critical path of step {model.median_step} (the median step; {total:.2f} ms, {along}):"]
    for seg in path[:rows]:
        out.append(f"  {seg.start_ms:>9.2f} ms  rank {seg.rank:<4} {seg.kind:<10} {seg.name:<32} {seg.ms:>9.2f} ms")
    if len(path) > rows:
        out.append(f"  ... {len(path) - rows} more links in --json (critical_path)")
    return out


def _ranks_in_order(result: AnalysisResult) -> list[str]:
    out: list[str] = []
    for seg in result.critical_path:
        if not out or out[-1] != str(seg.rank):
            out.append(str(seg.rank))
    return out


def what_if_blocks(result: AnalysisResult, with_figure: bool) -> list[Block]:
    """The report's "What if" section: the model, the ranked scenarios, the critical path and its figure."""
    model = result.what_if_model
    if model is None:
        return []
    out: list[Block] = [Blank(), Heading(2, "What if"), Blank(),
                        para(f"The {_header(model, result.what_if)}. Each scenario replays the same steps with one "
                             "change."), Blank(),
                        Table(["what if", "step ms", "+- error ms", "noise ms", "change ms", "saving %",
                               "saving over the run %", "hours per 1,000 steps", "counts"],
                              [list(_row(s)) for s in result.what_if])]
    if result.critical_path:
        out += [Blank(), Heading(3, f"Critical path of step {model.median_step} (the median step)"), Blank(),
                Table(["from ms", "rank", "kind", "name", "ms"],
                      [[f"{s.start_ms:.2f}", str(s.rank), s.kind, s.name, f"{s.ms:.2f}"]
                       for s in result.critical_path])]
    if with_figure:
        out += [Blank(), Image(CRITICAL_PATH_PNG, "critical path over the ranks' timelines")]
    return out


def plot_critical_path(result: AnalysisResult, out: Path) -> None:
    """The median step as replayed, one lane per rank (work by phase, waits, transfers), the critical path over it."""
    plt = pyplot()
    model = result.what_if_model
    lanes = model.lanes if model is not None else []
    ranks = sorted({lane["rank"] for lane in lanes} | {seg.rank for seg in result.critical_path})
    row = {rank: k for k, rank in enumerate(ranks)}
    names = sorted({lane["family"] for lane in lanes})
    colours = {name: plt.get_cmap("tab20")(k % 20) for k, name in enumerate(names)}
    colours["waiting"] = (0.85, 0.85, 0.85, 1.0)
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.45 * len(ranks) + 1.8)))
    for lane in lanes:
        family = lane["family"]
        ax.barh(row[lane["rank"]], lane["end_ms"] - lane["start_ms"], left=lane["start_ms"], height=0.6,
                color=colours[family], label=family)
    xs, ys = [], []
    for seg in result.critical_path:
        xs += [seg.start_ms, seg.start_ms + seg.ms]
        ys += [row[seg.rank], row[seg.rank]]
    if xs:
        ax.plot(xs, ys, color="black", linewidth=2.2, label="critical path")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the step's start (replayed)")
    step = model.median_step if model is not None else "-"
    ax.set_title(f"Critical path of step {step} over the ranks' timelines")
    save(fig, out)
