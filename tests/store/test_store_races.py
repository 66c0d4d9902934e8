"""gc, promote, rollback and put from four processes at once, round after
round, on a local store and on a bucket behind a proxy that delays every
request (tests/store/races.py holds the workers and the model): no version
that is current, previous verified or just put is ever deleted, every
version held is one the model holds, and every failure is typed."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from tests.s3server import Lie, LyingProxy, Request, S3Server
from tests.store.races import Races

#: Rounds in the default (local) and slow (bucket) runs, and in the reliability run.
ROUNDS = 12
RELIABILITY_ROUNDS = 1000
#: A bucket's rounds in the reliability run: about 15 a minute on the 2-core box
#: behind the delaying proxy, so 1,000 would take an hour of CI's 90 minutes.
#: They run as two histories of half as many rounds, the run's two longest
#: tests (``long``, so each worker starts on one), in no xdist group: each on
#: its worker's server (the session's), the shorter tests filling in around
#: them. One history of 150 was that run's longest test, on one worker while
#: the other stood idle; two, in the groups "s3" and "s3-races", still left a
#: worker idle for the run's last four minutes, as the second started after
#: the run's shorter tests (2026-12-07: 706 s, of which 281 s that history).
BUCKET_RELIABILITY_ROUNDS = 150


def _local(root: Path, rounds: int, *, dedup: bool = False) -> dict[str, int]:
    return Races(str(root), dedup=dedup).run(rounds)


def _bucket(
    url: str,
    server: S3Server,
    rounds: int,
    *,
    lies: float = 0.0,
    told: list[str] | None = None,
    dedup: bool = False,
) -> dict[str, int]:
    """The rounds on a bucket behind a proxy that delays every request and,
    with ``lies``, answers that share of the writes falsely: a 200 for a
    write it does not perform, or a 412 for one it does. Each lie told is
    appended to ``told``."""
    rng = random.Random(20261205)
    lock = threading.Lock()

    def delay(req: Request) -> Lie:
        with lock:
            wait = rng.choice((0.0, 0.0, 0.001, 0.003, 0.008))
            lie = req.method == "PUT" and rng.random() < lies
            return Lie(delay=wait, kind=rng.choice(("ack", "refuse")) if lie else None)

    with LyingProxy(server.endpoint, delay) as proxy:
        env = {"AWS_ENDPOINT_URL": proxy.endpoint}
        errors = Races(url, env=env, seed=1, storage_errors=lies > 0, dedup=dedup).run(rounds)
        if told is not None:
            told.extend(kind for kind, _, _ in proxy.lies)
        return errors


@pytest.mark.parametrize(
    "rounds",
    [
        ROUNDS,
        pytest.param(RELIABILITY_ROUNDS, marks=[pytest.mark.reliability, pytest.mark.long(90)]),
    ],
)
def test_concurrent_gc_promote_rollback_and_put_lose_nothing_on_a_local_store(
    tmp_path: Path, rounds: int
) -> None:
    _local(tmp_path / "store", rounds)


def test_concurrent_rounds_on_a_dedup_store_lose_no_tensor(tmp_path: Path) -> None:
    _local(tmp_path / "store", ROUNDS, dedup=True)


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_concurrent_rounds_on_a_dedup_bucket_lose_no_tensor(
    s3_url: str, s3_server: S3Server
) -> None:
    errors = _bucket(s3_url, s3_server, ROUNDS * 2, dedup=True)
    print("typed failures over the rounds:", errors)


@pytest.mark.parametrize(
    "rounds",
    [
        pytest.param(ROUNDS * 2, marks=[pytest.mark.slow, pytest.mark.xdist_group("s3")]),
        *(
            pytest.param(
                BUCKET_RELIABILITY_ROUNDS // 2,
                marks=[pytest.mark.reliability, pytest.mark.long(290)],
                id=f"history-{name}",
            )
            for name in ("a", "b")
        ),
    ],
)
def test_concurrent_gc_promote_rollback_and_put_lose_nothing_in_a_bucket(
    s3_url: str, s3_server: S3Server, rounds: int
) -> None:
    errors = _bucket(s3_url, s3_server, rounds)
    print("typed failures over the rounds:", errors)


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_concurrent_rounds_on_a_bucket_that_lies_about_writes_lose_nothing(
    s3_url: str, s3_server: S3Server
) -> None:
    told: list[str] = []
    errors = _bucket(s3_url, s3_server, ROUNDS * 2, lies=0.05, told=told)
    # The lies were told (Races checked that every failure they caused was
    # typed and that nothing held was lost). Which error a lie surfaces as
    # depends on the interleaving: a refused write that was made is a
    # StorageError or a ConflictError, an acknowledged one that was not may
    # be noticed by a later read or overwritten first; so only the count of
    # lies is asserted, never which error met them.
    assert told, "the proxy told no lie in the rounds"
    print("lies told:", len(told), "typed failures:", errors)
