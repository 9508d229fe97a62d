"""`supernode-agent`: run the daemon, check a config, drive the simulator, probe devices, remediation."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from agent.config import DEFAULT_CONFIG_PATH, ConfigError, load_config
from agent.httpclient import request_json
from exporters.validation import terminal_safe

# agent/sim/nvml_personality.py PERSONALITIES (named here so the CLI does not load agent.sim)
GPU_PERSONALITIES = ("h100", "gb200")


def _cmd_run(args: argparse.Namespace) -> int:
    from agent.memory import skip_system_mime_types

    skip_system_mime_types()  # before the daemon's modules import aiohttp.web
    from agent.daemon import run
    from agent.logs import setup_logging

    level, fmt = args.log_level, "keyvalue"
    try:  # the config's logging section, so the very first lines already have its format
        logging_cfg = load_config(args.config).config.logging
        level, fmt = level or logging_cfg.level, logging_cfg.format
    except ConfigError:
        pass  # run() reports the bad config below
    setup_logging(level or "info", fmt)
    try:
        return run(Path(args.config))
    except ConfigError as exc:
        print("supernode-agent: " + terminal_safe(exc, keep="\n"), file=sys.stderr)
        return 2


def _cmd_check_config(args: argparse.Namespace) -> int:
    try:
        loaded = load_config(args.file, args.node)
    except ConfigError as exc:
        print(terminal_safe(exc, keep="\n"), file=sys.stderr)
        return 1
    for warning in loaded.warnings:
        print("warning: " + terminal_safe(warning), file=sys.stderr)
    if args.dump:
        dump = loaded.config.dump()
        dump["secrets"] = {k: {"file": v["file"], "value": "<redacted>"} for k, v in dump["secrets"].items()}
        json.dump(dump, sys.stdout, indent=2, default=str)
        print()
    else:
        c = loaded.config
        print(f"{args.file}: ok (rack {c.agent.rack}, node {c.agent.node}, mode {c.agent.mode}, "
              f"{c.inventory.gpus.count} GPUs, {len(c.inventory.ports)} ports, {len(c.inventory.cdus)} CDUs, "
              f"{len(c.inventory.pdus)} PDUs, {len(c.inventory.leak_zones)} leak zones)")
    return 0


# -- simulator -----------------------------------------------------------------------


def _parse_fault_params(extra: Sequence[str]) -> dict[str, str]:
    """`--rx-dbm -12 --port p1` -> {"rx_dbm": "-12", "port": "p1"}; a bare flag means true."""
    params: dict[str, str] = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--"):
            raise SystemExit(f"sim inject: unexpected argument {tok!r} (parameters are --name value)")
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


def _cmd_sim(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from agent.sim.server import find_simulator

    if args.sim_cmd == "run":
        return _sim_run(args)
    try:
        url = find_simulator(args.sim)
    except LookupError as exc:
        print(f"supernode-agent sim: {exc}", file=sys.stderr)
        return 2
    try:
        if args.sim_cmd == "inject":
            status, body = request_json("POST", f"{url}/api/v1/inject",
                                      {"kind": args.kind, "params": _parse_fault_params(extra)})
        elif args.sim_cmd == "clear":
            status, body = request_json("POST", f"{url}/api/v1/clear", {})
        elif args.sim_cmd == "faults":
            status, body = request_json("GET", f"{url}/api/v1/faults")
        else:
            status, body = request_json("GET", f"{url}/api/v1/state")
    except OSError as exc:
        print(f"supernode-agent sim: simulator at {url} does not answer: {exc}", file=sys.stderr)
        return 2
    if status >= 400:
        print(f"supernode-agent sim: {body.get('error', body) if isinstance(body, dict) else body}", file=sys.stderr)
        return 1
    print(json.dumps(body, indent=2))
    return 0


def _sim_run(args: argparse.Namespace) -> int:
    from agent.logs import setup_logging
    from agent.sim.server import Simulator

    setup_logging("info")

    async def main() -> None:
        sim = Simulator(nodes=args.nodes, gpus=args.gpus, port=args.port, personality=args.personality)
        url = await sim.start()
        print(f"sim: {url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await sim.stop()

    asyncio.run(main())
    return 0


# -- demo ----------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from agent.demo import run_demo

    return run_demo(nodes=args.nodes, gpus=args.gpus, duration=args.duration, base_port=args.port,
                    personality=args.personality)


# -- probes --------------------------------------------------------------------------


def _cmd_probe(args: argparse.Namespace) -> int:
    from agent import probe

    try:
        text = probe.run(args)
    except probe.ProbeError as exc:
        print(f"supernode-agent probe {args.probe_kind}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


# -- remediation ---------------------------------------------------------------------


def _cmd_remediation(args: argparse.Namespace) -> int:
    from agent.remediation_cli import dispatch

    return dispatch(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="supernode-agent", description=__doc__)
    p.add_argument("--config", default=str(DEFAULT_CONFIG_PATH), help="agent config (default %(default)s)")
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"],
                   help="overrides the config's logging.level (default info)")
    sub = p.add_subparsers(dest="cmd")

    sub.add_parser("run", help="run the agent (the default)")

    cc = sub.add_parser("check-config", help="validate a config file; non-zero exit names the bad field")
    cc.add_argument("file")
    cc.add_argument("--dump", action="store_true", help="print the parsed config (secrets redacted)")
    cc.add_argument("--node", help="check as node NODE would load it (default: agent.node, else this host's name)")

    sim = sub.add_parser("sim", help="the simulated rack: run it, inject faults, clear them")
    sim.add_argument("--sim", help="simulator URL (default: found through its discovery file)")
    ss = sim.add_subparsers(dest="sim_cmd", required=True)
    sr = ss.add_parser("run", help="run a simulator in the foreground")
    sr.add_argument("--nodes", type=int, default=2)
    sr.add_argument("--gpus", type=int, default=4)
    sr.add_argument("--port", type=int, default=0)
    sr.add_argument("--personality", choices=GPU_PERSONALITIES, default="h100", help="GPU model of every node")
    si = ss.add_parser("inject", help="inject a fault: KIND [--node N] [--gpu I] [--param value ...]; see `sim faults`")
    si.add_argument("kind")
    ss.add_parser("clear", help="clear every injected fault")
    ss.add_parser("state", help="print the rack model's state")
    ss.add_parser("faults", help="list the fault kinds and their parameters")

    demo = sub.add_parser("demo", help="simulated rack plus one agent per node, in enforce mode")
    demo.add_argument("--nodes", type=int, default=2)
    demo.add_argument("--gpus", type=int, default=4)
    demo.add_argument("--duration", type=float, default=None, help="exit by itself after this many seconds")
    demo.add_argument("--port", type=int, default=0, help="first agent port (default: free ports)")
    demo.add_argument("--personality", choices=GPU_PERSONALITIES, default="gb200",
                      help="GPU model of every node (default %(default)s: the GB200 NVL72 class this agent is for)")

    pr = sub.add_parser("probe", help="poll one source once and print what the agent would export")
    from agent.probe import add_probe_parsers

    add_probe_parsers(pr)

    from agent.coordination.roles_command import add_parser as add_coordination_parser

    add_coordination_parser(sub)

    from agent.remediation_cli import add_remediation_parsers

    add_remediation_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not (args.cmd == "sim" and getattr(args, "sim_cmd", None) == "inject"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    cmd = args.cmd or "run"
    if cmd == "run":
        return _cmd_run(args)
    if cmd == "check-config":
        return _cmd_check_config(args)
    if cmd == "sim":
        return _cmd_sim(args, extra)
    if cmd == "demo":
        return _cmd_demo(args)
    if cmd == "probe":
        return _cmd_probe(args)
    if cmd == "coordination":
        from agent.coordination.roles_command import run as coordination_run

        return coordination_run(args)
    try:
        return _cmd_remediation(args)
    except BrokenPipeError:  # `supernode-agent journal | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
