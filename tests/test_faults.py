"""Faults in the things a turn depends on: the worker, Redis, the model server, the database.

For each: no node, no checkpoint, an unmoved head (or, where waiting is right, the whole turn
once the fault clears, never half of it); the player reads a clear message on the job and can
retry; once the dependency is back the next turn works. Already covered elsewhere and not
repeated here: typed model errors, truncated streams and malformed tool calls, SIGKILL
mid-narration and cancel (tests/test_turn_failures.py, tests/test_turn_worker.py,
tests/test_context_failures.py).
"""

from __future__ import annotations

import shutil
import sqlite3
import threading

import pytest
from django.db import connection
from django.test import Client

from checkpoints.models import ContextCheckpoint
from checkpoints.testing import use_profile
from stories import tree, turns
from stories.integrity import check_adventure
from stories.models import Adventure, ApiToken, Node, TurnJob
from stories.synthetic import build_story
from tests.conftest import CeleryWorker, RedisServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


# --- helpers -------------------------------------------------------------------------------------


class Api:
    def __init__(self, user) -> None:
        _, key = ApiToken.issue(user)
        self.headers = {"Authorization": f"Bearer {key}"}

    def get(self, url):
        return Client().get(url, headers=self.headers)

    def post(self, url, body=None):
        return Client().post(url, body or {}, content_type="application/json", headers=self.headers)

    def play(self, adventure, text="I walk on."):
        version = Adventure.objects.get(pk=adventure.pk).version
        return self.post(
            f"/api/v1/adventures/{adventure.pk}/turns", {"kind": "do", "text": text, "expected_version": version}
        )

    def job(self, job_id) -> dict:
        return self.get(f"/api/v1/jobs/{job_id}").json()

    def wait(self, job_id, *statuses, timeout=30) -> dict:
        statuses = statuses or ("done", "failed", "cancelled")
        return wait_for(
            lambda: (job := self.job(job_id))["status"] in statuses and job, timeout=timeout, message=str(statuses)
        )


@pytest.fixture
def api(user):
    return Api(user)


def snapshot(adventure):
    fresh = Adventure.objects.get(pk=adventure.pk)
    return (
        fresh.head_id,
        fresh.version,
        Node.objects.filter(adventure=adventure).count(),
        ContextCheckpoint.objects.filter(adventure=adventure).count(),
    )


def assert_failed_cleanly(job: dict, before, adventure, code: str | None = None):
    assert job["status"] == "failed", job
    if code:
        assert job["error"]["code"] == code, job
    assert job["error"]["message"], job
    assert "Traceback" not in job["error"]["message"]
    assert job["node"] is None
    assert snapshot(adventure) == before
    assert check_adventure(adventure) == []


def assert_retry_writes_the_turn(api, job_id, adventure, before, timeout=30):
    retried = api.post(f"/api/v1/jobs/{job_id}/retry")
    assert retried.status_code == 202, retried.content
    done = api.wait(job_id, timeout=timeout)
    assert done["status"] == "done", done
    fresh = Adventure.objects.get(pk=adventure.pk)
    assert fresh.version == before[1] + 1 and fresh.head_id == done["node"]
    assert Node.objects.filter(adventure=adventure).count() == before[2] + 1
    assert check_adventure(fresh) == []
    return done


@pytest.fixture
def adventure(user):
    return tree.adventure_create(owner=user, title="Faults", premise="A lighthouse in fog.", persona="A keeper.")


@pytest.fixture
def long_story(user, fake_openai):
    """A story long enough that its next turn compacts first, in several chunks."""
    profile = fake_openai.profile(timeout_seconds=30)
    return use_profile(build_story(nodes=150, bytes_per_node=250, owner=user), profile)


# --- the worker killed mid-compaction ------------------------------------------------------------


@pytest.mark.worker
def test_a_worker_killed_mid_compaction_saves_nothing_and_the_retry_compacts(
    start_worker, api, long_story, fake_openai, settings
):
    settings.STORYTREE_JOB_LOCK_TTL = 2
    worker = start_worker(STORYTREE_JOB_LOCK_TTL="2")
    before = snapshot(long_story)
    fake_openai.add_delay(60)  # the first summary request hangs: the worker is mid-compaction
    response = api.play(long_story)
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    wait_for(
        lambda: TurnJob.objects.get(pk=job_id).stage == "compacting" and fake_openai.requests,
        timeout=20,
        message="compaction to start",
    )
    worker.kill()

    assert snapshot(long_story) == before
    failed = api.wait(job_id, "failed", timeout=20)
    assert_failed_cleanly(failed, before, long_story, "worker_lost")
    assert "Nothing was saved" in failed["error"]["message"]

    start_worker()
    done = assert_retry_writes_the_turn(api, job_id, long_story, before)
    # The retried turn compacted again from scratch and committed its checkpoint with the node.
    checkpoint = ContextCheckpoint.objects.get(adventure=long_story)
    assert checkpoint.host_node_id == before[0] == Node.objects.get(pk=done["node"]).parent_id


