"""The ``treeguard serve`` command group.

- ``treeguard serve MODULE:ATTR --store ROOT [--spec FILE] [--host H] [--port N] [--watch]``
  serves the model's ``apply`` with the store's current verified version.
- ``treeguard serve --store ROOT [...]`` (no ``MODULE:ATTR``) serves the current
  version's exported artifact (``treeguard export``): no model code is imported.
- ``treeguard serve plan MODULE:ATTR [--spec FILE] [--budget BYTES]`` compiles
  every bucket ahead of time and prints its compile time and memory.
- ``treeguard serve swap URL VERSION`` asks a running server to hot-swap.
- ``treeguard serve [MODULE:ATTR] --store ROOT --ray --replicas N [--ray-address A]``
  runs N replicas under Ray Serve (on a local cluster, behind HAProxy with
  ``--ray-ingress haproxy``), of the model or (without it) of the exported
  artifact; ``treeguard serve swap --ray VERSION`` swaps every one of them,
  each checking VERSION (and its artifact) before any switches.

Exit codes, as for every treeguard command: 0 ok, 1 a check failed (over the
memory budget, a refused swap), 2 usage or unreadable input, 4 the model's
own code failed to import, build, or raised ``SystemExit``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from .._src import strictjson
from .._src.display import fmt_bytes
from .._src.errors import ConfigError, ServingError
from .._src.serving.token import read_token
from .._src.store.objects import is_url
from .console import console
from .failures import Group
from .loader import load_model
from .options import (
    given_keys,
    input_option,
    key_options,
    serving_spec,
    spec_option,
    store_option,
)


def _default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "treeguard", "jax")


class _ServeGroup(Group):
    """``serve [MODULE:ATTR] ...`` runs the server; ``serve plan|swap ...`` the subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(
    "serve",
    cls=_ServeGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
)
def serve() -> None:
    """Serve a Model over the KServe V2 protocol, plan its buckets, or hot-swap it.

    treeguard serve MODULE:ATTR --store ROOT runs the server (see `serve run -h`);
    treeguard serve --store ROOT serves the current version's exported artifact.
    """


_target = click.argument("target", metavar="MODULE:ATTR")


@serve.command("run")
@click.argument("target", metavar="[MODULE:ATTR]", required=False)
@store_option
@spec_option
@input_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also serve the Open Inference Protocol over gRPC on this port.",
)
@click.option("--watch", is_flag=True, help="Swap when the store's current version changes.")
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="Log one line per request (off: /metrics counts every request by status).",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The persistent compilation cache (default ~/.cache/treeguard/jax).",
)
@click.option("--memory-budget", type=click.IntRange(1), default=None, metavar="BYTES")
@click.option(
    "--control-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the bearer token swap and rollback require (needed off loopback).",
)
@click.option(
    "--allow-unchecked",
    is_flag=True,
    help="Serve versions verified with no model check (store verify without --model).",
)
@click.option("--ray", "use_ray", is_flag=True, help="Run replicas with Ray Serve (the ray extra).")
@click.option(
    "--replicas", default=2, show_default=True, type=click.IntRange(1), help="With --ray."
)
@click.option(
    "--ray-address",
    default=None,
    metavar="ADDRESS",
    help="With --ray: the running Ray cluster (default: a local one on 127.0.0.1).",
)
@click.option(
    "--ray-app",
    default="treeguard",
    show_default=True,
    help="With --ray: the Ray Serve application's name.",
)
@click.option(
    "--ray-ingress",
    type=click.Choice(["proxy", "haproxy"]),
    default="proxy",
    show_default=True,
    help="With --ray, on the local cluster it starts: Ray's HTTP proxy, or HAProxy in "
    "front of replicas that serve HTTP themselves (one hop less; see the Ray guide).",
)
@key_options
def run_command(  # noqa: PLR0917 - click passes every option
    target: str | None,
    store_root: Path,
    spec_file: Path | None,
    inputs: tuple[str, ...],
    host: str,
    port: int,
    grpc_port: int | None,
    watch: bool,
    access_log: bool,
    cache_dir: Path | None,
    memory_budget: int | None,
    control_token_file: Path | None,
    allow_unchecked: bool,
    use_ray: bool,
    replicas: int,
    ray_address: str | None,
    ray_app: str,
    ray_ingress: str,
) -> None:
    """Serve MODULE:ATTR's apply with the store's current verified version.

    Without MODULE:ATTR, serve the current version's exported artifact
    (treeguard export): no model code is imported; every version loaded or
    swapped to must hold the same exported function, covered by its verdict.

    With --ray, --replicas replicas of the server (of MODULE:ATTR, or without
    it of the exported artifact, which each replica reads and checks itself)
    run under Ray Serve behind its proxy (or HAProxy: --ray-ingress haproxy)
    on --host:--port (gRPC is not served there); swap them with `treeguard
    serve swap --ray VERSION`, which checks VERSION (and its artifact) on
    every replica first.
    """
    # The server imports JAX and starlette: only once the command runs.
    from .._src.serving.app import Server

    if not is_url(store_root) and not store_root.is_dir():  # a bucket URL: the store checks it
        raise ConfigError(f"{store_root}: no store there", hint="treeguard store put first")
    keys = given_keys()
    store: Any = _keyed_store(store_root, keys)
    if use_ray:
        _check_ray_options(grpc_port, watch, keyed=store is not store_root)
        # the Ray deployment's module (its model and store imports load JAX): only with --ray
        from .._src.serving.ray.api import check_ingress

        check_ingress(ray_address, ray_ingress)
    model, spec, store, version_check = _what_to_serve(target, store, spec_file, inputs)
    token = read_token(control_token_file) if control_token_file else None
    if use_ray:
        options = {
            "allow_unchecked": allow_unchecked,
            "memory_budget": memory_budget,
            "cache_dir": cache_dir or _default_cache(),
            "control_token": token,
            "access_log": access_log,
        }
        where = {"address": ray_address, "name": ray_app, "host": host, "port": port}
        model = None if target is None else model  # without it, each replica reads the artifact
        _run_ray(model, store_root, spec, replicas, options, where | {"ingress": ray_ingress})
        return
    server = Server(
        model,
        store,
        spec=spec,
        cache_dir=cache_dir or _default_cache(),
        memory_budget=memory_budget,
        watch_s=1.0 if watch else None,
        allow_unchecked=allow_unchecked,
        version_check=version_check,
    )
    listen = {"host": host, "port": port, "grpc_port": grpc_port, "access_log": access_log}
    _run_here(server, listen | {"control_token": token})


