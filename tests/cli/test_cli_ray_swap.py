"""The swap command ``treeguard serve --ray`` prints is one the command line takes
as pasted, Ray's token setting included (the run against a cluster is
tests/serving/ray/test_ray_cli.py)."""

from __future__ import annotations

import shlex

import click
import pytest

from treeguard._cli.main import main
from treeguard._src.serving.ray.api import swap_command  # _src: printed only under Ray


def _pasted(command: str) -> tuple[dict[str, str], list[str]]:
    """A POSIX shell's reading of ``command``: its leading settings, its words."""
    words = shlex.split(command)
    settings: dict[str, str] = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        key, value = words.pop(0).split("=", 1)
        settings[key] = value
    return settings, words


def test_the_printed_swap_carries_ray_s_token_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/home/me/ray token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a-secret")
    printed = swap_command("127.0.0.1:6379", name="cli app; rm -rf ~")
    settings, words = _pasted(printed.replace("VERSION", "v000002"))
    assert settings == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/home/me/ray token"}
    assert "a-secret" not in printed
    assert words[0] == "treeguard"
    ctx = main.make_context("treeguard", words[1:], resilient_parsing=True)
    assert isinstance(main, click.Group)
    _, serve, rest = main.resolve_command(ctx, words[1:])
    assert isinstance(serve, click.Group)
    sub_ctx = serve.make_context("serve", rest, parent=ctx)
    _, swap, args = serve.resolve_command(sub_ctx, rest)
    assert swap is not None and swap.name == "swap"
    params = swap.make_context("swap", args, parent=sub_ctx).params
    assert params["words"] == ("v000002",) and params["use_ray"]
    assert (params["ray_address"], params["ray_app"]) == ("127.0.0.1:6379", "cli app; rm -rf ~")


def test_without_token_authentication_it_prints_no_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    settings, words = _pasted(swap_command("127.0.0.1:6379"))
    assert settings == {"RAY_AUTH_MODE": "disabled"}
    assert words == [
        "treeguard",
        "serve",
        "swap",
        "--ray",
        "VERSION",
        "--ray-address",
        "127.0.0.1:6379",
    ]
