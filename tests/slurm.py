"""Tests use the same single-host Slurm the demo starts (sim/slurm_cluster.py)."""

from sim.slurm_cluster import SlurmCluster, slurm_available  # noqa: F401

import subprocess  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Iterator  # noqa: E402

from tests.helpers import wait_for  # noqa: E402


@contextmanager
def batch_job(cluster: SlurmCluster, script: Path, node: str | None = "node01", args: tuple[str, ...] = ()
              ) -> Iterator[str]:
    """A real batch job on `node` (any node when None; more sbatch `args`): its id; cancelled after, and waited
    out of the queue so no step outlives the test cluster."""
    script.chmod(0o755)
    where = ["-w", node] if node else []
    sub = subprocess.run(["sbatch", *where, *args, "-o", str(script.with_suffix(".out")), str(script)],
                         capture_output=True, text=True, env=cluster.env, timeout=20)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split()[-1]
    try:
        yield job
    finally:
        subprocess.run(["scancel", job], env=cluster.env, capture_output=True, timeout=20)

        def gone() -> bool:
            q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], env=cluster.env, capture_output=True,
                               text=True, timeout=20)
            return job not in q.stdout
        wait_for(gone, 30, interval=0.2, what=f"job {job} gone from the queue")


def node_states(cluster: SlurmCluster) -> dict[str, str]:
    """Slurm's node states without the flag suffixes (`idle*`: slurmd slow to answer on a loaded host): how every
    test reads them, so a flag never decides a test."""
    return {n: st.rstrip("*~#!%$@^-") for n, st in cluster.states().items()}


def running_cluster(names: list[str], *extra_binaries: str) -> Iterator[SlurmCluster]:
    """A private single-host Slurm for a module's tests (`yield from` it in a fixture); stopped by PID after."""
    from tests.helpers import require_binary

    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", *extra_binaries):
        require_binary(b)
    c = SlurmCluster(names=names).start()
    try:
        yield c
    finally:
        c.cleanup()
