"""The simulator's plug-in contract: a simulated device behind a real protocol, fed by the rack model."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sim.rack import RackModel


@runtime_checkable
class SimDevice(Protocol):
    """A device the simulator runs: it binds on 127.0.0.1 and serves values refreshed from the model.

    `update` is called after every model tick under `model.lock`; it must be
    cheap (copy numbers into the served tables), never block on I/O.
    """

    name: str

    async def start(self) -> None: ...

    def update(self, model: RackModel) -> None: ...

    async def stop(self) -> None: ...
