"""CLI verbs of remediation: `incidents [resolve|reject ID]`, `approve`, `journal`, `maintenance on|off|status`,
`report`.

`incidents` and `approve` talk to the running agent's API (the agent holds
the incidents and the pending approvals); `journal` and `report` read the
SQLite journal read-only, so they work even when the agent is down.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FORMATS = ("text", "json", "csv", "markdown")


def add_remediation_parsers(sub: argparse._SubParsersAction) -> None:
    inc = sub.add_parser("incidents", help="list open and recent incidents; `resolve ID` closes one and undoes its "
                         "actions, `reject ID` closes one and leaves its effects to a person")
    inc.add_argument("verb", nargs="?", choices=["resolve", "reject"], help="close an incident by hand")
    inc.add_argument("id", nargs="?", help="incident id (with resolve/reject)")
    inc.add_argument("--url", default=None, help="agent URL (default: from the config's listen address)")
    inc.add_argument("--token-file", default=None, help="admin token file (default: the config's admin_token)")
    ap = sub.add_parser("approve", help="approve a pending destructive step: by its id, or by incident id when "
                        "that incident has one pending step (several: they are listed; --all approves them all)")
    ap.add_argument("id")
    ap.add_argument("--all", action="store_true", help="approve every pending step of the incident (journaled as "
                    "all: true)")
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
    from agent.drill.cli_args import add_drill_parser

    add_drill_parser(sub)
    rp = sub.add_parser("report", help="goodput (availability, GPU-hours lost, jobs interrupted per cause) and MTBF "
                        "/ MTTR per component class, from the journal (read-only; works with the agent down)")
    rp.add_argument("--since", default="30d", help="window start: a duration back from now (30d, 12h, 90m) or an "
                    "ISO date or time (2026-11-01, 2026-11-01T08:00) (default %(default)s)")
    rp.add_argument("--db", action="append", default=None, help="journal database or state dir (default: the "
                    "config's state_dir); repeat it for the journals of several nodes (the rack's goodput). Without "
                    "a config the component counts, and so MTBF, are unknown")
    rp.add_argument("--format", choices=FORMATS, default=None, help="text (the default: reliability, then "
                    "goodput), json, csv (goodput per node and cause) or markdown (the contract view)")
    rp.add_argument("--json", action="store_true", help="the same as --format json")
    rp.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node for GPU-hours when no config "
                    "says (default: the config's inventory.gpus.count; neither: unknown)")


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


def duration_seconds(text: str) -> float | None:
    """`90m`, `2h`, `1d`, `30s` in seconds; None when the text is not such a duration."""
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)] if m else None


def parse_until(text: str | None, now: float | None = None) -> float | None:
    """`--until`: an ISO time (local time unless it names a zone) or a duration from now; epoch seconds."""
    import datetime
    import time

    if text is None:
        return None
    now = time.time() if now is None else now
    seconds = duration_seconds(text)
    if seconds is not None:
        return now + seconds
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise SystemExit(f"supernode-agent maintenance: --until {text!r}: not an ISO time or a duration "
                         "like 90m, 2h, 1d") from None


def parse_window(text: str, now: float | None = None) -> float:
    """`--since`: a duration back from now (30d, 12h, 90m, 3600s) or an ISO date or time (local time unless it
    names a zone), as the window's length in seconds."""
    import datetime
    import time

    now = time.time() if now is None else now
    seconds = duration_seconds(text)
    if seconds is None:
        try:
            seconds = now - datetime.datetime.fromisoformat(text.strip()).timestamp()
        except ValueError:
            seconds = None
    if not seconds or seconds <= 0:
        raise SystemExit(f"supernode-agent report: --since {text!r}: expected a duration like 30d, 12h, 90m or an ISO "
                         "date or time in the past like 2026-11-01 or 2026-11-01T08:00")
    return seconds


