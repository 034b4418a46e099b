"""``hf-distprof doctor``: the distributed-debugging checklist as bounded checks, run on every rank.

Launch it like training (``torchrun --nproc_per_node N $(which hf-distprof) doctor``, or ``accelerate launch
--multi_gpu``), or alone as a world of one. Every rank runs the checks of :data:`CHECKS` in order; rank 0 prints
each as ✓ (passed), ✗ (failed) or - (skipped) with the numbers behind it, then one summary line, and exits 1
when a check failed. :mod:`hf_distprof.cli.doctor` parses the command line and calls :func:`run`.

- :mod:`~hf_distprof.doctor.runner`: the bounded run (deadlines, the watchdog, skipping after a broken group);
- :mod:`~hf_distprof.doctor.board`: the results board in the launcher's key-value store;
- :mod:`~hf_distprof.doctor.checks`: what each rank does for each check;
- :mod:`~hf_distprof.doctor.judge`: rank 0's verdict on each check.

Test-only fault injection: ``HF_DISTPROF_DOCTOR_INJECT=<check>:<rank>[:hang]`` makes ``<rank>`` see a wrong
result of ``<check>`` (the default mode: data received off by one, or a clock one hour ahead for
``clock_skew``), or never join it (``hang``).
"""

from __future__ import annotations

from hf_distprof.doctor.checks import CHECKS, INJECT_ENV
from hf_distprof.doctor.runner import run

__all__ = ["CHECKS", "INJECT_ENV", "run"]
