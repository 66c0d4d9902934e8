"""A hand-written HTTP/2 client for the gRPC tests, doing what no library
client does: it sends calls, answers the server's SETTINGS and PINGs (so
keepalive finds it alive), and gives the server no flow-control window to
answer in (``SETTINGS_INITIAL_WINDOW_SIZE`` 0), so no response ever leaves."""

from __future__ import annotations

import socket
import struct
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING = 0, 1, 4, 6
END_STREAM, ACK, END_HEADERS = 1, 1, 4
INITIAL_WINDOW_SIZE = 4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK header field, literal and never indexed (short names and values)."""
    assert len(name) < 127 and len(value) < 127
    return b"\x10" + bytes([len(name)]) + name + bytes([len(value)]) + value


class Stalling:
    """A connection to a gRPC server carrying ``calls`` calls of ``path``, each
    with the message ``body``, whose responses the server may never send."""

    def __init__(self, port: int, path: str, body: bytes, calls: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.closed = threading.Event()  # set when the server ends the connection
        self.sock.sendall(
            PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, 0))
        )
        head = b"".join(
            _literal(k, v)
            for k, v in (
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", path.encode()),
                (b":authority", b"127.0.0.1"),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
            )
        )
        message = b"\x00" + struct.pack(">I", len(body)) + body
        for i in range(calls):
            stream = 1 + 2 * i
            self.sock.sendall(
                frame(HEADERS, END_HEADERS, stream, head) + frame(DATA, END_STREAM, stream, message)
            )
        self._reader = threading.Thread(target=self._answer, daemon=True)
        self._reader.start()

    def _answer(self) -> None:
        """Acknowledges SETTINGS and PINGs until the server closes the connection."""
        buf = b""
        try:
            while chunk := self.sock.recv(65536):
                buf += chunk
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    n = int.from_bytes(buf[:3], "big")
                    kind, flags, payload = buf[3], buf[4], buf[9 : 9 + n]
                    buf = buf[9 + n :]
                    if kind == SETTINGS and not flags & ACK:
                        self.sock.sendall(frame(SETTINGS, ACK, 0))
                    elif kind == PING and not flags & ACK:
                        self.sock.sendall(frame(PING, ACK, 0, payload))
        except OSError:
            pass
        finally:
            self.closed.set()

    def close(self) -> None:
        self.sock.close()
        self._reader.join(timeout=60)