def cli_report(args: argparse.Namespace) -> int:
    """`report`: the journal's incidents as MTBF / MTTR per class (agent.reliability) and goodput (agent.goodput)."""
    import json
    import time

    from agent.config import ConfigError, load_config
    from agent.goodput import GoodputError, JournalRead, check_times, goodput_report, own_node
    from agent.goodput_format import format_csv, format_markdown, format_text
    from agent.reliability import component_counts, format_report, reliability_report

    now = time.time()
    window = parse_window(args.since, now)
    fmt = "json" if args.json else (args.format or "text")
    try:
        cfg = load_config(args.config).config
    except ConfigError as exc:
        if not args.db:
            raise SystemExit(f"supernode-agent report: {exc}\n(pass --db to read a journal without the config)")
        cfg = None
    paths = [Path(p) for p in args.db] if args.db else [cfg.agent.state_dir]  # type: ignore[union-attr]
    reads = []
    for i, path in enumerate(paths):
        entries = read_report_journal(path)
        if entries is None:
            return 1
        mine = own_node(entries) or (cfg.agent.node if cfg is not None and i == 0 else None)
        reads.append(JournalRead(entries, mine, str(path)))
    node, rack = (cfg.agent.node, cfg.agent.rack) if cfg else (reads[0].node or "this agent", "?")
    counts = component_counts(cfg.inventory) if cfg else None
    zones = {z.name: z.nodes for z in cfg.inventory.leak_zones} if cfg else {}
    gpus = args.gpus_per_node if args.gpus_per_node is not None else (cfg.inventory.gpus.count if cfg else None)
    try:  # the first journal is this agent's: its reliability, as before; goodput over every journal read
        for r in reads:
            check_times(r.entries)
        rep = reliability_report(reads[0].entries, counts, now - window, now, node, zones)
        good = goodput_report(reads, gpus, now - window, now, cfg.inventory.nodes if cfg else ())
    except GoodputError as exc:
        print(f"supernode-agent report: {exc}: no figure printed", file=sys.stderr)
        return 1
    if fmt == "json":
        print(json.dumps({**rep, "goodput": good}, indent=2))
    elif fmt == "csv":
        sys.stdout.write(format_csv(good))
    elif fmt == "markdown":
        sys.stdout.write(format_markdown(good, rep, node, rack))
    else:
        sys.stdout.write(format_report(rep, node, rack) + format_text(good))
    return 0


def read_report_journal(path: Path) -> list | None:
    """The rows for `report`: a journal that cannot be read, or a row whose detail is not JSON, is said (file and
    row) and gives no report, never a report without those rows."""
    import json
    import sqlite3

    from agent.remediation.api import read_journal

    try:
        return read_journal(path)
    except sqlite3.Error as exc:
        raise SystemExit(f"supernode-agent report: journal {path}: cannot be read: {exc}: no figure printed") from None
    except json.JSONDecodeError:
        db = path / "journal.db" if path.is_dir() else path
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            bad = []
            for seq, detail in con.execute("SELECT seq, detail FROM journal ORDER BY seq"):
                try:
                    json.loads(detail or "{}")
                except json.JSONDecodeError as err:
                    bad.append(f"seq {seq} ({err.msg})")
        finally:
            con.close()
        raise SystemExit(f"supernode-agent report: journal {path}: row {', '.join(bad[:5])}: detail is not JSON: "
                         "no figure printed") from None


def _need_token(cmd: str, token_file: str | None) -> bool:
    if not token_file:
        print(f"supernode-agent {cmd}: no admin token (pass --token-file)", file=sys.stderr)
    return bool(token_file)


def dispatch(args: argparse.Namespace) -> int:
    from agent.remediation.api import cli_approve, cli_close, cli_incidents, cli_journal, cli_maintenance

    if args.cmd == "report":
        return cli_report(args)
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
        return cli_approve(url, args.id, token_file, args.all) if _need_token("approve", token_file) else 2
    if args.cmd == "drill":
        from agent.drill.api import cli_drill

        return cli_drill(url, token_file, args.plan, args.allow_jobs, args.format, args.abort, args.wait)
    if args.cmd == "maintenance":
        until = parse_until(args.until)
        if not _need_token("maintenance", token_file):
            return 2
        return cli_maintenance(url, args.state, args.node, until, token_file)
    return cli_journal(state_dir, args.limit)
