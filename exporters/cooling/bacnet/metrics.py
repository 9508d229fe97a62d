"""The BACnet client's own families: what it asked the device, what failed, whether COV push is up.

A BACnet CDU's readings are the cooling families every CDU protocol shares (exporters/cooling/modbus_metrics.py:
`supernode_cdu_*`, `supernode_leak_*`), so the coolant and leak detectors read it as they read a Modbus CDU.
"""

from __future__ import annotations

from exporters.model import MetricSpec, counter, gauge

REQUESTS = counter("supernode_bacnet_requests_total",
                   "BACnet requests sent to the device, by service (who-is, read-property-multiple, read-property, "
                   "subscribe-cov, write-property).", ["device", "service"])
ERRORS = counter("supernode_bacnet_errors_total",
                 "BACnet requests or values that failed, by kind (timeout, error, reject, abort, decode).",
                 ["device", "kind"])
COV_UP = gauge("supernode_bacnet_cov_up",
               "1 while every COV point of the poll has a subscription confirmed by a notification (pushed within "
               "one round trip); 0 while any is polled only (unsupported, refused, lost or not yet confirmed). One "
               "per poll of the device (source: cdu, leak), each with its own subscriptions.", ["device", "source"])
COV_NOTIFICATIONS = counter("supernode_bacnet_cov_notifications_total",
                            "COV notifications received from the device.", ["device"])

ALL: dict[str, MetricSpec] = {m.name: m for m in (REQUESTS, ERRORS, COV_UP, COV_NOTIFICATIONS)}
