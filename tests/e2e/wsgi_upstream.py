"""A real WSGI upstream: Python's wsgiref server, which reads header names the CGI way (PEP 3333,
RFC 3875 section 4.1.18): `HTTP_` and the name upper-cased with `-` as `_`, so `x-jwt-sub`,
`x_jwt_sub` and `X-Jwt_Sub` are all `HTTP_X_JWT_SUB`, their values joined by `,`
(wsgiref.simple_server.WSGIRequestHandler.get_environ). It answers every request 200 with the
request's `HTTP_*` variables as JSON: what an application on it would read."""
from __future__ import annotations

import json
import socketserver
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from lab import free_port


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


def _app(environ, start_response):
    seen = {k: v for k, v in environ.items() if k.startswith("HTTP_")}
    body = json.dumps({"environ": seen, "path": environ.get("PATH_INFO", "")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class WsgiUpstream:
    """wsgiref on 127.0.0.1, served by a thread of the test process; stop() ends it."""

    def __init__(self):
        self.port = free_port()
        self._server = make_server("127.0.0.1", self.port, _app, server_class=_ThreadingWSGIServer,
                                   handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
