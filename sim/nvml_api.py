"""The simulator's NVML routes: what the NVML twin (sim/nvml_twin.py) talks to.

One GET returns a node's whole GPU state, so the twin makes one request per
collection cycle however many GPUs and links there are; power limits are
POSTed and applied to the model at once; XID events are long-polled. NVML
error semantics that depend on the model (lost GPU, out-of-range limit,
NotSupported set) are decided here and returned as NVML return codes, which
the twin raises as the real `pynvml.NVMLError` subclasses.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pynvml
from aiohttp import web

from sim.nvml_faults import RecoveryRefused
from sim.nvml_faults import gpu_reset as reset_gpu
from sim.nvml_twin import PREFIX
from sim.rack import GpuState, RackModel

VBIOS = "96.00.99.00.01"
DRIVER_VERSION = "570.124.06"
CUDA_VERSION = 12080
EVENT_POLL_S = 0.05
MAX_WAIT_MS = 30_000
JOB_PID_BASE = 40_000  # the pid of the simulated job's process on GPU i is JOB_PID_BASE + i


def _reasons(g: GpuState, demand_w: float) -> int:
    mask = 0
    if not g.busy:
        mask |= pynvml.nvmlClocksEventReasonGpuIdle
    if demand_w > g.power_limit_mw / 1000 * 0.98:
        mask |= pynvml.nvmlClocksEventReasonSwPowerCap
    if g.temp_c >= g.gpu_max_c:
        mask |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
    if g.hw_thermal_slowdown:
        mask |= pynvml.nvmlClocksEventReasonHwThermalSlowdown
    if "hw_slowdown" in g.slowdown_reasons:
        mask |= pynvml.nvmlClocksEventReasonHwSlowdown
    if "hw_power_brake" in g.slowdown_reasons:  # the umbrella HW Slowdown bit is set with it, as nvidia-smi shows
        mask |= pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown
    return mask


def gpu_state(g: GpuState) -> dict[str, Any]:
    """Everything NVML would answer about one GPU, in NVML's own units (mW, mJ, MHz, bytes, C)."""
    demand_w = g.idle_w + g.workload * (g.default_limit_mw / 1000 - g.idle_w)
    util = min(1.0, g.power_w / (g.default_limit_mw / 1000)) if g.default_limit_mw else 0.0
    mem_used = int(g.memory_total * (0.05 + 0.85 * min(1.0, g.workload)))
    clock_scale = min(1.0, (g.power_limit_mw / 1000) / demand_w) if demand_w > 0 else 1.0
    thresholds = [0] * 4
    thresholds[pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN] = g.shutdown_c
    thresholds[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] = g.slowdown_c
    thresholds[pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX] = g.mem_max_c
    thresholds[pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX] = g.gpu_max_c
    state = {
        "index": g.index, "uuid": g.uuid, "name": g.name, "serial": g.serial, "pci_bus_id": g.pci_bus_id,
        "vbios": VBIOS, "lost": g.lost, "missing": g.missing, "hang_s": g.hang_seconds,
        "unsupported": sorted(g.unsupported),
        "temp_c": int(round(g.temp_c)), "mem_temp_c": int(round(g.mem_temp_c)), "thresholds_c": thresholds,
        "power_mw": int(g.power_w * 1000), "energy_mj": int(g.energy_mj),
        "limit_mw": g.power_limit_mw, "default_limit_mw": g.default_limit_mw,
        "min_limit_mw": g.min_limit_mw, "max_limit_mw": g.max_limit_mw,
        "util_gpu": int(round(100 * util)), "util_mem": int(round(60 * util)),
        "mem_total": g.memory_total, "mem_used": mem_used,
        "sm_mhz": int(g.sm_clock_mhz * clock_scale * g.slow_clock_ratio), "mem_mhz": g.mem_clock_mhz,
        "reasons": _reasons(g, demand_w),
        "ecc": [g.ecc_corrected, g.ecc_uncorrected],
        "remap": [g.remapped_correctable, g.remapped_uncorrectable, int(g.remap_pending), int(g.remap_failure)],
        # [current gen, current width, max gen, max width]: an idle GPU's link drops to Gen1 to save power (as
        # nvidia-smi shows it), so a downtraining check compares the generation under load, the width always
        "pcie": [g.pcie_gen if g.busy else 1, g.pcie_width, g.pcie_max_gen, g.pcie_max_width],
        # the job's compute process while one runs (pid, usedGpuMemory): a reset is refused while there is one
        "processes": [[JOB_PID_BASE + g.index, mem_used]] if g.busy else [],
        "xid_faults": [dict(f) for f in g.xid_faults], "last_xid": dict(g.last_xid) if g.last_xid else None,
        "pcie_replays": g.pcie_replays, "recovery_action": g.recovery_action, "persistence": g.persistence,
        "c2c_errors": list(g.c2c_errors) if g.c2c_errors is not None else None,
        "nvlink_version": g.nvlink_version, "nvlink_up": list(g.nvlink_up),
        "nvlink_errors": [list(e) for e in g.nvlink_errors],
        "nvlink_error_rate": {str(k): v for k, v in g.nvlink_error_rate.items()},
        "tx_kib": [int(v) for v in g.nvlink_tx_kib], "rx_kib": [int(v) for v in g.nvlink_rx_kib],
        "fabric": None if g.fabric_state is None else {
            "state": g.fabric_state, "status": g.fabric_status, "health": sorted(g.fabric_health),
            "cluster_uuid": g.fabric_cluster_uuid, "clique_id": g.fabric_clique_id},
        "nvlink_remote_type": g.nvlink_remote_type,
        "nvlink_remote_pci": list(g.nvlink_remote_pci) if g.nvlink_remote_pci is not None else None,
    }
    state.update(g.nvml_pinned)
    return state


