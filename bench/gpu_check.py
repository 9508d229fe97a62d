"""A read-only check of the NVML exporter on a real GPU: one short run, everything written under --out.

Why: the exporter is tested against the NVML twin, and the twin follows
real `nvidia-smi -q` captures and nvml.h; only a real driver says whether
they agree. A session lent a GPU machine has a few minutes of device time
in all, so one run gathers everything worth knowing, section by section (a
section that fails records its error; the others still run).

Read-only by construction: the exporter and this script see pynvml through
`ReadOnlyNvml`, which lets through only the calls that read (init,
shutdown, `*Get*`, event sets) and refuses every other NVML function
(set, clear, reset, create, ...) before it reaches the driver. Nothing
here sets a power limit, clocks or anything else on the GPU.

Sections of summary.json (printed too):
- environment: Python, nvidia-ml-py, driver, NVML, CUDA, each GPU (name, uuid, bus id, NVLinks it reports);
- nvlink_state: each link's state asked two ways, the per-link `nvmlDeviceGetNvLinkState` the exporter
  calls today and field 165 (`NVML_FI_DEV_NVLINK_GET_STATE`, one `nvmlDeviceGetFieldValues` batch per GPU):
  the answers side by side, whether they agree, and each way's median cost (issue 14's next step);
- exporter (Python >= 3.11): `--cycles` polls of `NvmlSource` as the agent runs it: the first poll's wall
  time, then the median CPU (this process, all threads) and wall time per poll, series per family, the
  calls and fields the GPU answers NotSupported, partial errors; probe.prom is the last poll as
  Prometheus text, what `supernode-agent probe nvml` prints;
- peer: `nvidia-smi -q` run `--peer-runs` times: median wall and CPU (children's rusage), and the ratio
  of the exporter's poll to it; its first output is kept as nvidia-smi-q.txt (a capture for
  tests/fixtures/nvidia-smi, once its provenance is written down);
- versus_nvidia_smi: the exporter's values against that capture, GPU by GPU (matched by bus id): static
  facts (identity, power limits, memory size, persistence, ECC aggregate, remapped rows) must agree;
  moving values (power, temperatures, clocks, utilization) are listed side by side.

On the device machine (its Python has none of our dependencies: `make gpu-check-deps` copies the
pure-Python ones, nvidia-ml-py, PyYAML, prometheus-client, into build/gpu-deps, which the run carries):

    python3 bench/gpu_check.py --deps build/gpu-deps --out "$OUT"

Against the simulator's twin (what the tests run), with a capture instead of nvidia-smi:

    python bench/gpu_check.py --sim-url http://127.0.0.1:PORT --node node01 --capture FILE --out DIR
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from timing import median_wall_cpu  # bench/timing.py: the benchmarks' one way of taking medians

REPO = Path(__file__).resolve().parent.parent

# The NVML functions that read, or that reading needs (init, shutdown, event sets): anything else named
# nvml* is refused. An allowlist, because pynvml has over a hundred calls that change a GPU and each
# release adds some: a new one is refused until someone has read what it does.
READING_CALLS = ("nvmlInit", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGet", "nvmlDeviceGet", "nvmlUnitGet",
                 "nvmlEventSetCreate", "nvmlEventSetWait", "nvmlEventSetFree", "nvmlDeviceRegisterEvents")
NVLINK_STATE_FIELD = 165  # NVML_FI_DEV_NVLINK_GET_STATE (nvml.h): 0 inactive, 1 active, 2 sleep, 3 traffic disabled
NVLINK_COUNT_FIELD = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
MAX_LINKS = 18  # NVLinks a GPU can have (NVML_NVLINK_MAX_LINKS)


class ReadOnlyNvml:
    """pynvml (or the twin) with every call that could change a GPU refused before it reaches the driver."""

    def __init__(self, lib: Any):
        self._lib = lib
        self.refused: list[str] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._lib, name)
        if name.startswith("nvml") and callable(value) and not name.startswith(READING_CALLS):
            def refuse(*_: Any, **__: Any) -> Any:
                self.refused.append(name)
                raise PermissionError(f"gpu_check is read-only: {name} is never called")

            return refuse
        return value


def _median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def _error_name(lib: Any, e: Exception) -> str:
    """NVML's own name for an error (NotSupported, NoPermission, ...), or the exception's type."""
    if isinstance(e, lib.NVMLError):
        name = type(e).__name__
        return name[len("NVMLError_"):] if name.startswith("NVMLError_") else name
    return f"{type(e).__name__}: {e}"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _field_value(lib: Any, fv: Any) -> Any:
    """One c_nvmlFieldValue_t's value by its type, or the name of its error."""
    if fv.nvmlReturn != lib.NVML_SUCCESS:
        return _error_name(lib, lib.NVMLError(fv.nvmlReturn))
    member = {lib.NVML_VALUE_TYPE_DOUBLE: "dVal", lib.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
              lib.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", lib.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
              lib.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}.get(fv.valueType, "ullVal")
    return getattr(fv.value, member)


