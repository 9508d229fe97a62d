"""GPU fault mutations of the rack model, for the simulator's fault-injection API to call.

Each takes the model lock, changes only GpuState fields the NVML twin reads,
and returns a one-line description for the injection log.

Recovery behaves as the hardware does, so the agent's recovery ladder has a
real-behaving peer: an XID is raised by its entry in NVIDIA's catalogue
(exporters/profiles/nvml/xid-catalogue.yaml) for the GPU's architecture; a
`sticky` XID of a class the hardware holds (immediate action RESET_GPU, or
XID 48's workflow, whose data-center action is RESET_GPU; RESTART_BM) stays
until the recovery that clears it, and meanwhile NVML's recovery-action field
says so (and XID 154 reports the change, as R550+ drivers do); XID 79 (off
the bus) leaves the GPU lost. `gpu_reset` is what `nvidia-smi --gpu-reset -i N`
does (NVML has no public reset call): refused while a process runs on the
GPU (NVML_ERROR_IN_USE) or when the GPU is off the bus (GPU_IS_LOST);
otherwise it clears reset-class faults, applies pending row remaps and ends
a hang, and leaves reboot-class ones. `reboot_node` clears what a power cycle
of the node clears and gives the node a new boot id. What a reset or reboot
cannot fix stays: a row-remap failure (no spare rows: service), a PCIe link
trained down, a blocked cold plate, NVLink errors of a marginal link.
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import Iterable

import pynvml

from exporters.gpu.xid_catalogue import XidEntry, load_catalogue
from sim.rack import GpuState, RackModel

GPU_RESET, NODE_REBOOT = "gpu_reset", "node_reboot"
# The catalogue's immediate actions whose fault the hardware holds, and what clears it. XID 48's workflow
# (WORKFLOW_XID_48) says "Data Center Recovery Action Solo: RESET_GPU".
HELD_BY = {"RESET_GPU": GPU_RESET, "WORKFLOW_XID_48": GPU_RESET, "RESTART_BM": NODE_REBOOT}
_RECOVERY = {GPU_RESET: pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET, NODE_REBOOT: pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT}
XID_OFF_THE_BUS = 79  # ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: NVML answers GPU_IS_LOST until a reboot
XID_RECOVERY_ACTION_CHANGED = 154  # GPU_RECOVERY_ACTION_CHANGED: the driver reports a new recovery action
PCIE_WIDTHS = (1, 2, 4, 8, 16)


class RecoveryRefused(Exception):
    """A reset the driver refuses; `ret` is the NVML return code it answers, the message says why."""

    def __init__(self, ret: int, why: str):
        super().__init__(why)
        self.ret = ret


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[int, XidEntry]:
    """NVIDIA's XID catalogue, loaded once per simulator process."""
    return load_catalogue()


def xid_entry(code: int, architecture: str) -> XidEntry:
    """The catalogue entry of `code` for a GPU of `architecture`; ValueError naming both when it has none."""
    entry = catalogue().get(code)
    if entry is None or architecture not in entry.architectures:
        raise ValueError(f"code: XID {code} is not in the XID catalogue for {architecture} "
                         f"(exporters/profiles/nvml/xid-catalogue.yaml)")
    return entry


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
        g = model.gpu(node, gpu)
        g.unsupported = set(g.base_unsupported) | set(names)
    return f"{node} gpu {gpu} unsupported={sorted(set(names))}"


def set_nvlink_down(model: RackModel, node: str, gpu: int, link: int, down: bool = True) -> str:
    with model.lock:
        g = model.gpu(node, gpu)
        if not 0 <= link < g.nvlink_count:
            raise ValueError(f"link: {link} out of range 0..{g.nvlink_count - 1}")
        g.nvlink_up[link] = not down
    return f"{node} gpu {gpu} link {link} {'down' if down else 'up'}"


def set_switch_down(model: RackModel, switch: int, down: bool = True) -> str:
    """NVSwitch chip `switch` fails: on a GB200 NVL72 NVLink index k of every GPU reaches chip k, so link
    `switch` goes down on every GPU of the rack at once (what each tray sees of one switch fault)."""
    with model.lock:
        gpus = [g for n in model.nodes.values() for g in n.gpus]
        if not gpus or not 0 <= switch < min(g.nvlink_count for g in gpus):
            raise ValueError(f"switch: {switch} out of range 0..{min((g.nvlink_count for g in gpus), default=0) - 1}")
        for g in gpus:
            g.nvlink_up[switch] = not down
    return f"switch chip {switch} {'down' if down else 'up'}: link {switch} of {len(gpus)} GPUs"


def set_recovery_action(model: RackModel, node: str, gpu: int, action: int) -> str:
    """The driver's recovery hint (NVML_GPU_RECOVERY_ACTION_*, field 230)."""
    with model.lock:
        model.gpu(node, gpu).recovery_action = int(action)
    return f"{node} gpu {gpu} recovery_action={action}"


