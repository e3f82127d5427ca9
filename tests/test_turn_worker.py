"""Turns on a real Celery worker process over a real Redis: the happy path, two racing
requests, and a worker killed with SIGKILL in the middle of narrating."""

from __future__ import annotations

import threading

import pytest
from django.test import Client

from stories import tree
from stories.integrity import check_adventure
from stories.models import Adventure, ApiToken, Node, TurnJob
from tests.conftest import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def headers(user):
    _, key = ApiToken.issue(user)
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def adventure(user):
    return tree.adventure_create(owner=user, title="Worker", premise="A windy cliff.", persona="A climber.")


def post_turn(headers, adventure, text, version, key=None):
    body = {"kind": "do", "text": text, "expected_version": version}
    if key:
        body["idempotency_key"] = key
    return Client().post(
        f"/api/v1/adventures/{adventure.pk}/turns", body, content_type="application/json", headers=headers
    )


def job_state(headers, job_id):
    return Client().get(f"/api/v1/jobs/{job_id}", headers=headers).json()


def test_a_real_worker_writes_the_turn(start_worker, headers, adventure):
    start_worker()
    response = post_turn(headers, adventure, "I look over the edge.", 1)
    assert response.status_code == 202
    job_id = response.json()["id"]
    done = wait_for(lambda: job_state(headers, job_id)["status"] == "done", timeout=30, message="the turn")
    assert done
    fresh = Adventure.objects.get(pk=adventure.pk)
    assert fresh.head.depth == 1 and fresh.version == 2
    assert check_adventure(fresh) == []


def test_two_requests_racing_on_one_version(start_worker, headers, adventure):
    start_worker()
    results = []

    def go(text):
        results.append(post_turn(headers, adventure, text, 1).status_code)

    threads = [threading.Thread(target=go, args=(t,)) for t in ("I jump.", "I wait.")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [202, 409]
    job = TurnJob.objects.get(adventure=adventure)
    wait_for(lambda: job_state(headers, job.pk)["status"] == "done", timeout=30, message="the winning turn")
    assert Node.objects.filter(adventure=adventure).count() == 2
    assert check_adventure(Adventure.objects.get(pk=adventure.pk)) == []


def test_a_worker_killed_mid_narration_leaves_no_half_written_turn(start_worker, headers, adventure, settings):
    settings.STORYTREE_JOB_LOCK_TTL = 2
    worker = start_worker(STORYTREE_BUILTIN_CHUNK_DELAY_MS="400", STORYTREE_JOB_LOCK_TTL="2")
    response = post_turn(headers, adventure, "I climb down the cliff slowly.", 1)
    job_id = response.json()["id"]
    wait_for(lambda: TurnJob.objects.get(pk=job_id).partial_text, timeout=30, message="narration to start streaming")
    worker.kill()

    fresh = Adventure.objects.get(pk=adventure.pk)
    assert fresh.version == 1 and fresh.head.depth == 0
    assert Node.objects.filter(adventure=adventure).count() == 1
    # Once the dead worker's lock has expired, the job reads as failed with a clear message.
    failed = wait_for(
        lambda: (s := job_state(headers, job_id))["status"] == "failed" and s, timeout=20, message="worker_lost"
    )
    assert failed["error"]["code"] == "worker_lost"
    assert "Nothing was saved" in failed["error"]["message"]

    # A new worker, and the player retries: the turn is written once.
    start_worker()
    assert Client().post(f"/api/v1/jobs/{job_id}/retry", headers=headers).status_code == 202
    wait_for(lambda: job_state(headers, job_id)["status"] == "done", timeout=30, message="the retried turn")
    fresh = Adventure.objects.get(pk=adventure.pk)
    assert fresh.head.depth == 1
    assert check_adventure(fresh) == []
