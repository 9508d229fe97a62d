"""supernode-agent: observability and self-healing for liquid-cooled GPU racks."""
__version__ = "0.1.0"
