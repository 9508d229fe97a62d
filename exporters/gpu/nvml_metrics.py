"""The GPU and NVLink metric families (METRICS.md), declared once; exporters/gpu/nvml.py fills them."""

from __future__ import annotations

from exporters.model import counter, gauge, info

G = ("gpu", "uuid")
L = ("gpu", "uuid", "link")

GPU_INFO = info("supernode_gpu_info", "Static facts of a GPU (value 1).",
                G + ("name", "serial", "pci_bus_id", "vbios", "driver", "cuda"))
GPU_UP = gauge("supernode_gpu_up",
               "1 if the GPU answers NVML; 0 if lost (GPU_IS_LOST), hung, or missing against the inventory.", G)
GPU_HUNG = gauge("supernode_gpu_hung",
                 "1 while the GPU's NVML calls overrun the per-GPU time budget (skipped until a probe answers).", G)
TEMPERATURE = gauge("supernode_gpu_temperature_celsius",
                    "GPU die (sensor=gpu) or HBM (sensor=memory) temperature in degrees Celsius.", G + ("sensor",), "celsius")
THRESHOLD = gauge("supernode_gpu_temperature_threshold_celsius", "Driver temperature thresholds in degrees Celsius.",
                  G + ("threshold",), "celsius")
POWER = gauge("supernode_gpu_power_watts", "GPU power draw in watts.", G, "watts")
ENERGY = counter("supernode_gpu_energy_joules_total", "Energy used by the GPU since the driver loaded, in joules.", G, "joules")
POWER_LIMIT = gauge("supernode_gpu_power_limit_watts",
                    "GPU power limits in watts (current, default, min, max constraints, enforced).", G + ("limit",), "watts")
UTILIZATION = gauge("supernode_gpu_utilization_ratio", "Share of the last sample period the engine was busy (0-1).",
                    G + ("engine",), "ratio")
MEMORY_USED = gauge("supernode_gpu_memory_used_bytes", "GPU framebuffer memory in use, in bytes.", G, "bytes")
MEMORY_TOTAL = gauge("supernode_gpu_memory_total_bytes", "GPU framebuffer memory size, in bytes.", G, "bytes")
CLOCK = gauge("supernode_gpu_clock_hertz", "Current clock frequency in hertz.", G + ("clock",), "hertz")
CLOCK_EVENT = gauge("supernode_gpu_clock_event_active", "1 while this reason holds the clocks down (throttle reason).",
                    G + ("reason",))
ECC = counter("supernode_gpu_ecc_errors_total", "ECC memory errors (volatile: since driver load; aggregate: lifetime).",
              G + ("type", "scope"))
REMAPPED = gauge("supernode_gpu_remapped_rows", "HBM rows remapped, by kind.", G + ("kind",))
REMAP_PENDING = gauge("supernode_gpu_remapped_rows_pending", "1 if a row remap waits for the next GPU reset.", G)
REMAP_FAILURE = gauge("supernode_gpu_remapped_rows_failure", "1 if a row remap failed (GPU needs service).", G)
PERSISTENCE = gauge("supernode_gpu_persistence_mode",
                    "1 if the driver keeps the GPU initialised with no client (persistence mode enabled).", G)
PCIE_WIDTH = gauge("supernode_gpu_pcie_link_width",
                   "PCIe lanes of the GPU's link: kind=current (as trained) or max (what the GPU and its slot allow).",
                   G + ("kind",))
PCIE_GENERATION = gauge("supernode_gpu_pcie_link_generation",
                        "PCIe generation of the GPU's link: kind=current (drops at idle on many GPUs to save power) "
                        "or max (what the GPU and its slot allow).", G + ("kind",))
PCIE_REPLAYS = counter("supernode_gpu_pcie_replays_total", "PCIe replay events of the GPU.", G)
XID = counter("supernode_gpu_xid_errors_total",
              "XID errors seen on the NVML event stream since the agent started, per XID, with NVIDIA's catalogue "
              "immediate action after the config's overrides (none: the catalogue gives none; unknown: not in it).",
              G + ("xid", "action"))
LAST_XID = gauge("supernode_gpu_last_xid", "Last XID seen on the NVML event stream (0: none since the agent started).", G)
RECOVERY = gauge("supernode_gpu_recovery_action", "1 for the driver's current recovery hint (NVML field 230).",
                 G + ("action",))
C2C_ERRORS = counter("supernode_gpu_c2c_errors_total",
                     "Chip-to-chip (Grace-GPU C2C) link errors of the GPU, by type (NVML fields 231-233).", G + ("type",))

