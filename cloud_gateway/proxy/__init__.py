"""The gateway's L7 proxy: the listeners Prometheus talks to.

Sans-IO parts (``heads``, ``framing``, ``target``, ``sni``, ``rewrite``, ``errors``) hold no
asyncio; ``server`` drives them from asyncio protocols (``client_conn``: the socket, no task
while idle; ``http_conn`` and ``tls_conn`` on it), ``exchange`` and ``response_relay`` (the
answer written from the stream's callbacks) and ``relay`` (CONNECT, TLS) over a
:class:`raven.transport.stream.StreamOpener`.
"""

from cloud_gateway.proxy.errors import ErrorKind
from cloud_gateway.proxy.server import ProxyServer
from cloud_gateway.proxy.target import Mode

__all__ = ["ErrorKind", "Mode", "ProxyServer"]
