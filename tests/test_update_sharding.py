"""Checked updates keep shardings: run in a child process with 8 CPU devices."""

from __future__ import annotations

import textwrap

import pytest
from subproc import run_python

CHILD = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from treeguard._src.errors import TreeMismatchError
    from treeguard._src.optimizer import optax_step
    from treeguard._src.updates import apply_updates, updater

    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))

    def put(tree, specs):
        return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)

    specs = {"w": P("x", "y"), "b": P("y")}
    params = put({"w": jnp.arange(64.0).reshape(8, 8), "b": jnp.arange(8.0)}, specs)
    grads = put({"w": jnp.ones((8, 8)), "b": jnp.ones(8)}, specs)

    def same_sharding(a, b):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            assert x.sharding.is_equivalent_to(y.sharding, x.ndim), (x.sharding, y.sharding)

    # same shardings: kept, over many steps, one compile
    step = updater(lambda p, g, *, lr: p - lr * g)
    new = params
    for _ in range(5):
        new = step(new, grads, lr=0.5)
    same_sharding(new, params)
    np.testing.assert_allclose(np.asarray(new["w"]), np.arange(64.0).reshape(8, 8) - 2.5)
    assert step.compile_count == 1, step.compile_count
    print("kept")

    # grads laid out differently on the same devices: resharded, params' sharding kept
    other = put({"w": jnp.ones((8, 8)), "b": jnp.ones(8)}, {"w": P("y", "x"), "b": P()})
    new = step(params, other, lr=0.5)
    same_sharding(new, params)
    np.testing.assert_allclose(np.asarray(new["b"]), np.arange(8.0) - 0.5)
    assert step.compile_count == 2, step.compile_count
    new = apply_updates(params, other)
    same_sharding(new, params)
    print("resharded")

    # grads on other devices: refused, naming the path and both placements
    single = jax.tree.map(lambda g: jax.device_put(g, jax.devices()[0]), grads)
    try:
        step(params, single, lr=0.5)
    except TreeMismatchError as e:
        text = str(e)
        assert e.mismatches[0].kind == "sharding", text
        assert "['b']: sharding named(mesh[x=2,y=4], spec('y',)) on cpu:0-7 in the params, " \\
            "single on cpu:0 in the updates" in text, text
        assert "jax.device_put" in text, text
    else:
        raise AssertionError("grads on one device were accepted")

    # mismatched single devices
    p1 = {"w": jax.device_put(jnp.ones(3), jax.devices()[0])}
    g1 = {"w": jax.device_put(jnp.ones(3), jax.devices()[1])}
    try:
        apply_updates(p1, g1)
    except TreeMismatchError as e:
        assert "['w']: sharding single on cpu:0 in the params, single on cpu:1 in the updates" \\
            in str(e), str(e)
    else:
        raise AssertionError("grads on another device were accepted")
    print("refused")

    # donation keeps the sharding and frees the old buffers
    donating = updater(lambda p, g: p - g, donate=True, on_nonfinite="skip")
    old = jax.tree.map(lambda x: x + 0, params)
    new = donating(old, grads)
    assert all(x.is_deleted() for x in jax.tree.leaves(old))
    same_sharding(new, params)
    print("donated")

    # optax: params and state keep their shardings
    opt = optax_step(optax.adam(1e-2), donate=True)
    p, s = jax.tree.map(lambda x: x + 0, params), None
    s = opt.init(p)
    s_ref = [(x.sharding, x.committed) for x in jax.tree.leaves(s)]
    for _ in range(3):
        p, s = opt(p, grads, s)
    same_sharding(p, params)
    for x, (sh, committed) in zip(jax.tree.leaves(s), s_ref):
        # the moments follow the params; the uncommitted step count may move
        assert not committed or x.sharding.is_equivalent_to(sh, x.ndim), (x.sharding, sh)
    assert opt.compile_count == 1, opt.compile_count
    print("optax")
    print("OK")
    """
)


@pytest.mark.slow
def test_shardings_survive_updates_on_a_2x4_mesh() -> None:
    proc = run_python(
        CHILD, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["kept", "resharded", "refused", "donated", "optax", "OK"]
