"""Every deletion form of the retention contract (docs/retention.md), each proven the same way
(DESIGN.md, Retention): build the tree with real turns, delete, then (a) the head still
plays, (b) every branch tip composes the same prompt, byte for byte, (c) regenerate from an
older node works, (d) no orphan rows remain and nothing protected went.

The extreme form, deleting every checkpoint of an adventure, is not something a pass does:
it is the cache guarantee (a tip may then have to compact again, so its prompt is rebuilt
rather than byte-identical); what a player sees through the API stays byte-identical and
the next turn rebuilds what it needs.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints import retention
from checkpoints.models import ContextCheckpoint
from checkpoints.testing import snapshot
from stories import paths, turns
from stories.models import Adventure, Node, TurnJob
from tests.test_retention import (
    assert_no_orphans,
    branch_tips,
    compositions,
    encoded,
    fresh,
    grow,
    prove_safe,
    small_profile,
    turn,
    version,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


@pytest.fixture
def small():
    return small_profile()


def rows(adventure: Adventure) -> set[int]:
    return set(ContextCheckpoint.objects.filter(adventure=adventure).values_list("pk", flat=True))


def test_unreferenced_checkpoints_are_deleted_and_nothing_else_changes(owner, small, redis_url):
    adventure = grow(owner, small)
    prompts, story = compositions(adventure), snapshot(adventure)
    plan = retention.plan(adventure)

    report = retention.prune_adventure(adventure=adventure)

    assert report.reasons == {"unreferenced": len(plan.reclaimable_checkpoints)} and plan.reclaimable_checkpoints
    assert rows(adventure) == plan.protected_checkpoints
    assert report.checkpoints.after.rows == report.checkpoints.before.rows - report.checkpoints.reclaimable.rows
    prove_safe(adventure, prompts=prompts, story=story, kept=plan.protected_checkpoints)


def test_invalid_checkpoints_are_deleted_even_where_they_were_nearest(owner, small, redis_url):
    adventure = grow(owner, small)
    head = fresh(adventure).head
    # The operator invalidates the checkpoint the head's turn uses (the admin action), and one
    # superseded row is corrupted (a forged summary: its digest no longer matches).
    nearest = retention.plan(adventure)
    used_by_head = next(
        cp for cp in ContextCheckpoint.objects.filter(pk__in=nearest.protected_checkpoints)
        if cp.host_node.live and cp.branch_id == head.branch_id
    )  # fmt: skip
    ContextCheckpoint.objects.filter(pk=used_by_head.pk).update(invalidated=True)
    corrupt = ContextCheckpoint.objects.get(pk=nearest.reclaimable_checkpoints[0])
    corrupt.summary_json = {**corrupt.summary_json, "summary": "A forged summary."}
    corrupt.save(update_fields=["summary_json"])
    # Composed after the damage: the head's turn no longer uses the invalidated row.
    prompts, story = compositions(adventure), snapshot(adventure)
    plan = retention.plan(adventure)
    assert used_by_head.pk not in plan.protected_checkpoints

    report = retention.prune_adventure(adventure=adventure)

    assert report.reasons["invalidated"] == 1 and report.reasons["summary_digest"] == 1
    assert not ContextCheckpoint.objects.filter(pk__in=[used_by_head.pk, corrupt.pk]).exists()
    assert rows(adventure) == plan.protected_checkpoints
    prove_safe(adventure, prompts=prompts, story=story, kept=plan.protected_checkpoints)


def test_a_model_change_makes_every_checkpoint_invalid_and_the_pass_takes_them_all(owner, small, redis_url):
    adventure = grow(owner, small)
    small.model_name = "another-model"
    small.save(update_fields=["model_name"])
    prompts, story = compositions(adventure), snapshot(adventure)
    count = len(rows(adventure))

    report = retention.prune_adventure(adventure=adventure)

    assert report.reasons == {"model_changed": count} and rows(adventure) == set()
    prove_safe(adventure, prompts=prompts, story=story, kept=set())


def test_old_finished_jobs_are_deleted_but_never_pending_or_retryable_ones(owner, small, redis_url, settings):
    settings.STORYTREE_JOB_RETENTION_DAYS = 7
    adventure = grow(owner, small)
    prompts, story = compositions(adventure), snapshot(adventure)
    now = timezone.now()
    old = now - timedelta(days=8)
    done = list(TurnJob.objects.filter(adventure=adventure, status=TurnJob.Status.DONE).order_by("pk"))
    aged, recent = done[: len(done) // 2], done[len(done) // 2 :]
    TurnJob.objects.filter(pk__in=[j.pk for j in aged]).update(finished_at=old)
    head, current = fresh(adventure).head, version(adventure)

    def job(status, finished_at, expected_version, **fields):
        return TurnJob.objects.create(
            adventure=adventure, kind="do", status=status, finished_at=finished_at, expected_head=head,
            expected_version=expected_version, **fields,
        )  # fmt: skip

    stale_failure = job(TurnJob.Status.FAILED, old, current - 3, error_code="timeout")
    retryable = job(TurnJob.Status.FAILED, old, current, error_code="timeout")  # job_retry still accepts it
    queued = job(TurnJob.Status.QUEUED, None, current)
    TurnJob.objects.filter(pk=queued.pk).update(created_at=old)  # pending work is never "old"
    never_finished_at = job(TurnJob.Status.CANCELLED, None, current - 1)  # no age known: kept

    report = retention.prune_adventure(adventure=adventure)

    expected = {j.pk for j in aged} | {stale_failure.pk}
    assert report.jobs.reclaimable.rows == len(expected) and report.jobs.reclaimable.bytes > 0
    assert not TurnJob.objects.filter(pk__in=expected).exists()
    kept = {j.pk for j in recent} | {retryable.pk, queued.pk, never_finished_at.pk}
    assert set(TurnJob.objects.filter(adventure=adventure).values_list("pk", flat=True)) == kept
    assert report.jobs.after.rows == len(kept)
    assert retention.prune_adventure(adventure=adventure).jobs.reclaimable.rows == 0

    # The pending job is still there to cancel; the retryable one can still be retried.
    assert turns.job_cancel(queued).status == TurnJob.Status.CANCELLED
    prove_safe(adventure, prompts=prompts, story=story, kept=retention.plan(adventure).protected_checkpoints)
    # Once the story moved on, the failed job is no longer retryable and goes with the next pass.
    assert retention.prune_adventure(adventure=adventure).jobs.reclaimable.rows == 1
    assert not TurnJob.objects.filter(pk=retryable.pk).exists()


def api_pages(client, adventure: Adventure) -> dict[str, bytes]:
    head = fresh(adventure).head
    last_job = TurnJob.objects.filter(adventure=adventure).order_by("-pk").first()
    base = f"/api/v1/adventures/{adventure.pk}"
    urls = [
        "/api/v1/adventures",
        base,
        f"{base}/story?limit=200",
        f"{base}/story?limit=10&before={head.pk}",
        f"{base}/branches",
        f"{base}/memories",
        f"{base}/world-entries",
        f"{base}/export",
        f"/api/v1/nodes/{head.pk}/attempts",
        f"/api/v1/nodes/{head.parent_id}/attempts",
        f"/api/v1/jobs/{last_job.pk}",
    ]
    pages = {}
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        pages[url] = b"".join(response.streaming_content) if response.streaming else response.content
    return pages


def test_deleting_every_checkpoint_changes_nothing_a_player_sees(owner, small, redis_url, client):
    adventure = grow(owner, small)
    client.force_login(owner)
    pages, story = api_pages(client, adventure), snapshot(adventure)
    context = client.get(f"/api/v1/adventures/{adventure.pk}/context").json()
    assert context["checkpoint"] is not None
    tips = branch_tips(adventure)
    before = {tip.pk: encoded(adventure, tip) for tip in tips}

    ContextCheckpoint.objects.filter(adventure=adventure).delete()

    assert api_pages(client, adventure) == pages  # story, heads, state, branches, attempts, jobs, export
    assert snapshot(adventure) == story
    assert_no_orphans(adventure)
    # Only the context panel, which reports the cache itself, shows the difference.
    assert client.get(f"/api/v1/adventures/{adventure.pk}/context").json()["checkpoint"] is None
    # Every tip still composes (compacting again where it must): the same stable prefix, the
    # same newest nodes verbatim, the same dynamic tail.
    for tip in tips:
        after = encoded(adventure, tip)
        old, new = json.loads(before[tip.pk]), json.loads(after)
        assert new[0] == old[0] and new[-1] == old[-1] and new[-2] == old[-2]  # prefix, tail, newest narration
        newest = [json.loads(messages[-3]["content"])["raw_tail"] for messages in (old, new)]
        assert newest[0] == newest[1]  # the newest node verbatim (a summary may ride on its message)
    # The next turn rebuilds what it needs; regenerate from an older node works.
    assert rows(adventure) == set()
    turn(adventure, text="I go on without a summary.")
    assert rows(adventure), "the turn compacted again and committed its checkpoint"
    assert client.get(f"/api/v1/adventures/{adventure.pk}/context").json()["checkpoint"] is not None
    head = fresh(adventure).head
    older = paths.node_at(head, head.depth - 6)
    regenerated = turn(adventure, kind="regenerate", node=older, text="")
    assert Node.objects.get(pk=regenerated.result_node_id).regenerated_from_id == older.pk
    assert_no_orphans(adventure)
