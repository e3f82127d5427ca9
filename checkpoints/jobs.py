"""Running a "compact" TurnJob: the worker side of the admin's "compact this branch now".

Claimed with a conditional update (queued → running), so two workers never both run it;
held under the adventure's generation lock, so it never races a turn of the same story;
progress (chunks done / total) and cancellation go through the job row.
"""

from __future__ import annotations

import logging
import time

import redis
from celery.exceptions import SoftTimeLimitExceeded
from django.db.models import F
from django.utils import timezone

from stories.llm.errors import ModelCancelled, ModelError
from stories.locks import LockBusy, adventure_lock
from stories.models import Adventure, TurnJob

from .budget import ContextError
from .context import compact_now

log = logging.getLogger(__name__)

CANCEL_POLL_SECONDS = 0.2
UNFINISHED = [TurnJob.Status.QUEUED, TurnJob.Status.RUNNING]


class _Job:
    """Progress writes and a throttled cancel check for one job row."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self._checked_at = 0.0
        self._cancelled = False

    def progress(self, done: int, total: int) -> None:
        TurnJob.objects.filter(pk=self.job_id).update(
            stage=TurnJob.Stage.COMPACTING, progress_done=done, progress_total=total
        )

    def cancelled(self) -> bool:
        now = time.monotonic()
        if not self._cancelled and now - self._checked_at >= CANCEL_POLL_SECONDS:
            self._checked_at = now
            self._cancelled = TurnJob.objects.filter(pk=self.job_id, cancel_requested=True).exists()
        return self._cancelled

    def finish(self, status: str, code: str = "", message: str = "", **fields) -> None:
        TurnJob.objects.filter(pk=self.job_id, status__in=UNFINISHED).update(
            status=status,
            stage=TurnJob.Stage.FINISHED,
            error_code=code,
            error_message=message,
            finished_at=timezone.now(),
            **fields,
        )


def claim(job_id: int, worker: str = "") -> TurnJob | None:
    """queued → running, or None when another worker has it (or it is not a compact job)."""
    claimed = TurnJob.objects.filter(pk=job_id, kind=TurnJob.Kind.COMPACT, status=TurnJob.Status.QUEUED).update(
        status=TurnJob.Status.RUNNING,
        stage=TurnJob.Stage.COMPACTING,
        started_at=timezone.now(),
        attempts=F("attempts") + 1,
        worker=worker[:200],
    )
    if not claimed:
        return None
    return TurnJob.objects.select_related("target_node").get(pk=job_id)


def compact_job_run(job_id: int, *, worker: str = "") -> None:
    """Claim the compact job `job_id`, compact the path of its target (default: the head)
    and finish it: done (result_node = the checkpoint's host), cancelled or failed with a
    code and a player-readable message. Nothing is saved unless compaction completes."""
    job = claim(job_id, worker)
    if job is None:
        return
    handle = _Job(job.pk)
    try:
        with adventure_lock(job.adventure_id, owner=str(job.pk)):
            adventure = Adventure.objects.get(pk=job.adventure_id)
            result = compact_now(adventure, job.target_node, on_progress=handle.progress, cancel=handle.cancelled)
        host = result.checkpoint.host_node_id if result.checkpoint is not None else None
        handle.finish(TurnJob.Status.DONE, result_node_id=host)
    except ModelCancelled:
        handle.finish(TurnJob.Status.CANCELLED, "cancelled", "Cancelled. Nothing was saved.")
    except (ModelError, ContextError) as exc:
        handle.finish(TurnJob.Status.FAILED, exc.code, exc.message)
    except LockBusy:
        handle.finish(TurnJob.Status.FAILED, "busy", "A turn of this story is being written. Try again in a moment.")
    except SoftTimeLimitExceeded:
        handle.finish(TurnJob.Status.FAILED, "timeout", "Summarizing took too long and was stopped. Nothing was saved.")
    except redis.RedisError:
        handle.finish(TurnJob.Status.FAILED, "queue_unavailable", "Lost contact with Redis. Nothing was saved.")
    except Exception:
        log.exception("compact job %s failed", job_id)
        handle.finish(TurnJob.Status.FAILED, "internal_error", "Summarizing failed unexpectedly. Nothing was saved.")
        raise
