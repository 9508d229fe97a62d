"""`supernode-agent`: run the daemon, check a config, probe devices, remediation (the simulator is `supernode-sim`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from agent.config import DEFAULT_CONFIG_PATH, ConfigError, load_config
from exporters.validation import terminal_safe


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
    from agent.remediation.cli import dispatch

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

    pr = sub.add_parser("probe", help="poll one source once and print what the agent would export")
    from agent.probe import add_probe_parsers

    add_probe_parsers(pr)

    from agent.coordination.roles_command import add_parser as add_coordination_parser

    add_coordination_parser(sub)

    from agent.remediation.cli import add_remediation_parsers

    add_remediation_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cmd = args.cmd or "run"
    if cmd == "run":
        return _cmd_run(args)
    if cmd == "check-config":
        return _cmd_check_config(args)
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
