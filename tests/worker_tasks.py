"""Tasks only the test worker loads (celery --include=tests.worker_tasks)."""

from __future__ import annotations

from celery import shared_task
from django.contrib.auth import get_user_model


@shared_task
def mark_user(user_id: int, marker: str) -> None:
    get_user_model().objects.filter(pk=user_id).update(first_name=marker)