# --- Redis stopped -------------------------------------------------------------------------------


@pytest.fixture
def own_redis(settings, transactional_db):
    """A Redis of this test's own, which it may stop and restart (the session one is shared)."""
    from storyproject.celery import app

    server = RedisServer()
    server.start()
    previous = app.conf.broker_url

    def point_at(url):
        app.conf.broker_url = url
        app._pool = None
        app.amqp._producer_pool = None

    settings.REDIS_URL = settings.CELERY_BROKER_URL = server.url
    point_at(server.url)
    app.conf.task_always_eager = False
    workers: list[CeleryWorker] = []

    def start_worker(**env) -> CeleryWorker:
        worker = CeleryWorker(server.url, env)
        worker.start()
        workers.append(worker)
        return worker

    server.start_worker = start_worker
    yield server
    for worker in workers:
        worker.stop()
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)
    point_at(previous)


@pytest.mark.worker
def test_redis_dying_while_a_turn_is_queued(own_redis, api, adventure):
    before = snapshot(adventure)
    response = api.play(adventure)  # no worker yet: the turn waits in the queue
    assert response.status_code == 202
    job_id = response.json()["id"]
    own_redis.stop()

    # The player polling the job learns the queue is gone, instead of waiting forever.
    failed = api.wait(job_id, "failed", timeout=10)
    assert_failed_cleanly(failed, before, adventure, "queue_unavailable")
    # A new turn is refused with a message, not a traceback; reading still works.
    refused = api.play(adventure)
    assert refused.status_code == 503, refused.content
    assert "not answering" in refused.json()["error"]["message"]
    assert api.get(f"/api/v1/adventures/{adventure.pk}").status_code == 200
    assert snapshot(adventure) == before

    own_redis.start()  # back, empty: the queued message is gone
    own_redis.start_worker()
    assert_retry_writes_the_turn(api, job_id, adventure, before)


@pytest.mark.worker
def test_redis_restarted_empty_while_a_turn_was_queued(own_redis, api, adventure):
    before = snapshot(adventure)
    job_id = api.play(adventure).json()["id"]
    own_redis.stop()
    own_redis.start()  # no persistence: the queued turn was lost with it

    failed = api.wait(job_id, "failed", timeout=10)
    assert_failed_cleanly(failed, before, adventure)
    own_redis.start_worker()
    assert_retry_writes_the_turn(api, job_id, adventure, before)


@pytest.mark.worker
def test_redis_dying_while_a_turn_runs(own_redis, api, adventure, fake_openai):
    use_profile(adventure, fake_openai.profile(timeout_seconds=10))
    own_redis.start_worker()
    before = snapshot(adventure)
    fake_openai.add_slow_stream(30, 0.1)  # about three seconds of narration
    job_id = api.play(adventure).json()["id"]
    wait_for(lambda: TurnJob.objects.get(pk=job_id).partial_text, timeout=20, message="narration to stream")
    own_redis.stop()

    failed = api.wait(job_id, "failed", "done", timeout=20)
    assert_failed_cleanly(failed, before, adventure, "queue_unavailable")
    assert "Redis" in failed["error"]["message"]

    own_redis.start()
    assert_retry_writes_the_turn(api, job_id, adventure, before, timeout=60)


# --- the model server ----------------------------------------------------------------------------


def test_the_model_server_going_silent_mid_stream_times_out_cleanly(api, adventure, fake_openai, redis_url):
    use_profile(adventure, fake_openai.profile(timeout_seconds=0.5))
    before = snapshot(adventure)
    fake_openai.add_slow_stream(6, 1.5)  # first pieces arrive, then silence longer than the timeout
    job = api.job(api.play(adventure).json()["id"])
    assert_failed_cleanly(job, before, adventure, "model_timeout")
    assert fake_openai.chunks_sent > 1  # it really was mid-stream
    # Narration shown while streaming is discarded with the failed reply.
    assert job["partial_text"] == ""
    assert_retry_writes_the_turn(api, job["id"], adventure, before)


def test_a_429_during_compaction_saves_no_checkpoint_and_says_when_to_retry(api, long_story, fake_openai, redis_url):
    before = snapshot(long_story)
    fake_openai.add_tool_call("submit_context_summary", {"summary": "So far, so good.", "key_points": []})
    fake_openai.add_error(429, retry_after="9")  # the second chunk is refused
    job = api.job(api.play(long_story).json()["id"])
    assert_failed_cleanly(job, before, long_story, "model_rate_limited")
    assert "9 seconds" in job["error"]["message"]
    assert job["progress"]["done"] >= 1  # one chunk had been summarized, and was not kept
    assert all("submit_turn_plan" not in r.raw for r in fake_openai.requests)
    assert_retry_writes_the_turn(api, job["id"], long_story, before)
    assert ContextCheckpoint.objects.filter(adventure=long_story).count() == 1


