"""The checkpoint protocol's messages, and its coordinator (docs/design/state.md).

The coordinator — the Spark sink's driver-side ``commit(batchId)``, or a worker's timer
for topologies fed by plain clients — talks to every worker with
:meth:`~spark_storm.messaging.IClient.request`:

==========  =================================================  ===============================
op          asks                                               answer (msgpack map)
==========  =================================================  ===============================
STATUS      the worker's view                                  stateful, epoch, committed,
                                                               generation, dirty, reasons,
                                                               replaying, last_group_age_s
PAUSE       stop, drop what is in flight, take generation g    ok
RESUME      restore epoch C, replay the input logs after it    ok
PREPARE     barrier E at every source task; answer once every  epoch, dirty, generation
            local stateful task wrote E
COMMIT      E is committed (with {query id: batch id})         ok
SAVEPOINT   copy the committed state of every local stateful   epoch, tasks (component, index,
            task into ``dir`` (E expected); hold the lease     count, state_version, files),
                                                               batches, kept, uncommitted
RELEASE     the savepoint is written: the lease is free         ok
==========  =================================================  ===============================

Every request is idempotent (a round can be retried from the top), and a round is
``STATUS`` -> (``PAUSE``, ``RESUME`` when a worker is dirty) -> ``PREPARE`` -> ``COMMIT``.
Each carries its coordinator's name: a worker lets one coordinator at a time change
anything (a lease of ``topology.state.coordinator.lease.ms`` from its last request) and
answers the others BUSY, so a Spark driver's commits and a worker's interval checkpoints
never interleave their rounds.
It lives here, below ``worker/``, so the Spark driver runs it without the worker runtime.
"""

from __future__ import annotations

import logging
import random
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from spark_storm.codec.serializer import pack_value, unpack_value
from spark_storm.errors import CheckpointError, CoordinatorBusyError, StormError, TransportError, WireFormatError
from spark_storm.messaging.api import REQUEST_BUSY, REQUEST_OK, REQUEST_UNHANDLED
from spark_storm.state.savepoint import ComponentManifest, Manifest, merge_answers, new_savepoint_dir, write_manifest

__all__ = [
    "COMMIT",
    "INTERVAL_PRIORITY",
    "PAUSE",
    "PREPARE",
    "RELEASE",
    "RESUME",
    "SAVEPOINT",
    "SAVEPOINT_PRIORITY",
    "STATUS",
    "Coordinator",
    "CoordinatorBusyError",
    "Endpoint",
    "RoundResult",
    "WorkerStatus",
    "decode_body",
    "encode_body",
]

logger = logging.getLogger(__name__)

STATUS: Final = 1
PAUSE: Final = 2
RESUME: Final = 3
PREPARE: Final = 4
COMMIT: Final = 5
SAVEPOINT: Final = 6
RELEASE: Final = 7
OP_NAMES: Final = {
    STATUS: "STATUS",
    PAUSE: "PAUSE",
    RESUME: "RESUME",
    PREPARE: "PREPARE",
    COMMIT: "COMMIT",
    SAVEPOINT: "SAVEPOINT",
    RELEASE: "RELEASE",
}
#: A savepoint's coordinator outranks a Spark driver's (1) and the interval rounds (0): a driver's
#: commit waits (BUSY) while the workers copy their state, and goes on after the RELEASE.
SAVEPOINT_PRIORITY: Final = 2
#: The interval rounds' rank: a worker answers their every request BUSY while a higher-ranked
#: coordinator was heard within the lease, or while it holds a Spark batch not yet committed.
INTERVAL_PRIORITY: Final = 0


