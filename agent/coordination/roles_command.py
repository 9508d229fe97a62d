"""`supernode-agent coordination etcd-roles`: a rack's etcd users and roles, as an etcdctl script or JSON.

Why a command: the least-privilege layout (agent.coordination.etcd_auth) has one
role per node and a dozen grants each; written by hand for 18 nodes it drifts
from the keys the agents really write. The command reads the same rack file
the agents load, so a device added to the rack adds its fact keys to every role.

Passwords never appear on a command line (shell history, `ps`): each `user add`
reads its password on stdin from a file (`--interactive=false < FILE`). The
command invents no secret unless asked: with `--password-dir DIR` it writes one
random password file per node that has none yet (mode 0600, kept on later runs);
without it the script reads files the operator provides.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agent.coordination.etcd_auth import (ROOT_NOTE, etcdctl_commands, rack_roles, root_commands, script_line,
                                          write_password)

AUTH_ENABLE = ["etcdctl", "auth", "enable"]


class RolesError(Exception):
    """The rack file or an option cannot be used; the message names it."""


def add_parser(sub: Any) -> None:
    co = sub.add_parser("coordination", help="rack coordination over etcd: its users and roles")
    cs = co.add_subparsers(dest="coordination_cmd", required=True)
    er = cs.add_parser("etcd-roles", help="the etcd users and roles of a rack (one per node, least privilege), "
                                          "as an etcdctl script or JSON")
    er.add_argument("--rack", required=True, type=Path, help="the rack file (rack: and inventory:) the agents load")
    er.add_argument("--rack-name", help="the rack's name (default: the rack file's rack:)")
    er.add_argument("--prefix", default="/supernode-agent", help="coordination.etcd.prefix (default %(default)s)")
    er.add_argument("--password-dir", type=Path, help=(
        "write a random password file per node here (<user>.password, mode 0600; an existing one is kept); "
        "default: the script reads ./<user>.password, which you provide"))
    er.add_argument("--format", choices=("script", "json"), default="script")


def run(args: argparse.Namespace) -> int:
    try:
        rack, inventory = _load_rack(args.rack, args.rack_name)
        plan = build_plan(inventory, rack, args.prefix, args.password_dir)
    except RolesError as exc:
        print(f"supernode-agent coordination etcd-roles: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        json.dump(plan, sys.stdout, indent=2)
        print()
    else:
        sys.stdout.write(render_script(plan))
    return 0


def _load_rack(path: Path, name: str | None) -> tuple[str, Any]:
    from pydantic import ValidationError

    from agent.config import MAX_CONFIG_BYTES, Inventory
    from agent.rack_file import RackFileError, with_rack_file
    from exporters.validation import error_lines

    try:
        data, _ = with_rack_file({"inventory_file": str(path)}, None, MAX_CONFIG_BYTES)
    except RackFileError as exc:
        raise RolesError(str(exc)) from None
    rack = name or data.get("agent", {}).get("rack")
    if not rack:
        raise RolesError(f"{path}: no rack: in the rack file; give --rack-name")
    try:
        inventory = Inventory.model_validate(data["inventory"])
    except ValidationError as err:
        raise RolesError(error_lines(err, f"{path}: invalid inventory", show_input=True)) from None
    if not inventory.nodes:
        raise RolesError(f"{path}: inventory.nodes is empty: no node to make a user for")
    return str(rack), inventory


def build_plan(inventory: Any, rack: str, prefix: str, password_dir: Path | None) -> dict[str, Any]:
    """The JSON form of the script: root's note, each node's user, role, grants and commands, `auth enable`."""
    if password_dir is not None:
        try:
            password_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise RolesError(f"--password-dir {str(password_dir)!r}: {exc.strerror or exc}") from None
    where = password_dir if password_dir is not None else Path(".")
    nodes = []
    for role in rack_roles(inventory, rack, prefix):
        pw_file = where / f"{role.name}.password"
        made = False
        if password_dir is not None:
            try:
                made = write_password(pw_file)
            except OSError as exc:
                raise RolesError(f"--password-dir: cannot write {str(pw_file)!r}: {exc.strerror or exc}") from None
        nodes.append({"node": role.node, "user": role.name, "role": role.name,
                      "permissions": [{"kind": p.kind, "key": p.key, "prefix": p.prefix} for p in role.permissions],
                      "password_file": str(pw_file), "password_written": made,
                      "commands": [{"argv": argv, "stdin": str(stdin) if stdin else None}
                                   for argv, stdin in etcdctl_commands(role, pw_file)]})
    root_pw = where / "root.password"
    return {"rack": rack, "prefix": prefix.rstrip("/"),
            "root": {"note": ROOT_NOTE, "commands": [{"argv": argv, "stdin": str(stdin) if stdin else None}
                                                     for argv, stdin in root_commands(root_pw)]},
            "nodes": nodes,
            "finally": {"note": "once per etcd cluster, after every rack's roles exist", "commands": [
                {"argv": AUTH_ENABLE, "stdin": None}]},
            "agent_config": ("each node: secrets.etcd_password.file = that node's password file, "
                             "coordination.etcd.password_secret: etcd_password (user defaults to <rack>.<node>), "
                             "coordination.etcd.tls.ca_file = the CA of etcd's certificates")}


def _line(cmd: dict[str, Any]) -> str:
    return script_line(cmd["argv"], Path(cmd["stdin"]) if cmd["stdin"] else None)


def render_script(plan: dict[str, Any]) -> str:
    """A shell script: one etcdctl command a line, argument lists quoted with shlex.join."""
    out = ["#!/bin/sh",
           f"# etcd users and roles of rack {plan['rack']} under {plan['prefix']}/{plan['rack']}/ "
           "(supernode-agent coordination etcd-roles)",
           f"# root: {plan['root']['note']}"]
    out += [f"#   {_line(c)}" for c in plan["root"]["commands"]]
    out += [f"# then: {plan['finally']['note']}:"] + [f"#   {_line(c)}" for c in plan["finally"]["commands"]]
    out += [f"# {plan['agent_config']}", "set -e"]
    for node in plan["nodes"]:
        out.append(f"# {node['node']}: may write only its own member and fact keys and the rack's shared keys")
        out += [_line(c) for c in node["commands"]]
    return "\n".join(out) + "\n"
