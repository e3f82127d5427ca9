"""Celery interfaces: take an id, call one domain function."""

from __future__ import annotations

from celery import shared_task


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def compact_adventure_task(self, job_id: int) -> None:
    """Run the queued "compact" TurnJob `job_id` (idempotent: the job row is claimed once)."""
    from .jobs import compact_job_run

    compact_job_run(job_id, worker=self.request.hostname or "")


# Registered with every worker through this autodiscovered module.
from .tasks_retention import prune_all_task  # noqa: E402, F401
