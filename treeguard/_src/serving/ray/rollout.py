"""The verified rolling swap across replicas, apart from Ray: who has been
asked what, who answered, and what the answers decide.

A swap to ``V`` is two rounds. In the first (``prepare``) every replica
loads ``V`` from the store (digest re-checked), runs the release checks on
it in its own process (contract, finite, regression) and keeps it loaded
without serving it. Only when every live replica has passed does the second
round (``commit``) begin, in which each replica switches to the version it
holds between two batches; if any replica fails, the round is ``abort`` and
every replica drops what it prepared, so the fleet never splits across
versions. A replica that starts during a swap answers the round in force.

``Rollout`` is the state the coordinator keeps; ``decide`` reads a round's
answers against the replicas alive now (a replica that died is not waited
for; one that started late is).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from ..weights import reason_of

#: The actions of a round.
ACTIONS = ("prepare", "commit", "abort")


@dataclasses.dataclass(frozen=True)
class Command:
    """One round: its sequence number, action and version."""

    seq: int
    action: str
    version: str


@dataclasses.dataclass(frozen=True)
class ReplicaReport:
    """One replica's answer to a round.

    Attributes:
      replica: the replica's id.
      seq: the round it answers.
      ok: whether the action succeeded on it.
      reason: why not, on one line (empty when ``ok``).
      active: the version it serves after the action.
    """

    replica: str
    seq: int
    ok: bool
    reason: str = ""
    active: str | None = None

    @classmethod
    def failed(
        cls, replica: str, seq: int, error: BaseException, active: str | None
    ) -> ReplicaReport:
        """The report of an action that raised ``error``."""
        return cls(replica, seq, False, reason_of(error, limit=500), active)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a round's answers decide.

    Attributes:
      waiting: live replicas that have not answered yet.
      failed: ``{replica: reason}`` for each live replica whose action failed.
      serving: the versions the live replicas that answered serve after it.
    """

    waiting: frozenset[str]
    failed: Mapping[str, str]
    serving: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        """Every live replica has answered."""
        return not self.waiting

    @property
    def passed(self) -> bool:
        """Every live replica has answered, and none failed."""
        return self.done and not self.failed


def decide(live: Iterable[str], reports: Mapping[str, ReplicaReport]) -> Decision:
    """Reads a round's reports against the replicas alive now.

    Example:
      >>> r = {
      ...     "a": ReplicaReport("a", 1, True),
      ...     "b": ReplicaReport("b", 1, False, "fails the finite check"),
      ... }
      >>> decide({"a", "b"}, r).failed
      {'b': 'fails the finite check'}
      >>> decide({"a", "c"}, r).waiting, decide({"a"}, r).passed
      (frozenset({'c'}), True)
    """
    alive = set(live)
    answered = sorted(alive & set(reports))
    waiting = frozenset(alive - set(reports))
    failed = {rid: reports[rid].reason for rid in answered if not reports[rid].ok}
    serving = sorted({a for rid in answered if (a := reports[rid].active) is not None})
    return Decision(waiting, failed, tuple(serving))


class Rollout:
    """The coordinator's state: the round in force, its answers, the version
    last committed, and where each replica's metrics are.

    Example:
      >>> r = Rollout()
      >>> cmd = r.publish("prepare", "v000002")
      >>> r.report(ReplicaReport("a", cmd.seq, True, active="v000001"))
      >>> r.report(ReplicaReport("a", cmd.seq - 1, False))  # an answer to an older round is dropped
      >>> decide({"a"}, r.reports).passed
      True
      >>> r.publish("commit", "v000002").seq, r.committed
      (2, 'v000002')
      >>> r.settle("v000002"); r.committed is None
      True
    """

    def __init__(self) -> None:
        self.seq = 0
        self.command: Command | None = None
        self.reports: dict[str, ReplicaReport] = {}
        #: the version a commit moved the fleet to while the store's pointer
        #: does not name it yet, for replicas that start in between
        self.committed: str | None = None
        #: ``{replica: metrics URL}``
        self.metrics: dict[str, str] = {}

    def publish(self, action: str, version: str) -> Command:
        """Starts a new round; the previous round's answers are dropped."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        self.seq += 1
        self.command = Command(self.seq, action, version)
        self.reports = {}
        if action == "commit":
            self.committed = version
        return self.command

    def settle(self, version: str) -> None:
        """The store's pointer now names ``version``: replicas that start from
        now on read it there (so a later rollback in the store is obeyed)."""
        if self.committed == version:
            self.committed = None

    def report(self, report: ReplicaReport) -> None:
        """Records an answer to the round in force (others are dropped)."""
        if report.seq == self.seq:
            self.reports[report.replica] = report

    def pending(self) -> Command | None:
        """The round a replica that starts now must answer (a prepare in
        force), or None."""
        cmd = self.command
        return cmd if cmd is not None and cmd.action == "prepare" else None


def refusal(version: str, failed: Mapping[str, str], serving: Sequence[str] = ()) -> str:
    """The message of a swap that no replica made because some failed,
    naming the versions the fleet goes on serving.

    Example:
      >>> why = {"r1": "version v000002 fails the finite check"}
      >>> print(refusal("v000002", why, ["v000001"]))
      swap to v000002 refused: the check failed on 1 replica(s), and none switched from v000001:
        replica r1: version v000002 fails the finite check
    """
    lines = [f"  replica {rid}: {why}" for rid, why in failed.items()]
    served = f" from {', '.join(serving)}" if serving else ""
    return (
        f"swap to {version} refused: the check failed on {len(failed)} replica(s), "
        f"and none switched{served}:\n" + "\n".join(lines)
    )