def _manifest(
    root: Path, ident: str, topology: str, version: str, epoch: int, answers: Mapping[str, Mapping[str, Any]]
) -> Manifest:
    """Return the manifest of the workers' SAVEPOINT answers (CheckpointError if a stateful task is missing)."""
    components: dict[str, ComponentManifest] = {}
    seen: dict[str, set[int]] = {}
    files: dict[str, tuple[int, int]] = {}
    for worker, answer in answers.items():
        for task in answer.get("tasks", []):
            component = str(task["component"])
            meta = ComponentManifest(int(task["count"]), int(task["state_version"]), bool(task["windowed"]))
            if components.setdefault(component, meta) != meta:
                msg = f"worker {worker} describes component {component!r} as {meta}, another as {components[component]}"
                raise CheckpointError(msg)
            seen.setdefault(component, set()).add(int(task["index"]))
            files.update({str(p): (int(v[0]), int(v[1])) for p, v in dict(task["files"]).items()})
    for component, meta in components.items():
        missing = sorted(set(range(meta.tasks)) - seen[component])
        if missing:
            msg = f"no worker saved task(s) {missing} of component {component!r} (a worker is missing from the plan)"
            raise CheckpointError(msg)
    batches, kept = merge_answers(answers.values())
    return Manifest(ident, topology, version, epoch, time.time(), batches, kept, components, files)


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Encode a request or answer body."""
    return pack_value(dict(body))


def decode_body(data: bytes, what: str) -> dict[str, Any]:
    """Decode a request or answer body (a msgpack map); CheckpointError naming ``what`` otherwise."""
    try:
        body = unpack_value(data) if data else {}
    except WireFormatError as exc:
        msg = f"{what}: unreadable body ({exc})"
        raise CheckpointError(msg) from exc
    if not isinstance(body, dict):
        msg = f"{what}: the body is a {type(body).__name__}, not a map"
        raise CheckpointError(msg)
    return body


class Endpoint(Protocol):
    """One worker as the coordinator reaches it: an ``IClient`` does, and so does a worker for itself."""

    def request(self, op: int, body: bytes, timeout: float) -> tuple[int, bytes]:
        """Send ``op`` with ``body``; return the worker's (status, body)."""
        ...


