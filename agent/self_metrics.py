"""The agent's metrics about itself: build, process, and config reloads.

Why: an operator alerts on the agent too. A crash loop shows as
`process_start_time_seconds` changing (systemd restarts it quietly), a refused
reload as `supernode_config_last_reload_successful 0` (the agent keeps running an
older config than the file on disk, which nobody sees otherwise), and a fleet's
versions as `supernode_build_info`. Process and platform metrics come from
prometheus_client's own collectors, registered on the agent's registry (never the
global one); their families are declared here so the catalogue lists them.
"""

from __future__ import annotations

import platform
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Callable, Iterator

from prometheus_client import PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent import __version__
from exporters.model import counter, gauge, info

BUILD_INFO = info("supernode_build_info", "The agent's build: its version, the Python and prometheus_client it runs on.",
                  ("version", "python", "prometheus_client"))
CONFIG_RELOADS = counter("supernode_config_reload_total",
                         "Config reloads tried (SIGHUP or POST /-/reload), by result (success, failure).", ("result",))
CONFIG_LAST_SUCCESS = gauge("supernode_config_last_reload_success_timestamp_seconds",
                            "Unix time the running config was loaded (at start, then at each successful reload).")
CONFIG_LAST_OK = gauge("supernode_config_last_reload_successful",
                       "0 while the last reload was refused (the file on disk is not what runs), else 1.")
# prometheus_client's ProcessCollector and PlatformCollector (Linux /proc):
PROCESS_CPU = counter("process_cpu_seconds_total", "Total user and system CPU time of the agent process, in seconds.")
PROCESS_START = gauge("process_start_time_seconds", "Start time of the agent process since the Unix epoch, in seconds.")
PROCESS_RSS = gauge("process_resident_memory_bytes", "Resident memory size of the agent process, in bytes.")
PROCESS_VMS = gauge("process_virtual_memory_bytes", "Virtual memory size of the agent process, in bytes.")
PROCESS_FDS = gauge("process_open_fds", "Open file descriptors of the agent process.")
PROCESS_MAX_FDS = gauge("process_max_fds", "File descriptor limit of the agent process.")
PYTHON_INFO = info("python_info", "Python platform information.", ("implementation", "major", "minor", "patchlevel", "version"))

RESULTS = ("success", "failure")


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


class ReloadStats:
    """Counts of reload results and the time the running config was loaded."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.counts = dict.fromkeys(RESULTS, 0)
        self.last_success = clock()  # the config loaded at start is the first successful load
        self.last_ok = True

    def record(self, ok: bool) -> None:
        self.counts["success" if ok else "failure"] += 1
        self.last_ok = ok
        if ok:
            self.last_success = self.clock()


class SelfCollector(Collector):
    def __init__(self, reloads: ReloadStats):
        self.reloads = reloads
        self.build = (__version__, platform.python_version(), _package_version("prometheus_client"))

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily(BUILD_INFO.name, BUILD_INFO.help, labels=list(BUILD_INFO.labels))
        build.add_metric(list(self.build), 1.0)
        reloads = CounterMetricFamily(CONFIG_RELOADS.name, CONFIG_RELOADS.help, labels=["result"])
        for result in RESULTS:
            reloads.add_metric([result], float(self.reloads.counts[result]))
        yield from (build, reloads,
                    GaugeMetricFamily(CONFIG_LAST_SUCCESS.name, CONFIG_LAST_SUCCESS.help, value=self.reloads.last_success),
                    GaugeMetricFamily(CONFIG_LAST_OK.name, CONFIG_LAST_OK.help, value=1.0 if self.reloads.last_ok else 0.0))


def self_collectors(reloads: ReloadStats) -> list[Collector]:
    """The collectors to register on the agent's registry: its own facts plus the process and platform."""
    return [SelfCollector(reloads), ProcessCollector(registry=None), PlatformCollector(registry=None)]
