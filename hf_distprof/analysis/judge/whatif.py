"""The what-if model's finding (pure): "what to fix first", when one fix would save more than the threshold and the
noise."""

from __future__ import annotations

from hf_distprof.analysis.results.findings import REPLAY, Finding
from hf_distprof.analysis.results.whatif import WhatIf, WhatIfModel, WhatIfScenario

WHAT_TO_FIX_FIRST = "what_to_fix_first"
"""The kind of the what-if finding."""

_ADVICE = {  # scenario -> (the first thing to try, the rest)
    "slow_rank": ("Find what rank {ranks} does that its peers do not (the critical path and the straggler and "
                  "imbalance findings say where): uneven data, extra work on that rank, a slower device or host", "."),
    "no_data_loading": ("Load data ahead of the step: DataLoader num_workers > 0, {pin}"
                        "persistent_workers=True, prefetch_factor", "; pre-tokenise instead of tokenising per item."),
    "hide_communication": ("Overlap communication with computation ({overlap}) or send fewer bytes (bf16 reduction, "
                           "fewer and larger collectives)", "."),
    "fastest_pace": ("Give every rank the same work, at the pace of the fastest: balance the data (sequence "
                     "lengths, batch sizes), then look at the hosts and devices of the slower ranks", "."),
    "network_at_reference": ("The transfers run slower than bench-collectives measured on this fabric: check the "
                             "{library} settings and the network path of the collectives that take longest", "."),
}
_PHASES = {"slow_rank": None, "no_data_loading": "data", "hide_communication": "communication",
           "fastest_pace": None, "network_at_reference": "communication"}


def noise_of(model: WhatIfModel, noise_ms: float | None) -> str:
    """What a saving was held against, in words: the run's noise over its judged steps, or the traced steps'."""
    if model.run_noise_ms is not None:
        return f"step-to-step noise {model.run_noise_ms:.2f} ms over the run's {model.run_steps} judged steps"
    return (f"step-to-step noise {noise_ms or 0.0:.2f} ms, the smaller of the measured steps' "
            f"{model.noise_ms or 0.0:.2f} ms and the predicted ones'")


def over_the_run(scenario: WhatIfScenario, model: WhatIfModel) -> str:
    """"; over the run's N judged steps that pace saves X% ..." when the run's figure is the smaller one, else ""."""
    if scenario.run_saving_pct is None or scenario.run_saving_pct >= scenario.saving_pct:
        return ""
    return (f"; over the run's {model.run_steps} judged steps that pace saves {scenario.run_saving_pct:.1f}% of the "
            "step (the step timer's records), the figure that counts")


def what_to_fix_first(answer: WhatIf, threshold_pct: float, on_gpu: bool = True, backend: str | None = None,
                      fsdp: bool = False) -> Finding | None:
    """The finding that opens the list when a scenario saves more than the noise and more than ``threshold_pct``
    % of the step (``AnalysisOptions.what_if_pct``); None otherwise. Its advice fits the run: no pinned memory without
    a GPU, the backend's own settings (NCCL's, gloo's)."""
    worth = sorted((s for s in answer.scenarios if s.beyond_noise and s.counted_pct > threshold_pct),
                   key=lambda s: -s.counted_pct)
    if not worth:
        return None
    top, model = worth[0], answer.model
    ranked = "; ".join(f"{s.title}: {s.step_ms_predicted:.2f} ms (-{s.saving_pct:.1f}%)"
                       if s.counted_pct == s.saving_pct else f"{s.title}: -{s.counted_pct:.1f}% over the run"
                       for s in worth)
    why = (f"replaying the {len(model.steps)} traced step(s) across ranks with {top.title} predicts "
           f"{top.step_ms_predicted:.2f} ms per step instead of the measured {top.step_ms_now:.2f} ms: "
           f"{top.saving_pct:.1f}% faster, {top.hours_per_1000_steps:.3f} h saved per 1,000 steps (model error "
           f"+-{top.error_ms:.2f} ms; {noise_of(model, top.noise_ms)}){over_the_run(top, model)}")
    action, more = _ADVICE[top.scenario]
    action = action.format(ranks=", ".join(map(str, top.ranks)), pin="pin_memory=True, " if on_gpu else "",
                           library="NCCL" if backend in (None, "nccl") else backend,
                           overlap="FSDP prefetching, wrap granularity" if fsdp else "DDP bucket_cap_mb, gradient "
                           "accumulation")
    return Finding(
        kind=WHAT_TO_FIX_FIRST,
        severity=top.counted_pct,
        title=f"What to fix first: {top.title}",
        ranks=list(top.ranks),
        evidence=f"{why}. Above the {threshold_pct:g}% threshold and the noise, in order: {ranked}",
        recommendation=action + more,
        phase=_PHASES.get(top.scenario),
        why=why,
        action=action,
        basis=REPLAY,
        steps=len(model.steps),
        numbers={"step_ms_now": top.step_ms_now, "step_ms_predicted": top.step_ms_predicted,
                 "saving_pct": top.saving_pct, "error_ms": top.error_ms,
                 **({"run_saving_pct": top.run_saving_pct} if top.run_saving_pct is not None else {})},
        # As for a per-step share: how many of the steps, each replayed on its own, save more than the threshold.
        confidence=sum(p > threshold_pct for p in top.saving_pct_per_step) / len(top.saving_pct_per_step),
    )
