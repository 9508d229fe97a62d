"""Issue 16: the engine's judgement in a cluster that looks like production, with the real daemon and Slurm.

Other racks with drained nodes (extra nodes in the private Slurm), Slurm
unreachable (sinfo/scontrol wrappers that fail while a flag file exists),
agents restarted and reloaded mid-incident, a person's maintenance.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.demo import agent_config
from tests.agentproc import running_agent
from tests.helpers import REPO, free_port, require_binary, wait_for
from tests.simrack import sim_rack
from tests.slurm import SlurmCluster

TOKEN = "token-for-tests"
RACK = ["node01", "node02"]      # the simulated rack (its inventory)
OTHER_RACK = ["node03", "node04"]  # another rack in the same Slurm cluster


@pytest.fixture(scope="module")
def cluster():
    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo"):
        require_binary(b)
    c = SlurmCluster(names=RACK + OTHER_RACK).start()
    yield c
    c.cleanup()


@pytest.fixture
def clean_cluster(cluster):
    yield cluster
    for n in RACK + OTHER_RACK:
        cluster.scontrol("update", f"NodeName={n}", "State=RESUME")


def _tokens(tmp_path: Path) -> None:
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")


def _journal(agent, **match: str) -> list[dict]:
    status, body = agent.get("/api/v1/journal?limit=2000", token=TOKEN)
    assert status == 200, body
    return [e for e in json.loads(body)["entries"] if all(e.get(k) == v for k, v in match.items())]


def _incidents(agent) -> dict:
    status, body = agent.get("/api/v1/incidents", token=TOKEN)
    assert status == 200, body
    return json.loads(body)


def _reason(cluster: SlurmCluster, node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%E"], capture_output=True, text=True,
                         env=cluster.env, timeout=10)
    return out.stdout.strip()


# -- 1: blast radius counts only this rack's nodes --------------------------------------------------


def test_other_racks_drained_nodes_do_not_block_this_racks_drain(clean_cluster, tmp_path):
    cluster = clean_cluster
    for n in OTHER_RACK:  # another rack under maintenance: two drained nodes the agent must not count
        assert cluster.scontrol("update", f"NodeName={n}", "State=DRAIN", "Reason=rack r02 pump swap").returncode == 0
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        _tokens(tmp_path)
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=cluster.conf)
        cfg["remediation"]["guardrails"].update(max_drained_nodes=1, max_drained_fraction=1.0, cooldown_seconds=0)
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("xid", node="node01", gpu=0, code=79)
            wait_for(lambda: cluster.states().get("node01") in ("drained", "draining"), 30,
                     what=f"node01 drained (journal: {_journal(agent, kind='blocked')})")
            assert _reason(cluster, "node01").startswith("supernode-agent:")
            assert not _journal(agent, kind="blocked", action="drain")
            # A person drains node02 (this rack): now a second drain in the rack is over max_drained_nodes=1,
            # and the block names the rack's nodes it counted, not the other rack's.
            assert cluster.scontrol("update", "NodeName=node01", "State=RESUME").returncode == 0
            assert cluster.scontrol("update", "NodeName=node02", "State=DRAIN", "Reason=bob: fan").returncode == 0
            status, _ = agent.request("POST", "/api/v1/incidents/" + _incidents(agent)["open"][0]["id"] + "/reject",
                                      token=TOKEN)
            assert status == 200
            rack.inject("gpu-lost", node="node01", gpu=1)
            rows = wait_for(lambda: _journal(agent, kind="blocked", action="drain"), 30, what="drain blocked")
            why = rows[0]["detail"]["why"]
            assert rows[0]["detail"]["guardrail"] == "blast_radius"
            assert "node02" in why and "max_drained_nodes is 1" in why
            assert not any(n in why for n in OTHER_RACK), why
            assert cluster.states()["node01"] == "idle"


# -- 3: Slurm unreachable is a blocked, retried step; the rest of the playbook still runs ---------------


def _failing_wrapper(path: Path, real: str, flag: Path) -> str:
    path.write_text(f"#!/bin/sh\nif [ -e '{flag}' ]; then echo 'slurm_load_partitions: Unable to contact slurm "
                    f"controller (connect failure)' >&2; exit 1; fi\nexec '{real}' \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_slurm_unreachable_blocks_the_drain_retries_it_and_the_leak_playbook_goes_on(clean_cluster, tmp_path):
    cluster = clean_cluster
    flag = tmp_path / "slurm-down"
    flag.write_text("")
    sinfo = _failing_wrapper(tmp_path / "sinfo", require_binary("sinfo"), flag)
    scontrol = _failing_wrapper(tmp_path / "scontrol", require_binary("scontrol"), flag)
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        _tokens(tmp_path)
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=cluster.conf)
        cfg["remediation"]["slurm"].update(sinfo=sinfo, scontrol=scontrol)
        cfg["remediation"]["guardrails"].update(retry_backoff_seconds=0.2, scheduler_retry_max_seconds=1.0)
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("leak", zone="zone-a")
            gpus = rack.sim.model.nodes["node01"].gpus
            wait_for(lambda: all(g.power_limit_mw == g.min_limit_mw for g in gpus), 20, what="zone GPUs capped")
            # Independent steps happen although the drain cannot: the valve waits for approval, notify says
            # it is not configured, and the drain is blocked with its reason, retried.
            pending = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"] if p["action"] == "cdu_write"],
                               20, what="valve close pending approval")
            assert agent.request("POST", f"/api/v1/incidents/{pending[0]['id']}/approve", token=TOKEN)[0] == 200
            wait_for(lambda: rack.sim.model.coolant.valve_open["zone-a"] is False, 20, what="valve closed")
            wait_for(lambda: _journal(agent, action="notify", result="not_configured"), 20, what="notify recorded")
            blocked = wait_for(lambda: len(_journal(agent, kind="blocked", action="drain")) >= 2 and
                               _journal(agent, kind="blocked", action="drain"), 20, what="drain blocked, retried")
            assert {b["detail"]["guardrail"] for b in blocked} == {"scheduler_unreachable"}
            assert "Unable to contact slurm controller" in blocked[0]["detail"]["why"]
            assert "retry in" in blocked[0]["detail"]["why"]
            assert cluster.states()["node01"] == "idle"
            flag.unlink()  # slurmctld answers again: the retry drains the node
            wait_for(lambda: _journal(agent, kind="result", action="drain", result="done"), 30, what="drain done")
            assert cluster.states().get("node01") in ("drained", "draining")
            assert "Traceback" not in agent.log()
            log = agent.log()
            assert re.search(r'event="drain blocked".*guardrail=scheduler_unreachable', log), log[-3000:]
