"""A JWKS endpoint for the tests: serves the current key set and counts the fetches."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JwksServer:
    def __init__(self, jwks: dict):
        self.jwks = jwks
        self.fetches = 0
        self.fail = False
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                with server._lock:
                    server.fetches += 1
                    body = json.dumps(server.jwks).encode()
                    status = 503 if server.fail else 200
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def set_jwks(self, jwks: dict) -> None:
        with self._lock:
            self.jwks = jwks

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
