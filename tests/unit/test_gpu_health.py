"""A rank's GPU as NVML sees it (hf_distprof.timing.gpu_health), with a fake ``pynvml``: a throttled GPU and a
healthy one, the index CUDA_VISIBLE_DEVICES maps to, no NVML at all; and what that evidence makes of a slow rank's cause
(hf_distprof.core.cause.with_device). A real GPU is read by the test marked ``gpu`` and by benchmarks/gpu_check.py."""

from __future__ import annotations

import sys
import types

import pytest

from hf_distprof.core.cause import Attribution, Cause, cause_why, device_evidence, evidence_sentence, with_device
from hf_distprof.timing import gpu_health


class FakeNvml(types.ModuleType):
    """pynvml's calls the sampler makes, for GPUs given as (SM clock, max clock, reason bits, temperature, mW)."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[tuple[int, int, int, int, int]], old_api: bool = False) -> None:
        super().__init__("pynvml")
        self.gpus, self.inits = gpus, 0
        if not old_api:
            self.nvmlDeviceGetCurrentClocksEventReasons = lambda h: self.gpus[h][2]

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.gpus):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return index

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return self.gpus[h][0]

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        return self.gpus[h][1]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self.gpus[h][2]

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return self.gpus[h][3]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self.gpus[h][4]

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000


HEALTHY = (1980, 1980, 0x1, 55, 650_000)  # only the idle bit: not a slowdown
THROTTLED = (1410, 1980, 0x40 | 0x4, 91, 700_000)  # hardware thermal slowdown and the power cap


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def install(gpus: list[tuple[int, int, int, int, int]], old_api: bool = False) -> FakeNvml:
        fake = FakeNvml(gpus, old_api)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        monkeypatch.setattr(gpu_health, "_NVML", None)
        monkeypatch.setattr(gpu_health, "_FAILED", False)
        return fake

    return install


def test_a_throttled_gpu_and_a_healthy_one(nvml) -> None:  # type: ignore[no-untyped-def]
    fake = nvml([HEALTHY, THROTTLED])
    healthy, hot = gpu_health.sample(0), gpu_health.sample(1)
    assert healthy is not None and (healthy.sm_clock_mhz, healthy.throttle, healthy.power_w) == (1980, [], 650.0)
    assert hot is not None and hot.throttle == ["software power cap", "hardware thermal slowdown"]
    assert (hot.sm_clock_mhz, hot.max_sm_clock_mhz, hot.temperature_c, hot.power_limit_w) == (1410, 1980, 91, 700.0)
    assert fake.inits == 1  # initialised once
    assert gpu_health.sample(5) is None  # a device NVML does not have: no sample, no error
    # Drivers before the "clocks event" name: the throttle-reasons call.
    nvml([THROTTLED], old_api=True)
    assert gpu_health.sample(0).throttle == ["software power cap", "hardware thermal slowdown"]  # type: ignore[union-attr]


def test_without_nvml_there_is_no_sample_and_it_is_tried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    monkeypatch.setattr(gpu_health, "_NVML", None)
    monkeypatch.setattr(gpu_health, "_FAILED", False)
    assert gpu_health.sample(0) is None and gpu_health._FAILED
    import torch

    assert gpu_health.of_device(torch.device("cpu")) is None  # off a GPU: not even asked


def test_the_nvml_index_follows_cuda_visible_devices() -> None:
    assert gpu_health.nvml_index(1, None) == 1 and gpu_health.nvml_index(1, "") == 1
    assert gpu_health.nvml_index(1, "2,3") == 3 and gpu_health.nvml_index(0, " 6 , 7") == 6
    assert gpu_health.nvml_index(4, "2,3") is None  # not a visible device: no sample rather than GPU 4's


def test_uuids_in_cuda_visible_devices_are_matched_by_torch_or_give_no_sample(monkeypatch) -> None:
    import torch

    asked = []

    def matched(index):
        asked.append(index)
        return {0: 5, 1: 2}[index]

    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", matched, raising=False)
    visible = "GPU-1a2b3c4d-0000-0000-0000-000000000005,GPU-9f8e7d6c-0000-0000-0000-000000000002"
    assert gpu_health.nvml_index(0, visible) == 5 and gpu_health.nvml_index(1, visible) == 2 and asked == [0, 1]

    def unmatched(index):
        raise RuntimeError("Can't get device UUIDs")

    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", unmatched, raising=False)
    assert gpu_health.nvml_index(0, "MIG-0a1b2c3d-0000-0000-0000-000000000000") is None
    assert gpu_health.nvml_index(0, visible) is None  # never the CUDA ordinal: that is another GPU's NVML index


def _slow(cause: Cause) -> Attribution:
    return Attribution(rank=1, cause=cause, steps=24, excess_s=0.030, cpu_wait_s=0.0, data_s=0.0, compute_s=0.030,
                       work_ratio=1.0, speed_ratio=1.05, slowest_in=24, longest_run=24)


def test_a_slow_rank_on_a_throttled_gpu_is_its_machine(nvml) -> None:  # type: ignore[no-untyped-def]
    nvml([HEALTHY, THROTTLED, HEALTHY, HEALTHY])
    health = {r: gpu_health.sample(r).to_json() for r in range(4)}  # type: ignore[union-attr]
    extra = device_evidence(health, 1)
    assert extra == {"throttle": ["software power cap", "hardware thermal slowdown"], "sm_clock_mhz": 1410,
                     "peers_sm_clock_mhz": 1980, "temperature_c": 91}
    assert evidence_sentence(extra) == ("its GPU runs at 1410 MHz against its peers' 1980 MHz, slowed by software "
                                        "power cap and hardware thermal slowdown (at 91 C)")
    # Compute slower with nothing else to say why: the GPU does.
    got = with_device(_slow(Cause.COMPUTE), health)
    assert got.cause == Cause.SLOWER_MACHINE and got.machine and got.extra == extra
    assert cause_why(got).startswith("not your code: it does the same work (1.00x the tokens of its peers) 1.05x "
                                     "slower per token; its GPU runs at 1410 MHz against its peers' 1980 MHz")
    # A cause already named (more work) stands, the evidence beside it; healthy GPUs change nothing.
    assert with_device(_slow(Cause.MORE_WORK), health).cause == Cause.MORE_WORK
    assert device_evidence(health, 0) == {} and with_device(_slow(Cause.COMPUTE), health | {1: health[0]}).cause == \
        Cause.COMPUTE
    assert device_evidence({}, 1) == {} and evidence_sentence({}) == ""
