"""Crash safety: SIGKILL the engine between intent and result; restart reconciles, nothing runs twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from agent.remediation.actions.slurm import SlurmScheduler
from agent.remediation.engine import Executors, RemediationEngine

from tests.helpers import REPO, require_binary, wait_for, await_for
from tests.remediation_support import identity, inventory, settings
from tests.slurm import SlurmCluster

# scontrol wrapper: runs the real scontrol, logs the call, then (for drains) hangs so the agent is killed
# after the drain took effect but before it could journal the result.
WRAPPER = textwrap.dedent("""\
    import os, subprocess, sys, time
    log = os.environ["WRAP_LOG"]
    rc = subprocess.run([os.environ["REAL_SCONTROL"], *sys.argv[1:]]).returncode
    with open(log, "a") as f:
        f.write(" ".join(sys.argv[1:]) + f" pid={os.getpid()}\\n")
    if "State=DRAIN" in sys.argv and os.environ.get("WRAP_HANG"):
        time.sleep(60)
    sys.exit(rc)
""")

CHILD = textwrap.dedent("""\
    import asyncio, sys
    sys.path[:0] = [{repo!r}]
    from agent.remediation.actions.slurm import SlurmScheduler
    from agent.remediation.engine import Executors, RemediationEngine
    from tests.remediation_support import identity, inventory, settings
    async def main():
        sched = SlurmScheduler(scontrol={wrapper!r}, slurm_conf={conf!r})
        eng = RemediationEngine(settings(max_drained_fraction=1.0), "enforce", identity(),
                                inventory(nodes=("node01", "node02")), {journal!r}, Executors(scheduler=sched))
        await eng.start()
        eng.fire("gpu_lost", {{"node": "node01"}}, "critical")
        await asyncio.sleep(120)
    asyncio.run(main())
""")


@pytest.fixture(scope="module")
def cluster():
    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo"):
        require_binary(b)
    c = SlurmCluster(names=["node01", "node02"]).start()
    yield c
    c.cleanup()


def test_sigkill_between_intent_and_result(cluster, tmp_path):
    wrapper = tmp_path / "scontrol"
    wrapper.write_text(f"#!{sys.executable}\n" + WRAPPER)
    wrapper.chmod(0o755)
    log, journal = tmp_path / "calls.log", tmp_path / "journal.db"
    env = {**os.environ, "WRAP_LOG": str(log), "REAL_SCONTROL": require_binary("scontrol"), "WRAP_HANG": "1"}
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(repo=str(REPO),
                                                                 wrapper=str(wrapper), conf=str(cluster.conf),
                                                                 journal=str(journal))], env=env)
    try:
        wait_for(lambda: log.exists() and "State=DRAIN" in log.read_text(), timeout=30, what="drain issued")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
        for line in log.read_text().splitlines() if log.exists() else []:
            pid = int(line.rsplit("pid=", 1)[1])
            try:
                os.kill(pid, signal.SIGKILL)  # the hung wrapper we started through the child
            except ProcessLookupError:
                pass
    assert cluster.states()["node01"] == "drained"

    async def restart():
        os.environ.pop("WRAP_HANG", None)
        os.environ["WRAP_LOG"], os.environ["REAL_SCONTROL"] = str(log), require_binary("scontrol")
        sched = SlurmScheduler(scontrol=str(wrapper), slurm_conf=cluster.conf)
        eng = RemediationEngine(settings(max_drained_fraction=1.0), "enforce", identity(),
                                inventory(nodes=("node01", "node02")), journal, Executors(scheduler=sched))
        assert eng.journal.unfinished_intents()
        await eng.start()
        assert not eng.journal.unfinished_intents()
        rec = [e for e in eng.journal.entries() if e.kind == "result" and e.action == "drain"]
        assert [(r.result, r.detail["reconciled"]) for r in rec] == [("done", "applied")]
        inc = eng.incidents.find("gpu_lost", {"node": "node01"})
        assert inc is not None  # restored with the same id
        await await_for(lambda: inc.state == "mitigated", timeout=20)
        # restored, re-fired: no second drain
        eng.fire("gpu_lost", {"node": "node01"}, "critical")
        assert sum("State=DRAIN" in l for l in log.read_text().splitlines()) == 1
        eng.clear("gpu_lost", {"node": "node01"})  # and the reconciled drain is still ours to undo
        await await_for(lambda: cluster.states().get("node01") == "idle", timeout=20)
        await eng.stop()
    asyncio.run(restart())
