"""GPUs through NVML: the collector, its metric families, the NVLink lanes, the power-cap control and the NVML profile."""
