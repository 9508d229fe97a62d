"""CLI verbs of remediation (`incidents`, `approve`, `journal`, `breaker-reset`): thin clients of the agent's API."""

from __future__ import annotations

import argparse


def add_remediation_parsers(sub: argparse._SubParsersAction) -> None:
    inc = sub.add_parser("incidents", help="list open and recent incidents with their durations")
    inc.add_argument("--url", default=None, help="agent URL (default: from the config's listen address)")
    inc.add_argument("--token-file", default=None, help="admin token file (default: the config's secrets.admin_token)")
    ap = sub.add_parser("approve", help="approve a pending destructive step (by incident or action id)")
    ap.add_argument("id")
    ap.add_argument("--url", default=None)
    ap.add_argument("--token-file", default=None)
    jr = sub.add_parser("journal", help="print the action journal")
    jr.add_argument("--db", default=None, help="journal database (default: under the config's state_dir)")


def dispatch(args: argparse.Namespace) -> int:
    raise SystemExit(f"supernode-agent {args.cmd}: remediation is not available in this build")