FABRIC_STATE = gauge("supernode_gpu_fabric_state",
                     "NVLink fabric registration of the GPU as a state set: 1 for the current state (not_supported, "
                     "not_started, in_progress, completed), 0 for the others (nvmlDeviceGetGpuFabricInfoV).",
                     G + ("state",))
FABRIC_STATUS = gauge("supernode_gpu_fabric_status_code",
                      "NVML return code of the GPU's fabric registration (0: success); only where the GPU has a fabric.", G)
FABRIC_HEALTH = gauge("supernode_gpu_fabric_health",
                      "1 while the fabric health-mask condition holds for the GPU, 0 while it does not; no series where "
                      "the driver reports the condition not supported.", G + ("condition",))
FABRIC_CLIQUE = info("supernode_gpu_fabric_clique_info",
                     "The NVLink fabric the GPU is registered in: cluster UUID and clique id (value 1).",
                     G + ("cluster_uuid", "clique_id"))

NVLINK_UP = gauge("supernode_nvlink_up", "1 if the NVLink is active.", L)
NVLINK_ERRORS = counter("supernode_nvlink_errors_total", "NVLink errors per link, by type.", L + ("type",))
NVLINK_BER = gauge("supernode_nvlink_bit_error_rate", "NVLink5 bit error rate per link (errors per bit).", L + ("kind",), "ratio")
NVLINK_TX = counter("supernode_nvlink_transmit_bytes_total", "NVLink data bytes transmitted per link.", L, "bytes")
NVLINK_RX = counter("supernode_nvlink_receive_bytes_total", "NVLink data bytes received per link.", L, "bytes")

# Per-GPU roll-ups of the per-link families (exporters/gpu/nvlink_rollup.py), always exported: the per-link series
# are exported only where they carry information (agent/series_budget.py), and these keep the whole GPU's count,
# traffic and worst BER visible (and rate()-able from the first error) on a quiet tray.
GPU_NVLINK_ERRORS = counter("supernode_gpu_nvlink_errors_total",
                            "NVLink errors of the GPU by type, summed over its links (per link: supernode_nvlink_errors_total).",
                            G + ("type",))
GPU_NVLINK_BER_MAX = gauge("supernode_gpu_nvlink_bit_error_rate_max",
                           "Worst NVLink5 bit error rate over the GPU's links, by kind (errors per bit; per link: "
                           "supernode_nvlink_bit_error_rate).", G + ("kind",), "ratio")
GPU_NVLINK_TX = counter("supernode_gpu_nvlink_transmit_bytes_total",
                        "NVLink data bytes the GPU transmitted, summed over its links.", G, "bytes")
GPU_NVLINK_REMOTE = gauge("supernode_gpu_nvlink_remote_links",
                          "The GPU's NVLinks by what they reach (remote_type switch, gpu, ibmnpu, unknown), a count; "
                          "which link reaches what: supernode_nvlink_remote_info (metrics.detail: nvlink_link_remote).",
                          G + ("remote_type",))
GPU_NVLINK_RX = counter("supernode_gpu_nvlink_receive_bytes_total",
                        "NVLink data bytes the GPU received, summed over its links.", G, "bytes")

NVLINK_REMOTE = info("supernode_nvlink_remote_info",
                     "What each NVLink reaches (value 1): remote device type (switch, gpu, ibmnpu, unknown) and its PCI "
                     "bus id where the driver gives one (empty otherwise).", L + ("remote_type", "remote_pci_bus_id"))

NVLINK_BY_METRIC = {"errors": NVLINK_ERRORS, "bit_error_rate": NVLINK_BER,
                    "transmit_bytes": NVLINK_TX, "receive_bytes": NVLINK_RX}

ALL = (GPU_INFO, GPU_UP, GPU_HUNG, TEMPERATURE, THRESHOLD, POWER, ENERGY, POWER_LIMIT, UTILIZATION, MEMORY_USED, MEMORY_TOTAL,
       CLOCK, CLOCK_EVENT, ECC, REMAPPED, REMAP_PENDING, REMAP_FAILURE, PERSISTENCE, PCIE_REPLAYS, XID, LAST_XID, RECOVERY,
       C2C_ERRORS, NVLINK_UP, NVLINK_ERRORS, NVLINK_BER, NVLINK_TX, NVLINK_RX,
       GPU_NVLINK_ERRORS, GPU_NVLINK_BER_MAX, GPU_NVLINK_TX, GPU_NVLINK_RX, GPU_NVLINK_REMOTE,
       PCIE_WIDTH, PCIE_GENERATION, FABRIC_STATE, FABRIC_STATUS, FABRIC_HEALTH, FABRIC_CLIQUE, NVLINK_REMOTE)
