"""What the operator dashboard shows: one function gathers it, the view only renders it.

Every probe of something outside the database (Redis, the Celery workers) is
bounded by a short timeout and turns a failure into a value the page shows
("Redis down", no workers), never into an error page: the dashboard is what an
operator opens when something is already wrong.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Count, F
from django.utils import timezone

from .models import TurnJob

log = logging.getLogger(__name__)

FAILED_JOBS_SHOWN = 20
# Recomputing a checkpoint's source hash reads its whole covered path, so the
# dashboard verifies only the newest few and says how many it left unchecked.
CHECKPOINTS_VERIFIED = 20
PROBE_TIMEOUT = 1.0


def dashboard_stats() -> dict[str, Any]:
    redis_stats = queue_stats()
    return {
        "generated_at": timezone.now(),
        "jobs_last_24h": jobs_by_status(since=timezone.now() - timedelta(hours=24)),
        "failed_jobs": failed_jobs(FAILED_JOBS_SHOWN),
        **redis_stats,
        # A ping needs the broker; with Redis down it would only wait out its retries.
        "workers": worker_names() if redis_stats["redis_up"] else [],
        "checkpoints": checkpoint_stats(CHECKPOINTS_VERIFIED),
        "database": database_size(),
    }


def jobs_by_status(*, since) -> list[dict[str, Any]]:
    """[{"status", "label", "count"}] for every status, zeros included, in the model's order."""
    counts = dict(
        TurnJob.objects.filter(created_at__gte=since)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return [{"status": value, "label": label, "count": counts.get(value, 0)} for value, label in TurnJob.Status.choices]


def failed_jobs(limit: int) -> list[TurnJob]:
    return list(
        TurnJob.objects.filter(status=TurnJob.Status.FAILED)
        .select_related("adventure")
        .order_by(F("finished_at").desc(nulls_last=True), "-created_at")[:limit]
    )


def queue_stats() -> dict[str, Any]:
    """Length of the Celery default queue (a Redis list named after it)."""
    from storyproject.celery import app

    queue = app.conf.task_default_queue or "celery"
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
        )
        length = int(client.llen(queue))
    except (redis.RedisError, OSError, ValueError) as exc:
        log.warning("dashboard: Redis at REDIS_URL is not answering: %s", exc)
        return {"redis_up": False, "queue_name": queue, "queue_length": None}
    return {"redis_up": True, "queue_name": queue, "queue_length": length}


def worker_names() -> list[str]:
    """Hostnames of the Celery workers that answered a ping within a second."""
    from storyproject.celery import app

    try:
        replies = app.control.ping(timeout=PROBE_TIMEOUT) or []
    except Exception as exc:  # kombu/redis raise many types; any of them means "no answer"
        log.warning("dashboard: worker ping failed: %s", exc)
        return []
    return sorted(name for reply in replies for name in reply)


def checkpoint_stats(verify_limit: int) -> dict[str, int]:
    """Totals, plus hash verification of the newest `verify_limit` not-invalidated rows.

    valid + stale + unchecked == total; invalidated rows count as stale.
    """
    from checkpoints.models import ContextCheckpoint

    total = ContextCheckpoint.objects.count()
    invalidated = ContextCheckpoint.objects.filter(invalidated=True).count()
    newest = ContextCheckpoint.objects.filter(invalidated=False).select_related(*CHECKPOINT_RELATED)[:verify_limit]
    valid = stale = 0
    for checkpoint in newest:
        ok, _reason = checkpoint_validity(checkpoint)
        valid += ok
        stale += not ok
    return {
        "total": total,
        "valid": valid,
        "stale": stale + invalidated,
        "invalidated": invalidated,
        "unchecked": total - invalidated - valid - stale,
    }


# What a checkpoint's validation reads; loading it with the row saves a query per relation.
CHECKPOINT_RELATED = ("adventure__model_profile", "host_node__branch", "covered_through", "retained_from", "branch")


def checkpoint_validity(checkpoint) -> tuple[bool, str]:
    """(usable, reason) from the checkpoint store's validator, the one home of that rule.

    It recomputes the source hash over the whole covered path, so it costs a few queries
    per checkpoint: callers validate a bounded number of rows (a page, the newest few)."""
    if checkpoint.invalidated:
        return False, "invalidated"  # the store's own first check, without computing its expectations
    from checkpoints import store

    return store.validate_checkpoint(checkpoint)


def database_size() -> dict[str, Any]:
    """{"vendor", "bytes"} (bytes None when it cannot be measured)."""
    vendor = connection.vendor
    size: int | None = None
    try:
        if vendor == "sqlite":
            name = Path(str(connection.settings_dict["NAME"]))
            # WAL mode: committed pages live in the -wal file until a checkpoint copies them back.
            size = sum(os.path.getsize(p) for p in (name, Path(f"{name}-wal")) if p.exists())
        elif vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_database_size(current_database())")
                size = int(cursor.fetchone()[0])
    except Exception as exc:  # an unmeasurable size is shown as unknown, never an error page
        log.warning("dashboard: cannot measure the database size: %s", exc)
    return {"vendor": vendor, "bytes": size}