def raise_catalogued_xid(model: RackModel, node: str, gpu: int, code: int, sticky: bool = False,
                         recurs: bool = False) -> str:
    """Raise XID `code` on the GPU as its catalogue entry says; `sticky`: the hardware holds its class (see above);
    `recurs`: a held reset-class fault a reset does not fix (the defect is still there: the GPU raises the XID
    again right after the reset and NVML still asks for a reset), which only a reboot clears.

    ValueError (naming the code and the architecture) when the catalogue has no such XID for this GPU.
    """
    with model.lock:
        g = model.gpu(node, gpu)
        entry = xid_entry(code, g.architecture)
        meaning = {"code": code, "mnemonic": entry.mnemonic, "description": entry.description,
                   "immediate_action": entry.immediate_action, "investigatory_action": entry.investigatory_action}
        model.raise_xid(node, gpu, code)
        g.last_xid = meaning
        held = HELD_BY.get(entry.immediate_action or "") if sticky else None
        if held is not None:
            g.xid_faults.append({"code": code, "mnemonic": entry.mnemonic,
                                 "immediate_action": entry.immediate_action, "cleared_by": held,
                                 "recurs": bool(recurs and held == GPU_RESET)})
            if code == XID_OFF_THE_BUS:
                g.lost = True
            elif _set_recovery(g):
                model.raise_xid(node, gpu, XID_RECOVERY_ACTION_CHANGED)
    return (f"{node} gpu {gpu} xid {code} {entry.mnemonic} ({entry.immediate_action or 'no action published'})"
            + (f", held until {held}" if held else ""))


def _set_recovery(g: GpuState) -> bool:
    """NVML's recovery action follows the held faults (the heaviest wins); True when it changed."""
    held = {f["cleared_by"] for f in g.xid_faults}
    want = _RECOVERY[NODE_REBOOT] if NODE_REBOOT in held else _RECOVERY[GPU_RESET] if GPU_RESET in held else None
    if want is None or g.recovery_action == _RECOVERY[NODE_REBOOT] or g.recovery_action == want:
        return False
    g.recovery_action = want
    return True


def gpu_reset(model: RackModel, node: str, gpu: int) -> str:
    """Reset one GPU as `nvidia-smi --gpu-reset -i N` does; RecoveryRefused (with the NVML code) when it cannot."""
    with model.lock:
        g = model.gpu(node, gpu)
        if g.lost or g.missing:
            raise RecoveryRefused(pynvml.NVML_ERROR_GPU_IS_LOST,
                                  f"{node} gpu {gpu}: off the bus, a GPU reset cannot reach it (a reboot may)")
        if g.busy:
            raise RecoveryRefused(pynvml.NVML_ERROR_IN_USE,
                                  f"{node} gpu {gpu}: in use by a process (workload {g.workload:g}); a reset needs "
                                  "the GPU idle")
        cleared = [f["code"] for f in g.xid_faults if f["cleared_by"] == GPU_RESET and not f.get("recurs")]
        recurring = [f["code"] for f in g.xid_faults if f.get("recurs")]
        g.xid_faults = [f for f in g.xid_faults if f["cleared_by"] != GPU_RESET or f.get("recurs")]
        if g.recovery_action != pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT:
            g.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        _set_recovery(g)  # a reboot-class fault still held keeps asking for a reboot
        applied = g.remap_pending
        if g.remap_pending:  # the pending remap takes effect at the reset
            g.remap_pending = False
        g.hang_seconds = 0.0
        for code in recurring:  # the defect a reset does not fix raises its XID again at once
            model.raise_xid(node, gpu, code)
    return (f"{node} gpu {gpu} reset: cleared xid {cleared or 'none'}"
            + (", row remap applied" if applied else "")
            + (f", still held: xid {[f['code'] for f in g.xid_faults]}" if g.xid_faults else ""))


def reboot_node(model: RackModel, node: str) -> str:
    """The node reboots: its driver and every GPU start afresh, with a new boot id and time.

    Cleared: lost, missing and hung GPUs, a hung driver, NotSupported answers, held XIDs, NVML's recovery
    action, pending row remaps (applied). Kept: what a power cycle cannot fix (see the module docstring).
    """
    with model.lock:
        n = model.nodes[node]
        n.nvml_hang_seconds = 0.0
        for g in n.gpus:
            g.lost = g.missing = False
            g.hang_seconds = 0.0
            g.unsupported = set(g.base_unsupported)  # the model's own NotSupported answers stay
            g.xid_faults = []
            g.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
            g.remap_pending = False
            g.nvlink_up = [True] * g.nvlink_count
        n.boot_id = str(uuid.uuid4())
        n.boot_time = time.time()
        n.boots += 1
        return f"{node} rebooted (boot {n.boots}, boot id {n.boot_id})"


