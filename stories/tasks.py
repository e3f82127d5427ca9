"""Celery interfaces: take an id, call one domain function."""

from __future__ import annotations

from celery import shared_task


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_turn_job(self, job_id: int) -> None:
    from .turns import turn_run

    turn_run(job_id, worker=self.request.hostname or "")
