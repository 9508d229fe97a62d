"""A real, private Slurm for tests and the demo: munged + slurmctld + slurmd under a temp dir.

Why its own munged: a private socket (AuthInfo=socket=...) means no clash
with a system munged or with another test run. Everything binds to
127.0.0.1, every daemon is started in the foreground so the PID we keep is
the daemon's own, and `stop()` ends exactly those PIDs.

Nodes: by default the single real node (this host, as `slurmd -C` reports
it). With `names=[...]` it starts one slurmd per name (`slurmd -N name`,
each on its own port, all with NodeHostname=this host), which is how the
demo gets nodes named like the simulator's (node01, node02, ...).

Reboots: where time namespaces work (root, Linux >= 5.6), each slurmd runs under sim/slurmd_supervisor.py
and slurm.conf names a RebootProgram, so `scontrol reboot` really reboots a node as Slurm sees it: the
program runs the optional `on_reboot` command (argv, `{node}` replaced: the demo tells the simulator's
twin), the node's slurmd restarts with a new BootTime and Slurm returns the node to service.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim.ports import free_port
from sim.slurmd_supervisor import SUPERVISOR_MODULE, time_namespaces_work

REPO_ROOT = Path(__file__).resolve().parent.parent
RESUME_TIMEOUT_SECONDS = 60  # a reboot not back by then is marked down by slurmctld
CRED_EXPIRE_SECONDS = 10  # AuthInfo cred_expire: also how long a requeued batch job waits (slurm.conf(5))
SCHED_INTERVAL_SECONDS = 2  # SchedulerParameters sched_interval: the main scheduling pass (default 60 s)


def _binary(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None)


def simulator_reboot_command(sim_url: str) -> list[str]:
    """The on-reboot argv that tells the simulator's twin a node rebooted (new boot id, its faults cleared)."""
    return [sys.executable, "-m", "sim.cli", "--sim", sim_url, "inject", "reboot", "--node", "{node}"]