@dataclass(frozen=True)
class WorkerStatus:
    """What a worker says in answer to STATUS."""

    worker: str
    stateful: bool
    epoch: int
    committed: int
    generation: int
    dirty: bool
    reasons: list[str]
    last_group_age_s: float | None
    lease_holder: str | None = None
    lease_age_s: float | None = None
    priority_age_s: float | None = None  # since a priority coordinator (a Spark driver) was last heard
    open_batch_idle_s: float | None = None  # a coordinated (Spark) batch is open: since a group of it came
    prepared: int = 0  # the last epoch it answered PREPARE ready for, in its generation (0: none)

    @classmethod
    def of(cls, worker: str, body: Mapping[str, Any]) -> WorkerStatus:
        """Read a STATUS answer."""
        try:
            age = body.get("last_group_age_s")
            lease_age = body.get("lease_age_s")
            return cls(
                worker=worker,
                stateful=bool(body["stateful"]),
                epoch=int(body["epoch"]),
                committed=int(body["committed"]),
                generation=int(body["generation"]),
                dirty=bool(body["dirty"]),
                reasons=[str(r) for r in body.get("reasons", [])],
                last_group_age_s=None if age is None else float(age),
                lease_holder=None if body.get("lease_holder") is None else str(body["lease_holder"]),
                lease_age_s=None if lease_age is None else float(lease_age),
                priority_age_s=None if body.get("priority_age_s") is None else float(body["priority_age_s"]),
                open_batch_idle_s=None if body.get("open_batch_idle_s") is None else float(body["open_batch_idle_s"]),
                prepared=int(body.get("prepared", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"worker {worker}: a STATUS answer lacks or mangles {exc}"
            raise CheckpointError(msg) from exc


@dataclass(frozen=True)
class RoundResult:
    """What one checkpoint round did."""

    epoch: int
    rolled_back_to: int | None
    attempts: int
    duration_s: float
    stateful: bool


class Coordinator:
    """Runs checkpoint rounds over a set of workers (any thread; one round at a time).

    Parameters
    ----------
    identity : str
        This coordinator's name, in every request (the workers' lease).
    priority : int
        A worker hands its lease to a coordinator of higher priority at once (a Spark
        driver's commits, 1, take over from interval checkpoints, 0).
    endpoints : callable
        Returns the current workers by name (``host:port``) -> :class:`Endpoint`; asked
        again for every attempt, so a restarted worker's new connection is used.
    timeout_s : float
        How long one PREPARE waits for every worker (``topology.state.commit.timeout.ms``).
    retries : int
        Rounds to try before giving up (``topology.state.commit.retries``).
    request_timeout_s : float
        How long a quick request (STATUS, PAUSE, RESUME, COMMIT) may take.
    stand_aside : callable, optional
        ``stand_aside(statuses)`` -> why this coordinator must not go on, or None; asked at
        every attempt, on the STATUS it starts with, so a retry looks again before it PAUSEs
        anyone (the interval rounds: a Spark driver heard, or its batch open).
    """

    def __init__(
        self,
        identity: str,
        endpoints: Callable[[], Mapping[str, Endpoint]],
        timeout_s: float,
        retries: int,
        request_timeout_s: float = 10.0,
        priority: int = 1,
        stand_aside: Callable[[Mapping[str, WorkerStatus]], str | None] | None = None,
    ) -> None:
        self.identity = identity
        self.priority = priority
        self._stand_aside = stand_aside
        self._endpoints = endpoints
        self._timeout_s = timeout_s
        self._retries = max(1, retries)
        self._request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self.rounds = 0
        self.rollbacks = 0
        self.rolled_forward = 0

    # --- one request to every worker, in parallel ---------------------------------------------
    def _all(
        self,
        op: int,
        body: Mapping[str, Any],
        timeout: float,
        only: set[str] | None = None,
        enough: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, dict[str, Any]]:
        endpoints = {w: e for w, e in self._endpoints().items() if only is None or w in only}
        if not endpoints:
            msg = "no workers to checkpoint (the plan names none)"
            raise CheckpointError(msg)
        data = encode_body({**body, "coordinator": self.identity, "priority": self.priority})
        name = OP_NAMES.get(op, str(op))

        def ask(item: tuple[str, Endpoint]) -> tuple[str, dict[str, Any]]:
            worker, endpoint = item
            status, answer = endpoint.request(op, data, timeout)
            if status == REQUEST_UNHANDLED:
                msg = f"worker {worker} does not answer {name} ({answer.decode(errors='replace')})"
                raise CheckpointError(msg)
            if status == REQUEST_BUSY:
                msg = f"worker {worker}: {answer.decode(errors='replace')}"
                raise CoordinatorBusyError(msg)
            if status != REQUEST_OK:
                msg = f"worker {worker} failed {name}: {answer.decode(errors='replace')}"
                raise CheckpointError(msg)
            return worker, decode_body(answer, f"worker {worker}'s answer to {name}")

        # The first failure ends the round at once: a PREPARE elsewhere would wait for barriers
        # a dead worker never sends (it ends on its own when the next round's PAUSE comes).  So
        # does the first answer ``enough`` accepts (a PREPARE answered dirty: the epoch is
        # spoiled whatever the others say, and their barriers may never come), with the
        # answers so far.
        pool = ThreadPoolExecutor(max_workers=min(16, len(endpoints)), thread_name_prefix="checkpoint")
        try:
            futures = [pool.submit(ask, item) for item in endpoints.items()]
            out: dict[str, dict[str, Any]] = {}
            for future in as_completed(futures):
                worker, answer = future.result()
                out[worker] = answer
                if enough is not None and enough(answer):
                    break
            return out
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def status(self, workers: set[str] | None = None) -> dict[str, WorkerStatus]:
        """STATUS from every worker (or from ``workers``)."""
        answers = self._all(STATUS, {}, self._request_timeout_s, workers)
        return {w: WorkerStatus.of(w, a) for w, a in answers.items()}

    # --- a round -------------------------------------------------------------------------------
    def checkpoint(self, batches: Mapping[str, int] | None = None, *, skip_if_stateless: bool = True) -> RoundResult:
        """Make every stateful task's state durable at a new epoch, rolling back first if needed.

        ``batches`` ({query id: batch id}) is recorded with the epoch: groups of those batches
        (or older ones of those queries) are replays from then on.

        A worker that cannot be reached (restarting, say) is waited for until ``timeout_s``;
        a round that reached the workers and failed (a task could not write, the epoch was
        spoiled by a failure while it was prepared) counts against ``retries``.

        Raises
        ------
        CoordinatorBusyError
            This coordinator ranks :data:`INTERVAL_PRIORITY` and a worker answered BUSY, or
            ``stand_aside`` gave a reason, at any attempt: the round stands aside at once.
        CheckpointError
            No round succeeded: ``retries`` rounds failed, or a worker stayed unreachable
            for ``timeout_s`` (the reason of the last attempt).
        """
        with self._lock:
            return self._checkpoint(batches, skip_if_stateless)

    def _checkpoint(self, batches: Mapping[str, int] | None, skip_if_stateless: bool) -> RoundResult:
        started = time.monotonic()
        deadline = started + self._timeout_s
        last_error: Exception | None = None
        rolled: int | None = None
        failed_rounds = 0
        attempt = 0
        while True:
            attempt += 1
            try:
                statuses = self.status()
                if skip_if_stateless and not any(s.stateful for s in statuses.values()):
                    return RoundResult(0, None, attempt, time.monotonic() - started, False)
                reason = None if self._stand_aside is None else self._stand_aside(statuses)
                if reason is not None:
                    raise CoordinatorBusyError(reason)
                committed = max(s.committed for s in statuses.values())
                generation = max(s.generation for s in statuses.values())
                committed = self._roll_forward(statuses, committed, generation)
                dirty = [f"{s.worker}: {', '.join(s.reasons) or 'dirty'}" for s in statuses.values() if s.dirty]
                # A barrier that went out without its commit (an earlier attempt failed half-way)
                # left tasks past the committed epoch: they roll back too.
                dirty += [
                    f"{s.worker}: epoch {s.epoch} prepared, not committed"
                    for s in statuses.values()
                    if s.epoch > committed and not s.dirty
                ]
                # A worker behind the others' generation (it started, or was assigned tasks,
                # after their last rollback) had what it emitted since dropped on arrival, and
                # would refuse the PREPARE: everyone rolls back together.
                dirty += [
                    f"{s.worker}: generation {s.generation}, the others are at {generation}"
                    for s in statuses.values()
                    if s.generation < generation and not s.dirty and s.epoch <= committed
                ]
                if dirty:
                    rolled = committed
                    self.rollback(committed, generation + 1, dirty)
                    generation += 1
                epoch = committed + 1
                prepared = self.prepare(epoch, generation)
                spoiled = [w for w, a in prepared.items() if a.get("dirty")]
                if spoiled:
                    msg = f"epoch {epoch} was spoiled while it was prepared (dirty: {', '.join(sorted(spoiled))})"
                    raise CheckpointError(msg)
                self._all(COMMIT, {"epoch": epoch, "batches": dict(batches or {})}, self._request_timeout_s)
                self.rounds += 1
                duration = time.monotonic() - started
                logger.info(
                    "checkpoint: epoch %d committed in %.3fs (attempt %d%s)",
                    epoch,
                    duration,
                    attempt,
                    f", after a rollback to {rolled}" if rolled is not None else "",
                )
                return RoundResult(epoch, rolled, attempt, duration, True)
            except (TransportError, OSError, CoordinatorBusyError) as exc:  # a worker away, or busy: wait
                last_error = exc
                if isinstance(exc, CoordinatorBusyError) and self.priority == INTERVAL_PRIORITY:
                    msg = f"standing aside: {exc}"  # a Spark driver (or a savepoint) runs the rounds
                    raise CoordinatorBusyError(msg) from exc
                if time.monotonic() > deadline:
                    msg = f"no checkpoint within {self._timeout_s:.0f}s: a worker stayed unreachable: {exc}"
                    raise CheckpointError(msg) from exc
                logger.info("checkpoint attempt %d: a worker is unreachable (%s); retrying", attempt, exc)
                time.sleep(min(1.0, 0.05 * attempt) * (1 + random.random()))
            except StormError as exc:
                last_error = exc
                failed_rounds += 1
                logger.warning("checkpoint round failed (%d of %d allowed): %s", failed_rounds, self._retries, exc)
                if failed_rounds >= self._retries or time.monotonic() > deadline:
                    msg = f"no checkpoint after {failed_rounds} failed rounds: {last_error}"
                    raise CheckpointError(msg) from exc
                time.sleep(min(2.0, 0.1 * failed_rounds) * (1 + random.random()))

    def _roll_forward(self, statuses: Mapping[str, WorkerStatus], committed: int, generation: int) -> int:
        """COMMIT an epoch every worker prepared, instead of rolling back below it; return the committed epoch.

        Two-phase commit's rule: once every participant is prepared, the epoch may have been
        committed somewhere (an earlier attempt's or another coordinator's COMMIT still in
        flight, landing after this round read STATUS), so it is committed, never discarded.
        Rolling it back would drop its entries on the workers whose COMMIT had not landed
        while another worker committed it: that task could then never restore the epoch
        (bench.chaos seed 1000 #71).  The COMMIT carries no batches: groups of a Spark batch
        the epoch took in are kept, and recognised when the batch comes again.
        """
        top = max(s.epoch for s in statuses.values())
        ready = all(
            not s.dirty and s.generation == generation and s.prepared == top and s.committed >= top - 1
            for s in statuses.values()
        )
        if top <= committed or not ready:
            return committed
        logger.warning(
            "checkpoint: epoch %d was prepared by every worker and committed by %s: committing it (no rollback)",
            top,
            ", ".join(sorted(w for w, s in statuses.items() if s.committed >= top)) or "none yet",
        )
        self._all(COMMIT, {"epoch": top, "batches": {}}, self._request_timeout_s)
        self.rolled_forward += 1
        return top

    # --- a savepoint ----------------------------------------------------------------------------------
    def savepoint(
        self,
        parent: str | Path,
        topology: str,
        version: str,
        *,
        commit_first: bool,
        hold: bool = False,
        attempts: int = 3,
    ) -> tuple[Path, Manifest]:
        """Write a savepoint of every stateful task at one committed epoch under ``parent``; return it.

        ``commit_first`` runs a round before (``kill --savepoint``: what the workers accepted is
        committed, so the savepoint leaves nothing behind) and again while a worker still holds
        input after the epoch.  Without it the savepoint is of the last committed epoch (a
        round first only if a worker is dirty or behind).  Every request carries
        :data:`SAVEPOINT_PRIORITY`: no other coordinator commits while the workers copy; the
        RELEASE at the end lets them go on; ``hold`` skips it (``kill --savepoint``: no commit
        may come between the savepoint and the kill, so the workers stay leased until they stop).

        Raises
        ------
        CheckpointError
            The workers did not agree on one committed epoch after ``attempts`` tries, a worker
            could not copy its state, or the topology has no state (the reason names which).
        """
        with self._lock:
            try:
                taken = self._savepoint(Path(parent), topology, version, commit_first, max(1, attempts))
            except BaseException:
                self._release()
                raise
            if not hold:
                self._release()
            return taken

    def _release(self) -> None:
        try:
            self._all(RELEASE, {}, self._request_timeout_s)
        except (StormError, OSError) as exc:  # the lease ends on its own
            logger.warning("savepoint: a worker did not take the RELEASE (%s); its lease runs out", exc)

    def _savepoint(
        self, parent: Path, topology: str, version: str, commit_first: bool, attempts: int
    ) -> tuple[Path, Manifest]:
        reason = ""
        for attempt in range(1, attempts + 1):
            statuses = self.status()
            if not any(s.stateful for s in statuses.values()):
                msg = f"topology {topology!r} has no stateful component: there is nothing to save"
                raise CheckpointError(msg)
            committed = max(s.committed for s in statuses.values())
            behind = [s.worker for s in statuses.values() if s.dirty or s.epoch > committed]
            if commit_first or behind or reason:
                committed = self._checkpoint({}, True).epoch
            root, ident = new_savepoint_dir(parent, topology, committed)
            try:
                root.mkdir(parents=True)
            except OSError as exc:
                msg = f"cannot create the savepoint directory {root}: {exc}; give a directory every worker writes to"
                raise CheckpointError(msg) from exc
            answers = self._all(SAVEPOINT, {"dir": str(root), "epoch": committed}, self._timeout_s)
            epochs = {w: int(a["epoch"]) for w, a in answers.items() if a.get("stateful", True)}
            left = {w: int(a.get("uncommitted", 0)) for w, a in answers.items() if a.get("uncommitted")}
            dirty = {w: "; ".join(map(str, a["dirty"])) for w, a in answers.items() if a.get("dirty")}
            if dirty:  # another coordinator's rollback paused it after this one's round: a round first
                reason = f"a worker is dirty ({dirty}): rolled back first"
            elif set(epochs.values()) - {committed}:
                reason = f"the workers' committed epochs differ ({epochs}); another commit came between"
            elif commit_first and left:
                reason = f"input came after epoch {committed} ({left} records): it is committed first"
            else:
                manifest = _manifest(root, ident, topology, version, committed, answers)
                write_manifest(root, manifest)
                logger.info("savepoint of %s at epoch %d written to %s", topology, committed, root)
                return root, manifest
            shutil.rmtree(root, ignore_errors=True)
            logger.info("savepoint attempt %d: %s; trying again", attempt, reason)
        msg = f"no savepoint of {topology!r} after {attempts} attempts: {reason}"
        raise CheckpointError(msg)

    # --- a round's steps (a round runs them; an operator or a test may too) ----------------------------
    def pause(self, generation: int) -> None:
        """PAUSE every worker at ``generation``: executors idle, in-flight work dropped (no RESUME yet)."""
        self._all(PAUSE, {"generation": generation}, self._request_timeout_s)

    def resume(self, epoch: int, generation: int, workers: set[str] | None = None) -> None:
        """RESUME every worker (or ``workers``) paused at ``generation`` from committed epoch ``epoch``.

        Their input logs replay.  The RESUMEs go out together, but a worker may run (and send
        its replay's output to a peer) well before that peer's RESUME arrives.
        """
        self._all(RESUME, {"epoch": epoch, "generation": generation}, self._request_timeout_s, workers)

    def prepare(self, epoch: int, generation: int) -> dict[str, dict[str, Any]]:
        """PREPARE ``epoch`` on every worker (a round's first phase alone); return their answers.

        The first answer ``dirty`` ends the phase with the answers so far: the epoch is spoiled,
        and a worker still waiting for the epoch's barrier (which a dirty worker's tasks may never
        send) is not waited for; its PREPARE ends when the next round's PAUSE comes.
        """
        body = {"epoch": epoch, "generation": generation}
        return self._all(PREPARE, body, self._timeout_s, enough=lambda answer: bool(answer.get("dirty")))

    def commit(self, epoch: int, batches: Mapping[str, int], workers: set[str] | None = None) -> None:
        """COMMIT ``epoch`` on every worker, or on ``workers`` only (a COMMIT that reached some of them)."""
        self._all(COMMIT, {"epoch": epoch, "batches": dict(batches)}, self._request_timeout_s, workers)

    def rollback(self, committed: int, generation: int, reasons: list[str]) -> None:
        """Roll every worker back to ``committed`` as ``generation``: PAUSE everywhere, then RESUME."""
        logger.warning(
            "checkpoint: rolling every worker back to epoch %d (generation %d): %s",
            committed,
            generation,
            "; ".join(reasons),
        )
        self.rollbacks += 1
        self.pause(generation)
        self.resume(committed, generation)
