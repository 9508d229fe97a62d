"""The BACnet/IP client of one device, through bacpypes3: Who-Is to its address, reads, writes, COV subscriptions.

Why bacpypes3 (see pyproject.toml): it is asyncio-native (the agent's loop
runs it; no thread and no second event loop), maintained, MIT-licensed, and
runs on Debian's Python 3.11; it decodes the APDUs, keeps the transaction
state machines (invoke ids, segmentation, retries) and dispatches COV
notifications. What it leaves to this module: which requests to make, bounds
on time, and the decoding of each value against the type the object should
have (decode.py), per value, so one hostile value faults one reading.

What the client's application serves: nothing. A BACnet client is a device
on the network; bacpypes3 would answer anyone's Who-Is, ReadProperty and
WriteProperty about it. This one accepts only I-Am and COV notifications,
and only from the configured device's address: it never answers a request,
so it never sends a broadcast (it binds an ephemeral port with a /32 mask:
no broadcast address exists for it) and nothing it holds can be written.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from exporters.model import SourceError

# bacpypes3 imports asyncio machinery only; importing it has no side effect on the network.
from bacpypes3.apdu import (AbortPDU, ConfirmedCOVNotificationRequest, ErrorRejectAbortNack, IAmRequest,
                            PropertyReference, ReadAccessSpecification, ReadPropertyACK,
                            ReadPropertyMultipleACK, ReadPropertyMultipleRequest, ReadPropertyRequest, RejectPDU,
                            SimpleAckPDU, SubscribeCOVRequest, UnconfirmedCOVNotificationRequest,
                            WritePropertyRequest)
from bacpypes3.app import Application
from bacpypes3.constructeddata import Any as AnyValue, SequenceOf
from bacpypes3.local.device import DeviceObject
from bacpypes3.local.networkport import NetworkPortObject
from bacpypes3.pdu import Address
from bacpypes3.primitivedata import Null, ObjectIdentifier

from exporters.cooling.bacnet.decode import PropertyProblem, cast_value

log = logging.getLogger("supernode.bacnet")

SERVICE_RPM = 14  # bit of ReadPropertyMultiple in protocol-services-supported (BACnetServicesSupported)
SERVICE_SUBSCRIBE_COV = 5
PER_OBJECT_BYTES = 6  # object id and the open/close tags of its results in a ReadPropertyMultiple-ACK
PER_PROPERTY_BYTES = 9  # a property id, its open/close tags and a value of up to 5 octets (Real, bit string)
RP_CONCURRENCY = 8  # ReadProperty requests in flight at once when the device has no ReadPropertyMultiple


class BacnetError(SourceError):
    """A request the device answered with an Error, Reject or Abort; `reason` is the standard's name for it."""

    def __init__(self, service: str, reply: Any):
        kind = type(reply).__name__
        if isinstance(reply, RejectPDU):
            self.reason = f"reject:{reply.apduAbortRejectReason}"
        elif isinstance(reply, AbortPDU):
            self.reason = f"abort:{reply.apduAbortRejectReason}"
        else:
            self.reason = f"{getattr(reply, 'errorClass', '?')}:{getattr(reply, 'errorCode', '?')}"
        self.unrecognized = "unrecognized-service" in self.reason
        super().__init__("protocol", f"{service} answered {kind} ({self.reason})")


@dataclass
class DeviceInfo:
    """What the device said about itself this session (from its I-Am and its Device object)."""

    instance: int
    max_apdu: int = 1476
    rpm: bool = True
    cov: bool = True
    firmware: str = "unknown"
    vendor: str = "unknown"
    model: str = "unknown"


@dataclass
class ClientStats:
    requests: Counter[str] = field(default_factory=Counter)  # by service
    errors: Counter[str] = field(default_factory=Counter)  # by kind: timeout, error, reject, abort, decode
    notifications: int = 0


def local_address_for(host: str, port: int) -> str:
    """The local IP address the kernel routes to `host` from: the client binds exactly that (never 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # UDP: no packet is sent
        return s.getsockname()[0]


class _ClientApp(Application):
    """bacpypes3's application with every incoming request dropped but I-Am and COV notifications from the device."""

    peer: Address | None = None

    async def indication(self, apdu: Any) -> None:  # type: ignore[override]
        if self.peer is None or apdu.pduSource != self.peer:
            return
        if isinstance(apdu, (IAmRequest, ConfirmedCOVNotificationRequest, UnconfirmedCOVNotificationRequest)):
            await super().indication(apdu)


