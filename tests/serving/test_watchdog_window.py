"""The watchdog's window against a model of it: every response judged on the
latest ``window`` outcomes of the served version, whatever came before."""

from __future__ import annotations

import pytest
import tinymodel
from hypothesis import given, settings
from hypothesis import strategies as st
from serving_support import put_verified, tiny_spec

import treeguard
from treeguard.serving import Server, WatchdogPolicy

POLICY = WatchdogPolicy(window=6, min_requests=3, max_nonfinite_rate=0.34, max_error_rate=0.5)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Server, str]:
    store = treeguard.ArtifactStore(tmp_path_factory.mktemp("window"))
    version = put_verified(store, tinymodel.params(eps=1.0))
    store.promote(version)
    server = Server(tinymodel.model, store, spec=tiny_spec(), watchdog=POLICY)
    server.start()
    return server, version


def expected(seen: list[tuple[bool, bool]]) -> str | None:
    if len(seen) < POLICY.min_requests:
        return None
    if sum(n for n, _ in seen) / len(seen) > POLICY.max_nonfinite_rate:
        return "nonfinite"
    if sum(e for _, e in seen) / len(seen) > POLICY.max_error_rate:
        return "5xx"
    return None


@settings(max_examples=100, deadline=None)
@given(outcomes=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=30))
def test_each_response_is_judged_on_the_latest_window(served, outcomes):
    server, version = served
    dog = server.watchdog
    active = server.weights.active_version
    for _ in range(POLICY.window):  # a window of good responses, whatever came before
        dog.record(version, active, nonfinite=False, error=False)
    seen = [(False, False)] * POLICY.window
    for nonfinite, error in outcomes:
        seen = [*seen, (nonfinite, error)][-POLICY.window :]
        assert dog.record(version, active, nonfinite=nonfinite, error=error) == expected(seen)
    assert dog.record("another version", active, nonfinite=True, error=True) is None  # not served


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window": 0}, "watchdog.window is 0\nhint: an int from 1 to 2**20"),
        ({"window": None}, "watchdog.window is None\nhint: an int from 1 to 2**20"),
        ({"min_requests": True}, "watchdog.min_requests is True\nhint: an int from 1 to 2**20"),
        (
            {"window": 5, "min_requests": 6},
            "watchdog.min_requests is 6, over its window of 5\nhint: at most the window",
        ),
        ({"max_error_rate": -0.1}, "watchdog.max_error_rate is -0.1\nhint: a share from 0 to 1"),
        (
            {"max_nonfinite_rate": float("nan")},
            "watchdog.max_nonfinite_rate is nan\nhint: a share from 0 to 1",
        ),
    ],
)
def test_a_policy_the_watchdog_could_not_follow_is_refused_naming_the_field(options, message):
    with pytest.raises(treeguard.ConfigError) as e:
        WatchdogPolicy(**options)
    assert str(e.value) == message
