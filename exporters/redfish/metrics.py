"""Metric families the Redfish collector fills (leak detectors, coolant connectors, pumps, health, the client).

The profile (exporters/profiles/redfish/*.yaml) names these families by their
exposition name; its loader checks every name against this table, so a typo in
a profile fails at load, not as a missing series on a dashboard.
"""

from __future__ import annotations

from exporters.model import MetricSpec, counter, gauge, info

DETECTOR_STATE = gauge(
    "supernode_leak_detector_state",
    "Redfish leak detector DetectorState, polled (re-read at once on an event): 0 OK (dry), 1 Warning, 2 Critical; "
    "bmc is the inventory name of the Redfish service, type its LeakDetectorType (Moisture, FloatSwitch).",
    ["bmc", "chassis", "detector", "type"])
CONNECTOR_TEMPERATURE = gauge(
    "supernode_coolant_connector_temperature_celsius",
    "Coolant temperature at a Redfish coolant connector in degrees Celsius (point supply or return), polled; "
    "loop is primary or secondary for a CDU's connectors, chassis for a server's own.",
    ["bmc", "equipment", "connector", "loop", "point"], "celsius")
CONNECTOR_PRESSURE = gauge(
    "supernode_coolant_connector_pressure_pascals",
    "Coolant pressure at a Redfish coolant connector in pascals (point supply, return or delta), polled.",
    ["bmc", "equipment", "connector", "loop", "point"], "pascals")
CONNECTOR_FLOW = gauge(
    "supernode_coolant_connector_flow_cubic_meters_per_second",
    "Coolant flow through a Redfish coolant connector in cubic metres per second, polled.",
    ["bmc", "equipment", "connector", "loop"], "cubic_meters_per_second")
CONNECTOR_HEAT = gauge(
    "supernode_coolant_connector_heat_removed_watts",
    "Heat removed through a Redfish coolant connector in watts, as the device reports it, polled.",
    ["bmc", "equipment", "connector", "loop"], "watts")
CONNECTOR_VALVE = gauge(
    "supernode_coolant_connector_valve_position_ratio",
    "Valve position of a Redfish coolant connector as a ratio (0 closed - 1 open), polled.",
    ["bmc", "equipment", "connector", "loop"], "ratio")
PUMP_SPEED = gauge(
    "supernode_coolant_pump_speed_ratio",
    "Speed of a Redfish pump as a ratio of full speed (0-1), polled.",
    ["bmc", "equipment", "pump"], "ratio")
PUMP_SETPOINT = gauge(
    "supernode_coolant_pump_speed_setpoint_ratio",
    "Speed set point of a Redfish pump (SpeedControlPercent.SetPoint) as a ratio of full speed (0-1), polled: a "
    "change is a set point change, not a flow fault.",
    ["bmc", "equipment", "pump"], "ratio")
SERVICE_TIME = gauge(
    "supernode_coolant_service_seconds",
    "Time in service of a Redfish pump or filter (its ServiceHours, since installed or last serviced) in seconds, "
    "polled; kind is pump or filter.",
    ["bmc", "equipment", "kind", "resource"], "seconds")
RATED_SERVICE_TIME = gauge(
    "supernode_coolant_rated_service_seconds",
    "Rated service life of a Redfish filter (its RatedServiceHours) in seconds, polled: due for service once "
    "supernode_coolant_service_seconds reaches it.",
    ["bmc", "equipment", "kind", "resource"], "seconds")
RESERVOIR_LEVEL = gauge(
    "supernode_coolant_reservoir_level_ratio",
    "Fluid level of a Redfish reservoir as a ratio (0-1), polled.",
    ["bmc", "equipment", "reservoir"], "ratio")
SENSOR_TEMPERATURE = gauge(
    "supernode_redfish_temperature_celsius",
    "A Redfish temperature sensor (Sensor with ReadingType Temperature) in degrees Celsius, polled: an NVLink "
    "switch tray's NVSwitch chips and coolant inlet.",
    ["bmc", "equipment", "sensor"], "celsius")
HEALTH = gauge(
    "supernode_redfish_health",
    "Status.Health of a Redfish resource, polled: 0 OK, 1 Warning, 2 Critical; kind is leak_detector, connector, "
    "pump, filter, reservoir, sensor or chassis (a switch tray's own health).",
    ["bmc", "equipment", "kind", "resource"])
SERVICE_INFO = info(
    "supernode_redfish_service_info",
    "Static facts of a Redfish service the agent reads (value 1): kind tray, cdu or switch, as the inventory says.",
    ["bmc", "kind", "redfish_version", "vendor", "model", "firmware", "profile"])
REQUESTS = counter("supernode_redfish_requests_total", "HTTP requests sent to the Redfish service (retries included).",
                   ["bmc"])
LOGINS = counter("supernode_redfish_logins_total",
                 "Redfish sessions created (the first, and each re-login after a 401 or an expired session).", ["bmc"])
DISCOVERIES = counter("supernode_redfish_discoveries_total",
                      "Walks of the resource tree from the service root; why is first, not_found (a 404 on a cached "
                      "resource) or periodic.", ["bmc", "why"])
EVENTS = counter("supernode_redfish_events_total",
                 "Event records received from the service's EventService (SSE stream or push), by whether they "
                 "named a polled leak or coolant resource and so triggered an immediate re-read.",
                 ["bmc", "triggered"])
EVENT_STREAM_UP = gauge(
    "supernode_redfish_event_stream_up",
    "1 while the event subscription (SSE stream or push subscription) is live; 0 while polling alone carries the "
    "leak detectors (the stream dropped, or the service offers none).", ["bmc", "transport"])
EVENT_STREAM_ERRORS = counter(
    "supernode_redfish_event_stream_errors_total",
    "Times the SSE event stream ended or could not be opened, by reason: too_long (a line or event over 1 MiB), "
    "not_utf8, not_json, connection, timeout, auth, tls, protocol, ended (the service closed it), unexpected; "
    "each is followed by a poll at once and a reconnect with backoff.", ["bmc", "reason"])
EVENT_POLLS_COALESCED = counter(
    "supernode_redfish_event_polls_coalesced_total",
    "Events (SSE or push) whose immediate re-read was folded into a poll already due: at most one forced poll per "
    "sources.redfish.event_min_poll_seconds per service, the last event always followed by one.", ["bmc"])
UNCONFIRMED_POLLING = gauge(
    "supernode_redfish_unconfirmed_polling",
    "1 while the service is polled every sources.redfish.unconfirmed_interval (default the leak interval) because "
    "its event subscription is not confirmed yet, or was lost: a leak is read as fast as a Modbus one; 0 while "
    "events arrive and polling is back at sources.redfish.interval.", ["bmc"])

ALL: dict[str, MetricSpec] = {m.name: m for m in (
    DETECTOR_STATE, CONNECTOR_TEMPERATURE, CONNECTOR_PRESSURE, CONNECTOR_FLOW, CONNECTOR_HEAT, CONNECTOR_VALVE,
    PUMP_SPEED, PUMP_SETPOINT, SERVICE_TIME, RATED_SERVICE_TIME, RESERVOIR_LEVEL, SENSOR_TEMPERATURE, HEALTH,
    SERVICE_INFO, REQUESTS, LOGINS,
    DISCOVERIES, EVENTS, EVENT_STREAM_UP,
    EVENT_STREAM_ERRORS, EVENT_POLLS_COALESCED, UNCONFIRMED_POLLING)}
# Labels the collector fills itself; a profile field names only the others (point).
AUTO_LABELS = {"bmc", "equipment", "connector", "loop", "pump", "reservoir", "sensor", "kind", "resource"}