class CovContext:
    """One subscription as bacpypes3's COV dispatch finds it: (address, process id) -> this; values go to `sink`."""

    def __init__(self, objid: ObjectIdentifier, sink: Callable[[ObjectIdentifier, str, Any], None]):
        self.monitored_object_identifier = objid
        self.sink = sink

    async def put(self, property_value: Any) -> None:  # called by bacpypes3 for each value of a notification
        self.sink(self.monitored_object_identifier, str(property_value.propertyIdentifier), property_value.value)


class BacnetLink:
    """One BACnet/IP device: the application (one UDP socket), its session facts, and every request made to it.

    Shared by the sources of one device (its coolant poll and its leak poll: `link_for`), as the Modbus gateway is.
    """

    def __init__(self, host: str, port: int, *, device_instance: int | None = None, timeout: float = 2.0,
                 retries: int = 0, client_instance: int = 4194300, name: str = ""):
        self.host, self.port = host, port
        self.name = name or f"{host}:{port}"
        self.device_instance = device_instance
        self.timeout, self.retries = timeout, retries
        self.client_instance = client_instance
        self.address = Address(f"{host}:{port}")
        self.stats = ClientStats()
        self.info: DeviceInfo | None = None
        self.users = 0
        self._app: _ClientApp | None = None
        self._identify_lock = asyncio.Lock()
        self._next_process_id = 1

    def same_settings(self, device_instance: int | None = None, timeout: float = 2.0, retries: int = 0,
                      client_instance: int = 4194300, name: str = "") -> bool:
        return (self.device_instance, self.timeout, self.retries, self.client_instance) == \
            (device_instance, timeout, retries, client_instance)

    # -- the application ------------------------------------------------------------

    def _application(self) -> _ClientApp:
        if self._app is None:
            local = local_address_for(self.host, self.port)
            device = DeviceObject(objectIdentifier=("device", self.client_instance), objectName="supernode-agent",
                                  vendorIdentifier=999, apduTimeout=max(1, int(self.timeout * 1000)),
                                  numberOfApduRetries=self.retries, maxApduLengthAccepted=1476)
            port = NetworkPortObject(f"{local}/32:0", objectIdentifier=("network-port", 1),
                                     objectName="NetworkPort-1")
            app = _ClientApp.from_object_list([device, port])
            app.peer = self.address
            self._app = app
        return self._app

    async def close(self) -> None:
        if self._app is not None:
            self._app.close()
            self._app = None
        self.info = None

    def forget(self) -> None:
        """The device stopped answering: learn about it again (Who-Is, Device object) at the next read."""
        self.info = None

    # -- requests ---------------------------------------------------------------------

    async def _request(self, service: str, apdu: Any) -> Any:
        """Send one confirmed request and return the device's ack. An Error, Reject or Abort (bacpypes3 raises them,
        as BaseExceptions) is a BacnetError; no answer in time (the stack's own retries included) a timeout."""
        app = self._application()
        apdu.pduDestination = self.address
        self.stats.requests[service] += 1
        budget = self.timeout * (self.retries + 1) + min(0.5, self.timeout)  # the stack's own retries, a margin
        try:
            async with asyncio.timeout(budget):
                reply = await app.request(apdu)
        except TimeoutError:
            self.stats.errors["timeout"] += 1
            raise SourceError("timeout", f"{self.name}: {service} unanswered after {budget:.1f}s") from None
        except ErrorRejectAbortNack as nack:
            reply = nack
        if isinstance(reply, ErrorRejectAbortNack):
            err = BacnetError(service, reply)
            if isinstance(reply, AbortPDU) and "no-response" in err.reason:
                self.stats.errors["timeout"] += 1
                raise SourceError("timeout", f"{self.name}: {service} unanswered ({err.reason})") from None
            self.stats.errors[err.reason.split(":", 1)[0] if err.reason.startswith(("reject", "abort"))
                              else "error"] += 1
            raise err from None
        if reply is None:
            self.stats.errors["timeout"] += 1
            raise SourceError("timeout", f"{self.name}: {service} unanswered")
        return reply

    async def identify(self) -> DeviceInfo:
        """Who-Is to the device's own address (never a broadcast), then what its Device object says it supports."""
        async with self._identify_lock:
            if self.info is not None:
                return self.info
            app = self._application()
            low = high = self.device_instance
            self.stats.requests["who-is"] += 1
            iams = await app.who_is(low, high, address=self.address, timeout=self.timeout)
            instance, max_apdu = self.device_instance, 1476
            if iams:
                iam = iams[0]
                instance = iam.iAmDeviceIdentifier[1]
                max_apdu = int(iam.maxAPDULengthAccepted)
            elif instance is None:
                self.stats.errors["timeout"] += 1
                raise SourceError("timeout", f"{self.name}: no I-Am to a Who-Is in {self.timeout:.1f}s "
                                             "(set device_instance if the device ignores Who-Is)")
            info = DeviceInfo(int(instance), max_apdu=max(50, min(max_apdu, 1476)))
            dev = ObjectIdentifier(("device", info.instance))
            services = await self.read_property(dev, "protocol-services-supported")
            if isinstance(services, PropertyProblem):
                raise SourceError("decode", f"{self.name}: protocol-services-supported: {services}")
            info.rpm = _bit(services, SERVICE_RPM)
            info.cov = _bit(services, SERVICE_SUBSCRIBE_COV)
            facts = await self.read([(dev, ("firmware-revision", "vendor-name", "model-name"))], info)
            got = facts.get(dev, {})
            for attr, prop in (("firmware", "firmware-revision"), ("vendor", "vendor-name"), ("model", "model-name")):
                value = got.get(prop)
                if isinstance(value, str) and value.isprintable():
                    setattr(info, attr, value[:64])
            self.info = info
            return info

    async def read_property(self, objid: ObjectIdentifier, prop: str) -> Any:
        reply = await self._request("read-property", ReadPropertyRequest(objectIdentifier=objid,
                                                                         propertyIdentifier=prop))
        if not isinstance(reply, ReadPropertyACK):
            self.stats.errors["decode"] += 1
            raise SourceError("decode", f"{self.name}: read-property answered {type(reply).__name__}")
        return self._cast(objid, prop, reply.propertyValue)

    def _cast(self, objid: ObjectIdentifier, prop: str, value: Any) -> Any:
        out = cast_value(str(objid[0]), prop, value)
        if isinstance(out, PropertyProblem) and out.kind == "decode":
            self.stats.errors["decode"] += 1
        return out

    async def read(self, objects: list[tuple[ObjectIdentifier, tuple[str, ...]]],
                   info: DeviceInfo | None = None) -> dict[ObjectIdentifier, dict[str, Any]]:
        """Every property asked for, per object: its value, or a PropertyProblem (unknown object, a value of the
        wrong type). ReadPropertyMultiple in as few requests as the device's APDU holds; ReadProperty (a few in
        flight) where it has none, or rejects it as unrecognized."""
        info = info or self.info or await self.identify()
        out: dict[ObjectIdentifier, dict[str, Any]] = {}
        if info.rpm:
            try:
                for chunk in chunks(objects, info.max_apdu):
                    out.update(await self._read_multiple(chunk))
                return out
            except BacnetError as exc:
                if not exc.unrecognized:
                    raise
                log.info("device has no ReadPropertyMultiple: ReadProperty from now on", extra={"device": self.name})
                info.rpm = False
        sem = asyncio.Semaphore(RP_CONCURRENCY)

        async def one(objid: ObjectIdentifier, prop: str) -> tuple[ObjectIdentifier, str, Any]:
            async with sem:
                try:
                    return objid, prop, await self.read_property(objid, prop)
                except BacnetError as exc:
                    return objid, prop, PropertyProblem("error", exc.reason)

        got = await asyncio.gather(*(one(o, p) for o, props in objects for p in props))
        for objid, prop, value in got:
            out.setdefault(objid, {})[prop] = value
        return out

    async def _read_multiple(self, objects: list[tuple[ObjectIdentifier, tuple[str, ...]]]) -> dict:
        specs = [ReadAccessSpecification(objectIdentifier=o, listOfPropertyReferences=[
            PropertyReference(propertyIdentifier=p) for p in props]) for o, props in objects]
        reply = await self._request("read-property-multiple", ReadPropertyMultipleRequest(
            listOfReadAccessSpecs=SequenceOf(ReadAccessSpecification)(specs)))
        if not isinstance(reply, ReadPropertyMultipleACK):
            self.stats.errors["decode"] += 1
            raise SourceError("decode", f"{self.name}: read-property-multiple answered {type(reply).__name__}")
        asked = {o: set(props) for o, props in objects}
        out: dict[ObjectIdentifier, dict[str, Any]] = {}
        for result in reply.listOfReadAccessResults or []:
            objid = result.objectIdentifier
            if objid not in asked:  # an object we did not ask for: not ours to decode
                self.stats.errors["decode"] += 1
                continue
            for element in result.listOfResults or []:
                prop = str(element.propertyIdentifier)
                if prop not in asked[objid]:
                    continue
                rr = element.readResult
                if rr is None:
                    value: Any = PropertyProblem("decode", "no read result")
                elif rr.propertyAccessError is not None:
                    err = rr.propertyAccessError
                    value = PropertyProblem("error", f"{err.errorClass}:{err.errorCode}")
                else:
                    value = self._cast(objid, prop, rr.propertyValue)
                out.setdefault(objid, {})[prop] = value
        return out

    async def write(self, objid: ObjectIdentifier, value: Any, priority: int | None) -> None:
        """WriteProperty present-value at `priority` (`value` already of the object's type; None relinquishes)."""
        request = WritePropertyRequest(objectIdentifier=objid, propertyIdentifier="present-value",
                                       propertyValue=AnyValue(Null(()) if value is None else value))
        if priority is not None:
            request.priority = priority
        reply = await self._request("write-property", request)
        if not isinstance(reply, SimpleAckPDU):
            raise SourceError("protocol", f"{self.name}: write-property answered {type(reply).__name__}")

    # -- COV --------------------------------------------------------------------------

    async def subscribe(self, objid: ObjectIdentifier, lifetime: int, sink: Callable[[ObjectIdentifier, str, Any], None],
                        process_id: int | None = None, confirmed: bool = True) -> int:
        """SubscribeCOV for `objid` (renewing `process_id`'s when given); notifications go to `sink`. Returns the
        subscriber process id. The subscription is only *made* here: a first notification confirms it (decode.py's
        caller counts that), since a device may accept a subscription and then never notify."""
        app = self._application()
        pid = process_id if process_id is not None else self._new_process_id()
        app._cov_contexts[(self.address, pid)] = CovContext(objid, sink)
        try:
            await self._request("subscribe-cov", SubscribeCOVRequest(
                subscriberProcessIdentifier=pid, monitoredObjectIdentifier=objid,
                issueConfirmedNotifications=confirmed, lifetime=lifetime))
        except BaseException:
            app._cov_contexts.pop((self.address, pid), None)
            raise
        return pid

    async def unsubscribe(self, objid: ObjectIdentifier, process_id: int) -> None:
        """Cancel a subscription (SubscribeCOV without lifetime); the device forgets it, and so do we."""
        app = self._application()
        app._cov_contexts.pop((self.address, process_id), None)
        await self._request("subscribe-cov", SubscribeCOVRequest(subscriberProcessIdentifier=process_id,
                                                                 monitoredObjectIdentifier=objid))

    def drop_subscription(self, process_id: int) -> None:
        if self._app is not None:
            self._app._cov_contexts.pop((self.address, process_id), None)

    def _new_process_id(self) -> int:
        pid = self._next_process_id
        self._next_process_id = pid % ((1 << 22) - 1) + 1
        return pid