# --- the database locked -------------------------------------------------------------------------


class WriteLock:
    """Another connection holding the database's write lock (SQLite: BEGIN IMMEDIATE;
    PostgreSQL: an exclusive lock on the adventure table) until released."""

    def __init__(self) -> None:
        settings = connection.settings_dict
        if connection.vendor == "sqlite":
            self.conn = sqlite3.connect(str(settings["NAME"]), timeout=30, check_same_thread=False)
            self.conn.isolation_level = None
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg

            self.conn = psycopg.connect(
                host=settings["HOST"] or "127.0.0.1",
                port=settings["PORT"] or 5432,
                user=settings["USER"],
                password=settings["PASSWORD"] or None,
                dbname=settings["NAME"],
            )
            self.conn.execute("LOCK TABLE stories_adventure IN EXCLUSIVE MODE")
        self.released = threading.Event()

    def release(self) -> None:
        if not self.released.is_set():
            self.released.set()
            self.conn.rollback() if connection.vendor != "sqlite" else self.conn.execute("ROLLBACK")
            self.conn.close()

    def release_after(self, seconds: float) -> None:
        threading.Timer(seconds, self.release).start()


@pytest.fixture
def busy_timeout():
    """Set this process's SQLite busy timeout (seconds) for the rest of the test."""
    options = connection.settings_dict["OPTIONS"]
    original = options.get("timeout")

    def set_to(seconds: float) -> None:
        if connection.vendor != "sqlite":
            return  # PostgreSQL waits on a lock; it has no busy timeout to shorten
        options["timeout"] = seconds
        connection.close()  # the next query reconnects with it

    yield set_to
    if original is not None:
        options["timeout"] = original
    connection.close()


def run_with_locked_commit(monkeypatch, adventure, *, hold: float | None):
    """Run one turn in this process; the database is write-locked by another connection as the
    turn reaches its commit, and released after `hold` seconds (None: when the job is failed)."""
    lock: list[WriteLock] = []
    commit_turn = turns.ctx.commit_turn

    def locked_commit(**kwargs):
        if not lock:
            lock.append(WriteLock())
            if hold is not None:
                lock[0].release_after(hold)
        return commit_turn(**kwargs)

    finish = turns._finish

    def release_then_finish(*args, **kwargs):
        if lock:
            lock[0].release()
        return finish(*args, **kwargs)

    monkeypatch.setattr(turns.ctx, "commit_turn", locked_commit)
    monkeypatch.setattr(turns, "_finish", release_then_finish)
    fresh = Adventure.objects.get(pk=adventure.pk)
    job = TurnJob.objects.create(
        adventure=fresh, kind="do", player_input="I ring the bell.", expected_head=fresh.head,
        expected_version=fresh.version,
    )  # fmt: skip
    try:
        turns.turn_run(job.pk)
    finally:
        if lock:
            lock[0].release()
    assert lock, "the turn never reached its commit"
    job.refresh_from_db()
    return job


@pytest.mark.parametrize(
    ("timeout", "hold", "outcome"),
    [
        pytest.param(3.0, 0.5, "done", id="released-within-the-busy-timeout"),
        pytest.param(0.3, 1.5, "done", id="released-after-the-busy-timeout"),
        pytest.param(0.2, None, "failed", id="held-until-the-turn-gives-up"),
    ],
)
def test_the_database_locked_while_a_turn_commits(
    api, adventure, redis_url, monkeypatch, busy_timeout, timeout, hold, outcome
):
    if connection.vendor != "sqlite" and outcome == "failed":
        pytest.skip("PostgreSQL waits for a lock rather than reporting busy")
    busy_timeout(timeout)
    before = snapshot(adventure)
    job = run_with_locked_commit(monkeypatch, adventure, hold=hold)
    assert job.status == outcome, (job.error_code, job.error_message)
    if outcome == "done":
        fresh = Adventure.objects.get(pk=adventure.pk)
        assert fresh.head_id == job.result_node_id and fresh.version == before[1] + 1
    else:
        assert job.error_code == "database_busy" and "Nothing was saved" in job.error_message
        assert job.result_node_id is None and snapshot(adventure) == before
    assert check_adventure(adventure) == []
    # The database is free again: the next turn works.
    monkeypatch.undo()
    after = snapshot(adventure)
    response = api.play(adventure)
    assert api.job(response.json()["id"])["status"] == "done"
    assert snapshot(adventure)[2] == after[2] + 1
