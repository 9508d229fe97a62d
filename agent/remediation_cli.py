"""CLI verbs of remediation: `incidents`, `approve`, `journal`, `breaker-reset`.

`incidents` and `approve` talk to the running agent's API (the agent holds
the incidents and the pending approvals); `journal` reads the SQLite journal
read-only, so it works even when the agent is down.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_remediation_parsers(sub: argparse._SubParsersAction) -> None:
    inc = sub.add_parser("incidents", help="list open and recent incidents with their durations")
    inc.add_argument("--url", default=None, help="agent URL (default: from the config's listen address)")
    inc.add_argument("--token-file", default=None, help="admin token file (default: the config's admin_token)")
    ap = sub.add_parser("approve", help="approve a pending destructive step (by incident or action id)")
    ap.add_argument("id")
    ap.add_argument("--url", default=None)
    ap.add_argument("--token-file", default=None)
    jr = sub.add_parser("journal", help="print the action journal (read-only)")
    jr.add_argument("--db", default=None, help="journal database or state dir (default: the config's state_dir)")
    jr.add_argument("--limit", type=int, default=100)


def _from_config(args: argparse.Namespace) -> tuple[str, str | None, Path]:
    """Agent URL, admin token file and state dir from the config, for the options not given."""
    from agent.config import ConfigError, load_config

    try:
        cfg = load_config(args.config).config
    except ConfigError as exc:
        if getattr(args, "url", None) and (getattr(args, "token_file", None) or args.cmd == "incidents"):
            return args.url, args.token_file, Path(".")
        if args.cmd == "journal" and args.db:
            return "", None, Path(args.db)
        raise SystemExit(f"supernode-agent {args.cmd}: {exc}\n(pass --url/--token-file or --db to skip the config)")
    scheme = "https" if cfg.listen.tls else "http"
    url = getattr(args, "url", None) or f"{scheme}://{cfg.listen.address}:{cfg.listen.port}"
    ref = cfg.secrets.get(cfg.remediation.admin_token_secret or "admin_token")
    if ref is None and cfg.auth.admin_tokens:  # named tokens only: the first one (pass --token-file for another)
        ref = next(iter(cfg.auth.admin_tokens.values()))
    token_file = getattr(args, "token_file", None) or (str(ref.file) if ref else None)
    return url, token_file, cfg.agent.state_dir


def dispatch(args: argparse.Namespace) -> int:
    from agent.remediation.api import cli_approve, cli_incidents, cli_journal

    if args.cmd == "journal" and args.db:
        return cli_journal(args.db, args.limit)
    url, token_file, state_dir = _from_config(args)
    if args.cmd == "incidents":
        return cli_incidents(url, token_file)
    if args.cmd == "approve":
        if not token_file:
            print("supernode-agent approve: no admin token (pass --token-file)", file=sys.stderr)
            return 2
        return cli_approve(url, args.id, token_file)
    return cli_journal(state_dir, args.limit)
