"""`supernode-sim demo`: a simulated rack and one real agent process per node, in enforce mode.

The agents are the same daemon an operator runs, started as subprocesses
with generated configs that point at the simulator's devices; only NVML is
replaced (by the twin), because there is no GPU here.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from agent.httpclient import request_json
from agent.memory import daemon_env
from sim.cli import gpu_reset_command
from sim.server import Simulator
from sim.ports import free_port


def agent_config(sim: Simulator, node: str, port: int, workdir: Path, mode: str = "enforce",
                 slurm_conf: Path | None = None, agent_urls: dict[str, str] | None = None,
                 etcd_endpoints: list[str] | None = None) -> dict[str, Any]:
    """The config of one demo agent: its identity, the rack inventory and the simulator's endpoints;
    `agent_urls` (node -> URL) lets its status page show the other nodes from their agents.

    With `etcd_endpoints` the agents coordinate (leader, two pollers per shared device, rack-wide
    guardrails); a large rack polls its own GPUs and ports less often, so 18 agents fit on 2 cores."""
    model = sim.model
    gpus = len(model.nodes[node].gpus)
    cfg: dict[str, Any] = {
        "agent": {"rack": model.rack, "node": node, "role": "compute", "mode": mode,
                  "state_dir": str(workdir / node / "state")},
        "listen": {"address": "127.0.0.1", "port": port},
        "inventory": {"nodes": list(model.nodes), "gpus": {"count": gpus,
                                                            "nvlinks_per_gpu": model.nodes[node].gpus[0].nvlink_count}},
        "sources": {"nvml": {"backend": "sim", "sim_url": sim.url, "interval": 1.0, "timeout": 1.0}},
        "secrets": {"admin_token": {"file": str(workdir / "admin.token")},
                    "webhook_token": {"file": str(workdir / "webhook.token")}},
    }
    from sim.device_set import demo_inventory

    demo_inventory(sim, node, cfg)
    if agent_urls:
        cfg["inventory"]["agent_urls"] = dict(agent_urls)
    from exporters.cooling.modbus_profile import load_profile

    # The BACnet reference CDU names its valves as the Modbus one does (zone_valve_N): one valve map either way.
    valve_cdu1 = any(c["name"] == "cdu1" and c.get("protocol", "modbus") in ("modbus", "bacnet")
                     for c in cfg["inventory"].get("cdus", []))
    valves = {p.name for p in load_profile("reference-cdu").expanded() if p.name.startswith("zone_valve_")
              } if valve_cdu1 else set()  # an SNMP or Redfish-only rack has no writable zone valve on cdu1
    for i, zone in enumerate(cfg["inventory"].get("leak_zones", [])):
        if f"zone_valve_{i + 1}" in valves:  # the reference CDU isolates two zones; a larger rack's others have none
            zone["valve"] = f"cdu1:zone_valve_{i + 1}"
    redfish_inventory(sim, cfg)
    cfg["remediation"] = {
        "slurm": ({"backend": "slurm", "slurm_conf": str(slurm_conf)} if slurm_conf else {"backend": "simulated"}),
        # A demo rack of two nodes: let a leak drain either; act quickly so the story is visible.
        "guardrails": {"max_drained_fraction": 1.0, "max_drained_nodes": len(model.nodes), "cooldown_seconds": 5},
        # no nvidia-smi here: the recovery ladder resets a GPU of the twin through the simulator's own CLI
        "gpu_recovery": {"gpu_reset_command": gpu_reset_command(sim.url)},
        # the leak story's dry hold in seconds, not the shipped 15 minutes: the approvals show within the tour
        "leak_scope": {"dry_hold_seconds": 5.0},
    }
    if etcd_endpoints:
        cfg["coordination"] = {"backend": "etcd", "etcd": {"endpoints": list(etcd_endpoints)}}
    if len(model.nodes) > 4:  # an NVL72-class rack on one small machine: the node-local sources slower
        cfg["sources"]["nvml"].update(interval=3.0, timeout=2.0)
        cfg["sources"]["links"] = {"interval": 5.0, "timeout": 2.0}
        cfg["sources"]["dom"] = dict(cfg["sources"].get("dom", {}), interval=60.0, timeout=20.0)
    tree_root = cfg["sources"].get("sysfs_root")
    if tree_root:  # the simulator's stand-in for `ip` and `ibportstate` acts on its link tree
        shim = [sys.executable, "-m", "sim.link_shim", str(tree_root)]
        cfg["remediation"]["link_control"] = {"ip": shim, "ibportstate": shim}
    return cfg


def demo_cold_plates(cfg: dict[str, Any]) -> None:
    """The demo's cold-plate and tray-flow detectors (issue 35), quick enough that `inject cold-plate-fouling`
    opens its incident within two minutes: R computed every 2 s, 10 s after the load gate opens, smoothed over
    10 s, a baseline learnt in a minute, and cold_plate_degraded held 30 s (shipped: 30 s, 60 s, 1 h, 5 min).
    tray_flow_low compares the trays an agent reads: one peer is enough on a demo of two trays, on an agent that
    reads every tray (sources.redfish.watch_rack_trays, left off here: it also hands the leader every tray's leak
    detectors, which the tour's tray-leak story does not expect)."""
    cfg["sources"]["thermal_resistance"] = {"interval": 2.0, "timeout": 2.0, "settle_seconds": 10.0,
                                            "smoothing_seconds": 10.0, "baseline_learn_seconds": 60.0}
    cfg["remediation"].setdefault("detectors", {}).update(
        cold_plate_degraded={"fire_seconds": 30.0, "clear_seconds": 30.0},
        tray_flow_low={"fire_seconds": 10.0, "clear_seconds": 30.0}, tray_flow_min_peers=1)


async def _keep_jobs(slurm: Any, sim_url: str, jobdir: Path, every: float = 2.0) -> None:
    """One demo job (sim/demo_job.py) on every idle node of the demo's Slurm, as a busy cluster has: the GPUs
    are busy while it runs, so a GPU reset waits for the drain's checkpoint signal to end it, and a node back
    in service gets a new job. A node without a job has idle GPUs (a job killed before its own cleanup too);
    nodes drained, rebooting or down get no new job."""
    jobdir.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parent.parent
    while True:
        try:
            states = await asyncio.to_thread(slurm.states)
            queue = await asyncio.to_thread(subprocess.run, ["squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%N"],
                                            capture_output=True, text=True, env=slurm.env, timeout=20)
            busy = set(queue.stdout.split()) if queue.returncode == 0 else set(states)
            for node, state in states.items():
                if node not in busy:
                    # no job on it (one killed before it could say so included): its GPUs are idle
                    await asyncio.to_thread(request_json, "POST", f"{sim_url}/api/v1/inject",
                                            {"kind": "workload", "params": {"node": node, "ratio": "0"}})
                if state.rstrip("*") != "idle":
                    continue
                script = jobdir / f"{node}.sh"
                script.write_text(f"#!/bin/sh\ncd '{repo}'\nexec '{sys.executable}' -m sim.demo_job --sim '{sim_url}' "
                                  f"--node '{node}'\n")
                script.chmod(0o755)
                await asyncio.to_thread(subprocess.run, ["sbatch", "-w", node, "-J", f"demo-{node}", "-o",
                                                         str(jobdir / f"{node}-%j.out"), str(script)],
                                        capture_output=True, env=slurm.env, timeout=20)
        except (OSError, subprocess.SubprocessError) as exc:  # Slurm busy: the next round tries again
            print(f"demo jobs: {exc}", file=sys.stderr)
        await asyncio.sleep(every)


def redfish_inventory(sim: Simulator, cfg: dict[str, Any]) -> None:
    """Every tray's BMC and the Redfish CDU the simulator serves, trusted through its run's CA, with its account.

    Each agent reads its own tray (a leak there drains and caps that node at once, and asks to power the tray
    off), the rack's Redfish CDU and its NVLink switch trays (inventory.switch_trays: shared devices, whose leak
    drains and caps their zone's nodes); the events arrive over SSE, so a tray leak acts within a fraction of a
    second.
    """
    rf = sim.redfish()
    if not rf:
        return
    cfg["secrets"]["redfish"] = {"file": rf["password_file"]}
    account = {"user": rf["username"], "password_secret": "redfish", "ca_file": rf["ca_file"]}
    switches = rf.get("switches", {})
    cfg["inventory"]["redfish"] = (
        [{"name": f"bmc-{node}", "kind": "tray", "node": node, "url": url, **account}
         for node, url in rf["bmcs"].items()]
        + [{"name": sw["bmc"], "kind": "switch", "url": sw["url"], **account} for sw in switches.values()]
        + [{"name": name, "kind": "cdu", "url": url, **account} for name, url in rf["cdus"].items()])
    cfg["inventory"]["switch_trays"] = [{"name": name, "chips": sw["chips"], "zone": sw["zone"], "bmc": sw["bmc"]}
                                        for name, sw in switches.items()]
    cfg["inventory"].update(demo_rack_units(list(sim.model.nodes), list(switches)))
    cfg["sources"]["redfish"] = {"interval": 2.0, "timeout": 1.5}


def demo_rack_units(nodes: list[str], switch_trays: list[str]) -> dict[str, Any]:
    """`rack_units` as a GB200 NVL72 places its trays (exporters/profiles/racks/gb200-nvl72.yaml): the demo's
    compute trays from the top, its switch trays between them; nothing for a rack larger than an NVL72."""
    from exporters.safe_yaml import load_yaml_file

    layout = load_yaml_file(Path(__file__).resolve().parent.parent / "exporters" / "profiles" / "racks"
                            / "gb200-nvl72.yaml", "rack elevation")
    if len(nodes) > len(layout["compute"]) or len(switch_trays) > len(layout["switch"]):
        return {}
    return {"rack_units": {**dict(zip(nodes, layout["compute"])), **dict(zip(switch_trays, layout["switch"]))}}


def _write_tokens(workdir: Path) -> None:
    for name in ("admin.token", "webhook.token"):
        path = workdir / name
        path.write_text(secrets.token_urlsafe(24) + "\n")
        path.chmod(0o600)


def _wait_ready(url: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


async def _demo(nodes: int, gpus: int, duration: float | None, base_port: int, personality: str,
                cdu_protocol: str = "modbus") -> int:
    workdir = Path(tempfile.mkdtemp(prefix="supernode-demo-"))
    _write_tokens(workdir)
    sim = Simulator(nodes=nodes, gpus=gpus, workdir=workdir / "sim", personality=personality, cdu_protocol=cdu_protocol)
    url = await sim.start()
    slurm = None
    from sim.slurm_cluster import SlurmCluster, simulator_reboot_command, slurm_available

    if slurm_available():
        try:
            slurm = await asyncio.to_thread(SlurmCluster(names=list(sim.model.nodes), base=workdir / "slurm",
                                                         on_reboot=simulator_reboot_command(url)).start)
        except Exception as exc:  # the demo still runs, with the simulated scheduler, and says so
            print(f"slurm: could not start a demo Slurm ({exc}); using the simulated scheduler", file=sys.stderr)
            slurm = None
    etcd = None
    from sim.etcd_cluster import EtcdCluster, etcd_binary

    if etcd_binary():
        try:
            etcd = await asyncio.to_thread(EtcdCluster(workdir / "etcd", 1).start)
        except Exception as exc:  # the demo still runs, each agent alone (static), and says so
            print(f"etcd: could not start a demo etcd ({exc}); agents run without coordination", file=sys.stderr)
            etcd = None
    procs: list[tuple[str, subprocess.Popen, int]] = []
    jobs: asyncio.Task | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        ports = {node: base_port + i if base_port else free_port() for i, node in enumerate(sim.model.nodes)}
        urls = {node: f"http://127.0.0.1:{p}" for node, p in ports.items()}
        for node, port in ports.items():
            cfg_path = workdir / node / "agent.yaml"
            cfg_path.parent.mkdir(parents=True, exist_ok=True)
            cfg = agent_config(sim, node, port, workdir, slurm_conf=slurm.conf if slurm else None, agent_urls=urls,
                               etcd_endpoints=etcd.endpoints if etcd else None)
            demo_cold_plates(cfg)
            if slurm is not None:  # the demo's jobs checkpoint and exit on it (sim/demo_job.py) before a drain or reboot
                cfg["remediation"]["slurm"]["checkpoint_signal"] = "USR1"
            if etcd is not None:  # the node's own etcd user (it may write only its own keys), over TLS
                await asyncio.to_thread(etcd.authorize, cfg, workdir / node)
            cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            log = open(workdir / node / "agent.log", "ab")
            proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(cfg_path), "run"],
                                    stdout=log, stderr=log, start_new_session=True, env=daemon_env())
            procs.append((node, proc, port))
        deadline = time.monotonic() + 20 + 3 * len(procs)  # 18 agents starting at once on 2 cores take a while
        for node, proc, port in procs:
            ok = await asyncio.to_thread(_wait_ready, f"http://127.0.0.1:{port}/healthz", deadline)
            if not ok:
                print(f"agent for {node} did not start; see {workdir / node / 'agent.log'}", file=sys.stderr)
                return 1
        jobs = asyncio.create_task(_keep_jobs(slurm, url, workdir / "jobs")) if slurm is not None else None
        for node, _, port in procs:
            print(f"metrics: http://127.0.0.1:{port}/metrics   ({node})")
        for node, _, port in procs:
            print(f"status page: http://127.0.0.1:{port}/   ({node}; the admin token shows incidents)")
        print(f"sim: {url}")
        print(f"cdu: the rack's cooling on {cdu_protocol}: {_cdu_line(sim)}")
        rf = sim.redfish()
        for node, bmc in rf.get("bmcs", {}).items():
            print(f"redfish-bmc: {bmc}/redfish/v1/   ({node}'s tray BMC)")
        for name, sw in rf.get("switches", {}).items():
            print(f"redfish-switch: {sw['url']}/redfish/v1/   ({name}'s BMC: NVSwitch chips "
                  f"{', '.join(map(str, sw['chips']))}, {sw['zone']})")
        for name, cdu in rf.get("cdus", {}).items():
            print(f"redfish-cdu: {cdu}/redfish/v1/   ({name})")
        from sim.bacnet_cdu import SimBacnetCdu

        for name, dev in sim.devices.items():
            if isinstance(dev, SimBacnetCdu):  # probe it: supernode-agent probe bacnet --profile P --target H:P
                host, port = dev.endpoint
                print(f"bacnet-cdu: {host}:{port}   ({name}, BACnet/IP, profile {dev.profile.name})")
        if rf:
            print(f"redfish-login: user {rf['username']}, password file {rf['password_file']}, CA file {rf['ca_file']}")
        if etcd:
            print(f"etcd: {etcd.endpoints[0]}   (rack coordination: one leader, two pollers per shared device)")
            print(f"etcd-auth: TLS (CA file {etcd.ca_file}), one etcd user per node (<rack>.<node>, its password in "
                  f"<node>/etcd.password), root's password in {etcd.root_password_file}")
        else:
            print("etcd: not installed; every agent polls the shared devices and node01 leads (static)")
        if slurm:
            print(f"slurm: SLURM_CONF={slurm.conf}   (sinfo -N, scontrol show node)")
        else:
            print("slurm: not installed; agents drain through the SIMULATED scheduler (no real Slurm)")
        first_port = procs[0][2]
        print(f"webhook: http://127.0.0.1:{first_port}/api/v1/alerts")
        print(f"webhook-token: {workdir / 'webhook.token'}")
        print(f"admin-token: {workdir / 'admin.token'}")
        print(f"logs and configs: {workdir}")
        sinfo = (f'SLURM_CONF={slurm.conf} sinfo -N -o "%N %T %E"' if slurm
                 else f"supernode-agent --config {workdir}/node01/agent.yaml incidents   # simulated scheduler")
        print(TRY_THIS.format(port=first_port, node=next(iter(sim.model.nodes)), workdir=workdir, sinfo=sinfo),
              flush=True)
        try:
            async with asyncio.timeout(duration):
                await stop.wait()
        except asyncio.TimeoutError:
            pass
        return 0
    finally:
        if jobs is not None:
            jobs.cancel()
        for _, proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for node, proc, _ in procs:
            try:
                await asyncio.to_thread(proc.wait, 6)
            except subprocess.TimeoutExpired:
                print(f"agent for {node} did not stop in time; killing it", file=sys.stderr)
                proc.kill()
        await sim.stop()
        if etcd is not None:
            await asyncio.to_thread(etcd.stop)
        if slurm is not None:
            await asyncio.to_thread(slurm.cleanup)
        print("demo stopped", flush=True)


