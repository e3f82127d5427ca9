"""The turn pipeline: requesting a turn, and writing it on a worker.

`turn_request` runs in the web process: it validates, checks the version,
dedupes on the idempotency key, creates a `TurnJob` and enqueues it after
commit. `turn_run` runs on a Celery worker: it claims the job with a
conditional update, holds the adventure's lock, composes the prompt
(compacting first when the budget says so), calls the model, validates the
plan, proves the next turn still fits, and commits node, state, head move,
any pending checkpoint and the job's completion in one transaction. Anything
that goes wrong before that transaction leaves no node, no checkpoint and an
unmoved head.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import timedelta

import redis
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from checkpoints import context as ctx
from checkpoints.budget import ContextError

from . import throttle, tree
from .llm.base import client_for, effective_limits
from .llm.errors import ModelCancelled, ModelError, ModelMalformed
from .llm.tools import REQUEST_CHECK, SUBMIT_TURN_PLAN
from .locks import HeldLock, LockBusy, LockLost, adventure_lock, holder, lock_ttl, redis_client
from .models import Adventure, Node, TurnJob
from .state import InvalidDelta, apply_delta, validate_delta

log = logging.getLogger(__name__)

PLAY_KINDS = {"do", "say", "story", "continue"}
TARGETED_KINDS = {"regenerate", "edit"}
ALL_KINDS = PLAY_KINDS | {"retry"} | TARGETED_KINDS
UNFINISHED = [TurnJob.Status.QUEUED, TurnJob.Status.RUNNING]

# Difficulty classes for the hidden d20 check.
DIFFICULTY_DC = {"easy": 8, "moderate": 12, "hard": 16, "extreme": 19}


class TurnRefused(Exception):
    """A turn request refused before anything was written."""

    status = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class TurnConflict(TurnRefused):
    status = 409
    code = "conflict"


class QueueUnavailable(TurnRefused):
    status = 503
    code = "queue_unavailable"


class TurnFailed(Exception):
    """The worker gave up on a job; nothing was written."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class JobCancelled(Exception):
    pass


STALE_MESSAGE = "This story moved on in another tab. Reload to see where it stands, then try again."


# --- Requesting a turn (web process) -------------------------------------------------------


def turn_request(
    *,
    adventure: Adventure,
    kind: str,
    text: str = "",
    node: Node | None = None,
    expected_version: int | None,
    idempotency_key: str | None = None,
) -> tuple[TurnJob, bool]:
    """Create (or find, for a repeated idempotency key) the job for one requested turn.

    Returns (job, created). Raises TurnRefused (400), TurnConflict (409) or QueueUnavailable (503).
    """
    text = (text or "").strip()
    if kind not in ALL_KINDS:
        raise TurnRefused(f"Unknown kind {kind!r}: use one of {', '.join(sorted(ALL_KINDS))}.")
    if len(text) > settings.STORYTREE_MAX_INPUT_CHARS:
        raise TurnRefused(
            f"That is {len(text):,} characters; a turn can be at most {settings.STORYTREE_MAX_INPUT_CHARS:,}.",
            code="too_long",
        )
    if kind in {"do", "say", "story", "edit"} and not text:
        raise TurnRefused("Write what your character does or says first.", code="empty_input")
    if idempotency_key is not None and not (0 < len(idempotency_key) <= 100):
        raise TurnRefused("idempotency_key must be 1 to 100 characters.")
    if expected_version is None:
        raise TurnRefused("expected_version is required: send the version of the story you are looking at.")

    throttle.hit(adventure.owner_id, "turns")
    with transaction.atomic():
        locked = Adventure.objects.select_for_update().get(pk=adventure.pk)
        if idempotency_key:
            existing = TurnJob.objects.filter(adventure=locked, idempotency_key=idempotency_key).first()
            if existing:
                return existing, False
        if locked.version != expected_version:
            raise TurnConflict(STALE_MESSAGE, code="stale_version")
        if TurnJob.objects.filter(adventure=locked, status__in=UNFINISHED).exclude(kind="compact").exists():
            raise TurnConflict(
                "A turn is already being written for this story. Wait for it or cancel it.", code="turn_in_progress"
            )
        target = _target_for(locked, kind, node)
        try:
            job = TurnJob.objects.create(
                adventure=locked,
                kind=kind,
                player_input=text if kind != "retry" else "",
                target_node=target,
                expected_head_id=locked.head_id,
                expected_version=locked.version,
                idempotency_key=idempotency_key or None,
            )
        except IntegrityError:
            # The same key raced in from another request: return that job.
            return TurnJob.objects.get(adventure=locked, idempotency_key=idempotency_key), False
        _mark_queued(job.pk)
    enqueue(job)
    return job, True


