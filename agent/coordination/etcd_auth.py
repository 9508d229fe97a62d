"""A rack's etcd users and roles: each node's agent may write only the keys that node must write.

Why: with one etcd identity for the whole rack, root on any one node owns every
other node's membership, facts and slots, and so the rack's safety path. Each
node gets its own user and role (both named `<rack>.<node>`):

- readwrite on its own keys only: `members/<node>`, `links/<node>` (its NVLink
  state vector: agent.coordination.link_vectors), `drill/<node>` (its fault
  drill document: agent/drill/records.py) and `facts/<job>/<node>` of
  every shared job of the inventory (agent.coordination.shared);
- readwrite on the keys the rack shares by design: the `leader` election key,
  the poller slots (`pollers/`: a slot is claimed by whoever is free to; what
  a slot may say is checked by its readers: a claim's value must be the
  claimer's node and its lease that node's member lease), and the rack state
  under `guard/`, `approvals/` and `maintenance/`;
- read on the rack's whole prefix (each agent mirrors it).

etcd cannot express "a value that names the writer", so the shared keys stay
writable by every node and their readers validate them; what etcd can enforce
(no node writes another node's member or fact key) it does.

One plan (`rack_roles`), two renderings: etcdctl argument lists for an
operator's script (`supernode-agent coordination etcd-roles`), and JSON-gateway
requests for the simulator's and the tests' etcd (agent/sim/etcd_cluster.py),
so what the tests run with is what the command prints.
"""

from __future__ import annotations

import base64
import os
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

from agent.coordination.etcd import prefix_end
from agent.coordination.shared import shared_devices

SHARED_KEYS = ("leader",)  # one key every member may write (the election; readers check its lease)
SHARED_PREFIXES = ("pollers/", "guard/", "approvals/", "maintenance/")  # rack state every member may write


@dataclass(frozen=True, slots=True)
class Permission:
    kind: Literal["read", "readwrite"]
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class NodeRole:
    node: str
    name: str  # the etcd user's and the role's name
    permissions: tuple[Permission, ...]


def user_name(rack: str, node: str) -> str:
    """The etcd user (and role) of one node's agent: the default of coordination.etcd.user."""
    return f"{rack}.{node}"


def rack_root(prefix: str, rack: str) -> str:
    return f"{prefix.rstrip('/')}/{rack}/"


def node_permissions(root: str, node: str, jobs: Iterable[str]) -> tuple[Permission, ...]:
    """What one node's agent may do under the rack's `root` (ending in /): its own keys and the shared ones."""
    own = [Permission("readwrite", f"{root}members/{node}"), Permission("readwrite", f"{root}links/{node}"),
           Permission("readwrite", f"{root}drill/{node}")]
    own += [Permission("readwrite", f"{root}facts/{job}/{node}") for job in sorted(set(jobs))]
    shared = [Permission("readwrite", root + k) for k in SHARED_KEYS]
    shared += [Permission("readwrite", root + p, prefix=True) for p in SHARED_PREFIXES]
    return (*own, *shared, Permission("read", root, prefix=True))


def rack_roles(inventory: Any, rack: str, prefix: str, nodes: Iterable[str] | None = None) -> list[NodeRole]:
    """One role per node of the inventory (or of `nodes`), each granting exactly that node's keys."""
    root = rack_root(prefix, rack)
    jobs = list(shared_devices(inventory).jobs)
    return [NodeRole(n, user_name(rack, n), node_permissions(root, n, jobs))
            for n in (list(nodes) if nodes is not None else list(inventory.nodes))]


# -- etcdctl -------------------------------------------------------------------------------------------------

ROOT_NOTE = ("once per etcd cluster, before these (etcdctl as root: ETCDCTL_USER=root, ETCDCTL_PASSWORD, "
             "ETCDCTL_ENDPOINTS, ETCDCTL_CACERT in the environment):")


def root_commands(password_file: Path) -> list[tuple[list[str], Path | None]]:
    """The cluster's root user (etcd warns without its root role); `auth enable` is the last command of all."""
    return [(["etcdctl", "user", "add", "root", "--interactive=false"], password_file),
            (["etcdctl", "user", "grant-role", "root", "root"], None)]


def etcdctl_commands(role: NodeRole, password_file: Path) -> list[tuple[list[str], Path | None]]:
    """(argv, file to give on stdin) of one node's role and user. The password is read from the file on stdin
    (`--interactive=false`), never put on a command line (where shell history and `ps` would show it)."""
    cmds: list[tuple[list[str], Path | None]] = [(["etcdctl", "role", "add", role.name], None)]
    for p in role.permissions:
        argv = ["etcdctl", "role", "grant-permission", role.name, p.kind, p.key]
        cmds.append((argv + ["--prefix=true"] if p.prefix else argv, None))
    cmds.append((["etcdctl", "user", "add", role.name, "--interactive=false"], password_file))
    cmds.append((["etcdctl", "user", "grant-role", role.name, role.name], None))
    return cmds


def script_line(argv: list[str], stdin: Path | None) -> str:
    """One shell line: the argument list quoted (shlex.join), the password file redirected to stdin."""
    return shlex.join(argv) + (f" < {shlex.quote(str(stdin))}" if stdin is not None else "")


def write_password(path: Path) -> bool:
    """A new random password in `path` (mode 0600), unless the file exists (kept: running again changes
    nothing a node already uses). True when written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")
    return True


# -- JSON gateway (the simulator's and the tests' etcd) ------------------------------------------------------

def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def gateway_requests(role: NodeRole, password: str) -> list[tuple[str, dict[str, Any]]]:
    """(path under /v3/, body) of the same role and user as `etcdctl_commands`, for etcd's JSON gateway."""
    reqs: list[tuple[str, dict[str, Any]]] = [("auth/role/add", {"name": role.name})]
    for p in role.permissions:
        perm = {"permType": p.kind.upper(), "key": _b64(p.key)}
        if p.prefix:
            perm["range_end"] = _b64(prefix_end(p.key))
        reqs.append(("auth/role/grant", {"name": role.name, "perm": perm}))
    reqs.append(("auth/user/add", {"name": role.name, "password": password}))
    reqs.append(("auth/user/grant", {"user": role.name, "role": role.name}))
    return reqs