TRY_THIS = """
try this (another shell, `. .venv/bin/activate` first):
  curl -s http://127.0.0.1:{port}/metrics | grep supernode_gpu_power_watts
  supernode-sim inject leak --zone zone-a                # {node}: GPUs capped, node drained at once
  supernode-agent --config {workdir}/{node}/agent.yaml incidents      # the valve close waits for you
  supernode-agent --config {workdir}/{node}/agent.yaml approve ID     # ID from `incidents`
  supernode-agent --config {workdir}/{node}/agent.yaml journal
  {sinfo}
  supernode-sim clear                                    # a leak never resumes a node without `approve`
  supernode-sim inject flow-drop --percent 40            # the rack capped by thermal margin to what the loop carries
  supernode-sim inject pump-fail --cdu cdu1 --pump 2     # pump_redundancy_lost; the flow halves: caps by margin
  supernode-sim inject filter-clogging --cdu cdu1        # strainer dP rises, flow falls: filter_clogging
  supernode-sim inject thermal --node {node} --gpu 0
  supernode-sim inject nvlink-errors --node {node} --gpu 2 --link 3 --rate 500
  supernode-sim inject xid --node {node} --gpu 0 --code 13   # RESTART_APP: the job is told (squeue -o "%N %k"), node stays
  supernode-sim inject xid --node {node} --gpu 1 --code 48 --sticky true   # drain, job checkpoints, GPU reset, resume
  supernode-sim inject xid --node {node} --gpu 1 --code 79 --sticky true   # Slurm reboots the node once approved
  supernode-sim inject tray-leak --node {node} --detector 0   # {node}'s BMC: a cold-plate detector Critical
  supernode-sim inject nvswitch-down --switch 5          # NVSwitch chip 5: one nvlink_switch_fault on the leader, no tray drained
  supernode-sim inject nvlink-down --node {node} --gpu 2 --link 9   # one tray's own link: that tray drained
  supernode-sim state | grep -A3 '"redfish"'             # each tray BMC's URL, the CA file, the account
  supernode-sim faults                                   # every fault kind and its parameters
Ctrl-C stops the simulator, Slurm and every agent."""


def _cdu_line(sim: Simulator) -> str:
    """Where the rack's CDU answers, by the protocol it speaks."""
    dev = sim.devices.get("cdu1")
    if dev is None:
        return "rfcdu1 (Redfish CoolingUnit) alone"
    from sim.snmp_cdu import SimSnmpCdu

    host, port = dev.endpoint
    if isinstance(dev, SimSnmpCdu):
        return (f"cdu1 SNMP v2c udp://{host}:{port} community public, profile {dev.profile.profile} "
                f"(supernode-agent probe snmp --profile {dev.profile.profile} --target {host}:{port}); it has no "
                f"pumps and no writable valve: the leak and flow stories below apply, pump-fail and the valve close "
                f"do not")
    return f"cdu1 Modbus TCP {host}:{port}, profile {dev.profile.name}"


def run_demo(nodes: int = 2, gpus: int = 4, duration: float | None = None, base_port: int = 0,
             personality: str = "gb200", cdu_protocol: str = "modbus") -> int:
    """The demo rack; GB200 by default, so NVLink5 series (BER) have data on the dashboards."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    from agent.logs import setup_logging

    setup_logging("warning")
    return asyncio.run(_demo(nodes, gpus, duration, base_port, personality, cdu_protocol))