def _target_for(adventure: Adventure, kind: str, node: Node | None) -> Node | None:
    head = adventure.head
    if kind == "retry":
        if Node.objects.filter(parent=head, live=True).exists():
            raise TurnConflict(
                "Retry works at the newest turn only; use regenerate for an earlier one.", code="not_tip"
            )
        if head.depth == 0:
            raise TurnRefused("The opening cannot be retried; play a turn first.", code="nothing_to_retry")
        return head
    if kind in TARGETED_KINDS:
        if node is None or node.adventure_id != adventure.pk:
            raise TurnRefused("Say which turn to regenerate or edit (node).", code="missing_node")
        if node.depth == 0:
            raise TurnRefused("The opening cannot be regenerated or edited.", code="opening")
        if kind == "regenerate" and node.kind == Node.Kind.OPENING:
            raise TurnRefused("The opening cannot be regenerated.", code="opening")
        return node
    return None


def enqueue(job: TurnJob) -> None:
    """Send the job to the workers once its row is committed; a broker outage fails the job cleanly."""
    from .tasks import run_turn_job

    def send() -> None:
        try:
            run_turn_job.delay(job.pk)
        except (KombuOperationalError, redis.RedisError, OSError) as exc:
            log.warning("could not enqueue job %s: %s", job.pk, exc)
            _finish(job, TurnJob.Status.FAILED, "queue_unavailable", QUEUE_DOWN_MESSAGE)
            raise QueueUnavailable(QUEUE_DOWN_MESSAGE) from exc

    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(send, robust=False)
    else:
        send()


QUEUE_DOWN_MESSAGE = "The story queue is not answering right now, so nothing was started. Try again in a minute."
QUEUE_LOST_MESSAGE = "The story queue restarted and lost this turn before it started. Nothing was saved; you can retry."


# A queued turn's message lives in Redis; so does this mark, set before the job row is committed
# as queued and removed when a worker claims it. A queued job without its mark was lost with
# Redis's data (a restart without persistence), so polling it can say so instead of waiting forever.
QUEUED_MARK_TTL = 7 * 24 * 3600


def _queued_mark(job_id: int) -> str:
    return f"storytree:job-queued:{job_id}"


def _mark_queued(job_id: int) -> None:
    # Down: the enqueue that follows meets the same outage and fails the job with its message.
    with contextlib.suppress(redis.RedisError):
        redis_client().set(_queued_mark(job_id), 1, ex=QUEUED_MARK_TTL)


def _unmark_queued(job_id: int) -> None:
    with contextlib.suppress(redis.RedisError):  # down: it expires on its own
        redis_client().delete(_queued_mark(job_id))


def job_cancel(job: TurnJob) -> TurnJob:
    """Cancel a queued job at once; ask a running one to stop before it commits."""
    now = timezone.now()
    TurnJob.objects.filter(pk=job.pk, status=TurnJob.Status.QUEUED).update(
        status=TurnJob.Status.CANCELLED, cancel_requested=True, finished_at=now, error_code="cancelled",
        error_message="Cancelled. Nothing was saved.",
    )  # fmt: skip
    TurnJob.objects.filter(pk=job.pk, status=TurnJob.Status.RUNNING).update(cancel_requested=True)
    job.refresh_from_db()
    return job


