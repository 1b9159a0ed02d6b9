"""Forwarding HTTP proxy that sends KubeRay's Ray dashboard calls to the real local Ray head.

The out-of-cluster ray-operator runs with ``HTTP_PROXY=http://127.0.0.1:<this port>``. Go's default
transport then sends every plain-HTTP request whose host is not loopback here, in absolute form
(``GET http://<cluster>-head-svc.<ns>.svc.cluster.local:8265/api/jobs/ HTTP/1.1``). Requests for
port 8265 (the Ray dashboard port in every RayCluster) are forwarded to the local Ray dashboard;
anything else is answered with 502 and logged, so an unexpected route shows up in the log.

Stdlib only; started and stopped by devcluster.py.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.server
import sys
import threading
import time
import urllib.parse

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}

DASHBOARD_PORT = 8265


class Handler(http.server.BaseHTTPRequestHandler):
    """Forwards absolute-form requests for ``*:8265`` to the target dashboard."""

    protocol_version = "HTTP/1.1"
    server: ProxyServer

    def log_message(self, format: str, *args: object) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {format % args}\n"
        with self.server.log_lock:
            sys.stderr.write(line)
            sys.stderr.flush()

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        port = url.port or (443 if url.scheme == "https" else 80)
        if not url.hostname:
            self._reply(400, b"rljob devcluster proxy: expected an absolute URL\n")
            return
        if port != DASHBOARD_PORT:
            self.log_message(
                "REJECT %s %s (only port %d is forwarded)", self.command, self.path, DASHBOARD_PORT
            )
            self._reply(502, f"rljob devcluster proxy: no route to {url.hostname}:{port}\n".encode())
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = f"{self.server.target_host}:{self.server.target_port}"
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        conn = http.client.HTTPConnection(self.server.target_host, self.server.target_port, timeout=60)
        try:
            conn.request(self.command, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:
            self.log_message("ERROR %s %s -> %s", self.command, self.path, exc)
            self._reply(502, f"rljob devcluster proxy: local Ray dashboard unreachable: {exc}\n".encode())
            return
        finally:
            conn.close()
        self.log_message("FORWARD %s %s -> %d (%d bytes)", self.command, self.path, resp.status, len(data))
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _forward

    def do_CONNECT(self) -> None:
        self.log_message("REJECT CONNECT %s (tunnels are not supported)", self.path)
        self._reply(405, b"rljob devcluster proxy: CONNECT is not supported\n")


class ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, listen: tuple[str, int], target_host: str, target_port: int) -> None:
        super().__init__(listen, Handler)
        self.target_host = target_host
        self.target_port = target_port
        self.log_lock = threading.Lock()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--target-port", type=int, required=True, help="local Ray dashboard port")
    parser.add_argument("--target-host", default="127.0.0.1")
    args = parser.parse_args(argv)
    server = ProxyServer(("127.0.0.1", args.listen_port), args.target_host, args.target_port)
    print(
        f"forwarding *:{DASHBOARD_PORT} -> {args.target_host}:{args.target_port} on 127.0.0.1:{args.listen_port}",
        file=sys.stderr,
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
