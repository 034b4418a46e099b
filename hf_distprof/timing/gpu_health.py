"""What a rank's GPU shows about itself (NVML, through ``nvidia-ml-py``): clocks, throttle reasons, temperature,
power. Sampled on logging steps only (each NVML call costs microseconds to a millisecond), never on a step's path: the
evidence that a rank slower on the same work is slowed by its device (a thermal or power cap, a lower clock).

Without the ``pynvml`` module (``pip install nvidia-ml-py``) or without an NVIDIA driver, :func:`sample` returns None
and nothing else changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

THROTTLE_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
"""NVML's clock-event (throttle) reason bits that slow a working GPU, by name (idle, application-clock and sync-boost
bits are not slowdowns)."""


@dataclass
class GpuHealth:
    """One GPU's state at one moment."""

    sm_clock_mhz: int
    max_sm_clock_mhz: int
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle: list[str] = field(default_factory=list)
    """The slowdowns active (:data:`THROTTLE_REASONS`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_NVML: Any = None
_FAILED = False


def _nvml() -> Any:
    """The initialised ``pynvml`` module; None when it is missing or has no driver to talk to (tried once)."""
    global _NVML, _FAILED
    if _NVML is not None or _FAILED:
        return _NVML
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001  # not installed, no driver, no NVIDIA GPU: no evidence, nothing breaks
        _FAILED = True
        return None
    _NVML = pynvml
    return _NVML


def sample(index: int) -> GpuHealth | None:
    """The state of CUDA device ``index`` (the NVML index of the same device), or None when NVML cannot say.

    Args:
        index: The device's index (``torch.cuda.current_device()``; with ``CUDA_VISIBLE_DEVICES`` set, the caller maps
            it to the physical index).
    """
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        clock = int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        top = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        bits = int(reasons(handle))
    except Exception:  # noqa: BLE001  # a call this driver lacks, a lost device: no sample
        return None
    out = GpuHealth(sm_clock_mhz=clock, max_sm_clock_mhz=top,
                    throttle=[name for bit, name in THROTTLE_REASONS.items() if bits & bit])
    for attr, call in (("temperature_c", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                       ("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
                       ("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)):
        try:
            setattr(out, attr, call())
        except Exception:  # noqa: BLE001  # optional figures
            pass
    return out


def nvml_index(cuda_index: int, visible: str | None) -> int | None:
    """The NVML index of CUDA device ``cuda_index`` when ``CUDA_VISIBLE_DEVICES`` is ``visible`` (NVML counts every
    GPU of the host; CUDA only the visible ones, in that order); None when it cannot be told.

    A list of indices is read here. UUIDs (``GPU-...``, as Kubernetes' device plugin and some SLURM sites set) are
    matched against NVML's by torch (``torch.cuda._get_nvml_device_index``, what ``torch.cuda.utilization`` uses);
    MIG ids, or anything else it cannot match, give None: no sample, never another GPU's (another job's) state
    blamed on this rank."""
    if not visible:
        return cuda_index
    listed = [v.strip() for v in visible.split(",") if v.strip()]
    if listed and all(v.isdigit() for v in listed):
        return int(listed[cuda_index]) if 0 <= cuda_index < len(listed) else None
    try:
        import torch

        return int(torch.cuda._get_nvml_device_index(cuda_index))
    except Exception:  # noqa: BLE001 - a private helper that moved, NVML without UUIDs, an id it cannot match
        return None


def of_device(device: Any) -> dict[str, Any] | None:
    """The GPU a rank trains on (a ``torch.device``), as NVML sees it now, as JSON: a logging step's cost, never a
    step's; None off a GPU or without NVML."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import os

    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    physical = nvml_index(index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    health = sample(physical) if physical is not None else None
    return health.to_json() if health is not None else None
