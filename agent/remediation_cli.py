"""CLI verbs of remediation: `incidents [resolve|reject ID]`, `approve`, `journal`, `maintenance on|off|status`.

`incidents` and `approve` talk to the running agent's API (the agent holds
the incidents and the pending approvals); `journal` reads the SQLite journal
read-only, so it works even when the agent is down.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_remediation_parsers(sub: argparse._SubParsersAction) -> None:
    inc = sub.add_parser("incidents", help="list open and recent incidents; `resolve ID` closes one and undoes its "
                         "actions, `reject ID` closes one and leaves its effects to a person")
    inc.add_argument("verb", nargs="?", choices=["resolve", "reject"], help="close an incident by hand")
    inc.add_argument("id", nargs="?", help="incident id (with resolve/reject)")
    inc.add_argument("--url", default=None, help="agent URL (default: from the config's listen address)")
    inc.add_argument("--token-file", default=None, help="admin token file (default: the config's admin_token)")
    ap = sub.add_parser("approve", help="approve a pending destructive step (by incident or action id)")
    ap.add_argument("id")
    ap.add_argument("--url", default=None)
    ap.add_argument("--token-file", default=None)
    mt = sub.add_parser("maintenance", help="a person works on a node: the agent observes it but does not act")
    mt.add_argument("state", choices=["on", "off", "status"])
    mt.add_argument("--node", default=None, help="node (default: this agent's node)")
    mt.add_argument("--until", default=None, help="end of maintenance: ISO time (2026-12-01T14:00) or a duration "
                    "from now (90m, 2h, 1d)")
    mt.add_argument("--url", default=None)
    mt.add_argument("--token-file", default=None)
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


def parse_until(text: str | None, now: float | None = None) -> float | None:
    """`--until`: an ISO time (local time unless it names a zone) or a duration from now; epoch seconds."""
    import datetime
    import re
    import time

    if text is None:
        return None
    now = time.time() if now is None else now
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return now + float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise SystemExit(f"supernode-agent maintenance: --until {text!r}: not an ISO time or a duration "
                         "like 90m, 2h, 1d") from None


def _need_token(cmd: str, token_file: str | None) -> bool:
    if not token_file:
        print(f"supernode-agent {cmd}: no admin token (pass --token-file)", file=sys.stderr)
    return bool(token_file)


def dispatch(args: argparse.Namespace) -> int:
    from agent.remediation.api import cli_approve, cli_close, cli_incidents, cli_journal, cli_maintenance

    if args.cmd == "journal" and args.db:
        return cli_journal(args.db, args.limit)
    url, token_file, state_dir = _from_config(args)
    if args.cmd == "incidents" and args.verb:
        if not args.id:
            print(f"supernode-agent incidents {args.verb}: which incident? (an ID from `incidents`)", file=sys.stderr)
            return 2
        return cli_close(url, args.verb, args.id, token_file) if _need_token("incidents", token_file) else 2
    if args.cmd == "incidents":
        return cli_incidents(url, token_file)
    if args.cmd == "approve":
        return cli_approve(url, args.id, token_file) if _need_token("approve", token_file) else 2
    if args.cmd == "maintenance":
        until = parse_until(args.until)
        if not _need_token("maintenance", token_file):
            return 2
        return cli_maintenance(url, args.state, args.node, until, token_file)
    return cli_journal(state_dir, args.limit)