def node_state(model: RackModel, node: str) -> dict[str, Any]:
    with model.lock:
        n = model.nodes[node]
        return {"node": node, "driver": DRIVER_VERSION, "cuda": CUDA_VERSION, "xid_seq": model.xid_seq,
                "driver_hang_s": n.nvml_hang_seconds, "boot_id": n.boot_id, "boot_time": n.boot_time,
                "gpus": [gpu_state(g) for g in model.nodes[node].gpus],
                **n.nvml_pinned}


def set_limit(model: RackModel, node: str, index: int, limit_mw: int) -> int:
    """Apply a power limit as the driver would; returns the NVML return code."""
    with model.lock:
        g = model.gpu(node, index)
        if g.lost or g.missing:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if "nvmlDeviceSetPowerManagementLimit" in g.unsupported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        if not g.min_limit_mw <= limit_mw <= g.max_limit_mw:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        model.set_power_limit(node, index, limit_mw)
        return pynvml.NVML_SUCCESS


def xid_events(model: RackModel, node: str, after: int) -> list[dict[str, Any]]:
    with model.lock:
        return [{"seq": seq, "index": g.index, "uuid": g.uuid, "xid": xid}
                for g in model.nodes[node].gpus for seq, xid in g.xids if seq > after]


def add_nvml_routes(app: web.Application, model: RackModel) -> None:
    """Mount the twin's routes on the simulator's aiohttp app."""

    def node_of(request: web.Request) -> str:
        node = request.match_info["node"]
        if node not in model.nodes:
            raise web.HTTPNotFound(text=f"node {node!r} not in the simulated rack")
        return node

    async def state(request: web.Request) -> web.Response:
        return web.json_response(node_state(model, node_of(request)))

    async def power_limit(request: web.Request) -> web.Response:
        node = node_of(request)
        try:
            index = int(request.match_info["index"])
            body = await request.json()
            limit_mw = int(body["limit_mw"])
            model.gpu(node, index)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            return web.json_response({"error": f"bad request: {e!r}"}, status=400)
        return web.json_response({"ret": set_limit(model, node, index, limit_mw)})

    async def reset(request: web.Request) -> web.Response:
        """`nvidia-smi --gpu-reset -i N`, answered with the NVML return code the driver gives (and why)."""
        node = node_of(request)
        try:
            index = int(request.match_info["index"])
            model.gpu(node, index)
        except (ValueError, IndexError) as e:
            return web.json_response({"error": f"bad request: {e!r}"}, status=400)
        try:
            return web.json_response({"ret": pynvml.NVML_SUCCESS, "result": reset_gpu(model, node, index)})
        except RecoveryRefused as e:
            return web.json_response({"ret": e.ret, "result": str(e)})

    async def events(request: web.Request) -> web.Response:
        node = node_of(request)
        try:
            after = int(request.query.get("after", "0"))
            wait_ms = min(int(request.query.get("timeout_ms", "0")), MAX_WAIT_MS)
        except ValueError as e:
            return web.json_response({"error": f"bad request: {e}"}, status=400)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            found = xid_events(model, node, after)
            if found or time.monotonic() >= deadline or request.transport is None or request.transport.is_closing():
                # (a client that went away ends its long poll now: a stopping server does not wait it out)
                return web.json_response({"events": found, "driver_hang_s": model.nodes[node].nvml_hang_seconds})
            await asyncio.sleep(min(EVENT_POLL_S, max(0.0, deadline - time.monotonic())))

    app.router.add_get(PREFIX + "/{node}/state", state)
    app.router.add_post(PREFIX + "/{node}/gpus/{index}/power-limit", power_limit)
    app.router.add_post(PREFIX + "/{node}/gpus/{index}/reset", reset)
    app.router.add_get(PREFIX + "/{node}/events", events)
