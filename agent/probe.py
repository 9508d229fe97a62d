"""`supernode-agent probe KIND`: poll one device once and print the exposition the agent would serve.

For bringing up a new CDU, PDU or node: it says at once whether the device
answers and whether the profile fits, without running the daemon.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Callable

from exporters.model import SourceError


class ProbeError(Exception):
    """The device did not answer, refused us, or the profile does not fit it."""


def _probe_nvml(args: argparse.Namespace) -> str:
    from exporters.nvml import NvmlSource
    from exporters.render import render_readings

    if args.sim:
        from agent.sim.nvml_twin import NvmlTwin
        from agent.sim.server import find_simulator

        lib: Any = NvmlTwin(find_simulator(args.sim), args.node)
    else:
        import pynvml

        lib = pynvml

    async def once() -> bytes:
        src = NvmlSource(lib, args.expect_gpus, args.nvlinks, call_timeout=args.timeout, xid_events=False)
        try:
            result = await src.poll()
        finally:
            await src.close()
        return render_readings(result.readings)

    try:
        return asyncio.run(once()).decode()
    except SourceError as exc:
        raise ProbeError(f"{exc.kind}: {exc}") from None
    except Exception as exc:  # pynvml raises NVMLError subclasses; say which
        raise ProbeError(f"{type(exc).__name__}: {exc}") from None


PROBES: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], str]]] = {}


def _nvml_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sim", nargs="?", const="", default=None,
                   help="use the simulator's NVML twin (URL, or found by itself)")
    p.add_argument("--node", default="node01", help="simulated node (with --sim)")
    p.add_argument("--expect-gpus", type=int, default=0, help="GPUs the inventory expects (0: do not check)")
    p.add_argument("--nvlinks", type=int, default=18)
    p.add_argument("--timeout", type=float, default=5.0)


PROBES["nvml"] = (_nvml_args, _probe_nvml)


def add_probe_parsers(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="probe_kind", required=True)
    for name, (add_args, _) in PROBES.items():
        add_args(sub.add_parser(name, help=f"probe {name}"))


def run(args: argparse.Namespace) -> str:
    return PROBES[args.probe_kind][1](args)
