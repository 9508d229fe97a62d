"""`supernode-sim`: run the simulated rack, inject and clear faults, read its state, run the demo.

The simulator's own command, apart from `supernode-agent`: the agent ships
without the simulator, so its CLI has nothing to offer for it. `inject`,
`clear`, `state` and `faults` talk to a running simulator over its HTTP API,
found through its discovery file (or `--sim URL`, or $SUPERNODE_SIM_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Sequence

from agent.httpclient import request_json
from sim.device_set import CDU_PROTOCOLS
from sim.nvml_personality import PERSONALITIES

PROG = "supernode-sim"


def parse_fault_params(extra: Sequence[str]) -> dict[str, str]:
    """`--rx-dbm -12 --port p1` -> {"rx_dbm": "-12", "port": "p1"}; a bare flag means true."""
    params: dict[str, str] = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--"):
            raise SystemExit(f"{PROG} inject: unexpected argument {tok!r} (parameters are --name value)")
        key, eq, val = tok[2:].partition("=")
        if not eq:
            if i + 1 < len(extra) and not (extra[i + 1].startswith("--")):
                val = extra[i + 1]
                i += 1
            else:
                val = "true"
        params[key.replace("-", "_")] = val
        i += 1
    return params


def gpu_reset_command(url: str) -> list[str]:
    """An agent's `remediation.gpu_recovery.gpu_reset_command` on a simulated rack: this CLI's `inject gpu-reset`
    at the simulator `url`, run by the Python that runs the simulator ({node} and {gpu} left for the agent).

    It exits 1 with the twin's refusal on stderr (a process still on the GPU, the GPU off the bus) and 0 once
    the GPU is reset, as `nvidia-smi --gpu-reset -i N` does on a real node."""
    return [sys.executable, "-m", "sim.cli", "--sim", url, "inject", "gpu-reset", "--node", "{node}", "--gpu", "{gpu}"]


def _cmd_api(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """inject / clear / state / faults: one request to the running simulator, its answer printed as JSON."""
    from sim.server import find_simulator

    try:
        url = find_simulator(args.sim)
    except LookupError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.cmd == "inject":
            status, body = request_json("POST", f"{url}/api/v1/inject",
                                        {"kind": args.kind, "params": parse_fault_params(extra)})
        elif args.cmd == "clear":
            status, body = request_json("POST", f"{url}/api/v1/clear", {})
        elif args.cmd == "faults":
            status, body = request_json("GET", f"{url}/api/v1/faults")
        else:
            status, body = request_json("GET", f"{url}/api/v1/state")
    except OSError as exc:
        print(f"{PROG}: simulator at {url} does not answer: {exc}", file=sys.stderr)
        return 2
    if status >= 400:
        print(f"{PROG}: {body.get('error', body) if isinstance(body, dict) else body}", file=sys.stderr)
        return 1
    print(json.dumps(body, indent=2))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """A simulator in the foreground until SIGINT/SIGTERM; its URL is printed first (and in the discovery file)."""
    from agent.logs import setup_logging
    from sim.server import Simulator

    setup_logging("info")

    async def main() -> None:
        sim = Simulator(nodes=args.nodes, gpus=args.gpus, port=args.port, personality=args.personality,
                        cdu_protocol=args.cdu_protocol)
        url = await sim.start()
        print(f"sim: {url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await sim.stop()

    asyncio.run(main())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from sim.demo import run_demo
    from sim.device_set import check_cdu_protocol

    try:
        check_cdu_protocol(args.cdu_protocol)
    except ValueError as exc:
        print(f"{PROG} demo: --{exc}", file=sys.stderr)
        return 2
    return run_demo(nodes=args.nodes, gpus=args.gpus, duration=args.duration, base_port=args.port,
                    personality=args.personality, cdu_protocol=args.cdu_protocol)


CDU_PROTOCOL_HELP = ("what the rack's CDU (cdu1) speaks: modbus (Modbus TCP), snmp, bacnet (BACnet/IP, COV push), or "
                     "redfish (no cdu1: the Redfish CDU rfcdu1 alone); the same loop and faults (default %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=(__doc__ or PROG).split("\n\n")[0])  # no docstrings under -OO (the daemon)
    p.add_argument("--sim", help="simulator URL (default: found through its discovery file)")
    sub = p.add_subparsers(dest="cmd", required=True)
    personalities = sorted(PERSONALITIES)

    sr = sub.add_parser("run", help="run a simulator in the foreground")
    sr.add_argument("--nodes", type=int, default=2)
    sr.add_argument("--gpus", type=int, default=4)
    sr.add_argument("--port", type=int, default=0)
    sr.add_argument("--personality", choices=personalities, default="h100", help="GPU model of every node")
    sr.add_argument("--cdu-protocol", choices=CDU_PROTOCOLS, default="modbus", help=CDU_PROTOCOL_HELP)
    si = sub.add_parser("inject", help=f"inject a fault: KIND [--node N] [--gpu I] [--param value ...]; "
                                       f"see `{PROG} faults`")
    si.add_argument("kind")
    sub.add_parser("clear", help="clear every injected fault")
    sub.add_parser("state", help="print the rack model's state")
    sub.add_parser("faults", help="list the fault kinds and their parameters")

    demo = sub.add_parser("demo", help="simulated rack plus one agent per node, in enforce mode")
    demo.add_argument("--nodes", type=int, default=2)
    demo.add_argument("--gpus", type=int, default=4)
    demo.add_argument("--duration", type=float, default=None, help="exit by itself after this many seconds")
    demo.add_argument("--port", type=int, default=0, help="first agent port (default: free ports)")
    demo.add_argument("--personality", choices=personalities, default="gb200",
                      help="GPU model of every node (default %(default)s: the GB200 NVL72 class this agent is for)")
    demo.add_argument("--cdu-protocol", choices=CDU_PROTOCOLS, default="modbus", help=CDU_PROTOCOL_HELP)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.cmd != "inject":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "run":
        return _cmd_run(args)
    if args.cmd == "demo":
        return _cmd_demo(args)
    return _cmd_api(args, extra)


if __name__ == "__main__":
    sys.exit(main())
