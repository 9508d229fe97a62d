"""Tests use the same single-host Slurm the demo starts (agent/sim/slurm_cluster.py)."""

from agent.sim.slurm_cluster import SlurmCluster, slurm_available  # noqa: F401