def environment(lib: Any) -> dict[str, Any]:
    try:
        from importlib.metadata import version
        pynvml_version = version("nvidia-ml-py")
    except Exception:  # installed without its metadata
        pynvml_version = "unknown"
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "nvidia_ml_py": pynvml_version,
                           "driver": _text(lib.nvmlSystemGetDriverVersion())}
    for key, fn in (("nvml", "nvmlSystemGetNVMLVersion"), ("cuda", "nvmlSystemGetCudaDriverVersion")):
        try:
            out[key] = _text(getattr(lib, fn)())
        except Exception as e:
            out[key] = _error_name(lib, e)
    gpus = []
    for i in range(lib.nvmlDeviceGetCount()):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        gpu: dict[str, Any] = {"index": i, "name": _text(lib.nvmlDeviceGetName(h)),
                               "uuid": _text(lib.nvmlDeviceGetUUID(h))}
        try:
            gpu["pci_bus_id"] = _text(lib.nvmlDeviceGetPciInfo(h).busId)
        except Exception as e:
            gpu["pci_bus_id"] = _error_name(lib, e)
        try:
            gpu["nvlink_count_field"] = _field_value(lib, lib.nvmlDeviceGetFieldValues(h, [NVLINK_COUNT_FIELD])[0])
        except Exception as e:
            gpu["nvlink_count_field"] = _error_name(lib, e)
        gpus.append(gpu)
    out["gpus"] = gpus
    return out