def _bit(bits: Any, n: int) -> bool:
    try:
        return len(bits) > n and bool(bits[n])
    except TypeError:
        return False


def chunks(objects: list[tuple[ObjectIdentifier, tuple[str, ...]]], max_apdu: int,
           max_objects: int = 0) -> Iterable[list[tuple[ObjectIdentifier, tuple[str, ...]]]]:
    """Objects in groups whose ReadPropertyMultiple-ACK fits the device's APDU (no segmentation needed)."""
    budget = max_apdu - 16
    cur: list[tuple[ObjectIdentifier, tuple[str, ...]]] = []
    used = 0
    for obj in objects:
        cost = PER_OBJECT_BYTES + PER_PROPERTY_BYTES * len(obj[1])
        if cur and (used + cost > budget or (max_objects and len(cur) >= max_objects)):
            yield cur
            cur, used = [], 0
        cur.append(obj)
        used += cost
    if cur:
        yield cur


_LINKS: dict[tuple[str, int], BacnetLink] = {}


def link_for(host: str, port: int, **kw: Any) -> BacnetLink:
    """The one link of a device (its sources and its control share it), counted so the last user closes it.

    A link asked for with other settings (a reload changed the timeout, the retries, the instances) is a new one:
    the sources of the old config keep theirs until they close, the new config's share the new one."""
    link = _LINKS.get((host, port))
    if link is None or (link._app is None and link.users == 0) or not link.same_settings(**kw):
        link = _LINKS[(host, port)] = BacnetLink(host, port, **kw)
    link.users += 1
    return link


async def release_link(link: BacnetLink) -> None:
    link.users -= 1
    if link.users <= 0:
        if _LINKS.get((link.host, link.port)) is link:
            del _LINKS[(link.host, link.port)]
        await link.close()
