"""The `remediation:` section of the agent config: detector thresholds, guardrails, Slurm, notify, exec.

Why a model of its own: every threshold and every guardrail limit has a
default taken from PLAYBOOKS.md / DEVICES.md, a unit in its name and a
description, and a typo in the YAML is refused at load with the path of the
field (extra="forbid"), like the rest of the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .leak_scope import LeakScopeSettings

ActionKind = Literal["gpu_power_cap", "drain", "resume", "isolate_link", "cdu_write", "pdu_outlet", "tray_power",
                     "notify", "exec", "job_notify", "gpu_reset", "node_reboot"]

# Approval keys a playbook step may carry (approval:, undo_approval:, and resume_after_check for a resume whose
# health check did not pass) that `guardrails.automatic` may waive; "always" can never be waived.
AutomaticKey = Literal["pdu_outlet_off", "cdu_write_valve", "tray_power_off", "resume_after_leak", "resume_after_check",
                       "gpu_reset", "node_reboot", "leak_watch_below", "rack_valve_close", "leak_loop_isolate"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hold(_Strict):
    """Hysteresis in time: how long a condition must hold before it fires, and its absence before it clears."""

    fire_seconds: float = Field(default=0.0, ge=0, description="Condition true this long before the detector fires.")
    clear_seconds: float = Field(default=10.0, ge=0, description="Condition false this long before it clears.")
    enabled: bool = True


class DetectorSettings(_Strict):
    """Thresholds of the local detectors (set and clear values give hysteresis)."""

    leak_consecutive_polls: int = Field(default=2, ge=1, description="Wet on this many consecutive polls fires a leak.")
    leak: Hold = Hold(fire_seconds=0.0, clear_seconds=10.0)
    leak_sensor_fault: Hold = Hold(fire_seconds=0.0, clear_seconds=10.0)
    leak_source_down: Hold = Hold(fire_seconds=0.0, clear_seconds=10.0)
    leak_tray: Hold = Hold(fire_seconds=0.0, clear_seconds=10.0)
    zone_leak_trays: int = Field(default=2, ge=2, description=(
        "Compute trays of one zone wet at once that widen a tray leak to its zone (the zone valve): one tray's own "
        "detectors are that tray's leak (leak_tray); a zone's own sensor (the leak rope, a switch tray) is the "
        "zone's at once."))
    leak_loop: Hold = Hold(fire_seconds=0.0, clear_seconds=30.0)
    leak_loop_pressure_floor_pascals: float | None = Field(default=None, gt=0, description=(
        "Secondary supply pressure below this while a detector is wet widens the leak to the loop (leak_loop), "
        "like secondary flow below flow_low_ratio of its baseline does; default: flow alone."))
    rack_tray_leaks: int = Field(default=2, ge=1, description=(
        "More than this many compute trays of the rack leaking at once (their BMCs' own detectors) asks for "
        "rack isolation: NVIDIA's tier for an NVL72 rack is more than 2."))
    tray_leak_rack: Hold = Hold(fire_seconds=0.0, clear_seconds=30.0)
    nominal_flow_cubic_meters_per_second: float | None = Field(
        default=None, gt=0, description=(
            "Secondary nominal flow; default: a rolling baseline (highest healthy flow over "
            "flow_baseline_window_seconds since the last pump set point change)."))
    flow_baseline_window_seconds: float = Field(
        default=900.0, gt=0, description="Span of the rolling flow and ΔT baselines (also the alert's window).")
    flow_setpoint_settle_seconds: float = Field(
        default=30.0, ge=0, description="After a pump speed set point change: no decision and no baseline sample "
                                        "for this long, then the baseline restarts from the new flow.")
    flow_low_ratio: float = Field(default=0.7, gt=0, lt=1, description="Fires below this fraction of nominal flow.")
    flow_clear_ratio: float = Field(default=0.85, gt=0, le=1, description="Clears above this fraction of nominal flow.")
    flow_confirm_delta_t: bool = Field(
        default=True, description="Cross-check: low flow fires only while the secondary ΔT rose above its baseline.")
    flow_confirm_delta_t_rise_celsius: float = Field(
        default=0.5, ge=0, description="How far the secondary return - supply must rise above its rolling mean.")
    coolant_flow_low: Hold = Hold(fire_seconds=2.0, clear_seconds=10.0)
    supply_hot_celsius: float = Field(default=45.0, description="Secondary supply above this fires (ASHRAE W45 class).")
    supply_hot_clear_celsius: float = Field(default=43.0)
    coolant_supply_hot: Hold = Hold(fire_seconds=10.0, clear_seconds=30.0)
    condensation_margin_celsius: float = Field(default=2.0, description="Supply - dew point below this fires.")
    condensation_clear_margin_celsius: float = Field(default=3.0)
    condensation_risk: Hold = Hold(fire_seconds=10.0, clear_seconds=30.0)
    # Pump and loop health (issue 35, detectors_loop.py): warnings that notify, each from any CDU protocol.
    pump_speed_low_fraction: float = Field(default=0.8, gt=0, lt=1, description=(
        "A running pump below this share of its set point (the CDU's pump speed set point, else its fastest "
        "pump's speed) has lost its part of the redundancy: pump_redundancy_lost fires."))
    pump_speed_clear_fraction: float = Field(default=0.9, gt=0, le=1, description=(
        "pump_redundancy_lost clears once every pump runs at or above this share of the set point."))
    pump_redundancy_lost: Hold = Hold(fire_seconds=5.0, clear_seconds=30.0)
    filter_dp_high_pascals: float = Field(default=50_000.0, gt=0, description=(
        "A CDU strainer's pressure drop at or above this fires filter_clogging (a clean one reads ~20 kPa at "
        "nominal flow; replace at two to three times its clean drop, as CDU manuals put it)."))
    filter_dp_clear_pascals: float = Field(default=40_000.0, gt=0, description="filter_clogging clears below this.")
    filter_clogging: Hold = Hold(fire_seconds=30.0, clear_seconds=60.0)
    reservoir_low_ratio: float = Field(default=0.3, gt=0, lt=1, description=(
        "A CDU's reservoir below this fill level (0-1) fires reservoir_low (the reference CDU's own alarm level)."))
    reservoir_clear_ratio: float = Field(default=0.4, gt=0, le=1, description="reservoir_low clears at this level.")
    reservoir_low: Hold = Hold(fire_seconds=30.0, clear_seconds=60.0)
    service_due_fraction: float = Field(default=0.9, gt=0, le=1, description=(
        "A filter in service for this share of its rated service life (Redfish ServiceHours / RatedServiceHours) "
        "fires coolant_service_due."))
    coolant_service_due: Hold = Hold(fire_seconds=0.0, clear_seconds=60.0)
    gpu_thermal_margin_celsius: float = Field(default=3.0, ge=0, description="Fires within this of the slowdown threshold.")
    gpu_thermal_clear_margin_celsius: float = Field(default=6.0, ge=0)
    gpu_thermal_clock_events: list[str] = Field(
        default_factory=lambda: ["hw_thermal", "sw_thermal"], description="Clock event reasons that count as thermal.")
    gpu_thermal: Hold = Hold(fire_seconds=2.0, clear_seconds=30.0)
    # The GPU recovery ladder (issue 33): which class an XID asks for is data (exporters/profiles/nvml/
    # xid-recovery.yaml, with the catalogue); these hold the four incidents. App is an event: it clears this long
    # after its last XID; the others clear only on a proven recovery, so their hold is short.
    gpu_app_fault: Hold = Hold(fire_seconds=0.0, clear_seconds=60.0)
    gpu_reset_required: Hold = Hold(fire_seconds=0.0, clear_seconds=10.0)
    gpu_reboot_required: Hold = Hold(fire_seconds=0.0, clear_seconds=10.0)
    gpu_service_required: Hold = Hold(fire_seconds=0.0, clear_seconds=10.0)
    gpu_lost: Hold = Hold(fire_seconds=0.0, clear_seconds=60.0)
    gpu_lost_hung_fire_seconds: float = Field(default=10.0, ge=0, description=(
        "A hung GPU (its NVML reads overran sources.nvml.gpu_timeout) fires gpu_lost only once it has read hung "
        "this long (and at least gpu_lost.fire_seconds): a read that is slow once on a loaded host answers again "
        "at the next poll, and draining the node for it would cost its jobs for nothing. Shipped: two NVML polls "
        "after the first at the 5 s interval. A GPU off the bus (GPU_IS_LOST) or missing fires on gpu_lost's own "
        "hold, at once as shipped."))
    nvlink_error_rate_per_second: float = Field(
        default=10.0, gt=0, description="Errors/s per link, summed over nvlink_error_types.")
    nvlink_error_types: list[str] = Field(
        # `effective`: NVLink5 (GB200) errors left after FEC, where the legacy types answer NotSupported.
        default_factory=lambda: ["crc_flit", "crc_data", "replay", "recovery", "recovery_failed", "effective"],
        description="supernode_nvlink_errors_total types that count towards the rate.")
    nvlink_effective_ber: float = Field(default=1e-12, gt=0, description="NVLink5 effective BER above this fires.")
    # Above the rack's attribution latency (one NVML interval, 5 s shipped, + its timeout + etcd): a switch fault is
    # attributed (and its links left out here) before any tray's hold ends, so it never drains a tray first.
    nvlink_errors: Hold = Hold(fire_seconds=10.0, clear_seconds=60.0)
    nvlink_switch_fault_min_trays: int = Field(default=3, ge=2, le=72, description=(
        "The same NVLink index failing on at least this many compute trays is its NVSwitch chip's fault "
        "(switch-side: nvlink_switch_fault), fewer is each tray's own (nvlink_errors). A rack of fewer trays uses "
        "its tray count, never below 2."))
    nvlink_switch_fault: Hold = Hold(fire_seconds=0.0, clear_seconds=30.0)
    nvlink_switch_attribution: bool | None = Field(default=None, description=(
        "Publish this tray's NVLink state vector and attribute the rack's NVLink failures (etcd coordination, or "
        "static with inventory.agent_urls: each agent follows its peers' feeds). "
        "Default: on when inventory.switch_trays lists the rack's NVSwitch trays (a rack-scale NVLink domain, "
        "GB200 NVL72, where link k of every GPU reaches switch chip k); an HGX rack's links stay each tray's own."))
    nvlink_switch_fault_drain_partition: bool = Field(default=False, description=(
        "Drain the NVLink partition on a switch-side fault: each compute tray's nvlink_errors then counts its "
        "switch-side links too, so every tray of the domain drains itself. Off: the fabric routes over the other "
        "switch chips at reduced bandwidth, and the nvlink_switch_fault incident only notifies."))
    # A GPU off its NVLink fabric (registration not completed, or failed): a minute covers a re-registration after a
    # GPU reset or a fabric manager restart, which ends on its own in seconds; off it longer, it is drained.
    gpu_fabric_degraded: Hold = Hold(fire_seconds=60.0, clear_seconds=30.0)
    optic_flaps: int = Field(default=3, ge=1, description="Flaps within optic_flap_window_seconds fire optic_degraded.")
    optic_flap_window_seconds: float = Field(default=300.0, gt=0)
    optic_symbol_error_rate_per_second: float = Field(default=1.0, gt=0)
    optic_rx_margin_db: float = Field(default=0.0, description="Fires at rx power below warning threshold + this.")
    optic_degraded: Hold = Hold(fire_seconds=5.0, clear_seconds=60.0)
    rack_power_over_ratio: float = Field(default=1.0, gt=0, description="Fires above this fraction of the budget.")
    rack_power_clear_ratio: float = Field(default=0.95, gt=0)
    rack_power_over_budget: Hold = Hold(fire_seconds=5.0, clear_seconds=30.0)
    pdu_outlet_off: Hold = Hold(fire_seconds=5.0, clear_seconds=30.0)
    # GPU health causes and stragglers (detectors_gpu_health.py): warnings that only notify.
    gpu_pcie_generation_min_utilization_ratio: float = Field(default=0.5, ge=0, le=1, description=(
        "A PCIe link's generation below its maximum counts only while the GPU's utilisation is at least this "
        "(0-1): GPUs drop an idle link to Gen1 to save power. Its width below the maximum always counts."))
    gpu_pcie_degraded: Hold = Hold(fire_seconds=60.0, clear_seconds=60.0)
    gpu_clock_slowdown_reasons: list[str] = Field(
        default_factory=lambda: ["hw_slowdown", "hw_power_brake"], description=(
            "Clock-event reasons (supernode_gpu_clock_event_active) that fire gpu_clock_slowdown; a hw_slowdown "
            "that a thermal reason explains is gpu_thermal's."))
    gpu_clock_slowdown: Hold = Hold(fire_seconds=30.0, clear_seconds=60.0)
    gpu_straggler_min_utilization_ratio: float = Field(default=0.5, ge=0, le=1, description=(
        "A GPU is compared with its node's others only at this utilisation or more (0-1): under load."))
    gpu_straggler_min_gpus: int = Field(default=3, ge=2, description=(
        "The node's median is a reference only with at least this many GPUs under load."))
    gpu_straggler_clock_band_ratio: float = Field(default=0.1, gt=0, lt=1, description=(
        "An SM clock below the node median of busy GPUs by more than this share of it fires."))
    gpu_straggler_power_band_ratio: float = Field(default=0.2, gt=0, lt=1, description=(
        "A power draw further than this share of the node median of busy GPUs from it (either side) fires."))
    gpu_straggler_clear_band_fraction: float = Field(default=0.5, gt=0, le=1, description=(
        "Clears once the clock and power are back within this fraction of their bands (hysteresis)."))
    gpu_straggler: Hold = Hold(fire_seconds=60.0, clear_seconds=60.0)
    # Cold plates and tray coolant flow (issue 35, detectors_cold_plate.py): warnings that only notify.
    cold_plate_degraded_ratio: float = Field(default=0.15, gt=0, lt=10, description=(
        "A GPU's thermal resistance above its learnt baseline, or above the median of its tray's other loaded "
        "GPUs, by more than this share fires cold_plate_degraded; it clears back within half of it."))
    cold_plate_min_peers: int = Field(default=2, ge=1, description=(
        "The tray's other loaded GPUs with a thermal resistance needed for their median to be a reference."))
    cold_plate_degraded: Hold = Hold(fire_seconds=300.0, clear_seconds=300.0)
    tray_flow_low_ratio: float = Field(default=0.7, gt=0, lt=1, description=(
        "A tray's coolant flow (its BMC's coolant connectors) below this share of the median of the other trays "
        "on its CDU fires tray_flow_low."))
    tray_flow_clear_ratio: float = Field(default=0.85, gt=0, le=1, description="Clears above this share.")
    tray_flow_min_peers: int = Field(default=2, ge=1, description=(
        "Other trays of the CDU with a flow reading needed for their median to be a reference."))
    tray_flow_low: Hold = Hold(fire_seconds=30.0, clear_seconds=60.0)


class Guardrails(_Strict):
    """Limits that bound what remediation may do; all on by default."""

    max_drained_nodes: int = Field(default=2, ge=0, description="Most nodes drained at once (scheduler's count).")
    max_drained_fraction: float = Field(default=0.5, ge=0, le=1, description="Most of the rack drained at once.")
    breaker_max_actions: int = Field(default=30, ge=1, description="Actions within the window that trip the breaker.")
    breaker_window_seconds: float = Field(default=60.0, gt=0)
    rate_per_hour: dict[str, int] = Field(default_factory=lambda: {"default": 60},
                                          description="Actions per type per hour; key 'default' for the rest.")
    cooldown_seconds: float = Field(default=60.0, ge=0, description="Least time between two runs of one (action, target).")
    attempts_per_incident: int = Field(default=3, ge=1, description="Tries of one step before escalation.")
    retry_backoff_seconds: float = Field(default=0.5, ge=0, description="First retry delay; doubles each try.")
    approval_expiry_seconds: float = Field(default=3600.0, gt=0, description="A pending approval lapses after this.")
    automatic: list[AutomaticKey] = Field(default_factory=lambda: ["gpu_reset", "leak_watch_below"], description=(
        "Destructive steps allowed without approval: pdu_outlet_off, cdu_write_valve, tray_power_off, "
        "resume_after_leak, resume_after_check, gpu_reset, node_reboot, leak_watch_below, rack_valve_close, "
        "leak_loop_isolate (a tray is powered on again only with a person's approval). Default: gpu_reset (a "
        "reset of a drained GPU with no process on it) and leak_watch_below (the drain of the trays below a "
        "leaking tray: their running jobs go on, no new one lands where the water may fall)."))
    scheduler_retry_max_seconds: float = Field(default=60.0, gt=0, description=(
        "A step blocked by scheduler_unreachable is retried with doubling delays up to this one."))


class SlurmSettings(_Strict):
    enabled: bool = True
    backend: Literal["slurm", "simulated"] = Field(default="slurm", description="simulated: in-process (demo only).")
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    squeue: str = Field(default="squeue", description="Lists the node's jobs for the checkpoint signal.")
    scancel: str = Field(default="scancel", description="Sends the checkpoint signal (--full: batch shell and every step).")
    slurm_conf: Path | None = Field(default=None, description="Passed as SLURM_CONF to every call.")
    timeout_seconds: float = Field(default=10.0, gt=0)
    checkpoint_signal: str | None = Field(default=None, description=(
        "Signal sent to the node's jobs (batch shell and every step) before drain; a failed signal never blocks it."))


class ExecProgram(_Strict):
    path: Path = Field(description="Absolute path of the program.")
    undo_path: Path | None = None
    timeout_seconds: float = Field(default=30.0, gt=0)


class LinkControlSettings(_Strict):
    """How isolate_link steps take a port down: the programs (argv prefixes) and the read-back wait."""

    ip: list[str] = Field(default_factory=lambda: ["ip"], min_length=1,
                          description="Argv prefix of `ip` (Ethernet/RoCE: `... link set dev X down|up`).")
    ibportstate: list[str] = Field(default_factory=lambda: ["ibportstate"], min_length=1,
                                   description="Argv prefix of `ibportstate` (InfiniBand: `... disable|enable`).")
    timeout_seconds: float = Field(default=5.0, gt=0, description="Longest one isolation command may run.")
    settle_seconds: float = Field(default=2.0, ge=0, description=(
        "How long the read-back waits for the port's state to follow the command (IB and some NICs lag)."))


class JournalRetentionSettings(_Strict):
    """How long the journal keeps rows it no longer needs (applied at every start, before the replay, then daily)."""

    resolved_incident_days: float | None = Field(default=90.0, gt=0, description=(
        "Rows of an incident resolved and quiet for this long (none of its actions unfinished) are removed; "
        "null keeps them forever."))
    webhook_dedup_days: float | None = Field(default=7.0, gt=0, description=(
        "Webhook dedup rows of an alert resolved this long ago are removed (Alertmanager keeps and resends "
        "alerts for 5 days by default); a firing alert's rows are kept. null keeps them forever."))


class XidOverride(_Strict):
    """An operator's replacement for one entry of NVIDIA's XID catalogue (exporters/profiles/nvml/xid-catalogue.yaml).

    Only the shape is checked here; that the XID is in the catalogue and the actions are in its vocabulary is
    checked against the catalogue file at config load (agent/config.py), so check-config names the bad one."""

    immediate_action: str | None = Field(default=None, description="A catalogue immediate action (e.g. RESET_GPU).")
    investigatory_action: str | None = Field(default=None, description="A catalogue guidance class.")


class GpuRecoverySettings(_Strict):
    """How the GPU recovery ladder acts (issue 33): tell the job, reset a GPU, reboot the node through Slurm."""

    job_notify: Literal["comment", "requeue", "none"] = Field(default="comment", description=(
        "What an application-level fault (the catalogue's RESTART_APP) does to the node's jobs: `comment` sets "
        "the job's Comment (owner-visible in squeue/sacct), `requeue` puts it back in the queue, `none` only "
        "journals."))
    gpu_reset_command: list[str] = Field(
        default_factory=lambda: ["nvidia-smi", "--gpu-reset", "-i", "{gpu}"], min_length=1, description=(
            "Argument list of a GPU reset ({gpu}: the index, {node}, {uuid} replaced per element; never a shell)."))
    gpu_reset_timeout_seconds: float = Field(default=60.0, gt=0, description="Longest one reset may run.")
    idle_wait_seconds: float = Field(default=600.0, gt=0, description=(
        "How long a reset waits for the GPU to have no process (its node drained, the job gone) before it fails "
        "and the ladder escalates."))
    reboot_timeout_seconds: float = Field(default=900.0, gt=0, description=(
        "How long a node_reboot waits for Slurm to report the node booted again (BootTime after the request) "
        "before it fails and the ladder escalates to service."))
    verify_seconds: float = Field(default=30.0, gt=0, description=(
        "After a reset or reboot: how long the health read may take to show the GPU healthy."))


class DerateSettings(_Strict):
    """The derate by margin (issue 35, derate_watch.py): when a coolant incident's cap is planned again."""

    replan_shed_change: float = Field(default=0.05, gt=0, le=1, description=(
        "Re-plan an applied derate once the share of power to shed differs from the applied one by at least "
        "this (0-1): the loop's capacity moved (flow, supply), not one poll's noise."))
    replan_min_interval_seconds: float = Field(default=30.0, ge=0, description=(
        "At least this long between two plans of one incident's derate (the GPUs' power and the loop settle "
        "within seconds of a new limit)."))


