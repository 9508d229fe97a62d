"""Least privilege in etcd: each node's agent authenticates as its own user, which may write only its own keys.

The roles come from one plan (agent.coordination.etcd_auth), printed by `supernode-agent coordination
etcd-roles` and applied by the test etcd itself; here a real etcd runs with auth and TLS and a short token
TTL, real agents connect to it, and node02's credentials are tried on node03's keys through the agent's own
client and through etcdctl running the command's script.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from agent.cli import main
from agent.config import parse_config
from agent.coordination.etcd import EtcdAuthError, EtcdClient
from agent.coordination.etcd_rack import EtcdCoordinator
from agent.coordination.shared import shared_devices
from tests.agentproc import AgentProcess
from tests.coordination_rack import TOKEN, coordinated_config, is_up, metric
from tests.etcd import running_etcd
from tests.helpers import await_for, require_binary, wait_for
from sim.harness import SimRack

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "rack18" / "rack.yaml"
EXAMPLE_JOBS = ("cdu/cdu1", "leak/cdu1", "leak/leak1", "pdu/pdu-a", "pdu/pdu-b")  # its CDU, leak controller, PDUs
SHARED = {("leader", False), ("pollers/", True), ("guard/", True), ("approvals/", True), ("maintenance/", True)}
TOKEN_TTL = 2  # etcd --auth-token-ttl: an idle token is forgotten after 2 s, so the agents re-authenticate often
PREFIX = "/supernode-test"


def _covers(perm: dict, key: str) -> bool:
    return key.startswith(perm["key"]) if perm["prefix"] else key == perm["key"]


def _roles(capsys, *args: str) -> str:
    assert main(["coordination", "etcd-roles", *args]) == 0
    return capsys.readouterr().out


def test_each_node_role_grants_exactly_its_own_member_and_fact_keys(tmp_path, capsys):
    plan = json.loads(_roles(capsys, "--rack", str(EXAMPLE), "--format", "json"))
    root = "/supernode-agent/r01/"
    nodes = yaml.safe_load(EXAMPLE.read_text())["inventory"]["nodes"]
    assert [n["node"] for n in plan["nodes"]] == nodes
    for entry in plan["nodes"]:
        node = entry["node"]
        assert entry["user"] == entry["role"] == f"r01.{node}"
        writes = [p for p in entry["permissions"] if p["kind"] == "readwrite"]
        own = {(f"members/{node}", False), (f"links/{node}", False), (f"drill/{node}", False)} | {
            (f"facts/{job}/{node}", False) for job in EXAMPLE_JOBS}
        assert {(p["key"][len(root):], p["prefix"]) for p in writes} == own | SHARED, node
        assert [(p["key"], p["prefix"]) for p in entry["permissions"] if p["kind"] == "read"] == [(root, True)]
        for other in nodes:
            if other == node:
                continue
            for key in [f"{root}members/{other}", f"{root}links/{other}", f"{root}drill/{other}"] + [
                    f"{root}facts/{job}/{other}" for job in EXAMPLE_JOBS]:
                assert not any(_covers(p, key) for p in writes), (node, key)


def test_the_script_reads_passwords_from_0600_files_never_from_its_command_lines(tmp_path, capsys):
    pw = tmp_path / "pw"
    script = _roles(capsys, "--rack", str(EXAMPLE), "--password-dir", str(pw))
    files = sorted(pw.iterdir())
    assert [f.name for f in files] == [f"r01.node{i:02d}.password" for i in range(1, 19)]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    passwords = {f: f.read_text() for f in files}
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    assert commands[0] == "set -e"
    for line in commands[1:]:
        argv, _, stdin = line.partition(" < ")
        parts = shlex.split(argv)
        assert parts[0] == "etcdctl", line
        if parts[1:3] == ["user", "add"]:
            assert "--interactive=false" in parts and Path(shlex.split(stdin)[0]) in passwords, line
        assert not any(p.strip() in line for p in passwords.values()), line
    _roles(capsys, "--rack", str(EXAMPLE), "--password-dir", str(pw))  # again: the passwords nodes use are kept
    assert {f: f.read_text() for f in files} == passwords


# -- a real etcd with auth and TLS, real agents -----------------------------------------------------------------

class Rack:
    def __init__(self, etcd, sim, base: Path, good: AgentProcess, wrong: AgentProcess):
        self.etcd, self.sim, self.base, self.good, self.wrong = etcd, sim, base, good, wrong
        self.root = f"{PREFIX}/{sim.sim.model.rack}/"

    def config(self, node: str, work: Path) -> dict:
        work.mkdir(parents=True, exist_ok=True)
        return coordinated_config(self.sim.sim, node, work, self.etcd.endpoints)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    yield from running_etcd(tmp_path_factory.mktemp("etcd-auth"), 1, token_ttl=TOKEN_TTL)


@pytest.fixture(scope="module")
def rack(tmp_path_factory, etcd):
    base = tmp_path_factory.mktemp("rack-auth")
    sim = SimRack(base, nodes=3, gpus=1).start()
    agents: list[AgentProcess] = []
    try:
        for node in ("node01", "node02"):
            work = base / node
            work.mkdir()
            cfg = coordinated_config(sim.sim, node, work, etcd.endpoints)
            if node == "node02":  # node02's agent: a wrong password
                (work / "etcd.password").write_text("not-node02s-password\n")
            agents.append(AgentProcess(cfg, work).start())
        wait_for(lambda: is_up(agents[0]), 60, what="node01 coordinating as its own etcd user")
        yield Rack(etcd, sim, base, *agents)
    finally:
        for a in agents:
            a.stop()
        sim.stop()


def _leak_job(cfg: dict) -> str:
    return next(j for j in sorted(shared_devices(parse_config(cfg).config.inventory).jobs) if j.startswith("leak/"))


def test_node02_may_write_its_own_keys_but_not_node03s_through_the_agents_client(rack, tmp_path):
    cfg = rack.config("node02", tmp_path / "node02")
    job = _leak_job(cfg)
    client = EtcdCoordinator(parse_config(cfg)).client  # the client node02's agent builds from its config

    async def run() -> list[str]:
        refused = []
        try:
            await client.put(f"{rack.root}facts/{job}/node02", "{}")
            await client.delete(f"{rack.root}facts/{job}/node02")
            await client.put(f"{rack.root}links/node02", "{}")  # its own NVLink vector (issue 34)
            await client.delete(f"{rack.root}links/node02")
            for key in (f"{rack.root}facts/{job}/node03", f"{rack.root}members/node03", f"{rack.root}links/node03"):
                with pytest.raises(EtcdAuthError) as exc:
                    await client.put(key, "node03")
                refused.append(str(exc.value))
        finally:
            await client.close()
        return refused

    refused = asyncio.run(run())
    user = f"{rack.sim.sim.model.rack}.node02"
    assert len(refused) == 3 and all("permission denied" in r and user in r for r in refused), refused
    assert rack.etcd.get(f"{rack.root}facts/{job}/node03") is None
    assert rack.etcd.get(f"{rack.root}members/node03") is None


def test_etcdctl_running_the_commands_script_refuses_node02_on_node03s_keys_and_anyone_anonymous(rack, tmp_path):
    """The command's own script, run with etcdctl as root, makes users that etcd holds to their keys."""
    etcdctl = require_binary("etcdctl")
    cfg = rack.config("node02", tmp_path / "cfg")
    (tmp_path / "rack.yaml").write_text(yaml.safe_dump({"rack": "scripted", "inventory": cfg["inventory"]}))
    made = subprocess.run([sys.executable, "-m", "agent.cli", "coordination", "etcd-roles", "--rack",
                           str(tmp_path / "rack.yaml"), "--prefix", "/scripted", "--password-dir", str(tmp_path / "pw")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert made.returncode == 0, made.stderr
    (tmp_path / "roles.sh").write_text(made.stdout)
    base_env = dict(os.environ, ETCDCTL_API="3", ETCDCTL_ENDPOINTS=",".join(rack.etcd.endpoints),
                    ETCDCTL_CACERT=str(rack.etcd.ca_file))
    applied = subprocess.run(["sh", str(tmp_path / "roles.sh")], capture_output=True, text=True, timeout=120,
                             env=dict(base_env, ETCDCTL_USER="root", ETCDCTL_PASSWORD=rack.etcd.root_password))
    assert applied.returncode == 0, applied.stderr[-2000:]

    job = _leak_job(cfg)
    node02 = dict(base_env, ETCDCTL_USER="scripted.node02",
                  ETCDCTL_PASSWORD=(tmp_path / "pw" / "scripted.node02.password").read_text().strip())

    def put(env: dict, key: str) -> subprocess.CompletedProcess:
        return subprocess.run([etcdctl, "put", key, "v"], capture_output=True, text=True, timeout=30, env=env)

    own = put(node02, f"/scripted/scripted/facts/{job}/node02")
    assert own.returncode == 0, own.stderr
    for key in (f"/scripted/scripted/facts/{job}/node03", "/scripted/scripted/members/node03"):
        other = put(node02, key)
        assert other.returncode != 0 and "permission denied" in other.stderr, (key, other.stderr)
    anonymous = put(base_env, "/scripted/scripted/leader")
    assert anonymous.returncode != 0 and "user name is empty" in anonymous.stderr, anonymous.stderr
    assert rack.etcd.get(f"/scripted/scripted/facts/{job}/node03") is None
    assert rack.etcd.get("/scripted/scripted/leader") is None


def test_an_anonymous_client_is_refused(rack):
    async def run() -> str:
        client = EtcdClient(rack.etcd.endpoints, 2.0, parse_config(rack.config("node03", rack.base / "anon"))
                            .config.coordination.etcd.tls)
        try:
            with pytest.raises(EtcdAuthError) as exc:
                await client.put(f"{rack.root}leader", "node03")
            return str(exc.value)
        finally:
            await client.close()

    assert "user name is empty" in asyncio.run(run())
    assert rack.etcd.get(f"{rack.root}leader") != b"node03"


def test_a_wrong_password_degrades_the_agent_with_an_error_naming_its_user(rack):
    user = f"{rack.sim.sim.model.rack}.node02"

    def why() -> str:
        status, body = rack.wrong.get("/api/v1/status", token=TOKEN)
        return json.loads(body)["coordination"]["why"] if status == 200 else ""

    reason = wait_for(lambda: "authentication failed" in (w := why()) and w, 60, what="node02 says why it is degraded")
    assert user in reason, reason
    assert metric(rack.wrong, "supernode_coordination_up", backend="etcd") == 0
    assert rack.wrong.proc is not None and rack.wrong.proc.poll() is None  # degraded, not crashed
    assert rack.etcd.get(f"{rack.root}members/node02") is None
    assert is_up(rack.good)


def _token_refused(etcd, token: str) -> bool:
    req = urllib.request.Request(f"{etcd.endpoints[0]}/v3/kv/range", method="POST", headers={"Authorization": token},
                                 data=json.dumps({"key": base64.b64encode(b"/").decode()}).encode())
    try:
        with urllib.request.urlopen(req, timeout=5, context=ssl.create_default_context(cafile=str(etcd.ca_file))):
            return False
    except urllib.error.HTTPError as exc:
        return exc.code == 401 and b"invalid auth token" in exc.read()


def test_an_expired_token_is_replaced_by_authenticating_again(rack, tmp_path):
    cfg = rack.config("node02", tmp_path / "node02")
    key = f"{rack.root}facts/{_leak_job(cfg)}/node02"
    client = EtcdCoordinator(parse_config(cfg)).client

    async def run() -> int:
        try:
            await client.put(key, "{}")
            stale = client._token
            assert stale and client.authentications == 1
            # each probe uses the token, and a use renews it: probe less often than the TTL
            await await_for(lambda: _token_refused(rack.etcd, stale), 30, interval=2 * TOKEN_TTL + 1,
                            what=f"etcd forgets the idle token (--auth-token-ttl {TOKEN_TTL})")
            await client.put(key, "{}")
            await client.delete(key)
            return client.authentications
        finally:
            await client.close()

    assert asyncio.run(run()) == 2


def test_an_agent_goes_on_after_etcd_restarts_and_forgets_every_token(rack):
    """A restarted member knows no token: the running agent authenticates again and keeps publishing."""
    job = _leak_job(rack.good.config)
    key = f"{rack.root}facts/{job}/node01"

    def revision() -> int:
        kvs = rack.etcd._range(key)
        return int(kvs[0]["mod_revision"]) if kvs else 0

    first = wait_for(revision, 60, what=f"node01 publishing {job}")
    wait_for(lambda: revision() > first, 60, what="node01 publishing again and again")
    member = rack.etcd.members[0]
    member.stop()
    member.start()
    wait_for(lambda: rack.etcd.healthy(member), 60, what="etcd back")
    restarted = revision()
    wait_for(lambda: revision() > restarted, 60, what="node01 publishing after etcd forgot its token")
    wait_for(lambda: is_up(rack.good), 60, what="node01 coordinating again")
