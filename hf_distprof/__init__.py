"""hf_distprof: profiling callbacks and trace analysis for distributed Hugging Face Trainer runs.

The Trainer-facing names are resolved lazily (PEP 562) so that ``hf-distprof analyze`` and the
``hf_distprof.analysis`` package never pay for importing transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hf_distprof._version import __version__

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "ProfilingArguments": "hf_distprof.config",
    "add_profiling_args": "hf_distprof.config",
    "build_callbacks": "hf_distprof.callbacks",
    "ProfilerCallback": "hf_distprof.callbacks.profiler.callback",
    "MemoryLoggerCallback": "hf_distprof.callbacks.memory.logger",
    "SimpleGPUMemoryCallback": "hf_distprof.callbacks.memory.logger",
    "MemoryViewsCallback": "hf_distprof.callbacks.memory.views",
    "HangWatchdogCallback": "hf_distprof.callbacks.hang",
    "NsightCallback": "hf_distprof.callbacks.nsys",
    "StepTimerCallback": "hf_distprof.callbacks.step_timer",
    "TraceAnalysisCallback": "hf_distprof.callbacks.analyze",
    "RunSummaryCallback": "hf_distprof.callbacks.summary",
    "DebugArguments": "hf_distprof.recipe.debug_env",
    "apply_debug_env": "hf_distprof.recipe.debug_env",
    "StrategyArguments": "hf_distprof.recipe.strategy",
}

__all__ = [
    "DebugArguments",
    "HangWatchdogCallback",
    "MemoryLoggerCallback",
    "MemoryViewsCallback",
    "NsightCallback",
    "ProfilerCallback",
    "ProfilingArguments",
    "RunSummaryCallback",
    "SimpleGPUMemoryCallback",
    "StepTimerCallback",
    "StrategyArguments",
    "TraceAnalysisCallback",
    "__version__",
    "add_profiling_args",
    "apply_debug_env",
    "build_callbacks",
]

if TYPE_CHECKING:
    from hf_distprof.callbacks.memory.logger import MemoryLoggerCallback, SimpleGPUMemoryCallback
    from hf_distprof.callbacks.hang import HangWatchdogCallback
    from hf_distprof.callbacks.memory.views import MemoryViewsCallback
    from hf_distprof.callbacks.nsys import NsightCallback
    from hf_distprof.callbacks.profiler.callback import ProfilerCallback
    from hf_distprof.callbacks.step_timer import StepTimerCallback
    from hf_distprof.callbacks.analyze import TraceAnalysisCallback
    from hf_distprof.callbacks.summary import RunSummaryCallback
    from hf_distprof.callbacks import build_callbacks
    from hf_distprof.config import ProfilingArguments, add_profiling_args
    from hf_distprof.recipe.debug_env import DebugArguments, apply_debug_env
    from hf_distprof.recipe.strategy import StrategyArguments


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_distprof' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
