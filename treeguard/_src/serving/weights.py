"""The weights being served: load, check, swap, roll back, quarantine.

A swap loads only a version the store marks verified (its digest re-checked,
its verdict's signature checked when the store has a key), runs the fast
checks of ``treeguard verify`` on it in process (contract, finite,
regression on the stored reference batches), and only then takes traffic.
A version with the active TreeSpec reuses the compiled executables; one with
another spec is warmed on every bucket first. The switch is one reference
assignment read once per batch, so a batch already running finishes on the
params it started with. The old active becomes ``previous`` for an instant
rollback, which the engine's ``Watchdog`` (``watchdog.py``) asks for on its
own when a version misbehaves.

A version the watchdog rolls back from is quarantined by a verdict of the
store: ``store.verify`` records it as rejected by the check ``QUARANTINE``,
signed with the store's key like every verdict. A restart never serves it
(it is no longer verified), an edit that turns it back into ``verified`` is
refused by the store's signature check (``SignatureError``), and only a new
``store verify`` of the version lifts the quarantine.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..errors import (
    FormatError,
    IntegrityError,
    NonFiniteVersionError,
    ServingError,
    TreeguardError,
    TreeMismatchError,
)
from ..leaf import short_dtype
from ..nonfinite import describe_nonfinite, find_nonfinite, host_all_finite
from ..spec import TreeSpec, spec_of
from ..verify.model import Model
from .metrics import Metrics
from .release import params_like
from .runner import Runner, Slot, keystr_of
from .spec import ServingSpec
from .verdicts import model_checks, trail_text, version_trail

log = logging.getLogger("treeguard.serving")

#: The name of the check a quarantine verdict fails (``store ls`` shows it).
QUARANTINE = "serve.quarantine"


class Weights:
    """Loads, checks, warms, swaps and rolls back the served params.

    Args:
      model: the ``treeguard.verify.Model``; its ``apply`` is served.
      spec: the ``ServingSpec``.
      store: the ``ArtifactStore`` versions come from.
      runner: the ``Runner`` that warms a version and runs its checks.
      metrics: where swaps and rollbacks are counted.
      memory_budget: bytes the served params may take in all (active,
        previous and a version being loaded); None for the device's free
        memory when it reports one.
      allow_unchecked: serve versions whose verdict ran no model check
        (``release.release_checks``); ``treeguard serve`` refuses them unless
        ``--allow-unchecked``.
      on_switch: called (under the switch lock) whenever the active version
        changes: the engine clears its watchdog's window there.
      version_check: called with each version before it is loaded or
        returned to (an exported artifact's gates: ``export.Served.check``);
        a ``TreeguardError`` it raises refuses the version.
    """

    def __init__(
        self,
        model: Model,
        spec: ServingSpec,
        store: Any,
        *,
        runner: Runner,
        metrics: Metrics,
        memory_budget: int | None = None,
        allow_unchecked: bool = True,
        on_switch: Callable[[], None] = lambda: None,
        version_check: Callable[[str], None] | None = None,
    ) -> None:
        self.model, self.spec, self.store = model, spec, store
        self._version_check = version_check
        self.runner = runner
        self.active: Slot | None = None
        self.previous: Slot | None = None
        self.quarantined: set[str] = set()
        self.metrics = metrics
        self.memory_budget = memory_budget
        self.allow_unchecked = allow_unchecked
        self._on_switch = on_switch
        self.ready = False
        self._swap_lock = threading.Lock()
        self._switch_lock = threading.Lock()
        self._refs: Any = None
        self._refs_loaded = False
        self._like: Any = None
        self._like_made = False
        #: ``{"from", "to", "reasons"}`` when warm-up fell back from the current version.
        self.fallback: dict[str, Any] | None = None
        #: the served version's provenance (``verdicts.version_trail``), None when unsigned
        self.trail: dict[str, Any] | None = None

    # -- loading and checks ----------------------------------------------------

    def _params_spec(self) -> TreeSpec | None:
        return self.model.stored_params_spec()

    @property
    def active_version(self) -> str | None:
        """The version served now, or None before the first is warm."""
        active = self.active
        return None if active is None else active.version

    def params_like(self) -> Any:
        """The structure every version is loaded into (see ``release.params_like``)."""
        if not self._like_made:
            self._like_made = True
            self._like = params_like(self.model)
        return self._like

    def _load(self, version: str, *, contract: TreeSpec | None) -> Slot:
        # the store's errors by their bases (every one is a TreeguardError, an
        # unknown version also a LookupError), so this holds however the
        # store arranges its modules
        try:
            info = self.store.info(version)
        except LookupError as e:
            raise ServingError(str(e), status=404) from e
        except TreeguardError as e:
            raise ServingError(f"version {version} cannot be served: {e}") from e
        if not self.allow_unchecked and not model_checks(info.checks):
            raise ServingError(
                f"version {version} was verified with no model check (checks: [])",
                hint=f"run the model's checks: treeguard store verify STORE {version} --model "
                "MODULE:ATTR; or serve it as it is with --allow-unchecked",
            )
        if info.kind != "file":
            raise ServingError(
                f"version {version} cannot be served: it is a {info.kind} checkpoint, and the "
                "server loads single-file versions",
                hint="gather it with store.load_verified(version, like) and put the result as a "
                "file version (store.put), then verify and swap to that",
            )
        nbytes = int(info.nbytes or 0)
        self._check_room(version, nbytes)
        like = self.params_like()
        try:
            digest = self.store.check_verified(version)
            if self._version_check is not None:
                self._version_check(version)
            stored = self.store.load_verified(version, like=like)
        except TreeMismatchError as e:
            raise ServingError(
                f"version {version} fails the contract check (the model's params): {e}",
                status=409,
            ) from e
        except (TreeguardError, OSError) as e:  # not verified, changed, unsigned, unreadable
            raise ServingError(f"version {version} cannot be served: {e}") from e
        if contract is not None and like is not contract:  # else the load compared them
            try:
                from ..diff import check

                check(stored, contract)
            except TreeMismatchError as e:
                raise ServingError(
                    f"version {version} fails the contract check: {e}", status=409
                ) from e
        _check_finite(version, stored)  # on the host copy, before it reaches the device
        params = jax.device_put(stored)
        del stored
        return Slot(version, params, spec_of(params), nbytes, digest)

    def _still_servable(self, slot: Slot) -> None:
        """Refuses to return to weights already held unless the store still
        passes their version through its gate (verified, signed when it has a
        key) with the digest they were loaded under."""
        try:
            digest = self.store.check_verified(slot.version)
            if self._version_check is not None:
                self._version_check(slot.version)
        except (TreeguardError, OSError) as e:
            raise ServingError(f"version {slot.version} cannot be served: {e}") from e
        if digest != slot.digest:
            raise ServingError(
                f"version {slot.version} cannot be served: its verdict now names another file "
                f"(digest {digest[:12]}…, loaded under {slot.digest[:12]}…)",
                hint=f"swap to it again to load and check it: POST /v2/treeguard/swap "
                f'{{"version": "{slot.version}"}}',
            )

    def _check_room(self, version: str, nbytes: int) -> None:
        held = sum(s.nbytes for s in (self.active, self.previous) if s is not None)
        if self.memory_budget is not None:
            room, where = self.memory_budget - held, f"the memory budget of {self.memory_budget}"
        else:
            stats = jax.devices()[0].memory_stats() or {}
            if "bytes_limit" not in stats:
                return
            room = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
            where = "the device's free memory"
        if nbytes > room:
            raise ServingError(
                f"version {version} needs {nbytes} bytes of params, and {where} leaves "
                f"{max(room, 0)} with {held} held by the active and previous versions",
                hint="roll back or restart with one version, or raise the memory budget",
                status=507,
            )

    def _references(self) -> Any:
        if not self._refs_loaded:
            self._refs_loaded = True
            if self.model.references is not None:
                from ..verify.refs import load_references

                try:
                    self._refs = load_references(self.model.references)
                except (OSError, FormatError, IntegrityError) as e:
                    log.warning("reference batches unreadable, regression check skipped: %s", e)
        return self._refs

    def _reference_batches(self) -> list[tuple[str, list[np.ndarray[Any, Any]]]]:
        refs = self._references()
        if refs is None:
            return []
        out = []
        paths = self.spec.input_paths
        for case in refs.cases:
            if case.name not in refs.expected:
                continue
            found = {keystr_of(p): np.asarray(x) for p, x in jax.tree.leaves_with_path(case.batch)}
            if all(p in found for p in paths):
                out.append((case.name, [found[p] for p in paths]))
        return out

    def fast_checks(self, slot: Slot) -> list[str]:
        """The in-process checks a version passes before taking traffic.

        Returns:
          The names of the checks run, in order.

        Raises:
          ServingError: naming the check that failed and why.
        """
        # both run as the version is loaded; the contract only where the model has one
        ran = (["contract"] if self._params_spec() is not None else []) + ["finite"]
        batches = self._reference_batches()
        for name, leaves in batches:
            rows = int(leaves[0].shape[0])
            if rows > self.spec.largest:
                continue
            outs, _ = self.runner.run(slot, leaves, rows, phase="swap")
            for path, out in outs:
                if not host_all_finite(out):
                    raise ServingError(
                        f"version {slot.version} fails the regression check: output {path} on "
                        f"the stored case {name!r} is not finite",
                        hint="it must not be served",
                    )
        if batches:
            ran.append("regression")
        return ran

    # -- lifecycle -------------------------------------------------------------

    def _record_event(self, action: str, version: str, **detail: Any) -> None:
        """Appends to the store's log, or raises ``ServingError`` (507) saying why not."""
        try:
            self.store.log_event(action, version, **detail)
        except (TreeguardError, OSError) as e:
            raise ServingError(
                f"the store cannot record the {action.removeprefix('serve_')} to {version}: "
                f"{str(e).splitlines()[0]}; nothing was changed",
                hint="serve from a store this process may write, or swap by promoting "
                "and restarting",
                status=507,
            ) from e

    def _candidates(self, first: str | None) -> list[str]:
        """``first``, then every other verified version, newest first."""
        verified = [
            i for i in self.store.versions() if i.status == "verified" and i.version != first
        ]
        verified.sort(key=lambda i: (i.created, i.version), reverse=True)
        return ([first] if first else []) + [i.version for i in verified]

    def start(self, version: str | None = None) -> Slot:
        """Loads, checks and warms ``version`` (default: the store's current).

        A quarantined version is skipped, and one that fails to load, warm
        or pass the fast checks falls back to the newest verified version
        that passes; the fallback is recorded in the store as an automatic
        rollback (``trigger="warmup"``) and kept in ``fallback``.

        Raises:
          ServingError: 503 when no version passes, naming each and why.
        """
        current = version or self.store.current()
        # a quarantine whose signature fails (in a store with a key) is none:
        # its load refuses the version, naming the signature as the reason
        versions = self.store.versions()
        self.quarantined = quarantined_in(versions) - self.store.forged_verdicts(versions).keys()
        reasons: dict[str, str] = {}
        for candidate in self._candidates(current):
            if candidate in self.quarantined:
                reasons[candidate] = "quarantined by the watchdog"
                continue
            try:
                slot = self._load(candidate, contract=self._params_spec())
                self.runner.warm(slot, phase="warmup")
                self.fast_checks(slot)
            except Exception as e:  # noqa: BLE001 - any failure of a version is its reason
                text = reason_of(e)
                reasons[candidate] = text
                log.warning("version %s cannot be served: %s", candidate, text)
                continue
            with self._switch_lock:
                self.active = slot
            self._now_serving(slot)
            if candidate != current:
                self.fallback = {"from": current, "to": candidate, "reasons": dict(reasons)}
                self.metrics.rollbacks.labels(model=self.metrics.model, trigger="warmup").inc()
                try:
                    self.store.log_event(
                        "serve_rollback", candidate, previous=current, trigger="warmup"
                    )
                except (TreeguardError, OSError) as e:
                    log.warning("the fallback could not be recorded in the store: %s", e)
                log.warning(
                    "fell back from %s to %s: %s", current, candidate, reasons.get(current or "")
                )
            self.ready = True
            log.info(
                "serving version %s after warm-up of %d buckets", candidate, len(self.spec.buckets)
            )
            return slot
        if not reasons:
            raise ServingError(
                f"the store {self.store.root} has no current version",
                hint="put, verify and promote one first",
                status=503,
            )
        raise ServingError(
            "no version can be served: " + "; ".join(f"{v}: {why}" for v, why in reasons.items()),
            hint="verify and promote a version that passes the model's checks",
            status=503,
        )

    def prepare(self, version: str) -> tuple[Slot, list[str]]:
        """Loads, checks and (for a new spec) warms ``version`` without serving it.

        Returns:
          The loaded slot, for ``swap(version, prepared=slot)``, and the
          names of the checks it passed.

        Raises:
          ServingError: as ``swap`` does for a version that cannot be served.
        """
        active = self.active
        slot = self._load(version, contract=self._params_spec())
        if active is not None and slot.spec != active.spec:
            self.runner.warm(slot, phase="swap")
        return slot, self.fast_checks(slot)

    def swap(self, version: str, *, prepared: Slot | None = None) -> dict[str, Any]:
        """Loads, checks and (for a new spec) warms ``version``, records the
        swap in the store, then serves it.

        Args:
          version: the version to serve.
          prepared: the slot ``prepare(version)`` returned, served without
            loading it again once the store still passes it with the same
            digest.

        Returns:
          ``{"active", "previous", "compiles", "checks"}``.

        Raises:
          ServingError: if the version is unknown (404), not verified,
            rejected or changed since it was verified (409), fails a fast
            check (409), there is no room for it (507), the store cannot
            record the swap (507, nothing changed), or another swap is
            running (409).
        """
        if not self._swap_lock.acquire(blocking=False):
            self.metrics.swaps.labels(model=self.metrics.model, result="refused").inc()
            raise ServingError("another swap is in progress", hint="retry when it ends")
        try:
            active = self.active
            if active is not None and active.version == version:
                return self._swap_result([], 0)
            before = self.runner.guard.total
            prev = self.previous
            try:
                if prev is not None and prev.version == version:
                    self._still_servable(prev)
                    slot, checks = prev, ["reused"]
                elif prepared is not None and prepared.version == version:
                    self._still_servable(prepared)
                    slot, checks = prepared, ["prepared"]
                else:
                    slot, checks = self.prepare(version)
                self._record_event("serve_swap", version, previous=active and active.version)
            except ServingError:
                self.metrics.swaps.labels(model=self.metrics.model, result="refused").inc()
                raise
            self._switch(slot)
            self.quarantined.discard(version)
            self.metrics.swaps.labels(model=self.metrics.model, result="ok").inc()
            return self._swap_result(checks, self.runner.guard.total - before)
        finally:
            self._swap_lock.release()

    def _swap_result(self, checks: list[str], compiles: int) -> dict[str, Any]:
        return {
            "active": self.active and self.active.version,
            "previous": self.previous and self.previous.version,
            "compiles": compiles,
            "checks": checks,
        }

    def _now_serving(self, slot: Slot) -> None:
        """The version's metric, and its provenance kept and logged: who signed its verdict."""
        self.metrics.set_version(slot.version)
        self.trail = version_trail(self.store, slot.version)
        log.info("version %s is served; %s", slot.version, trail_text(self.trail))

    def _switch(self, slot: Slot) -> None:
        with self._switch_lock:
            self.previous, self.active = self.active, slot
            self._on_switch()
        self._now_serving(slot)

    def rollback(self, trigger: str = "manual") -> dict[str, Any]:
        """Serves the previous version again (instant: it is loaded and warm).

        A manual rollback is recorded in the store first (if it cannot be,
        nothing changes); an automatic one also quarantines the version it
        leaves (``quarantine``: a rejected verdict, signed where the store
        has a key), before it switches, so a restart never serves it again.
        It happens even when the store cannot record it (a warning says so).

        Raises:
          ServingError: if there is no previous version, or the store no
            longer lets it be served, or (manual only) cannot record it.
        """
        with self._swap_lock:
            prev, bad = self.previous, self.active
            if prev is None or bad is None:
                raise ServingError(
                    "no previous version to roll back to", hint="swap to a verified version"
                )
            self._still_servable(prev)
            try:
                self._record_event(
                    "serve_rollback", prev.version, previous=bad.version, trigger=trigger
                )
                if trigger != "manual":
                    self._record_event("serve_quarantine", bad.version, trigger=trigger)
            except ServingError as e:
                if trigger == "manual":
                    raise
                log.warning("%s", str(e).splitlines()[0])
            if trigger != "manual":
                # the verdict before the switch: a crash in between never serves it again
                self.quarantine(bad.version, trigger)
            with self._switch_lock:
                self.active, self.previous = prev, bad
                self._on_switch()
                if trigger != "manual":
                    self.quarantined.add(bad.version)
        self._now_serving(prev)
        self.metrics.rollbacks.labels(model=self.metrics.model, trigger=trigger).inc()
        log.warning("rolled back from %s to %s (trigger %s)", bad.version, prev.version, trigger)
        return self._swap_result([], 0)

    def quarantine(self, version: str, trigger: str) -> bool:
        """Records ``version`` as quarantined in the store: a rejected verdict
        whose failed check is ``QUARANTINE`` (signed where the store has a
        key). It reads and hashes the version, so it runs off the event loop.

        Returns:
          Whether the store recorded it (when it cannot, a warning says why,
          and the quarantine holds in this process only).
        """

        def quarantined(_tree: Any) -> bool:
            raise ServingError(f"the watchdog quarantined it (trigger {trigger})")

        try:
            info = self.store.verify(
                version, like=self.params_like(), checks=[(QUARANTINE, quarantined)]
            )
        except (TreeguardError, OSError) as e:
            log.warning(
                "the quarantine of %s could not be recorded in the store: %s", version, reason_of(e)
            )
            return False
        return bool(info.status == "rejected")

    def auto_rollback(self, trigger: str) -> bool:
        """Rolls back for ``trigger`` unless there is nothing safe to return to."""
        prev = self.previous
        if prev is None or prev.version in self.quarantined:
            return False
        try:
            self.rollback(trigger)
        except ServingError as e:
            log.warning("automatic rollback (%s) refused: %s", trigger, str(e).splitlines()[0])
            return False
        return True

    def status(self) -> dict[str, Any]:
        """What ``/v2/treeguard/status`` shows."""
        return {
            "ready": self.ready,
            "active": self.active and self.active.version,
            "previous": self.previous and self.previous.version,
            "quarantined": sorted(self.quarantined),
            "fallback": self.fallback,
            "buckets": list(self.spec.buckets),
            "compile_policy": self.spec.compile_policy.value,
            "compiles": dict(self.runner.guard.counts),
        }


def reason_of(error: BaseException, *, limit: int = 2000) -> str:
    r"""An error as one line for a log or a refusal: its lines but the hint
    joined by ``; ``, control characters spelled out, at most ``limit``
    characters.

    Example:
      >>> reason_of(ValueError("2 mismatches:\n  ['a']: shape\nhint: fix it"))
      "2 mismatches:; ['a']: shape"
      >>> print(reason_of(RuntimeError("\x1b[31mred")))
      \x1b[31mred
    """
    lines = [ln.strip() for ln in str(error).splitlines() if not ln.startswith("hint: ")]
    text = "; ".join(ln for ln in lines if ln) or type(error).__name__
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def quarantined_in(versions: Sequence[Any]) -> set[str]:
    """The versions whose verdict is a quarantine: rejected by the check ``QUARANTINE``.

    Example:
      >>> from treeguard._src.store.records import CheckRecord
      >>> class Info:
      ...     version, status = "v000002", "rejected"
      ...     checks = [CheckRecord("integrity", True), CheckRecord(QUARANTINE, False)]
      >>> quarantined_in([Info()])
      {'v000002'}
    """
    return {
        info.version
        for info in versions
        if info.status == "rejected" and any(c.name == QUARANTINE and not c.ok for c in info.checks)
    }


def _check_finite(version: str, tree: Any) -> None:
    """The load gate: a version whose params hold NaN or Inf, of any float
    kind (bfloat16 and float8 included), is refused, naming each leaf and its dtype.

    Raises:
      NonFiniteVersionError: naming the finite check, each leaf and its dtype.
    """
    counts = find_nonfinite(tree)
    if counts:
        leaves = {keystr_of(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}
        dtypes = {p: short_dtype(np.dtype(leaves[p].dtype)) for p in counts if p in leaves}
        where = f"the params of version {version}"
        raise NonFiniteVersionError(
            version, counts, dtypes, describe_nonfinite(tree, where=where) or ""
        )