def job_retry(job: TurnJob) -> TurnJob:
    """Requeue a failed or cancelled job once, if the story has not moved since it was requested."""
    with transaction.atomic():
        job = TurnJob.objects.select_for_update().get(pk=job.pk)
        if job.status not in {TurnJob.Status.FAILED, TurnJob.Status.CANCELLED}:
            raise TurnConflict("Only a failed or cancelled turn can be retried.", code="not_failed")
        adventure = Adventure.objects.select_for_update().get(pk=job.adventure_id)
        if adventure.version != job.expected_version:
            raise TurnConflict(STALE_MESSAGE, code="stale_version")
        if TurnJob.objects.filter(adventure=adventure, status__in=UNFINISHED).exclude(kind="compact").exists():
            raise TurnConflict("A turn is already being written for this story.", code="turn_in_progress")
        _mark_queued(job.pk)
        TurnJob.objects.filter(pk=job.pk).update(
            status=TurnJob.Status.QUEUED, stage=TurnJob.Stage.WAITING, cancel_requested=False, error_code="",
            error_message="", partial_text="", progress_done=0, progress_total=0, finished_at=None,
        )  # fmt: skip
    job.refresh_from_db()
    enqueue(job)
    return job


def job_refresh(job: TurnJob) -> TurnJob:
    """Read a job, noticing a worker that died holding it (its lock expired with no heartbeat),
    and a queued turn that can never start (Redis is down, or came back without it)."""
    if job.status == TurnJob.Status.QUEUED and job.kind != TurnJob.Kind.COMPACT:
        try:
            lost = not redis_client().exists(_queued_mark(job.pk))
        except redis.RedisError:
            code, message = "queue_unavailable", QUEUE_DOWN_MESSAGE
        else:
            code, message = "queue_lost", QUEUE_LOST_MESSAGE
        if code == "queue_unavailable" or lost:
            TurnJob.objects.filter(pk=job.pk, status=TurnJob.Status.QUEUED).update(
                status=TurnJob.Status.FAILED, error_code=code, error_message=message, finished_at=timezone.now(),
                stage=TurnJob.Stage.FINISHED,
            )  # fmt: skip
            job.refresh_from_db()
    if job.status == TurnJob.Status.RUNNING and job.started_at:
        grace = timedelta(seconds=lock_ttl() * 2)
        if timezone.now() - job.started_at > grace:
            try:
                held_by = holder(job.adventure_id)
            except redis.RedisError:
                return job
            if held_by != str(job.pk):
                TurnJob.objects.filter(pk=job.pk, status=TurnJob.Status.RUNNING, attempts=job.attempts).update(
                    status=TurnJob.Status.FAILED, error_code="worker_lost", error_message=WORKER_LOST_MESSAGE,
                    finished_at=timezone.now(), stage=TurnJob.Stage.FINISHED, partial_text="",
                )  # fmt: skip
                job.refresh_from_db()
    return job


WORKER_LOST_MESSAGE = "The storyteller stopped unexpectedly. Nothing was saved; you can retry."


# --- Writing a turn (worker) ---------------------------------------------------------------


def turn_run(job_id: int, *, worker: str = "") -> None:
    """Claim and run one job to its end. Safe to call twice for the same job."""
    job = _claim(job_id, worker)
    if job is None:
        return
    try:
        with adventure_lock(job.adventure_id, owner=str(job.pk)) as lock:
            _generate(job, lock)
    except JobCancelled:
        _finish(job, TurnJob.Status.CANCELLED, "cancelled", "Cancelled. Nothing was saved.")
    except ModelCancelled:
        _finish(job, TurnJob.Status.CANCELLED, "cancelled", "Cancelled. Nothing was saved.")
    except TurnFailed as exc:
        _finish(job, TurnJob.Status.FAILED, exc.code, exc.message)
    except ModelError as exc:
        _finish(job, TurnJob.Status.FAILED, exc.code, exc.message)
    except ContextError as exc:
        _finish_unless_moved(job, exc.code, exc.message)
    except tree.StaleVersion:
        _finish(job, TurnJob.Status.FAILED, "stale_version", STALE_MESSAGE)
    except tree.TreeError as exc:
        _finish_unless_moved(job, getattr(exc, "code", "refused"), str(exc))
    except LockBusy:
        _finish(
            job, TurnJob.Status.FAILED, "busy", "Another job of this story is still running. Try again in a moment."
        )
    except SoftTimeLimitExceeded:
        _finish(
            job, TurnJob.Status.FAILED, "timeout", "Writing this turn took too long and was stopped. Nothing was saved."
        )
    except (redis.RedisError, LockLost):
        _finish(
            job, TurnJob.Status.FAILED, "queue_unavailable", "Lost contact with Redis while writing. Nothing was saved."
        )
    except OperationalError as exc:
        if not _database_busy(exc):
            raise
        _finish(job, TurnJob.Status.FAILED, "database_busy", DATABASE_BUSY_MESSAGE)


