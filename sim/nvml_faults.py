"""GPU fault mutations of the rack model, for the simulator's fault-injection API to call.

Each takes the model lock, changes only GpuState fields the NVML twin reads,
and returns a one-line description for the injection log.
"""

from __future__ import annotations

from typing import Iterable

from sim.rack import GpuState, RackModel


def _gpus(model: RackModel, node: str | None, gpu: int | None) -> list[GpuState]:
    nodes = [model.nodes[node]] if node else list(model.nodes.values())
    return [g for n in nodes for g in n.gpus if gpu is None or g.index == gpu]


def set_lost(model: RackModel, node: str, gpu: int, on: bool = True) -> str:
    """Every NVML call on the GPU answers GPU_IS_LOST (it stays enumerated)."""
    with model.lock:
        model.gpu(node, gpu).lost = on
    return f"{node} gpu {gpu} lost={on}"


def set_missing(model: RackModel, node: str, gpu: int, on: bool = True) -> str:
    """The GPU is not enumerated at all (nvmlDeviceGetCount drops it; the rest renumber, as in NVML)."""
    with model.lock:
        model.gpu(node, gpu).missing = on
    return f"{node} gpu {gpu} missing={on}"


def set_hang(model: RackModel, node: str, gpu: int, seconds: float) -> str:
    """Every NVML call on this GPU's handle blocks the calling thread up to this long, or until cleared (0 ends it)."""
    with model.lock:
        model.gpu(node, gpu).hang_seconds = max(0.0, float(seconds))
    return f"{node} gpu {gpu} hangs {seconds}s per call"


def set_driver_hang(model: RackModel, node: str, seconds: float) -> str:
    """Every NVML call on the node (init, enumeration, every handle, event waits) blocks up to this long, or until cleared."""
    with model.lock:
        model.nodes[node].nvml_hang_seconds = max(0.0, float(seconds))
    return f"{node} nvml driver hangs {seconds}s per call"


def set_unsupported(model: RackModel, node: str, gpu: int, names: Iterable[str]) -> str:
    """These pynvml function names or NVML_FI_* field names answer NotSupported."""
    with model.lock:
        model.gpu(node, gpu).unsupported = set(names)
    return f"{node} gpu {gpu} unsupported={sorted(set(names))}"


def set_nvlink_down(model: RackModel, node: str, gpu: int, link: int, down: bool = True) -> str:
    with model.lock:
        g = model.gpu(node, gpu)
        if not 0 <= link < g.nvlink_count:
            raise ValueError(f"link: {link} out of range 0..{g.nvlink_count - 1}")
        g.nvlink_up[link] = not down
    return f"{node} gpu {gpu} link {link} {'down' if down else 'up'}"


def set_recovery_action(model: RackModel, node: str, gpu: int, action: int) -> str:
    """The driver's recovery hint (NVML_GPU_RECOVERY_ACTION_*, field 230)."""
    with model.lock:
        model.gpu(node, gpu).recovery_action = int(action)
    return f"{node} gpu {gpu} recovery_action={action}"


def clear_gpu_faults(model: RackModel, node: str | None = None, gpu: int | None = None) -> str:
    """Undo every GPU fault (counters already counted stay, as on real hardware)."""
    with model.lock:
        gpus = _gpus(model, node, gpu)
        if gpu is None:
            for n in [model.nodes[node]] if node else model.nodes.values():
                n.nvml_hang_seconds = 0.0
        for g in gpus:
            g.lost = g.missing = False
            g.hang_seconds = 0.0
            g.unsupported = set()
            g.thermal_extra_c = 0.0
            g.nvlink_error_rate = {}
            g.nvlink_up = [True] * g.nvlink_count
            g.recovery_action = 0
    return f"cleared gpu faults on {len(gpus)} gpus"
