"""``treeguard serve``, ``serve plan`` and ``serve swap`` in process; the
public surface of ``treeguard.serving``."""

from __future__ import annotations

import json
import os
import types

import pytest
from click.testing import CliRunner
from serving_support import mlp_spec
from subproc import run_module, run_python

import treeguard.serving
from treeguard._cli.main import main


@pytest.mark.slow
def test_plan_prints_every_bucket_and_fails_over_the_budget(tmp_path):
    spec = tmp_path / "spec.json"
    mlp_spec(buckets=(1, 4)).save(spec)
    args = ["serve", "plan", "treeguard.examples.mlp:model", "--spec", str(spec)]
    out = CliRunner().invoke(main, [*args, "--json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    assert [b["bucket"] for b in plan["buckets"]] == [1, 4]
    assert plan["params_bytes"] == 52 and plan["fits"]
    assert all(b["compile_s"] > 0 and b["output_bytes"] > 0 for b in plan["buckets"])
    out = CliRunner().invoke(main, [*args, "--budget", "100"])
    assert out.exit_code == 1
    assert f"params plus bucket 4 need {plan['peak_bytes']} bytes, over the budget of 100" in (
        out.output
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "plan", "treeguard.examples.mlp"], "is not MODULE:ATTR"),
        (["serve", "plan", "treeguard.examples.mlp:model", "--input", "['z']"], "not in the model"),
        (["serve", "swap", "ftp://x", "v1"], "is not an http(s) URL"),
        (["serve", "swap", "http://127.0.0.1:9", "v1"], "cannot reach http://127.0.0.1:9"),
        (["serve", "treeguard.examples.mlp:model", "--store", "/nonexistent/x"], "no store there"),
    ],
)
def test_usage_errors_exit_2(args, message):
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, out.output
    assert message in out.output


@pytest.mark.parametrize(
    ("mode", "text", "message"),
    [
        (0o644, "x" * 32, "others may read it (mode 644)"),
        (0o600, "too-short", "the token has 9 characters, not 16 to 4096"),
        (0o600, "a-token-with-\x1b-in-it", "the token holds a character other than"),
    ],
    ids=["loose-mode", "short", "escape"],
)
def test_a_control_token_file_is_refused_before_anything_is_served_or_sent(
    tmp_path, mode, text, message
):
    token = tmp_path / "token"
    token.write_text(text)
    os.chmod(token, mode)
    (tmp_path / "s").mkdir()
    for args in (
        ["serve", "treeguard.examples.mlp:model", "--store", str(tmp_path / "s")],
        ["serve", "swap", "http://127.0.0.1:9", "v000001"],
    ):
        out = CliRunner().invoke(main, [*args, "--control-token-file", str(token)])
        assert out.exit_code == 2, out.output
        assert f"control token file {token}: {message}" in out.output
        assert "\x1b" not in out.output
    out = CliRunner().invoke(
        main, ["serve", "swap", "--ray", "v000001", "--control-token-file", str(token)]
    )
    assert out.exit_code == 2 and "--control-token-file goes with a URL" in out.output


def test_serving_all_matches_the_exports():
    names = {
        n
        for n, v in vars(treeguard.serving).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    assert sorted(treeguard.serving.__all__) == treeguard.serving.__all__
    assert set(treeguard.serving.__all__) == names
    for n in names:
        assert getattr(treeguard.serving, n).__doc__, n


@pytest.mark.slow
def test_importing_the_serving_api_pulls_in_no_http_stack():
    out = run_python(
        "import sys, treeguard, treeguard.serving, treeguard._cli.serve\n"
        "heavy = {'starlette', 'uvicorn', 'prometheus_client', 'httpx'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_port_in_use_stops_serve_with_the_reason_not_uvicorn_s_exit(tmp_path):
    import socket

    import jax

    import treeguard
    from treeguard.examples import mlp

    store = treeguard.ArtifactStore(tmp_path / "s")
    v = store.put(mlp.init(jax.random.key(0)))
    assert treeguard.serving.verify_version(store, v, mlp.model).status == "verified"
    store.promote(v)
    with socket.socket() as taken:  # the server runs in a child: uvicorn sets up logging
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "treeguard.examples.mlp:model", "--store", str(tmp_path / "s")]
        out = run_module("treeguard", [*args, "--host", "127.0.0.1", "--port", str(port)])
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == treeguard.serving.ServingError.exit_code, said
    assert "stopped: uvicorn exited with status" in said  # its own code, not ours
    assert f"the server on 127.0.0.1:{port}" in said