DATABASE_BUSY_MESSAGE = "The database was too busy to save this turn. Nothing was saved; you can retry."
# SQLite answers "database is locked" once its busy timeout (SQLITE_BUSY_TIMEOUT) passes while
# another connection holds the write lock. The turn's writes are whole transactions, so they
# are simply run again, a few times, before the job gives up.
DATABASE_BUSY_ATTEMPTS = 4


def _database_busy(exc: OperationalError) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


def _retry_when_busy(write):
    """Run `write` (one whole transaction, or one statement in autocommit) again while the
    database reports itself busy, with a short backoff; the last failure is raised."""
    for attempt in range(DATABASE_BUSY_ATTEMPTS):
        try:
            return write()
        except OperationalError as exc:
            last = attempt == DATABASE_BUSY_ATTEMPTS - 1
            if last or not _database_busy(exc) or transaction.get_connection().in_atomic_block:
                raise
            log.warning("database busy, retrying (%s/%s)", attempt + 1, DATABASE_BUSY_ATTEMPTS)
            time.sleep(min(0.25 * 2**attempt, 2.0))
    return None  # pragma: no cover - the loop returns or raises


def _claim(job_id: int, worker: str) -> TurnJob | None:
    now = timezone.now()
    claimed = TurnJob.objects.filter(pk=job_id, status=TurnJob.Status.QUEUED).update(
        status=TurnJob.Status.RUNNING, started_at=now, attempts=F("attempts") + 1, worker=worker[:200],
    )  # fmt: skip
    if not claimed:
        # A redelivery after a worker died mid-job: take it over only when nobody holds its lock.
        job = TurnJob.objects.filter(pk=job_id).first()
        if job is None or job.status != TurnJob.Status.RUNNING or holder(job.adventure_id) is not None:
            return None
        claimed = TurnJob.objects.filter(pk=job_id, status=TurnJob.Status.RUNNING, attempts=job.attempts).update(
            started_at=now, attempts=F("attempts") + 1, worker=worker[:200], partial_text="",
        )  # fmt: skip
        if not claimed:
            return None
    _unmark_queued(job_id)
    return TurnJob.objects.select_related("adventure", "target_node").get(pk=job_id)


def _finish(job: TurnJob, status: str, code: str, message: str) -> None:
    """End an unfinished job that wrote nothing. Narration it streamed is discarded with it."""
    _retry_when_busy(
        lambda: TurnJob.objects.filter(pk=job.pk, status__in=UNFINISHED).update(
            status=status,
            error_code=code,
            error_message=message,
            finished_at=timezone.now(),
            stage=TurnJob.Stage.FINISHED,
            partial_text="",
        )  # fmt: skip
    )


def _finish_unless_moved(job: TurnJob, code: str, message: str) -> None:
    """Fail the job with `code`, unless the story moved while the worker read it: the path is
    read in several statements, so another tab's head move (an attempt switch, a fork) can
    make it look broken (`broken_ancestry`) or refused. That is a stale turn, not damage."""
    moved = (
        job.expected_version is not None
        and Adventure.objects.filter(pk=job.adventure_id).exclude(version=job.expected_version).exists()
    )
    if moved:
        code, message = "stale_version", STALE_MESSAGE
    _finish(job, TurnJob.Status.FAILED, code, message)


