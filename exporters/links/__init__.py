"""Network links from Linux: port state and counters (sysfs), optics DOM (ethtool -m), link control and probe."""