def set_row_remap(model: RackModel, node: str, gpu: int, state: str) -> str:
    """A row remap as NVML reports it (nvmlDeviceGetRemappedRows): `pending` one more uncorrectable-error row
    remapped, applied at the next reset; `failed` a remap that found no spare row (failureOccurred)."""
    if state not in ("pending", "failed"):
        raise ValueError(f"state: expected pending or failed, got {state!r}")
    with model.lock:
        g = model.gpu(node, gpu)
        if state == "pending":
            g.remapped_uncorrectable += 1
            g.remap_pending = True
        else:
            g.remap_failure = True
    return f"{node} gpu {gpu} row remap {state}"


def set_pcie_link(model: RackModel, node: str, gpu: int, width: int | None, gen: int | None) -> str:
    """The GPU's PCIe link trains to this width and/or generation, at most its maximum (a downtrained link)."""
    with model.lock:
        g = model.gpu(node, gpu)
        width = g.pcie_max_width if width is None else width
        gen = g.pcie_max_gen if gen is None else gen
        if width not in PCIE_WIDTHS or width > g.pcie_max_width:
            raise ValueError(f"width: expected one of {[w for w in PCIE_WIDTHS if w <= g.pcie_max_width]}, got {width}")
        if not 1 <= gen <= g.pcie_max_gen:
            raise ValueError(f"gen: expected 1..{g.pcie_max_gen}, got {gen}")
        g.pcie_width, g.pcie_gen = width, gen
    return f"{node} gpu {gpu} pcie x{width} gen{gen} (max x{g.pcie_max_width} gen{g.pcie_max_gen})"


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
            g.unsupported = set(g.base_unsupported)  # the model's own NotSupported answers stay
            g.thermal_extra_c = 0.0
            g.nvlink_error_rate = {}
            g.nvlink_up = [True] * g.nvlink_count
            g.recovery_action = 0
            g.xid_faults = []
            g.remap_pending = g.remap_failure = False
            g.pcie_width, g.pcie_gen = g.pcie_max_width, g.pcie_max_gen
            g.slowdown_reasons, g.slow_clock_ratio = set(), 1.0
            if g.fabric_state is not None:  # back on the fabric, healthy
                g.fabric_state, g.fabric_status, g.fabric_health = FABRIC_STATES["completed"], 0, set()
    return f"cleared gpu faults on {len(gpus)} gpus"


SLOWDOWN_REASONS = ("hw_slowdown", "hw_power_brake", "none")


def set_clock_slowdown(model: RackModel, node: str, gpu: int, reason: str, ratio: float) -> str:
    """The GPU holds its SM clock at `ratio` of what it would run at, reporting `reason` as NVML's clock-event
    reason (HW Slowdown halves the clocks or more, NVML's documentation says), or no reason at all (`none`: a slow
    GPU nothing explains). A GPU reset or a reboot leaves it (the board or its power supply keeps asserting
    it); `sim clear` ends it."""
    if reason not in SLOWDOWN_REASONS:
        raise ValueError(f"reason: expected one of {list(SLOWDOWN_REASONS)}, got {reason!r}")
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio: expected a share of the clock in (0, 1], got {ratio}")
    with model.lock:
        g = model.gpu(node, gpu)
        g.slowdown_reasons = set() if reason == "none" else {reason}
        g.slow_clock_ratio = ratio
    return f"{node} gpu {gpu} sm clock x{ratio} reason {reason}"


# NVML_GPU_FABRIC_STATE_* by the name the fault takes (pynvml's values)
FABRIC_STATES = {"not_started": 1, "in_progress": 2, "completed": 3}


def set_fabric_state(model: RackModel, node: str, gpu: int, state: str, status: int, health: list[str]) -> str:
    """The GPU's NVLink fabric registration reads `state` with `status` (an nvmlReturn_t) and these healthMask
    conditions holding, until `sim clear` (or this fault again with state completed). Refused on a GPU without
    a fabric (the H100 personality answers NotSupported)."""
    from sim.nvml_twin import FABRIC_HEALTH_CONDITIONS

    if state not in FABRIC_STATES:
        raise ValueError(f"state: expected one of {list(FABRIC_STATES)}, got {state!r}")
    unknown = sorted(set(health) - set(FABRIC_HEALTH_CONDITIONS))
    if unknown:
        raise ValueError(f"health: unknown condition(s) {unknown}; expected some of {list(FABRIC_HEALTH_CONDITIONS)}")
    if status < 0:
        raise ValueError(f"status: expected an nvmlReturn_t (0 success), got {status}")
    with model.lock:
        g = model.gpu(node, gpu)
        if g.fabric_state is None:
            raise ValueError(f"{node} gpu {gpu} has no NVLink fabric (its personality answers NotSupported)")
        g.fabric_state, g.fabric_status, g.fabric_health = FABRIC_STATES[state], status, set(health)
    return f"{node} gpu {gpu} fabric state {state} status {status} health {sorted(health) or 'ok'}"