class _JobProgress:
    """Throttled writes of stage, progress and streamed text to the job row."""

    def __init__(self, job: TurnJob) -> None:
        self.job = job
        self.text = ""
        self._last_write = 0.0
        self._last_cancel_check = 0.0
        self._cancelled = False

    def stage(self, stage: str, **fields) -> None:
        TurnJob.objects.filter(pk=self.job.pk).update(stage=stage, **fields)

    def compaction(self, done: int, total: int) -> None:
        self.stage(TurnJob.Stage.COMPACTING, progress_done=done, progress_total=total)
        if self.cancelled():
            raise JobCancelled

    def on_text(self, delta: str) -> None:
        self.text += delta
        now = time.monotonic()
        if now - self._last_write >= 0.1:
            self._last_write = now
            TurnJob.objects.filter(pk=self.job.pk).update(partial_text=self.text)

    def flush(self) -> None:
        TurnJob.objects.filter(pk=self.job.pk).update(partial_text=self.text)

    def cancelled(self) -> bool:
        if self._cancelled:
            return True
        now = time.monotonic()
        if now - self._last_cancel_check >= 0.2:
            self._last_cancel_check = now
            self._cancelled = TurnJob.objects.filter(pk=self.job.pk, cancel_requested=True).exists()
        return self._cancelled

    def check_cancel(self) -> None:
        self._last_cancel_check = 0.0
        if self.cancelled():
            raise JobCancelled


@dataclass
class _Plan:
    """What the turn is about, resolved from the job."""

    parent: Node  # the node the new one is a child of (history ends here)
    kind: str  # the node kind to write
    text: str
    fixed_from: Node | None  # regenerate: the node whose delta and checks are reused


def _resolve(job: TurnJob, adventure: Adventure) -> _Plan:
    if job.kind in PLAY_KINDS:
        return _Plan(parent=adventure.head, kind=job.kind, text=job.player_input, fixed_from=None)
    target = job.target_node
    if target is None:
        raise TurnFailed("target_gone", "The turn this job was about no longer exists. Nothing was saved.")
    if target.parent is None:
        raise TurnFailed("opening", "The opening cannot be rewritten.")
    if job.kind == "retry":
        return _Plan(parent=target.parent, kind=target.kind, text=target.player_input, fixed_from=None)
    if job.kind == "regenerate":
        return _Plan(parent=target.parent, kind=target.kind, text=target.player_input, fixed_from=target)
    return _Plan(parent=target.parent, kind=target.kind, text=job.player_input, fixed_from=None)  # edit


def roll_check(arguments: dict, *, rng: random.Random | None = None) -> dict:
    """The runtime's hidden check: an exact, recorded d20 roll. The model sees only the outcome."""
    seed = random.SystemRandom().getrandbits(63) if rng is None else rng.getrandbits(63)
    roll = random.Random(seed).randint(1, 20)
    dc = DIFFICULTY_DC[arguments["difficulty"]]
    outcome = "success" if roll >= dc else "partial" if roll >= dc - 4 else "failure"
    return {
        "skill": arguments["skill"],
        "difficulty": arguments["difficulty"],
        "reason": arguments.get("reason", ""),
        "seed": seed,
        "roll": roll,
        "dc": dc,
        "outcome": outcome,
    }


