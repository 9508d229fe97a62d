"""A leak on the rack's CDU -> its zone's node drained in a real slurmctld: the CDU over BACnet/IP (COV push, and
polling only) against the same CDU over Modbus TCP, in one run (issue 37: "as fast as the Modbus path").

  bacnet + COV      the simulator's BACnet CDU (legacy BACpypes, its own process) turns its leak input active;
                    its COV notification is the first wet reading, the leak detector's confirmation re-read (a
                    ReadPropertyMultiple) the second, the leak playbook's drain follows.
  bacnet polling    the same CDU with `sources.bacnet.cov: false`: the 0.5 s leak poll sees it.
  modbus            the Modbus reference CDU's leak input (the same channel, zone and model), polled every 0.5 s.

Each case is a real agent process as the demo configures it (sim.demo.agent_config), with the rack's separate leak
controller left out so the CDU's own leak inputs carry the leak; one Slurm for the run, a rack per protocol. RUNS
injections per case (default 20; BENCH_RUNS), at a random phase against the 0.5 s leak poll, each waiting until the
incident resolved and the node resumed. Times: the journal's first intent and the drain's `done` (the node read
back drained from Slurm) minus the injection's wall time. Aim: BACnet p99 to drained no later than Modbus's.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from bench_redfish_leak import Journal, _line, _measure  # noqa: E402
from sim.demo import agent_config  # noqa: E402
from sim.harness import sim_rack  # noqa: E402
from tests.agentproc import running_agent  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from timing import machine_reference, percentiles, until  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "20"))
LEAK_POLL = 0.5
TOKEN = "bench-token"
CASES = {"bacnet + COV": "bacnet", "bacnet polling": "bacnet", "modbus": "modbus"}


def config(rack, work: Path, case: str, slurm_conf: Path) -> dict:
    for name in ("admin.token", "webhook.token"):
        (work / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), work, mode="enforce", slurm_conf=slurm_conf)
    cfg["inventory"]["leak_controllers"] = []  # the CDU's own leak inputs carry the leak, whatever its protocol
    cfg["sources"]["leak"] = {"interval": LEAK_POLL, "timeout": 0.4}
    cfg["sources"]["bacnet"] = {"cov": case != "bacnet polling"}
    cfg["remediation"] = {"slurm": {"backend": "slurm", "slurm_conf": str(slurm_conf)},
                          "detectors": {"leak": {"clear_seconds": 0.2}},
                          "leak_scope": {"dry_hold_seconds": 0},  # each run's undo at once: not what this times
                          "guardrails": {"automatic": ["resume_after_leak", "resume_after_check", "cdu_write_valve"],
                                         "cooldown_seconds": 0, "max_drained_fraction": 1.0,
                                         "breaker_max_actions": 100000, "rate_per_hour": {"default": 100000}}}
    return cfg


def run_case(rack, work: Path, case: str, slurm_conf: Path) -> tuple[list[float], list[float]]:
    work.mkdir(parents=True)
    cfg = config(rack, work, case, slurm_conf)
    journal = Journal(Path(cfg["agent"]["state_dir"]) / "journal.db")
    intents: list[float] = []
    drained: list[float] = []
    with running_agent(cfg, work) as agent:
        until(lambda: agent.get("/readyz")[0] == 200, 60, "agent ready")
        if case == "bacnet + COV":
            until(lambda: 'supernode_bacnet_cov_up{device="cdu1",source="leak"} 1.0' in agent.metrics(), 60,
                  "COV confirmed")
        for i in range(RUNS):
            first, done = _measure(rack, agent, journal, case, i, random.uniform(0, LEAK_POLL), True)
            intents.append(first)
            drained.append(done)
    return intents, drained


def main() -> None:
    from sim.slurm_cluster import SlurmCluster, slurm_available

    if not slurm_available():
        print("no Slurm here: this bench times leak -> drained in a real slurmctld")
        return
    print(machine_reference())
    intents: dict[str, list[float]] = {}
    drained: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        slurm = SlurmCluster(names=["node01", "node02"], base=Path(d) / "slurm").start()
        try:
            for protocol in ("bacnet", "modbus"):
                with sim_rack(Path(d) / f"rack-{protocol}", cdu_protocol=protocol) as rack:
                    for n, (case, p) in enumerate(CASES.items()):
                        if p == protocol:
                            intents[case], drained[case] = run_case(rack, Path(d) / f"case{n}", case, slurm.conf)
        finally:
            slurm.cleanup()
    print(f"leak on the rack's CDU -> first intent in a real agent's journal, {RUNS} injections per case "
          f"(leak poll {LEAK_POLL:g} s, random phase):")
    for case in CASES:
        print(_line(case, intents[case]))
    print("-> node drained in a real slurmctld (the drain's result read back), the same injections:")
    for case in CASES:
        print(_line(case, drained[case]))
    c50, c99 = percentiles(drained["bacnet + COV"])
    m50, m99 = percentiles(drained["modbus"])
    print(f"  BACnet (COV) / Modbus, drained: p50 {c50 / m50:.2f}x   p99 {c99 / m99:.2f}x   "
          f"aim (p99 no later than Modbus's): {'met' if c99 <= m99 else 'NOT met'}")


if __name__ == "__main__":
    main()
