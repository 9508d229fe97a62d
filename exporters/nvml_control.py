"""GPU power capping over NVML: the one write the remediation playbooks make to a GPU.

Clamped to the GPU's own constraints (NVML refuses out-of-range limits with
INVALID_ARGUMENT), then read back, because what the driver applied is what
the journal must record. `lib` is pynvml or the simulator's twin; the caller
runs this where a blocking call is acceptable (e.g. through BlockingCaller)
and has called nvmlInit. NVML errors propagate as pynvml.NVMLError subclasses
(NoPermission when not root, GpuIsLost, NotSupported).
"""

from __future__ import annotations

from typing import Any


def get_power_limit(lib: Any, index: int) -> float:
    """The GPU's current power limit in watts."""
    return lib.nvmlDeviceGetPowerManagementLimit(lib.nvmlDeviceGetHandleByIndex(index)) / 1000.0


def power_limit_range(lib: Any, index: int) -> tuple[float, float]:
    """(min, max) power limit the driver accepts for this GPU, in watts."""
    lo, hi = lib.nvmlDeviceGetPowerManagementLimitConstraints(lib.nvmlDeviceGetHandleByIndex(index))
    return lo / 1000.0, hi / 1000.0


def set_power_limit(lib: Any, index: int, watts: float) -> float:
    """Set the power limit (clamped to the GPU's constraints); returns the watts the driver reports after."""
    if not watts == watts:  # NaN would clamp to an arbitrary bound
        raise ValueError("watts: expected a number, got NaN")
    h = lib.nvmlDeviceGetHandleByIndex(index)
    lo, hi = lib.nvmlDeviceGetPowerManagementLimitConstraints(h)
    limit_mw = int(round(min(max(watts * 1000.0, lo), hi)))
    lib.nvmlDeviceSetPowerManagementLimit(h, limit_mw)
    return lib.nvmlDeviceGetPowerManagementLimit(h) / 1000.0
