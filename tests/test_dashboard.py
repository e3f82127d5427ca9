"""The operator dashboard: what `dashboard_stats()` gathers, how it degrades when Redis or
the workers are gone, and that only staff reach the page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from stories import dashboard, tree
from stories.dashboard import dashboard_stats
from stories.models import TurnJob

pytestmark = pytest.mark.django_db

# Nothing listens on port 1: a refused connection, at once.
REDIS_DOWN = "redis://127.0.0.1:1/0"


@pytest.fixture
def story(user):
    return tree.adventure_create(owner=user, title="Saltmarsh", premise="Rain on the harbour.")


def job(story, status: str, *, age: timedelta = timedelta(0), **fields) -> TurnJob:
    created = TurnJob.objects.create(adventure=story, kind="do", player_input="I wait.", status=status, **fields)
    if age:
        TurnJob.objects.filter(pk=created.pk).update(created_at=timezone.now() - age)
    return created


@pytest.fixture
def redis_down(settings, monkeypatch):
    settings.REDIS_URL = REDIS_DOWN
    pings = []
    monkeypatch.setattr("storyproject.celery.app.control.ping", lambda **kw: pings.append(kw) or [])
    return pings


def test_jobs_by_status_counts_the_last_24_hours_only(story, redis_down):
    job(story, "done")
    job(story, "done")
    job(story, "failed", error_code="model_timeout", error_message="No answer.")
    job(story, "done", age=timedelta(hours=25))  # yesterday's: not counted
    stats = dashboard_stats()
    counts = {row["status"]: row["count"] for row in stats["jobs_last_24h"]}
    assert counts == {"queued": 0, "running": 0, "done": 2, "failed": 1, "cancelled": 0}


def test_failed_jobs_are_the_latest_twenty_with_their_reasons(story, redis_down):
    now = timezone.now()
    for i in range(25):
        job(
            story, "failed", error_code=f"code_{i}", error_message=f"reason {i}", finished_at=now - timedelta(minutes=i)
        )
    job(story, "done")
    failed = dashboard_stats()["failed_jobs"]
    assert len(failed) == 20
    assert [j.error_code for j in failed[:2]] == ["code_0", "code_1"]
    assert failed[0].error_message == "reason 0"


def test_redis_down_is_reported_and_workers_are_not_pinged(redis_down):
    stats = dashboard_stats()
    assert stats["redis_up"] is False
    assert stats["queue_length"] is None
    assert stats["workers"] == []
    assert redis_down == []  # no ping: it would only wait out the broker's retries


def test_queue_length_reads_the_celery_list(redis_url, monkeypatch):
    import redis

    monkeypatch.setattr("storyproject.celery.app.control.ping", lambda **kw: [])
    client = redis.Redis.from_url(redis_url)
    client.rpush("celery", "a", "b", "c")
    stats = dashboard_stats()
    assert stats["redis_up"] is True
    assert stats["queue_name"] == "celery"
    assert stats["queue_length"] == 3
    assert stats["workers"] == []


def test_a_failing_ping_shows_no_workers(monkeypatch):
    def boom(**kwargs):
        raise OSError("broker gone")

    monkeypatch.setattr("storyproject.celery.app.control.ping", boom)
    assert dashboard.worker_names() == []


@pytest.mark.worker
def test_a_running_worker_answers_the_ping(celery_worker):
    names = dashboard.worker_names()
    assert len(names) == 1 and names[0].startswith("test-")


def test_database_size_is_measured():
    size = dashboard.database_size()
    assert size["vendor"] in {"sqlite", "postgresql"}
    assert size["bytes"] and size["bytes"] > 0


def test_checkpoint_counts(populated_checkpoints, redis_down):
    stats = dashboard_stats()["checkpoints"]
    assert stats == {"total": 4, "valid": 1, "stale": 3, "invalidated": 1, "unchecked": 0}


def test_only_the_newest_checkpoints_are_verified(populated_checkpoints, redis_down, monkeypatch):
    monkeypatch.setattr(dashboard, "CHECKPOINTS_VERIFIED", 2)
    stats = dashboard_stats()["checkpoints"]
    assert stats["total"] == 4 and stats["invalidated"] == 1
    assert stats["valid"] + stats["stale"] - stats["invalidated"] == 2
    assert stats["unchecked"] == 1


@pytest.fixture
def populated_checkpoints(user):
    """One real checkpoint (compacted with the offline narrator), two with broken hashes, one invalidated."""
    from checkpoints.context import compact_now
    from stories import paths
    from stories.models import Node
    from stories.synthetic import build_story
    from tests.test_admin import fake_checkpoint

    story = build_story(nodes=40, bytes_per_node=1500, owner=user)
    real = compact_now(story).checkpoint
    assert real is not None
    head = Node.objects.get(pk=story.head_id)
    fakes = [fake_checkpoint(story, paths.node_at(head, d + 2), paths.node_at(head, d)) for d in (1, 4, 7)]
    fakes[0].invalidated = True
    fakes[0].save(update_fields=["invalidated"])
    return [real, *fakes]


# --- the page ------------------------------------------------------------------------------


def test_dashboard_page_renders_for_staff(admin_client, story, redis_down):
    job(story, "failed", error_code="model_unreachable", error_message="Connection refused by the model server.")
    response = admin_client.get(reverse("admin:storytree_dashboard"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Redis down" in page
    assert "Connection refused by the model server." in page
    assert 'data-status="failed">1<' in page
    assert response.context["stats"]["database"]["bytes"] > 0


def test_dashboard_shows_queue_length_when_redis_is_up(admin_client, redis_url, monkeypatch):
    import redis

    monkeypatch.setattr("storyproject.celery.app.control.ping", lambda **kw: [{"celery@box": {"ok": "pong"}}])
    redis.Redis.from_url(redis_url).rpush("celery", "x")
    page = admin_client.get(reverse("admin:storytree_dashboard")).content.decode()
    assert "1 waiting" in page
    assert "celery@box" in page


def test_players_and_anonymous_visitors_get_the_admin_login(client, user):
    url = reverse("admin:storytree_dashboard")
    login = reverse("admin:login")
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith(login)
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith(login)
