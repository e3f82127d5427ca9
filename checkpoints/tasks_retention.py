"""The nightly retention pass as a Celery task (scheduled by beat when
STORYTREE_PRUNE_NIGHTLY is on; see docs/retention.md). It only calls the domain function."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

log = logging.getLogger(__name__)


# acks_late: a pass is idempotent (a second one deletes nothing the first left), and each
# adventure is its own transaction, so a redelivered or interrupted run loses nothing.
@shared_task(acks_late=True, ignore_result=True)
def prune_all_task() -> None:
    """Prune every adventure, most recently played first. Stops cleanly at the soft time
    limit: the adventures done so far stay pruned and the one in progress rolls back."""
    from .retention import prune_all, total

    try:
        reports = prune_all(dry_run=False)
    except SoftTimeLimitExceeded:
        log.warning("retention pass stopped at the soft time limit; the next run continues")
        return
    summary = total(reports, dry_run=False)
    log.info(
        "retention pass: %s adventures; checkpoints %s rows / %s bytes reclaimed, jobs %s rows / %s bytes reclaimed",
        summary.adventures,
        summary.checkpoints.reclaimable.rows,
        summary.checkpoints.reclaimable.bytes,
        summary.jobs.reclaimable.rows,
        summary.jobs.reclaimable.bytes,
    )
