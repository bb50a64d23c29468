"""The gateway's L7 proxy: the listeners Prometheus talks to.

Sans-IO parts (``heads``, ``framing``, ``target``, ``sni``, ``rewrite``, ``errors``) hold no
asyncio; ``server`` (with ``http_conn``, ``exchange``, ``relay``, ``tls_conn``) drives them over
asyncio streams and a :class:`raven.transport.stream.StreamOpener`.
"""

from cloud_gateway.proxy.errors import ErrorKind
from cloud_gateway.proxy.server import ProxyServer
from cloud_gateway.proxy.target import Mode

__all__ = ["ErrorKind", "Mode", "ProxyServer"]
