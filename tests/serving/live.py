"""A real ``treeguard serve`` process on 127.0.0.1 for the tests: started
through the command line, polled until ready (bounded), stopped by pid.

The server's output is drained while it runs: its access log under a load
generator outgrows a pipe's buffer, and a server blocked writing its log
answers nothing."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from ports import free_port
from serving_support import mlp_spec
from subproc import start_python

SERVER = """
import sys
from treeguard._cli.serve import serve
sys.argv = ["treeguard", *sys.argv[1:]]
serve()
"""


@dataclass
class Live:
    """A running server: its base URL, its port, its process."""

    url: str
    port: int
    proc: subprocess.Popen[str]
    grpc_port: int | None = None
    log: str = ""
    out: str = ""


@contextlib.contextmanager
def live_server(
    *args: str,
    ready_s: float = 180,
    grpc: bool = False,
    env: dict[str, str] | None = None,
    before: str = "",
    cwd: Any = None,
) -> Iterator[Live]:
    """``treeguard serve ARGS --port P`` until the block ends (then stopped by pid),
    run in ``cwd`` (default the project's root).

    ``before`` is Python the server's process runs first (to lower its
    open-file limit, say).

    ``live.log`` holds the server's stderr once the block has ended, and
    ``live.out`` its stdout (uvicorn's access log, when it writes one).
    """
    port = free_port()
    extra = ["--grpc-port", str(grpc_port := free_port())] if grpc else []
    proc = start_python(before + SERVER, *args, "--port", str(port), *extra, env=env, cwd=cwd)
    live = Live(f"http://127.0.0.1:{port}", port, proc, grpc_port if grpc else None)
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=_drain, args=(stream, sink), daemon=True)
        for stream, sink in ((proc.stdout, out), (proc.stderr, err))
    ]
    for r in readers:
        r.start()

    def stop() -> str:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        for r in readers:
            r.join(timeout=30)
        live.out = "".join(out)
        return "".join(err)

    try:
        with httpx.Client(base_url=live.url, timeout=10) as c:
            end = time.monotonic() + ready_s
            while time.monotonic() < end and proc.poll() is None:
                with contextlib.suppress(httpx.TransportError):
                    if c.get("/v2/health/ready").status_code == 200:
                        break
                time.sleep(0.1)
            else:
                raise AssertionError(f"the server never became ready: {stop()[-3000:]}")
        yield live
    finally:
        live.log = stop()


def _drain(stream: Any, sink: list[str]) -> None:
    """Reads ``stream`` to its end into ``sink`` (then closes it)."""
    with stream:
        for line in stream:
            sink.append(line)


@contextlib.contextmanager
def served_mlp(
    store: Any, folder: Any, limits: Any, *args: str, grpc: bool = False, before: str = ""
) -> Iterator[Live]:
    """The bundled model from ``store`` under ``limits`` (its spec saved in
    ``folder``), with ARGS; its log must hold no traceback once it stopped."""
    spec = folder / "spec.json"
    mlp_spec(limits=limits).save(spec)
    with live_server(
        "treeguard.examples.mlp:model",
        "--store",
        str(store.root),
        "--spec",
        str(spec),
        "--allow-unchecked",
        *args,
        grpc=grpc,
        before=before,
    ) as live:
        yield live
    assert "Traceback" not in live.log, live.log[-3000:]
