"""The `coordination:` section: how the agents of one rack share its devices, its leader and its guardrails.

Why a section of its own: the rack's shared devices (CDUs over Modbus or Redfish, leak controllers,
PDUs) must not be polled by every agent, shared actuators (zone valves,
outlets) must be driven by one agent at a time, and rack-wide guardrails must
be counted across agents. `static` keeps today's behaviour, written down:
the leader and the pollers come from the config and nothing fails over.
`etcd` puts all three on a real etcd v3 cluster: a leased leader with
fencing, leased poller slots, and transactions for the guardrails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EtcdTls(_Strict):
    """TLS to etcd, verified; with a client certificate when etcd asks for one (`--client-cert-auth`)."""

    ca_file: Path = Field(description="CA that signed the etcd members' certificates.")
    cert_file: Path | None = Field(default=None, description="Client certificate (etcd --client-cert-auth).")
    key_file: Path | None = Field(default=None, description="Its private key.")

    @model_validator(mode="after")
    def _pair(self) -> "EtcdTls":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class EtcdSettings(_Strict):
    endpoints: list[str] = Field(min_length=1, description=(
        "Client URLs of the etcd members (http://host:2379 or https://...); the agent fails over between them."))
    prefix: str = Field(default="/supernode-agent", description=(
        "Key prefix; the rack's keys live under <prefix>/<rack>/."))
    request_timeout_seconds: float = Field(default=1.0, gt=0, le=30, description=(
        "One etcd request (range, put, txn, keepalive) at most; past it the next endpoint is tried."))
    tls: EtcdTls | None = None
    user: str | None = Field(default=None, min_length=1, max_length=128, description=(
        "etcd user this agent authenticates as (etcd auth). Default with password_secret: <rack>.<node>, the "
        "user `supernode-agent coordination etcd-roles` makes for this node (so one agent.yaml serves the rack)."))
    password_secret: str | None = Field(default=None, description=(
        "Name in `secrets` of the file holding this node's etcd password; without it the agent connects "
        "anonymously (etcd without auth)."))

    @model_validator(mode="after")
    def _user_needs_password(self) -> "EtcdSettings":
        if self.user is not None and self.password_secret is None:
            raise ValueError("user needs password_secret (the secret holding its password)")
        return self

    def user_of(self, rack: str, node: str) -> str | None:
        """The etcd user of node `node` of rack `rack` (None: anonymous)."""
        if self.password_secret is None:
            return None
        from agent.coordination.etcd_auth import user_name

        return self.user or user_name(rack, node)

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not (url.startswith("http://") or url.startswith("https://")) or len(url) > 200:
                raise ValueError(f"expected http(s)://host:port, got {url[:80]!r}")
        return [u.rstrip("/") for u in v]

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not v.startswith("/") or "//" in v or len(v) > 100:
            raise ValueError(f"expected an absolute key prefix like /supernode-agent, got {v[:80]!r}")
        return v.rstrip("/")


class Coordination(_Strict):
    """See the module docstring; README "Rack coordination" says how to choose."""

    backend: Literal["static", "etcd"] = Field(default="static", description=(
        "static: leader and pollers from this file, no failover; etcd: elected, leased, fenced."))
    pollers_per_device: int = Field(default=2, ge=1, le=16, description=(
        "Agents that poll one shared device (CDU over Modbus or Redfish, leak controller, PDU) at most."))
    lease_ttl_seconds: float = Field(default=5.0, ge=1.0, le=120, description=(
        "etcd: lease TTL of an agent's leadership, poller slots and facts; a dead agent is replaced after it."))
    pollers: dict[str, list[str]] = Field(default_factory=dict, description=(
        "static: shared device name -> the nodes that poll it (default: every node that lists it, as "
        "without coordination). A node not listed for a device does not poll it."))
    peers: dict[str, str] = Field(default_factory=dict, description=(
        "Deprecated alias of inventory.agent_urls (node -> its agent's base URL), folded into it with a warning. "
        "Static: a node that does not poll a device reads its pollers' polls from their agents' "
        "/api/v1/coordination/facts streams, at inventory.agent_urls."))
    peers_ca_file: Path | None = Field(default=None, description=(
        "Deprecated alias of status.peer_tls.ca_file (the CA of the peers' https listeners), folded into it."))
    degraded_poll_interval_seconds: float = Field(default=2.0, gt=0, le=60, description=(
        "etcd unreachable: each agent polls the rack's leak inputs itself, at most this often."))
    drain_reservation_seconds: float = Field(default=30.0, gt=0, le=600, description=(
        "etcd: how long a drain counted in the rack's reservation (before the scheduler shows it) holds a place."))
    max_clock_skew_seconds: float = Field(default=5.0, ge=0, le=300, description=(
        "How far ahead of this agent's clock a time written by another agent (a drain reservation, an action "
        "count, a fact, an approval) may be; a later one cannot be true and the record is rejected (counted in "
        "supernode_coordination_rejected_records_total). Keep the rack's clocks in sync (NTP)."))
    fact_heartbeat_seconds: float = Field(default=2.0, ge=0, le=30, description=(
        "A poller sends its poll of a shared device to the other agents (etcd: a fact put; static: a line on its "
        "stream) when something a detector reads changed, whenever a leak input reads wet, and otherwise at least "
        "this often: the receivers' copy stays fresh for two of these. 0: every poll (before issue 38)."))
    maintenance_poll_seconds: float = Field(default=10.0, ge=0.5, le=600, description=(
        "static: how often this agent asks each peer (inventory.agent_urls) whether its node is in maintenance "
        "(GET /api/v1/coordination/maintenance); a peer that does not answer keeps its last known state until its "
        "`until`. etcd carries maintenance in the rack's keys instead, at once."))
    etcd: EtcdSettings | None = None

    @model_validator(mode="after")
    def _backend_needs(self) -> "Coordination":
        if self.backend == "etcd" and self.etcd is None:
            raise ValueError("backend etcd needs an etcd section (endpoints)")
        if self.backend == "etcd" and self.pollers:
            raise ValueError("pollers is for the static backend; etcd assigns pollers among live agents")
        if self.backend == "etcd" and self.peers:
            raise ValueError("peers (deprecated: inventory.agent_urls) is for the static backend; etcd carries the "
                             "facts (the status page's inventory.agent_urls works with either)")
        for node, url in self.peers.items():
            if not (url.startswith("http://") or url.startswith("https://")) or len(url) > 200:
                raise ValueError(f"peers.{node}: expected http(s)://host:port, got {url[:80]!r}")
        for device, nodes in self.pollers.items():
            if len(nodes) > self.pollers_per_device:
                raise ValueError(f"pollers.{device}: {len(nodes)} nodes, more than pollers_per_device "
                                 f"({self.pollers_per_device})")
        return self