def _run_here(server: Any, listen: dict[str, Any]) -> None:
    """``server.serve(**listen)`` in this process, until it is stopped."""
    try:
        server.serve(**listen)
    except SystemExit as e:  # uvicorn's own exit (it logged why), not the model's
        raise ServingError(
            f"the server on {listen['host']}:{listen['port']} stopped: uvicorn exited with "
            f"status {e.code!r}",
            hint="its log above says why (a port in use, an address not on this machine)",
        ) from e


def _what_to_serve(
    target: str | None, store: Any, spec_file: Path | None, inputs: tuple[str, ...]
) -> tuple[Any, Any, Any, Any]:
    """``(model, spec, store, version_check)``: MODULE:ATTR's model and its
    serving spec, or without a target the store's current exported artifact,
    through its gates (so a refused artifact stops the command before any
    server or replica starts) with the check every later version must pass."""
    if target is not None:
        model = load_model(target, command="serve")
        return model, serving_spec(model, spec_file, inputs), store, None
    if inputs:
        raise ConfigError(
            "an exported artifact is served without --input (its inputs are the ones it "
            "was exported for)",
            hint="treeguard serve --store STORE [--spec FILE] [--port N]",
        )
    served = _served(store, spec_file)
    return served.model, served.spec, served.store, served.check


def _check_ray_options(grpc_port: int | None, watch: bool, *, keyed: bool) -> None:
    """Refuses the options ``--ray`` does not take."""
    if grpc_port is not None or watch:
        raise ConfigError(
            "--grpc-port and --watch are not served with --ray",
            hint="swap every replica with: treeguard serve swap --ray VERSION",
        )
    if keyed:
        raise ConfigError(
            "--signing-key, --trusted-key and --revoked-key are not passed to Ray replicas",
            hint="set $TREEGUARD_TRUSTED_KEYS (and $TREEGUARD_REVOKED_KEYS) in the "
            "environment of the cluster's nodes; each replica opens the store with them",
        )


def _keyed_store(store_root: Path, keys: dict[str, Any]) -> Any:
    """The store opened with the command's key options; its root alone (the
    server opens it, with the environment's keys) when none is given."""
    if keys["signing_key"] is None and not keys["trusted_keys"] and not keys["revoked_keys"]:
        return store_root
    from .._src.store import ArtifactStore  # its readers: only once the command runs

    return ArtifactStore(store_root, **keys)


def _served(store: Any, spec_file: Path | None) -> Any:
    """The store's current exported artifact, through its gates (no model code)."""
    from .._src.export.served import served_from_store  # JAX and jax.export: only once it runs
    from .._src.serving.spec import ServingSpec
    from .._src.store import ArtifactStore

    spec = ServingSpec.load(spec_file) if spec_file is not None else None
    opened = store if isinstance(store, ArtifactStore) else ArtifactStore(store)
    return served_from_store(opened, spec=spec)


def _require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "--ray needs Ray Serve, which is not installed",
            hint="pip install 'treeguard[ray]'",
        )


def _run_ray(  # noqa: PLR0917 - one call site
    model: Any | None,
    store_root: Path,
    spec: Any,
    replicas: int,
    options: dict[str, Any],
    where: dict[str, Any],
) -> None:
    """Runs ``app(model, store_root, spec, num_replicas=replicas, **options)``
    under Ray Serve, placed by ``where`` (``run_application``'s ``name``,
    ``address``, ``host``, ``port`` and ``ingress``)."""
    _require_ray()
    # the deployment imports JAX, and Ray once the application is built
    from .._src.serving.ray.api import app, run_application, swap_command

    name = where["name"]

    def ready(live: dict[str, int | None], cluster: str, proxy: str) -> None:
        console().print(
            f"serving {name!r} on {proxy} with {len(live)} replicas; swap them "
            f"with: {swap_command(cluster, name=name)}; Ctrl-C stops it",
            markup=False,
            soft_wrap=True,
        )

    built = app(model, store_root, spec, num_replicas=replicas, **options)
    run_application(built, on_ready=ready, **where)


