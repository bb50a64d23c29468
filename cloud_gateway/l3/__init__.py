"""L3 forwarding on the cloud gateway: the router between the TUN device and agents."""

from cloud_gateway.l3.router import AgentPort, L3Router, SendDatagram

__all__ = ["AgentPort", "L3Router", "SendDatagram"]