def slurm_available() -> bool:
    return all(_binary(b) for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo"))


class SlurmCluster:
    """Start with `start()`, stop with `stop()` (by PID). `env` carries SLURM_CONF for every client call."""

    def __init__(self, names: list[str] | None = None, base: Path | None = None,
                 ctld_port: int | None = None, first_slurmd_port: int | None = None,
                 on_reboot: list[str] | None = None):
        self.dir = Path(base or tempfile.mkdtemp(prefix="slurm-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.names = names
        self.ctld_port = ctld_port or free_port()
        self.first_slurmd_port = first_slurmd_port
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.nodes: list[str] = []
        self.on_reboot = list(on_reboot or [])
        self.reboot_program = self.dir / "reboot-program"
        self.can_reboot = time_namespaces_work()

    @property
    def _python_env(self) -> dict[str, str]:
        """The env of our own Python helpers (supervisor, RebootProgram): `sim` importable from this checkout."""
        path = os.environ.get("PYTHONPATH")
        return {**self.env, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT)}

    def _write_reboot_program(self) -> list[str]:
        """slurm.conf lines for reboots (none where time namespaces do not work: `scontrol reboot` then fails
        with Slurm's own error, never a fake success)."""
        if not self.can_reboot:
            return []
        config = self.dir / "reboot.json"
        config.write_text(json.dumps({"on_reboot": self.on_reboot}))
        env = self._python_env
        log = self.dir / "log" / "reboot-program.log"
        self.reboot_program.write_text(
            "#!/bin/sh\n# slurmd runs this as root, with no arguments, on `scontrol reboot`\n"
            f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])} exec {shlex.quote(sys.executable)} -m {SUPERVISOR_MODULE} "
            f"reboot --config {shlex.quote(str(config))} >> {shlex.quote(str(log))} 2>&1\n")
        self.reboot_program.chmod(0o755)
        return [f"RebootProgram={self.reboot_program}", f"ResumeTimeout={RESUME_TIMEOUT_SECONDS}"]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        line = subprocess.run([_binary("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
        hw = " ".join(f for f in line.split() if not f.startswith("NodeName=") and not f.startswith("UpTime"))
        node_lines = []
        if self.names:
            for i, name in enumerate(self.names):
                port = (self.first_slurmd_port + i) if self.first_slurmd_port else free_port()
                node_lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} {hw} State=UNKNOWN")
            self.nodes = list(self.names)
        else:
            port = self.first_slurmd_port or free_port()
            node_lines.append(f"NodeName={host} NodeAddr=127.0.0.1 Port={port} {hw} State=UNKNOWN")
            self.nodes = [host]
        d = self.dir
        for sub in ("state", "spool", "log", "munge"):
            (d / sub).mkdir(exist_ok=True)
        os.chmod(d / "munge", 0o700)
        self.conf.write_text("\n".join([
            "ClusterName=ci",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire: a requeued batch job may not start again before its credential's lifetime has
            # passed (slurmctld's batch_requeue_fini sets its BeginTime to now + cred_expire + 1; default 120 s,
            # minimum 5). 10 s still covers a launch on a loaded host; the drill's requeue then resumes in
            # seconds, not two minutes. sched_interval: the main scheduling pass every 2 s instead of 60, so a
            # job whose BeginTime passed starts at once (a pass is cheap on a rack of 18 nodes).
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_SECONDS}",
            f"SchedulerParameters=sched_interval={SCHED_INTERVAL_SECONDS}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none",
            "MailProg=/bin/true", "ReturnToService=2",
            *self._write_reboot_program(),
            *node_lines,
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def start(self, timeout: float = 30.0) -> "SlurmCluster":
        self._write_conf()
        log = open(self.dir / "log" / "daemons.out", "ab")
        self.procs.append(subprocess.Popen(
            [_binary("munged"), "-F", "-f", f"--socket={self.munge_socket}",
             f"--pid-file={self.dir / 'munge' / 'munged.pid'}", f"--log-file={self.dir / 'log' / 'munged.log'}",
             f"--seed-file={self.dir / 'munge' / 'seed'}"], stdout=log, stderr=log))
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged socket")
        self.procs.append(subprocess.Popen([_binary("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf)],
                                           stdout=log, stderr=log, env=self.env))
        for name in self.nodes:
            args = [_binary("slurmd"), "-D", "-f", str(self.conf), "-N", name]
            if self.can_reboot:  # under our supervisor: restarted with a new boot time when Slurm reboots it
                args = [sys.executable, "-m", SUPERVISOR_MODULE, "run", "--node", name, "--", *args]
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=log,
                                               env=self._python_env if self.can_reboot else self.env))
        self._wait(self._all_idle, timeout, "all nodes idle")
        return self

    def _wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"slurm daemon {p.args[0]} exited ({p.returncode}) while waiting for {what}; "
                                       f"logs in {self.dir / 'log'}")
            time.sleep(0.1)
        raise TimeoutError(f"slurm: {what} not reached in {timeout}s; logs in {self.dir / 'log'}")

    def states(self) -> dict[str, str]:
        out = subprocess.run([_binary("sinfo"), "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                             env=self.env, timeout=10)
        result = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                result[parts[0]] = parts[1]
        return result

    def _all_idle(self) -> bool:
        states = self.states()
        return bool(states) and all(states.get(n) == "idle" for n in self.nodes)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([_binary("scontrol"), *args], capture_output=True, text=True, env=self.env, timeout=10)

    def _end_jobs(self, timeout: float = 10.0) -> None:
        """Kill every job of this cluster and wait (bounded) until none is left. Why before the daemons stop: a
        job's step runs under a slurmstepd of its own, which outlives slurmd and slurmctld and keeps its job's
        processes (a demo job polling a simulator long gone) running after the cluster is gone."""
        user = getpass.getuser()
        scancel, squeue = _binary("scancel"), _binary("squeue")
        if scancel is None or squeue is None:
            return
        try:
            subprocess.run([scancel, "--full", "--signal=KILL", f"--user={user}"], capture_output=True,
                           env=self.env, timeout=10)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                left = subprocess.run([squeue, "--noheader", f"--user={user}"], capture_output=True,
                                      text=True, env=self.env, timeout=10)
                if left.returncode != 0 or not left.stdout.strip():
                    return
                time.sleep(0.2)
        except (OSError, subprocess.SubprocessError):
            return  # the controller is gone already: nothing left to ask

    def stop(self) -> None:
        if any(p.poll() is None for p in self.procs):
            self._end_jobs()
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
