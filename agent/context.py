"""What the daemon offers the parts plugged into it: a typed interface instead of `Agent` and its `Any` fields.

Why a protocol in a leaf module: the HTTP surface (agent/http.py), the status page (agent/status/http.py), the
Redfish push endpoint (agent/redfish_events.py), rack coordination and remediation's wiring
(agent/remediation/wiring.py) all need the running agent, and the agent needs them; importing `Agent` closed
an import cycle daemon -> http -> status -> ... -> daemon that only `TYPE_CHECKING` imports kept open. They
depend on this module instead (it imports nothing of the agent at run time), and `agent.daemon.Agent`
satisfies it (checked in tests/test_layering.py).

The fields a plug-in may set are the ones listed as plain attributes (`remediation`, `status_hub`); the
lists (`route_mounts`, `extra_collectors`) are appended to before the listener starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from agent.config import LoadedConfig
    from agent.runtime import SourceScheduler
    from agent.snapshot import SnapshotStore


@runtime_checkable
class RemediationPlugin(Protocol):
    """The remediation hook as the daemon and the page use it (agent/remediation/wiring.py RemediationHook)."""

    degraded: str | None

    async def start(self) -> None: ...

    async def stop(self, close_journal: bool = True) -> None: ...


@runtime_checkable
class AgentContext(Protocol):
    """The running agent, as its plug-ins see it."""

    loaded: "LoadedConfig"  # the config running now (a reload swaps it)
    store: "SnapshotStore"  # every reading, and the listeners told of each publish
    scheduler: "SourceScheduler"  # the sources' timers: `poll_now(job_id)`, `runners`
    registry: "CollectorRegistry"  # what /metrics renders besides the snapshot
    coordination: Any  # the rack coordinator (agent/coordination: static or etcd)
    route_mounts: list[Callable[["web.Application"], None]]  # routes mounted when the listener starts
    extra_collectors: list[Any]  # collectors registered with the registry at start
    remediation: Any  # RemediationPlugin once attached, None while remediation is unavailable
    status_hub: Any  # the status page's stream, once the listener runs

    def identity(self) -> dict[str, str]: ...

    def remediation_degraded(self) -> str | None: ...

    def render_metrics(self) -> bytes: ...

    def state_dict(self) -> dict[str, Any]: ...

    def sources_not_polled(self) -> list[str]: ...

    def reload(self) -> Awaitable[tuple[bool, str]]: ...
