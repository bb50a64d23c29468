"""L3 forwarding on the edge agent: the forwarder between the TUN device and gateways."""

from edge_agent.tun.forwarder import PathHandle, TunForwarder

__all__ = ["PathHandle", "TunForwarder"]
