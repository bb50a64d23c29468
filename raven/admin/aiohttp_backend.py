"""The admin server's HTTP backend on aiohttp."""

from __future__ import annotations

from aiohttp import web

from raven.admin.routes import AdminRequest, Dispatch


def _request(request: web.Request) -> AdminRequest:
    query: dict[str, str] = {}
    for key, value in request.query.items():
        query.setdefault(key, value)  # the first of repeated parameters
    headers = {key.lower(): value for key, value in request.headers.items()}
    return AdminRequest(request.method, request.path, query, headers, request.remote or "")


class AiohttpBackend:
    """One aiohttp app whose every path goes to the admin routes' dispatch."""

    def __init__(self, *, shutdown_timeout_s: float = 2.0) -> None:
        self._shutdown_timeout_s = shutdown_timeout_s
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int, dispatch: Dispatch) -> tuple[str, int]:
        async def handle(request: web.Request) -> web.StreamResponse:
            admin_request = _request(request)
            answer = await dispatch(admin_request)
            headers = {**answer.headers, "Content-Type": answer.content_type}
            response = web.Response(status=answer.status, body=answer.body, headers=headers)
            if answer.compressible and admin_request.accepts_gzip():
                response.enable_compression(web.ContentCoding.gzip)
            return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self._shutdown_timeout_s
        )
        await runner.setup()
        site = web.TCPSite(runner, host or None, port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        sockets = getattr(site._server, "sockets", None) or []
        bound_port = int(sockets[0].getsockname()[1]) if sockets else port
        return host, bound_port

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
