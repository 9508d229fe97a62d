"""GPU power capping over NVML: the one write the remediation playbooks make to a GPU.

Clamped to the GPU's own constraints (NVML refuses out-of-range limits with
INVALID_ARGUMENT), then read back, because what the driver applied is what
the journal must record. `lib` is pynvml or the simulator's twin; the caller
runs this where a blocking call is acceptable (e.g. through BlockingCaller)
and has called nvmlInit. NVML errors propagate as pynvml.NVMLError subclasses
(NoPermission when not root, GpuIsLost, NotSupported). `InitOnFirstUse`
makes the init itself one of those off-loop calls.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("exporters.gpu.nvml")


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


class InitOnFirstUse:
    """pynvml (or the twin) whose nvmlInit runs on a thread of its own, started at once and waited for,
    at most `timeout`, by the first call that needs it.

    Why: remediation is built at start and on every reload, on the event
    loop; an nvmlInit there with a wedged driver would stop /metrics and the
    systemd watchdog. Callers already make NVML calls on worker threads with
    timeouts of their own; they now wait for the init there too, and a driver
    that does not answer gives NVMLError(TIMEOUT) (or the init's own error,
    retried on the next call) instead of a hang.
    """

    def __init__(self, lib: Any, timeout: float):
        self._lib = lib
        self._timeout = timeout
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._start()

    def _start(self) -> None:
        done = self._done = threading.Event()
        self._error = None

        def run() -> None:
            try:
                self._lib.nvmlInit()
            except Exception as exc:  # kept for the callers: no driver, no permission
                self._error = exc
                log.warning("nvml init failed error=%r", str(exc))
            finally:
                done.set()

        threading.Thread(target=run, name="nvml-init", daemon=True).start()

    def ready(self) -> None:
        """Wait for the init (starting it again if the last one failed); raise what it raised."""
        with self._lock:
            if self._done.is_set() and self._error is not None:
                self._start()
            done = self._done
        if not done.wait(self._timeout):
            raise self._lib.NVMLError(self._lib.NVML_ERROR_TIMEOUT)
        if self._error is not None:
            raise self._error

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._lib, name)
        if not (name.startswith("nvml") and callable(value)) or isinstance(value, type) or name.startswith("nvmlInit"):
            return value  # constants, struct types, error classes
        ready = self.ready

        def call(*args: Any, **kwargs: Any) -> Any:
            ready()
            return value(*args, **kwargs)

        call.__name__ = name
        return call
