"""Proxies on the loopback that forward to a real server and fail chosen answers.

`HttpFaultProxy` sits in front of an HTTP server (SeaweedFS's REST catalog or its S3
endpoint). Each request is matched against the rules in order; a rule that fires either
forwards the request, lets the server apply it and then loses the answer (`503`: answers
503 instead; `close`: closes the connection without answering; `timeout`: holds the
answer for `hold` seconds, longer than the client waits, then closes; `half`: sends the
server's status and headers, which promise the whole body, then half the body, then closes;
`html502`: answers a load balancer's HTML 502 page instead), or answers without
forwarding (`slowdown`: S3's 503 SlowDown, as a throttling store does). Requests no rule
fires on are forwarded as they are (the Host header kept: S3 signatures cover it).

`PostgresDropProxy` sits in front of PostgreSQL and drops the client's connection right
after the server applied the COMMIT of chosen `UPDATE iceberg_tables` statements (a SQL
catalog's compare-and-swap), before the client hears back.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass
class Rule:
    """Fire `action` on the matching requests whose 1-based number (among those this rule
    matches) `fires` says yes to."""

    methods: str | None  # "PUT,GET,...", None: any
    path: re.Pattern[str]
    action: str  # 503 | close | timeout | half | html502 | slowdown
    fires: Callable[[int], bool]
    hold: float = 0.0  # timeout: seconds the answer is held
    seen: int = 0
    fired: list[int] = field(default_factory=list)  # numbers of the requests it fired on


class HttpFaultProxy:
    def __init__(self, upstream: str, rules: list[Rule]) -> None:
        target = urlsplit(upstream)
        self.host, self.port = target.hostname or "127.0.0.1", target.port or 80
        self.rules = rules
        self.lock = threading.Lock()
        self.forwarded = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                body = self._body()
                rule = proxy._rule_for(self.command, self.path)
                if rule is not None and rule.action == "slowdown":
                    self._answer(503, b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                                 b"<Message>Please reduce your request rate.</Message></Error>", "application/xml")
                    return
                status, headers, answer = proxy._forward(self.command, self.path, self.headers, body)
                if rule is None:
                    self.send_response(status)
                    for key, value in headers:
                        # A HEAD's Content-Length is the object's size: passed on as it is.
                        if key.lower() not in _HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                            self.send_header(key, value)
                    if self.command != "HEAD":
                        self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    return
                # The server applied the request; its answer is lost on the way back.
                if rule.action == "503":
                    self._answer(503, b'{"error": {"message": "service unavailable", "type": "ServiceUnavailableException", '
                                 b'"code": 503}}', "application/json")
                    return
                if rule.action == "html502":
                    self._answer(502, b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
                                 b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
                                 b"</body>\r\n</html>\r\n", "text/html")
                    return
                if rule.action == "half":
                    # The headers promise the whole answer; half of it arrives, then the
                    # connection closes (a proxy or server cut off mid-answer).
                    self.send_response(status)
                    for key, value in headers:
                        if key.lower() not in _HOP and key.lower() != "content-length":
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer[: len(answer) // 2])
                    self.wfile.flush()
                if rule.action == "timeout":
                    time.sleep(rule.hold)
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _rule_for(self, method: str, path: str) -> Rule | None:
        with self.lock:
            for rule in self.rules:
                if (rule.methods is None or method in rule.methods.split(",")) and rule.path.search(path):
                    rule.seen += 1
                    if rule.fires(rule.seen):
                        rule.fired.append(rule.seen)
                        return rule
                    return None
        return None

    def _forward(self, method: str, path: str, headers: object, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for key, value in headers.items():  # type: ignore[attr-defined]
                if key.lower() not in _HOP and key.lower() != "content-length":
                    conn.putheader(key, value)
            chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()  # type: ignore[attr-defined]
            if chunked:  # as it came (S3's aws-chunked uploads are sent so)
                conn.putheader("Transfer-Encoding", "chunked")
                conn.endheaders(iter([body]) if body else iter([]), encode_chunked=True)
            else:
                if body or method in ("POST", "PUT"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
            response = conn.getresponse()
            answer = b"" if method == "HEAD" else response.read()
            with self.lock:
                self.forwarded += 1
            return response.status, response.getheaders(), answer
        finally:
            conn.close()

    def __enter__(self) -> HttpFaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class PostgresDropProxy:
    """TCP proxy to PostgreSQL: the COMMIT that follows the `fires`-chosen `UPDATE
    iceberg_tables` reaches the server, which applies it; then the client's connection is
    dropped before the server's answer reaches it."""

    def __init__(self, upstream: tuple[str, int], fires: Callable[[int], bool]) -> None:
        self.upstream = upstream
        self.fires = fires
        self.updates = 0
        self.dropped: list[int] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopped = False
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        armed = False  # this connection sent a chosen UPDATE: its COMMIT's answer is lost
        lost = threading.Event()

        def back() -> None:
            try:
                while True:
                    data = server.recv(65536)
                    if not data or lost.is_set():
                        break
                    client.sendall(data)
            except OSError:
                pass
            finally:
                for s in (client, server):
                    try:
                        s.close()
                    except OSError:
                        pass

        threading.Thread(target=back, daemon=True).start()
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                if b"UPDATE iceberg_tables" in data:
                    with self.lock:
                        self.updates += 1
                        armed = self.fires(self.updates)
                        if armed:
                            self.dropped.append(self.updates)
                if armed and b"COMMIT" in data:
                    # The server's answer to this COMMIT is not passed on: `back` drops
                    # both connections when it arrives (the COMMIT applied by then).
                    lost.set()
                    server.sendall(data)
                    return
                server.sendall(data)
        except OSError:
            pass
        for s in (client, server):
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> PostgresDropProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped = True
        self.listener.close()