def nvlink_state(lib: Any, reps: int) -> list[dict[str, Any]]:
    """Each link's state by the per-link call and by field 165, side by side, and what each way costs."""
    out = []
    for i in range(lib.nvmlDeviceGetCount()):
        h = lib.nvmlDeviceGetHandleByIndex(i)

        def by_call() -> list[Any]:
            states: list[Any] = []
            for link in range(MAX_LINKS):
                try:
                    states.append(lib.nvmlDeviceGetNvLinkState(h, link))
                except Exception as e:
                    states.append(_error_name(lib, e))
            return states

        def by_field() -> list[Any]:
            try:
                values = lib.nvmlDeviceGetFieldValues(h, [(NVLINK_STATE_FIELD, link) for link in range(MAX_LINKS)])
            except Exception as e:  # the whole batch refused (an old driver): every link says why
                return [_error_name(lib, e)] * MAX_LINKS
            return [_field_value(lib, v) for v in values]

        calls, fields = by_call(), by_field()
        links = [{"link": link, "call": c, "field": f,
                  # the call answers NVML_FEATURE_ENABLED (1) for an active link; the field 1 for active
                  "agree": (c == 1) == (f == 1) if isinstance(c, int) and isinstance(f, int) else None}
                 for link, (c, f) in enumerate(zip(calls, fields))]
        costs = {}
        for name, fn in (("call_per_link", by_call), ("field_batch", by_field)):
            wall, cpu = median_wall_cpu(fn, reps)
            costs[name] = {"wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3}
        out.append({"gpu": i, "links": links, "cost": costs,
                    "disagree": [x["link"] for x in links if x["agree"] is False]})
    return out


def exporter(lib: ReadOnlyNvml, cycles: int, out_dir: Path) -> dict[str, Any]:
    """`cycles` polls of the exporter as the agent runs it; the last one written as probe.prom."""
    import asyncio

    from exporters.gpu.nvml import NvmlSource
    from exporters.model import Quality
    from exporters.render import render_readings

    async def run() -> dict[str, Any]:
        src = NvmlSource(lib, 0, MAX_LINKS, call_timeout=10.0, xid_events=True, gpu_timeout=5.0)
        try:
            w0 = time.perf_counter()
            result = await src.poll()
            first_wall = time.perf_counter() - w0
            walls, cpus = [], []
            for _ in range(cycles):
                w0, c0 = time.perf_counter(), time.process_time()
                result = await src.poll()
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
        finally:
            await src.close()
        families = Counter(r.spec.name for r in result.readings if r.quality is not Quality.UNSUPPORTED)
        (out_dir / "probe.prom").write_bytes(render_readings(result.readings))
        return {"first_poll_wall_ms": first_wall * 1e3, "cycles": cycles,
                "poll_wall_ms": _median(walls) * 1e3, "poll_cpu_ms": _median(cpus) * 1e3,
                "series": sum(families.values()), "families": dict(sorted(families.items())),
                "unsupported": sorted({r.reading_id() for r in result.readings if r.quality is Quality.UNSUPPORTED}),
                "partial_errors": dict(result.partial_errors),
                "_readings": result.readings}

    return asyncio.run(run())


def peer(runs: int, out_dir: Path) -> dict[str, Any]:
    """`nvidia-smi -q`: what it costs per run; its first output kept as a capture."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return {"skipped": "nvidia-smi not found: no peer, no ratio"}
    walls, cpus = [], []
    for n in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        done = subprocess.run([binary, "-q"], capture_output=True, text=True, timeout=60, check=False)
        walls.append(time.perf_counter() - w0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if n == 0:
            (out_dir / "nvidia-smi-q.txt").write_text(done.stdout)
            if done.returncode != 0:
                return {"error": f"nvidia-smi -q exited {done.returncode}: {done.stderr.strip()[:500]}"}
    return {"runs": runs, "wall_ms": _median(walls) * 1e3, "cpu_ms": _median(cpus) * 1e3}


# NVML_GPU_FABRIC_STATE_* (nvml.h) -> the exporter's state label
_FABRIC_STATE_NAMES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def versus_nvidia_smi(capture: str, readings: list) -> list[dict[str, Any]]:
    """The exporter's values against nvidia-smi's for each GPU, matched by PCI bus id."""
    from sim.nvml_capture import nvml_answers, parse
    from agent.snapshot import Snapshot
    from exporters.gpu import nvml_metrics as M

    snap = Snapshot(time.time(), readings)  # its `value`: the one OK reading of a family and labels, or None

    def one(spec: Any, gpu: str, **labels: str) -> float | None:
        return snap.value(spec.name, gpu=gpu, **labels)

    info = {r.labels["pci_bus_id"].upper(): r.labels for r in snap.select(M.GPU_INFO.name)}
    out = []
    for raw in parse(capture).gpus:
        smi = nvml_answers(raw)
        labels = info.get(smi["pci_bus_id"].upper())
        if labels is None:
            out.append({"pci_bus_id": smi["pci_bus_id"], "error": "no GPU of the exporter at this bus id"})
            continue
        g = labels["gpu"]
        ecc = [one(M.ECC, g, type=t, scope="aggregate") for t in ("corrected", "uncorrected")]
        remap = [one(M.REMAPPED, g, kind=k) for k in ("correctable", "uncorrectable")]
        remap += [one(M.REMAP_PENDING, g), one(M.REMAP_FAILURE, g)]
        limits = (("current", "limit_mw"), ("default", "default_limit_mw"), ("min", "min_limit_mw"),
                  ("max", "max_limit_mw"))
        static = {
            **{k: (labels.get(k), smi[k]) for k in ("name", "uuid", "serial", "vbios")},
            **{f"power_limit_{k}_w": (one(M.POWER_LIMIT, g, limit=k), smi[key] / 1000) for k, key in limits},
            "memory_total_bytes": (one(M.MEMORY_TOTAL, g), float(smi["mem_total"])),
            "persistence": (one(M.PERSISTENCE, g), float(smi["persistence"])),
            "ecc_aggregate": (ecc, [float(x) for x in smi["ecc_aggregate"]]),
            "remapped_rows": (remap, [float(x) for x in smi["remap"]]),
            # the fabric registration (the resume gate's input): the state set's one active state, and nvidia-smi's
            "fabric_state": (next((r.labels["state"] for r in snap.select(M.FABRIC_STATE.name, gpu=g) if r.value == 1),
                                  None), _FABRIC_STATE_NAMES.get(smi["fabric"]["state"])),
        }
        if "GPU Recovery Action" in raw:  # R560 and later print the driver's recovery hint (NVML field 230)
            static["recovery_action"] = (
                next((r.labels["action"] for r in snap.select(M.RECOVERY.name, gpu=g) if r.value == 1), None),
                raw["GPU Recovery Action"].strip().lower().replace(" ", "_"))
        moving = {
            "power_w": (one(M.POWER, g), smi["power_mw"] / 1000),
            "temperature_gpu_c": (one(M.TEMPERATURE, g, sensor="gpu"), float(smi["temp_c"])),
            "temperature_memory_c": (one(M.TEMPERATURE, g, sensor="memory"), float(smi["mem_temp_c"])),
            "clock_sm_hz": (one(M.CLOCK, g, clock="sm"), smi["sm_mhz"] * 1e6),
            "utilization_gpu": (one(M.UTILIZATION, g, engine="gpu"), smi["util_gpu"] / 100),
        }
        out.append({"gpu": g, "pci_bus_id": smi["pci_bus_id"],
                    "static": {k: {"exporter": a, "nvidia_smi": b, "agree": a == b} for k, (a, b) in static.items()},
                    "moving": {k: {"exporter": a, "nvidia_smi": b} for k, (a, b) in moving.items()},
                    "disagree": sorted(k for k, (a, b) in static.items() if a != b)})
    return out


def _section(summary: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one section; its failure is recorded under its name and the run goes on."""
    try:
        summary[name] = fn()
    except Exception as e:  # one section's failure must not cost the others' device time
        summary[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
    return summary[name]


def _counts(values: list[Any]) -> str:
    """[1, 1, 1, 'NotSupported'] -> "1 x3, NotSupported x1": a link list in one line."""
    return ", ".join(f"{k} x{n}" for k, n in Counter(map(str, values)).items())


def report(summary: dict[str, Any]) -> list[str]:
    """The summary in a few lines (summary.json has it all): what a note on the issue quotes."""
    lines = []
    for name, section in summary.items():
        if isinstance(section, dict) and ("error" in section or "skipped" in section):
            lines.append(f"{name}: ERROR {section['error']}" if "error" in section else f"{name}: {section['skipped']}")
            continue
        if name == "environment":
            e = section
            lines.append(f"environment: Python {e['python']}, nvidia-ml-py {e['nvidia_ml_py']}, driver {e['driver']}, "
                         f"NVML {e['nvml']}, CUDA {e['cuda']}; {e['platform']}")
            lines += [f"  gpu {g['index']}: {g['name']} {g['uuid']} {g['pci_bus_id']}, "
                      f"NVLinks (field 91): {g['nvlink_count_field']}" for g in e["gpus"]]
        elif name == "nvlink_state":
            for g in section:
                c = g["cost"]
                lines.append(f"nvlink_state gpu {g['gpu']}: per-link call [{_counts([x['call'] for x in g['links']])}]; "
                             f"field 165 [{_counts([x['field'] for x in g['links']])}]; disagree: {g['disagree'] or 'none'}; "
                             f"cost per GPU, call x{MAX_LINKS} {c['call_per_link']['cpu_ms']:.3f} ms CPU, "
                             f"one field batch {c['field_batch']['cpu_ms']:.3f} ms CPU")
        elif name == "exporter":
            x = section
            lines.append(f"exporter: first poll {x['first_poll_wall_ms']:.1f} ms wall; median of {x['cycles']} polls "
                         f"{x['poll_cpu_ms']:.2f} ms CPU, {x['poll_wall_ms']:.2f} ms wall; {x['series']} series in "
                         f"{len(x['families'])} families; unsupported: {x['unsupported'] or 'none'}; "
                         f"partial errors: {x['partial_errors'] or 'none'}")
        elif name == "peer":
            lines.append(f"peer nvidia-smi -q: median of {section['runs']} runs {section['cpu_ms']:.1f} ms CPU, "
                         f"{section['wall_ms']:.1f} ms wall; exporter poll / peer: "
                         f"CPU {section.get('ratio_cpu_exporter_to_peer', float('nan')):.3f}, "
                         f"wall {section.get('ratio_wall_exporter_to_peer', float('nan')):.3f}")
        elif name == "versus_nvidia_smi":
            for g in section:
                if "error" in g:
                    lines.append(f"versus nvidia-smi {g['pci_bus_id']}: {g['error']}")
                    continue
                moving = "; ".join(f"{k} {v['exporter']} vs {v['nvidia_smi']}" for k, v in g["moving"].items())
                lines.append(f"versus nvidia-smi gpu {g['gpu']}: static facts agree "
                             f"{len(g['static']) - len(g['disagree'])}/{len(g['static'])}, disagree: "
                             f"{g['disagree'] or 'none'}; moving: {moving}")
        elif name == "nvml_init":
            lines.append("nvml_init: ok")
        elif name == "refused_calls":
            lines.append(f"refused (read-only) calls: {section or 'none'}")
    return lines


# What --write-deps copies: the import names of the pure-Python packages the check needs, and their distributions.
DEPS = {"pynvml": "nvidia-ml-py", "yaml": "PyYAML", "prometheus_client": "prometheus-client"}


def write_deps(dest: Path) -> None:
    """Copy the installed pure-Python dependencies, with their .dist-info (licences), into `dest` (replaced)."""
    import importlib
    from importlib.metadata import distribution

    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for module, dist in DEPS.items():
        where = Path(importlib.import_module(module).__file__ or "")
        if where.name == "__init__.py":
            shutil.copytree(where.parent, dest / module, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(where, dest / where.name)
        d = distribution(dist)
        for f in d.files or ():  # its .dist-info too: the version the run reports, the licence (or, in METADATA, its name)
            if f.parts[0].endswith(".dist-info"):
                (dest / f).parent.mkdir(parents=True, exist_ok=True)
                (dest / f).write_bytes(Path(d.locate_file(f)).read_bytes())
    print(f"wrote {dest}: {', '.join(sorted(p.name for p in dest.iterdir()))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="folder for summary.json, probe.prom, nvidia-smi-q.txt")
    ap.add_argument("--deps", type=Path, help="a folder of pure-Python dependencies to import from (gpu-check-deps)")
    ap.add_argument("--cycles", type=int, default=30, help="exporter polls timed")
    ap.add_argument("--reps", type=int, default=50, help="repetitions of each NVLink state read")
    ap.add_argument("--peer-runs", type=int, default=5, help="nvidia-smi -q runs timed")
    ap.add_argument("--sim-url", help="the simulator's URL: check the NVML twin instead of the real library")
    ap.add_argument("--node", default="node01", help="the twin's node (with --sim-url)")
    ap.add_argument("--capture", type=Path, help="compare against this nvidia-smi -q text instead of running it")
    ap.add_argument("--write-deps", type=Path, metavar="DIR", help="copy the dependencies into DIR for --deps, and stop")
    args = ap.parse_args()
    if args.write_deps is not None:
        write_deps(args.write_deps)
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.deps is not None:
        sys.path.insert(0, str(args.deps.resolve()))
    sys.path.insert(0, str(REPO))
    args.out.mkdir(parents=True, exist_ok=True)

    if args.sim_url:
        from sim.nvml_twin import NvmlTwin
        raw: Any = NvmlTwin(args.sim_url, args.node)
    else:
        try:
            import pynvml
        except ImportError as e:
            print(f"pynvml not importable ({e}): run `make gpu-check-deps` and pass --deps build/gpu-deps",
                  file=sys.stderr)
            return 2
        raw = pynvml
    lib = ReadOnlyNvml(raw)
    summary: dict[str, Any] = {}
    if "error" not in _section(summary, "nvml_init", lambda: lib.nvmlInit() or {"ok": True}):
        try:
            _section(summary, "environment", lambda: environment(lib))
            _section(summary, "nvlink_state", lambda: nvlink_state(lib, args.reps))
        finally:
            lib.nvmlShutdown()
    if "error" in summary["nvml_init"]:
        result = summary["exporter"] = {"error": "not run: nvmlInit failed"}
    elif sys.version_info >= (3, 11):
        result = _section(summary, "exporter", lambda: exporter(lib, args.cycles, args.out))
    else:
        result = summary["exporter"] = {"error": f"Python {platform.python_version()}: the exporter needs 3.11"}
    readings = result.pop("_readings", None)
    if args.capture is not None:
        capture = args.capture.read_text()
        summary["peer"] = {"skipped": f"nvidia-smi not run: compared with {args.capture.name}"}
    else:
        _section(summary, "peer", lambda: peer(args.peer_runs, args.out))
        smi = args.out / "nvidia-smi-q.txt"
        capture = smi.read_text() if smi.is_file() and "runs" in summary["peer"] else ""
    if "poll_cpu_ms" in result and "cpu_ms" in summary["peer"]:
        summary["peer"]["ratio_cpu_exporter_to_peer"] = result["poll_cpu_ms"] / summary["peer"]["cpu_ms"]
        summary["peer"]["ratio_wall_exporter_to_peer"] = result["poll_wall_ms"] / summary["peer"]["wall_ms"]
    if readings is not None and capture:
        _section(summary, "versus_nvidia_smi", lambda: versus_nvidia_smi(capture, readings))
    summary["refused_calls"] = sorted(set(lib.refused))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print("\n".join(report(summary)))
    failed = [k for k, v in summary.items() if isinstance(v, dict) and "traceback" in v]
    return 1 if failed or summary["refused_calls"] else 0


if __name__ == "__main__":
    sys.exit(main())
