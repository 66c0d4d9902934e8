"""``treeguard serve ... --ray`` and ``treeguard serve swap --ray``."""

from __future__ import annotations

import json
import os
import queue
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from bridge import can_isolate
from click.testing import CliRunner
from fleet import body, checked_store, wait_until
from subproc import run_module

from treeguard._cli.main import main

SERVE = [sys.executable, "-m", "treeguard", "serve"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["serve", "swap", "--ray", "http://127.0.0.1:8000", "v1"],
            "serve swap --ray takes one VERSION",
        ),
        (["serve", "swap", "v1"], "serve swap takes URL VERSION"),
        (
            ["serve", "treeguard.examples.mlp:model", "--store", ".", "--ray", "--grpc-port", "9"],
            "--grpc-port and --watch are not served with --ray",
        ),
        (
            [
                *("serve", "treeguard.examples.mlp:model", "--store", ".", "--ray"),
                *("--ray-ingress", "haproxy", "--ray-address", "127.0.0.1:6379"),
            ],
            "--ray-ingress haproxy starts a local cluster; the cluster at 127.0.0.1:6379 keeps "
            "the ingress it was started with",
        ),
    ],
)
def test_ray_usage_errors(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, out.output
    assert message in out.output


#: An application name a shell would split, and run the rest of, were it not quoted.
HOSTILE = "cli's app; touch injected"


def _auth_settings(folder: Path) -> dict[str, str]:
    """Ray's token settings for a process that connects by address: token
    mode, the cluster's token in a file whose path needs quoting, and in
    ``$RAY_AUTH_TOKEN`` too (which must never be printed)."""
    named = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
    token = os.environ.get("RAY_AUTH_TOKEN") or Path(named).read_text().strip()
    path = folder / "ray token" / "auth_token"
    path.parent.mkdir()
    path.write_text(token)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path), "RAY_AUTH_TOKEN": token}


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # the session's cluster
def test_serve_ray_and_swap_ray_on_a_running_cluster(cluster, tmp_path):
    versions = checked_store(tmp_path, "mlp")
    v1, v2 = versions.names
    cluster.call("clear")
    address = cluster.call("address")
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    auth = _auth_settings(tmp_path)
    args = ["treeguard.examples.mlp:model", "--store", str(versions.store.root), "--input", "['x']"]
    proc = subprocess.Popen(
        [*SERVE, *args, "--ray", "--replicas", "2", "--ray-address", address, "--ray-app", HOSTILE],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=bare | auth,
        start_new_session=True,
    )
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        first = lines.get(timeout=300).decode()  # a safety stop
        assert first.startswith(
            f"serving {HOSTILE!r} on http://{cluster.url} with 2 replicas; swap them with: "
        )
        x = np.full((1, 2), 0.5, np.float32)
        url = f"http://{cluster.url}/v2/models/mlp/infer"
        assert httpx.post(url, json=body(x)).json()["model_version"] == v1
        # the command it printed: Ray's token settings in front, never the token
        printed = first.split("swap them with: ", 1)[1].rsplit("; Ctrl-C stops it", 1)[0]
        leaked = auth["RAY_AUTH_TOKEN"] in printed
        assert not leaked, "the printed command holds the token"  # the token never shown
        assert shlex.split(printed) == [
            "RAY_AUTH_MODE=token",
            f"RAY_AUTH_TOKEN_PATH={auth['RAY_AUTH_TOKEN_PATH']}",
            *("treeguard", "serve", "swap", "--ray", "VERSION"),
            *("--ray-address", address, "--ray-app", HOSTILE),
        ]
        # pasted in a POSIX shell with none of Ray's settings, and a home
        # without Ray's token file: it swaps with what it carries alone
        (tmp_path / "home").mkdir()
        pasted = bare | {"HOME": str(tmp_path / "home")}
        pasted["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{pasted.get('PATH', '')}"
        swap = subprocess.run(
            ["sh", "-c", printed.replace(" VERSION ", f" {v2} ")],
            capture_output=True,
            env=pasted,
            cwd=tmp_path,
            timeout=300,
        )
        assert swap.returncode == 0, swap.stderr.decode()[-2000:]
        assert swap.stdout.decode().strip().endswith(f"serving {v2} on 2 replicas")
        assert not (tmp_path / "injected").exists()
        assert httpx.post(url, json=body(x)).json()["model_version"] == v2
        assert versions.store.current() == v2
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        proc.stdout.close()
    assert proc.returncode == 0
    # the application is gone from the cluster it ran on; the cluster stays
    wait_until(lambda: httpx.post(url, json=body(x)).status_code == 404)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # the session's cluster
@pytest.mark.parametrize("token", ["wrong", "missing"])
def test_swap_ray_without_the_clusters_token_names_the_address_and_the_fix(
    cluster, tmp_path, token
):
    address = cluster.call("address")
    wrong = secrets.token_hex(16)
    (tmp_path / "home").mkdir()  # no ~/.ray/auth_token
    path = tmp_path / "auth_token"
    if token == "wrong":
        path.write_text(wrong)
    settings = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path), "RAY_AUTH_TOKEN": ""}
    done = run_module(
        "treeguard",
        ["serve", "swap", "--ray", "v1", "--ray-address", address],
        env=settings | {"HOME": str(tmp_path / "home")},
        cwd=tmp_path,
        timeout=300,  # a safety stop
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    # Ray's reason (a wrong token: it gave up connecting; none: it has none to send)
    reason = "Failed to connect" if token == "wrong" else "RAY_AUTH_TOKEN_PATH is set but"
    assert f"error: cannot connect to the Ray cluster at {address}: {reason}" in done.stderr
    assert "hint: is a cluster running there? One with token authentication" in done.stderr
    assert "$RAY_AUTH_TOKEN_PATH names, or in ~/.ray/auth_token" in done.stderr
    assert wrong not in done.stdout + done.stderr  # the token is never shown


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one cluster at a time
def test_serve_ray_behind_haproxy_starts_serves_and_cleans_up(tmp_path):
    why = can_isolate()
    if why is not None:
        pytest.skip(f"HAProxy binds every interface, so the command runs isolated: {why}")
    versions = checked_store(tmp_path, "mlp")
    script = 'ip link set lo up && exec "$@"'
    here = Path(__file__).parent
    child = [sys.executable, str(here / "isolated_cli.py"), str(versions.store.root), "8000"]
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script, "-", *child],
        capture_output=True,
        timeout=400,  # a safety stop
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout.decode().splitlines()[-1])
    assert out["first"].startswith("serving 'treeguard' on http://127.0.0.1:8000 with 2 replicas")
    assert out["config"]  # Ray wrote an HAProxy configuration under the command's folder
    assert out["status"] == 200 and out["response"]["model_version"] == versions.names[0]
    assert out["exit"] == 0 and out["left"] == []