class RemediationSettings(_Strict):
    detectors: DetectorSettings = DetectorSettings()
    derate: DerateSettings = DerateSettings()
    guardrails: Guardrails = Guardrails()
    leak_scope: LeakScopeSettings = LeakScopeSettings()
    journal_retention: JournalRetentionSettings = JournalRetentionSettings()
    playbook_dir: Path | None = Field(default=None, description="Replaces the shipped playbooks when set.")
    slurm: SlurmSettings = SlurmSettings()
    notify_url: str | None = Field(default=None, description="notify steps POST their JSON event here.")
    notify_timeout_seconds: float = Field(default=5.0, gt=0)
    device_timeout_seconds: float = Field(default=5.0, gt=0, description=(
        "Budget of one blocking device call in remediation (NVML, links, Modbus, PDU); past it the step fails."))
    intent_commit_wait_seconds: float = Field(default=1.0, ge=0, description=(
        "Before a step writes to a device it waits this long at most for its intent to reach the journal's "
        "disk (normally one fsync), so a crash mid-write leaves an intent to reconcile; a slow or full disk "
        "delays a step by no more than this, and the result then says intent_on_disk: false."))
    exec_allow: dict[str, ExecProgram] = Field(default_factory=dict, description="Name -> program exec steps may run.")
    link_control: LinkControlSettings = LinkControlSettings()
    rack_leader: str | None = Field(default=None, description=(
        "Node whose agent drives shared rack devices (valves, outlets); default: the first inventory node."))
    webhook_token_secret: str | None = Field(default=None, description="Name in `secrets` of the webhook bearer token.")
    admin_token_secret: str | None = Field(default=None, description="Name in `secrets` of the admin (approve) token.")
    xid_overrides: dict[int, XidOverride] = Field(default_factory=dict, description=(
        "XID -> replacement immediate/investigatory action for that one catalogue entry (issue 33): the GPU fault "
        "judge looks the ladder class up from the overridden action."))
    gpu_recovery: GpuRecoverySettings = GpuRecoverySettings()
    resume_health_check: str = Field(default="nvml", description=(
        "Before resuming a node drained for a GPU fault (steps with resume_check): `nvml` (the agent's own "
        "check), the name of an exec_allow program (exit 0 passes), or `none` (always a person's approval)."))

    @model_validator(mode="after")
    def _resume_check_known(self) -> "RemediationSettings":
        name = self.resume_health_check
        if name not in ("nvml", "none") and name not in self.exec_allow:
            raise ValueError(f"resume_health_check: {name!r} is neither nvml, none nor a program in exec_allow "
                             f"({', '.join(sorted(self.exec_allow)) or 'none listed'})")
        return self
