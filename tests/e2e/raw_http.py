"""HTTP/1.1 requests written byte for byte on a socket, for what `requests` cannot send: an
absolute-form target with another Host, header names with `_` or `.`, repeated fields, odd
spellings of a request line."""
from __future__ import annotations

import json
import socket
import urllib.parse


def exchange(url: str, request: bytes, timeout: float = 10) -> tuple[int, dict[bytes, bytes], bytes]:
    """Sends `request` (a whole HTTP/1.1 request, head and body) to the gateway at `url` and
    reads one response: its status, its fields (names lower-case; a repeated one keeps the last)
    and its body."""
    u = urllib.parse.urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        s.sendall(request)
        return read_response(s)


def read_response(s: socket.socket) -> tuple[int, dict[bytes, bytes], bytes]:
    """Reads one HTTP/1.1 response with a Content-Length (every answer here has one: the demo
    upstream's and the filters' local replies), else until the connection closes. Envoy keeps the
    connection of a local reply open for a second after `Connection: close`."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1]) if lines[0] else 0
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    length = int(fields[b"content-length"]) if b"content-length" in fields else None
    while (length is None or len(body) < length) and (chunk := s.recv(65536)):
        body += chunk
    return status, fields, body


def request(target: bytes, fields: list[tuple[bytes, bytes]], method: bytes = b"GET", body: bytes = b"") -> bytes:
    """A request with exactly these fields, in order (no Host unless given), closing the
    connection after it."""
    head = method + b" " + target + b" HTTP/1.1\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in fields)
    head += b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    return head + body


def json_body(body: bytes) -> dict | None:
    """The body as a JSON object, else None."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
