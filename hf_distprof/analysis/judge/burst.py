"""A burst (pure): a rank that held the others back in a few steps only, said (:mod:`hf_distprof.core.burst`).

The slow-rank verdict names a rank slowest in most steps; a burst of five steps of fifty is not, but the others waited
for it all that time. Judged from the step timer's records over the run's judged steps, by the rule its end-of-run
table uses (the same sentence in both); beside a slow rank the verdict over the run names, its stalls (and any other
rank's) beyond its usual excess.
"""

from __future__ import annotations

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.across import Across, RankVerdicts
from hf_distprof.analysis.results.facts import BurstFacts
from hf_distprof.analysis.results.findings import STEP_TIMER, Judgement
from hf_distprof.core.burst import find_burst, quiet_gate


def burst_findings(across: Across, verdicts: RankVerdicts, options: AnalysisOptions) -> list[Judgement]:
    """The burst finding, if the step timer's records hold one (beside the slow rank its verdict over the run names:
    stalls only)."""
    timer, run = across.timer, verdicts.run
    if len(timer.own_work) < 2 or not timer.judged:
        return []
    steps = [s for s in timer.judged if s in timer.step_times]
    work = {r: [by_step[s] for s in steps] for r, by_step in timer.own_work.items() if all(s in by_step for s in steps)}
    if len(work) != len(timer.own_work):
        return []
    parted = all(s in timer.parts.get(r, {}) for r in work for s in steps)
    phases = {name: {r: [timer.parts[r][s][k] for s in steps] for r in work}
              for name, k in (("data", 2), ("compute", 3))} if parted else None
    found = find_burst(work, steps, [timer.step_times[s] for s in steps], options.imbalance_pct, phases,
                       run.rank if run is not None and run.raised else None, quiet_gate(run))
    if found is None:
        return []
    return [Judgement(kind="burst", severity=found.pct, ranks=[found.rank], facts=BurstFacts(found), basis=STEP_TIMER,
                      steps=len(steps), numbers={"excess_s": found.excess_s, "pct_of_run": found.pct,
                                                 "burst_steps": len(found.steps)},
                      phase=found.phase)]