def _generate(job: TurnJob, lock: HeldLock) -> None:
    progress = _JobProgress(job)
    adventure = Adventure.objects.select_related("model_profile", "head").get(pk=job.adventure_id)
    if adventure.version != job.expected_version:
        raise TurnFailed("stale_version", STALE_MESSAGE)
    progress.check_cancel()
    plan = _resolve(job, adventure)
    profile = adventure.model_profile
    tools = [SUBMIT_TURN_PLAN] if plan.fixed_from is not None else [REQUEST_CHECK, SUBMIT_TURN_PLAN]
    fixed = None
    if plan.fixed_from is not None:
        fixed = [{"skill": c.get("skill", ""), "outcome": c.get("outcome", "")} for c in plan.fixed_from.checks]
    dynamic_tail = ctx.build_dynamic_tail(
        adventure, head=plan.parent, kind=plan.kind, text=plan.text, state=plan.parent.state_after, fixed_outcomes=fixed
    )

    prepared = ctx.prepare(
        adventure=adventure,
        head=plan.parent,
        dynamic_tail=dynamic_tail,
        tools=tools,
        on_progress=progress.compaction,
        cancel=progress.cancelled,
    )
    progress.check_cancel()
    progress.stage(TurnJob.Stage.NARRATING, partial_text="")
    client = client_for(profile)
    _, _, max_output = effective_limits(profile)
    # One sampling seed per job: a retry is a new job, so even a deterministic narrator
    # (the offline one) writes a different attempt.
    result = client.chat(
        messages=prepared.messages, tools=tools, max_output_tokens=max_output,
        cancel=progress.cancelled, on_text=progress.on_text, seed=job.pk,
    )  # fmt: skip
    call = result.tool_calls[0]
    checks: list[dict] = []
    prompt_bytes = prepared.prompt_bytes
    if call.name == REQUEST_CHECK.name:
        record = roll_check(call.arguments)
        checks.append(record)
        messages = ctx.continuation(prepared, call, record["outcome"])
        prompt_bytes = max(prompt_bytes, ctx.request_bytes(messages))
        result = client.chat(
            messages=messages, tools=[SUBMIT_TURN_PLAN], max_output_tokens=max_output,
            cancel=progress.cancelled, on_text=progress.on_text, seed=job.pk,
        )  # fmt: skip
        call = result.tool_calls[0]
    if call.name != SUBMIT_TURN_PLAN.name:
        raise ModelMalformed(f"expected submit_turn_plan, got {call.name}")
    progress.flush()
    turn_plan = call.arguments

    if plan.fixed_from is not None:
        # Regenerate: the same action, the same authoritative delta, the same check records.
        delta, checks = plan.fixed_from.state_delta, plan.fixed_from.checks
        state_after = plan.fixed_from.state_after
    else:
        try:
            delta = validate_delta(turn_plan.get("state_delta", []))
            state_after = apply_delta(plan.parent.state_after or {}, delta)
        except InvalidDelta as exc:
            raise TurnFailed(
                "invalid_delta", f"The model proposed a state change that is not allowed ({exc}). Nothing was saved."
            ) from exc
    content = {
        "kind": plan.kind,
        "player_input": plan.text,
        "narration": turn_plan["narration"],
        "suggestions": list(turn_plan.get("suggestions", [])),
        "state_delta": delta,
        "state_after": state_after,
        "checks": checks,
        "model_name": result.model[:200],
        "prompt_bytes": prompt_bytes,
        "prompt_stable_bytes": prepared.stable_prefix_bytes,
    }
    ctx.assert_next_turn_fits(adventure=adventure, head=plan.parent, candidate=content, prepared=prepared)

    progress.check_cancel()
    # Still ours? Without Redis the heartbeat could not renew it: another job may hold the story now.
    lock.verify()
    progress.stage(TurnJob.Stage.COMMITTING)

    def write_node() -> Node:
        node = _write(job, adventure, plan, content)
        # Completing the job is part of the same transaction; a cancel that landed first wins.
        done = TurnJob.objects.filter(pk=job.pk, status=TurnJob.Status.RUNNING, cancel_requested=False).update(
            status=TurnJob.Status.DONE, stage=TurnJob.Stage.FINISHED, result_node=node, finished_at=timezone.now(),
            partial_text="",  # the node holds the narration now; the job log need not keep a copy
        )  # fmt: skip
        if not done:
            raise JobCancelled
        Adventure.objects.filter(pk=adventure.pk).update(last_played_at=timezone.now())
        return node

    _retry_when_busy(
        lambda: ctx.commit_turn(
            adventure=adventure,
            expected_version=job.expected_version,
            pending_checkpoint=prepared.pending_checkpoint,
            write_node=write_node,
        )
    )


def _write(job: TurnJob, adventure: Adventure, plan: _Plan, content: dict) -> Node:
    if job.kind in PLAY_KINDS:
        return tree.node_append(adventure=adventure, expected_version=job.expected_version, **content)
    if job.kind == "retry":
        return tree.attempt_add(
            adventure=adventure, tip=job.target_node, expected_version=job.expected_version, **content
        )
    return tree.sibling_branch_add(
        adventure=adventure,
        target=job.target_node,
        expected_version=job.expected_version,
        regenerated_from=job.target_node if job.kind == "regenerate" else None,
        **content,
    )
