"""A reboot for the test Slurm's nodes: each slurmd runs under this supervisor, which can "reboot" it.

Why: Slurm's `scontrol reboot` runs the node's `RebootProgram` and then waits for the node to register
again with a BootTime later than the request. On a single test host nothing may really reboot, so the
supervisor stops that node's slurmd and starts it again in a fresh Linux time namespace whose boot clock
starts at zero (`unshare --time --boottime -<host uptime>`): slurmd reads its uptime from that clock and
reports a new BootTime, as after a real reboot. Nothing else on the host is touched.

Two entry points (`python -m sim.slurmd_supervisor ...`):

- `run --node NAME -- SLURMD ARGV...`: start slurmd, restart it on SIGUSR1, end it on SIGTERM/SIGINT (and it
  dies with us: PR_SET_PDEATHSIG), exit when it exits on its own;
- `reboot --config FILE`: what the cluster's RebootProgram runs (slurmd runs that as root, with no
  arguments). It finds which node is rebooting by walking up its process tree to the slurmd that started it
  (`-N NAME`), runs the optional on-reboot command (argv, `{node}` replaced; the demo tells the simulator's
  twin), then signals that slurmd's supervisor to restart it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
SUPERVISOR_MODULE = "sim.slurmd_supervisor"
ON_REBOOT_TIMEOUT = 30.0
# How long a "reboot" keeps the node away. Not a synchronisation: slurmctld accepts a rebooted node only when its
# BootTime (registration time minus uptime, which the kernel rounds up to whole seconds) is not before the second
# it sent the reboot, so a slurmd back within the same second would look as if it never rebooted.
BOOT_SECONDS = 2.0


def time_namespaces_work() -> bool:
    """Whether this host lets us start a process in a new time namespace (root, Linux >= 5.6, util-linux)."""
    try:
        return subprocess.run(["unshare", "--time", "--boottime", "0", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the supervisor dies, so a killed supervisor leaves no slurmd."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _fresh_boot_argv(argv: list[str]) -> list[str]:
    """argv run in a new time namespace whose CLOCK_BOOTTIME reads (nearly) zero: a node that just booted."""
    uptime = int(time.clock_gettime(time.CLOCK_BOOTTIME))
    return ["unshare", "--time", "--boottime", str(-uptime), *argv]


class Supervisor:
    def __init__(self, node: str, argv: list[str]):
        self.node = node
        self.argv = argv
        self.child: subprocess.Popen | None = None
        self.restart_wanted = False
        self.stop_wanted = False

    def _start(self) -> None:
        self.child = subprocess.Popen(_fresh_boot_argv(self.argv), preexec_fn=_die_with_parent)
        print(f"supervisor {self.node}: slurmd started (pid {self.child.pid})", flush=True)

    def _end_child(self) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        self.child.send_signal(signal.SIGTERM)
        try:
            self.child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait(timeout=5)

    def run(self) -> int:
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "restart_wanted", True))
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop_wanted", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "stop_wanted", True))
        self._start()
        while True:
            if self.stop_wanted:
                self._end_child()
                return 0
            if self.restart_wanted:
                self.restart_wanted = False
                print(f"supervisor {self.node}: reboot: restarting slurmd", flush=True)
                booting = time.monotonic() + BOOT_SECONDS
                self._end_child()
                while time.monotonic() < booting and not self.stop_wanted:
                    time.sleep(0.1)
                if self.stop_wanted:
                    return 0
                self._start()
            assert self.child is not None
            if self.child.poll() is not None:
                print(f"supervisor {self.node}: slurmd exited ({self.child.returncode})", flush=True)
                return self.child.returncode or 0
            time.sleep(0.1)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _parent(pid: int) -> int:
    """The parent pid from /proc/PID/stat (its 4th field, after the parenthesised command name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def rebooting_node(start: int | None = None) -> tuple[str, int]:
    """(node name, its supervisor's pid): up the process tree to the slurmd (`-N NAME`) that ran us, then its
    supervisor. Raises LookupError when we were not started by a supervised slurmd."""
    pid = start or os.getpid()
    node = None
    while pid > 1:
        argv = _cmdline(pid)
        if node is None and argv and os.path.basename(argv[0]) == "slurmd" and "-N" in argv[:-1]:
            node = argv[argv.index("-N") + 1]
        elif node is not None and SUPERVISOR_MODULE in argv and "run" in argv:
            return node, pid
        pid = _parent(pid)
    what = f"slurmd -N {node}'s supervisor" if node else "a slurmd started with -N NAME"
    raise LookupError(f"no {what} among this process's ancestors")


def reboot(config: Path) -> int:
    """The RebootProgram: on-reboot command (if any), then the supervisor restarts this node's slurmd."""
    try:
        node, supervisor = rebooting_node()
    except LookupError as exc:
        print(f"reboot program: {exc}", file=sys.stderr)
        return 2
    cfg = json.loads(config.read_text()) if config.exists() else {}
    command = [a.replace("{node}", node) for a in cfg.get("on_reboot") or []]
    if command:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=ON_REBOOT_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"reboot program {node}: on-reboot command failed: {exc}; not rebooting", file=sys.stderr)
            return 1
        print(f"reboot program {node}: on-reboot exit {done.returncode}: {done.stdout.strip()} {done.stderr.strip()}",
              flush=True)
        if done.returncode != 0:
            return 1  # the node does not come back: Slurm's ResumeTimeout marks it down, as after a failed boot
    os.kill(supervisor, signal.SIGUSR1)
    print(f"reboot program {node}: supervisor {supervisor} asked to restart slurmd", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {SUPERVISOR_MODULE}")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run slurmd (the argv after --) and restart it on SIGUSR1")
    r.add_argument("--node", required=True)
    r.add_argument("argv", nargs=argparse.REMAINDER)
    b = sub.add_parser("reboot", help="the RebootProgram: reboot the slurmd node that runs us")
    b.add_argument("--config", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cmd == "run":
        cmd = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        return Supervisor(args.node, cmd).run()
    return reboot(args.config)


if __name__ == "__main__":
    sys.exit(main())
