#!/usr/bin/env python3
"""A new tick period takes effect at once in nginx, as in Envoy (`Wasm::setTickPeriod`): with
`tick_guest.wat`, a root armed for 60 s is asked for 1 ms by a request; the next request, 200 ms
later, must see one tick (status 201), not zero (the old 60 s timer). Exit status 1 otherwise.

Usage: .venv/bin/python nginx-compat/tests/calls/tick_rearm.py [MODULE.so]
"""
import http.client
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent


def main():
    module = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target" / "nginx" / "ngx_http_tollgate_wasm_module.so")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-tick-"))
    wasm = tmp / "tick_guest.wasm"
    subprocess.run(["cargo", "run", "-q", "--release", "-p", "tollgate-host", "--example", "wat2wasm",
                    str(HERE / "tick_guest.wat"), str(wasm)], cwd=ROOT / "nginx-compat", check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp / "nginx.conf"
    conf.write_text(f"""load_module {module};
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
wasm {{ module t {wasm}; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f;
    uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
    server {{ listen 127.0.0.1:{port}; location / {{ proxy_wasm t; return 204; }} }}
}}
""")
    proc = subprocess.Popen(["/usr/sbin/nginx", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        statuses = []
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/")
            statuses.append(conn.getresponse().status)
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(10)
    ok = statuses == [200, 201]
    print(("ok   " if ok else "FAIL ") + f"ticks seen by two requests 200 ms apart: {statuses} (want [200, 201])")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
