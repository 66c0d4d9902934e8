"""The ports ``haproxy_environment`` hands HAProxy's stats page and exporter
and Ray's fallback proxy: distinct, free, and never from the kernel's
ephemeral range, where an outgoing connection could take one before HAProxy
binds it. No cluster is started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from machine import needs_inet_sockets
from ports import free_port

import treeguard as tg
from treeguard._src.serving.ray.ports import (  # _src: the range file is no public parameter
    ephemeral_ports,
    pick_free,
    quiet_ports,
    replica_ports,
    server_ports,
)
from treeguard.serving import ray as tg_ray

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORT_KEYS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
)
#: Ray Serve's replicas' ports in HAProxy mode (HTTP, gRPC), by default.
REPLICAS = (*range(30000, 31001), *range(40000, 41001))


def test_haproxy_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    needs_inet_sockets()
    if not RANGE_FILE.exists():
        pytest.skip(f"no {RANGE_FILE} on this machine")
    low, high = map(int, RANGE_FILE.read_text().split())
    for _ in range(20):
        env = tg_ray.haproxy_environment("/tmp/tg-haproxy")
        ports = [int(env[key]) for key in PORT_KEYS]
        assert len(set(ports)) == 3, ports
        for port in ports:
            assert not low <= port <= high, (port, low, high)
            assert port >= 20000 and port not in REPLICAS, port  # Ray's own ports
            with socket.socket() as s:
                s.bind(("", port))  # free on every interface, where HAProxy binds it


def room(low: int, high: int) -> set[int]:
    """The ports from 20000 up outside ``low``-``high`` and the replicas'."""
    return set(range(20000, 65536)) - set(range(low, high + 1)) - set(REPLICAS)


@settings(max_examples=15, deadline=None)
@given(low=st.integers(1, 65535), width=st.integers(0, 65535))
def test_ports_lie_outside_any_ephemeral_range_that_leaves_room(
    tmp_path_factory: pytest.TempPathFactory, low: int, width: int
) -> None:
    needs_inet_sockets()
    high = min(low + width, 65535)
    left = room(low, high)
    assume(len(left) >= 100)
    source = tmp_path_factory.mktemp("range") / "ip_local_port_range"
    source.write_text(f"{low}\t{high}\n")
    ports = server_ports(3, source=source)
    assert len(set(ports)) == 3
    assert set(ports) <= left, (ports, low, high)


def test_an_ephemeral_range_over_every_port_warns_and_picks_inside_it(tmp_path: Path) -> None:
    needs_inet_sockets()
    source = tmp_path / "ip_local_port_range"
    source.write_text("1\t65535\n")
    with pytest.warns(RuntimeWarning) as caught:
        ports = server_ports(3, source=source, environ={})
    assert str(caught[0].message) == (
        f"the kernel's ephemeral ports 1-65535 (from {source}) leave no port from 20000 up "
        "for HAProxy's servers: they are picked among the ephemeral ones, where an outgoing "
        "connection may take one before HAProxy binds it; narrow the range, for example "
        "sysctl -w net.ipv4.ip_local_port_range='32768 60999'"
    )
    assert len(set(ports)) == 3 and not set(ports) & {*REPLICAS, 52365}


def test_the_replicas_ports_ray_reads_from_the_environment_are_never_picked(
    tmp_path: Path,
) -> None:
    needs_inet_sockets()
    source = tmp_path / "ip_local_port_range"
    source.write_text("32768\t65535\n")  # below it: 20000 to 32767
    moved = {  # the replicas' HTTP ports moved over all of them but the last 67
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "20000",
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "32700",
    }
    for _ in range(10):
        assert set(server_ports(3, source=source, environ=moved)) <= set(range(32701, 32768))
    with pytest.raises(
        tg.ConfigError, match=r"^RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT is 'many', not a port"
    ):
        server_ports(1, source=source, environ={"RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": "many"})


def test_ray_s_dashboard_agent_port_is_never_picked(tmp_path: Path) -> None:
    source = tmp_path / "ip_local_port_range"
    source.write_text("32768\t50000\n")  # 52365 lies above it
    assert 52365 not in quiet_ports(ephemeral_ports(source), replica_ports({}))


def test_a_range_file_that_holds_no_range_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "ip_local_port_range"
    source.write_text("32768\n")
    with pytest.raises(tg.ConfigError, match=r"holds '32768', not a range of ports 'LOW HIGH'"):
        ephemeral_ports(source)


def test_without_a_range_file_ports_come_from_below_32768(tmp_path: Path) -> None:
    needs_inet_sockets()
    assert ephemeral_ports(tmp_path / "absent") == range(32768, 65536)
    ports = server_ports(3, source=tmp_path / "absent")
    assert all(20000 <= p < 30000 or 31000 < p < 32768 for p in ports), ports


def test_a_port_held_on_any_interface_is_never_picked() -> None:
    needs_inet_sockets()
    held, free = free_port(), free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", held))  # HAProxy binds every interface: this blocks it
        holder.listen()
        assert pick_free([held, free], 1) == [free]
        with pytest.raises(tg.ConfigError) as info:
            pick_free([held], 1)
    assert str(info.value) == (
        "1 port wanted for servers, and 0 of the 1 outside the kernel's ephemeral range "
        "are free\n"
        "hint: stop the servers that hold them, or narrow the ephemeral range "
        "(net.ipv4.ip_local_port_range) to leave more ports outside it"
    )
    assert sorted(pick_free([held, free, held], 2)) == sorted([held, free])  # once each