@serve.command("plan")
@_target
@spec_option
@input_option
@click.option("--budget", type=click.IntRange(1), default=None, metavar="BYTES")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(
    target: str,
    spec_file: Path | None,
    inputs: tuple[str, ...],
    budget: int | None,
    as_json: bool,
) -> None:
    """Compile every bucket ahead of time; print compile time and memory per bucket.

    Exits 1 when the params plus the largest bucket exceed --budget.
    """
    from .._src.serving.plan import plan  # imports JAX: only once the command runs

    model = load_model(target, command="serve plan")
    spec = serving_spec(model, spec_file, inputs)
    result = plan(model, spec, budget=budget)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        from rich.table import Table

        table = Table("bucket", "compile", "arguments", "outputs", "temps", "code")
        for b in result.buckets:
            table.add_row(
                str(b.bucket),
                f"{b.compile_s * 1000:.0f} ms",
                fmt_bytes(b.argument_bytes),
                fmt_bytes(b.output_bytes),
                fmt_bytes(b.temp_bytes),
                fmt_bytes(b.code_bytes),
            )
        out = console()
        out.print(table)
        out.print(
            f"params {fmt_bytes(result.params_bytes)}; params plus the largest bucket "
            f"{fmt_bytes(result.peak_bytes)}"
            + (f" of a budget of {fmt_bytes(budget)}" if budget else ""),
            markup=False,
        )
    if not result.fits:
        raise ServingError(
            f"params plus bucket {result.buckets[-1].bucket} need {result.peak_bytes} bytes, "
            f"over the budget of {budget}",
            hint="drop the largest bucket or raise --budget",
        )


@serve.command("swap")
@click.argument("words", nargs=-1, required=True, metavar="URL VERSION | --ray VERSION")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait.")
@click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help="Swap every replica of a Ray Serve application (checked on each first).",
)
@click.option("--ray-address", default="auto", show_default=True, metavar="ADDRESS")
@click.option("--ray-app", default="treeguard", show_default=True)
@click.option(
    "--control-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The file holding the server's control token (its --control-token-file).",
)
def swap_command(  # noqa: PLR0917 - click passes every option
    words: tuple[str, ...],
    timeout: float,
    use_ray: bool,
    ray_address: str,
    ray_app: str,
    control_token_file: Path | None,
) -> None:
    """Ask the server at URL to hot-swap to VERSION (verified, checked, then served).

    A server started with --control-token-file takes the swap only with the
    same file's token. With --ray, every replica of the Ray Serve application
    checks VERSION first; they switch only if all pass, then the store's
    current version moves.
    """
    if use_ray:
        if len(words) != 1:
            raise ConfigError("serve swap --ray takes one VERSION", hint="serve swap --ray v000002")
        if control_token_file is not None:
            raise ConfigError(
                "--control-token-file goes with a URL: serve swap --ray reaches the replicas "
                "through Ray, not over HTTP",
                hint="serve swap --ray VERSION",
            )
        _swap_ray(words[0], address=ray_address, name=ray_app, timeout=timeout)
        return
    if len(words) != 2:
        raise ConfigError(
            "serve swap takes URL VERSION", hint="serve swap http://127.0.0.1:8000 v2"
        )
    url, version = words
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{url!r} is not an http(s) URL", hint="http://127.0.0.1:8000")
    headers = {"Content-Type": "application/json"}
    if control_token_file is not None:
        headers["Authorization"] = "Bearer " + read_token(control_token_file).decode("ascii")
    req = urllib.request.Request(
        url.rstrip("/") + "/v2/treeguard/swap",
        data=json.dumps({"version": version}).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = strictjson.loads(resp.read(1 << 20), "the server's answer", context=url)
    except urllib.error.HTTPError as e:
        try:
            refusal = strictjson.loads(e.read(1 << 20), "the server's refusal", context=url)
            message = refusal.get("error", str(e))
        except (ValueError, AttributeError):
            message = str(e)
        raise ServingError(f"swap to {version} refused ({e.code}): {message}") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ConfigError(f"cannot reach {url}: {e}") from e
    click.echo(
        f"serving {body.get('active')} (previous {body.get('previous')}); "
        f"{body.get('compiles')} compiles; checks: {', '.join(body.get('checks') or []) or '-'}"
    )


def _swap_ray(version: str, *, address: str, name: str, timeout: float) -> None:
    _require_ray()
    from .._src.serving.ray.api import connect, swap  # Ray only with --ray

    ray = connect(address)
    try:
        result = swap(version, name=name, timeout_s=timeout)
    finally:
        ray.shutdown()
    click.echo(f"serving {result['version']} on {len(result['replicas'])} replicas")


if __name__ == "__main__":  # pragma: no cover
    serve()
