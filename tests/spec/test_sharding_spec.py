"""Shardings recorded in a spec are checked against live trees (8 simulated devices)."""

from __future__ import annotations

import textwrap

import pytest
from subproc import run_python

CHILD = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import numpy as np
    import treeguard as tg

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    sharded = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("data", "model")))
    replicated = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P()))
    spec = tg.spec_of({"w": sharded}, sharding=True)
    assert spec.has_sharding
    tg.check({"w": sharded}, spec)
    tg.check({"w": sharded}, spec)
    found = tg.mismatches({"w": replicated}, spec)
    assert [(m.path, m.kind) for m in found] == [("['w']", "sharding")], found
    assert "data=2" in found[0].expected and "spec()" in found[0].actual, found
    try:
        tg.check({"w": replicated}, spec)
    except tg.TreeMismatchError as e:
        print("REFUSED", e.mismatches[0].kind)
    again = tg.TreeSpec.from_json(spec.to_json())
    assert tg.mismatches({"w": replicated}, again)[0].kind == "sharding"
    assert tg.mismatches({"w": replicated}, tg.spec_of({"w": sharded})) == []  # not recorded: not checked
    print("OK")
    """
)


@pytest.mark.slow
def test_recorded_sharding_is_checked_on_live_trees() -> None:
    out = run_python(
        CHILD, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["REFUSED", "sharding", "OK"]
