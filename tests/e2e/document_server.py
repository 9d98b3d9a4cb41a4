"""A remote document endpoint for the tests (JWKS, price tables): serves the current body with
a chosen status and counts the fetches."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class DocumentServer:
    """A remote document endpoint (a JWKS, a price table): serves `body` with `status`, counts
    fetches; `endless` streams zeros after a huge Content-Length until the client goes or 20 s
    pass."""

    def __init__(self, document: dict):
        self.body = json.dumps(document).encode()
        self.status = 200
        self.endless = False
        self.fetches = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                with server.lock:
                    server.fetches += 1
                    body, status, endless = server.body, server.status, server.endless
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(1 << 40 if endless else len(body)))
                self.end_headers()
                if not endless:
                    self.wfile.write(body)
                    return
                # Slowly (6.4 MB/s): the call's timeout must end it, without buffering gigabytes.
                deadline = time.monotonic() + 20
                try:
                    while time.monotonic() < deadline:
                        self.wfile.write(b"0" * 65536)
                        time.sleep(0.01)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def serve(self, body: bytes | dict, status: int = 200, endless: bool = False) -> None:
        with self.lock:
            self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.status, self.endless = status, endless

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
