"""Failure semantics of compaction: cancelled, timed-out, rate-limited or malformed
compression writes no node and no checkpoint and leaves the head where it was — in a
turn, in the real turn pipeline, and in a "compact" job. Plus the two commands."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from checkpoints.models import ContextCheckpoint
from checkpoints.tasks import compact_adventure_task
from checkpoints.testing import play, use_profile
from stories import tree
from stories.llm.errors import ModelCancelled, ModelError, ModelMalformed, ModelRateLimited, ModelTimeout
from stories.models import Adventure, Node, TurnJob
from stories.synthetic import build_story
from stories.tree import StaleVersion

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


@pytest.fixture
def story(owner, fake_openai):
    """A story long enough that its next turn must compact first (several chunks)."""
    profile = fake_openai.profile(timeout_seconds=0.5)
    return use_profile(build_story(nodes=150, bytes_per_node=250, owner=owner), profile)


def state(adventure):
    fresh = Adventure.objects.get(pk=adventure.pk)
    return (
        fresh.head_id,
        fresh.version,
        Node.objects.filter(adventure=adventure).count(),
        ContextCheckpoint.objects.count(),
    )


def ok(fake):
    fake.add_tool_call("submit_context_summary", {"summary": "So far, so good.", "key_points": []})


FAILURES = {
    "timed out": (lambda fake: fake.add_delay(2.0), ModelTimeout),
    "rate limited": (lambda fake: fake.add_error(429, retry_after="3"), ModelRateLimited),
    "plain text": (lambda fake: fake.add_text("Here is a summary in prose."), ModelMalformed),
    "bad arguments": (lambda fake: fake.add_raw_arguments("submit_context_summary", '{"summary": 5}'), ModelMalformed),
    "cut off": (lambda fake: fake.add_truncated("submit_context_summary"), ModelMalformed),
    "rate limited on chunk 2": (lambda fake: (ok(fake), fake.add_error(429)), ModelRateLimited),
}


@pytest.mark.parametrize("name", list(FAILURES))
def test_failed_compression_writes_nothing_and_the_head_stays(story, fake_openai, name):
    script, error = FAILURES[name]
    before = state(story)
    script(fake_openai)
    with pytest.raises(error):
        play(story, "I go on.")
    assert state(story) == before
    # The model never narrated: the turn stopped at compaction.
    assert all("submit_turn_plan" not in r.raw for r in fake_openai.requests)


def test_a_cancelled_compression_writes_nothing(story, fake_openai):
    before = state(story)
    progress: list[tuple[int, int]] = []
    with pytest.raises(ModelCancelled):
        play(story, "I go on.", on_progress=lambda d, t: progress.append((d, t)), cancel=lambda: len(progress) > 1)
    assert state(story) == before and progress[:2] == [(0, progress[0][1]), (1, progress[0][1])]


def test_a_narration_failure_after_compaction_drops_the_pending_checkpoint(story, fake_openai):
    before = state(story)
    with pytest.raises(ModelError):
        play(story, "I go on.", before_chat=lambda prepared: fake_openai.add_error(503))
    assert state(story) == before


def test_a_head_moved_during_the_turn_lands_nothing(story, fake_openai):
    def elsewhere(prepared):
        # Another tab undoes while this turn is being written.
        tree.undo(adventure=story, expected_version=Adventure.objects.get(pk=story.pk).version)

    with pytest.raises(StaleVersion):
        play(story, "I go on.", before_chat=elsewhere)
    assert ContextCheckpoint.objects.count() == 0
    assert Node.objects.filter(adventure=story, player_input="I go on.").count() == 0


def test_the_real_turn_pipeline_fails_cleanly_when_compression_fails(story, fake_openai, redis_url):
    from stories.turns import turn_run

    before = state(story)
    adventure = Adventure.objects.get(pk=story.pk)
    job = TurnJob.objects.create(
        adventure=adventure,
        kind="do",
        player_input="I go on.",
        expected_head=adventure.head,
        expected_version=adventure.version,
    )
    fake_openai.add_error(429, retry_after="5")
    turn_run(job.pk)
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "model_rate_limited")
    assert state(story) == before

    # Retried, it compacts (progress recorded) and commits node and checkpoint together.
    job2 = TurnJob.objects.create(
        adventure=adventure,
        kind="do",
        player_input="I go on.",
        expected_head=adventure.head,
        expected_version=adventure.version,
    )
    turn_run(job2.pk)
    job2.refresh_from_db()
    assert job2.status == "done", (job2.error_code, job2.error_message)
    assert job2.progress_total > 1 and job2.progress_done == job2.progress_total
    checkpoint = ContextCheckpoint.objects.get()
    assert checkpoint.host_node_id == before[0] == job2.result_node.parent_id


# --- the compact job ---------------------------------------------------------------------------


def compact_job(adventure, **fields) -> TurnJob:
    adventure = Adventure.objects.get(pk=adventure.pk)
    return TurnJob.objects.create(
        adventure=adventure,
        kind=TurnJob.Kind.COMPACT,
        target_node=adventure.head,
        expected_head=adventure.head,
        expected_version=adventure.version,
        **fields,
    )


def test_the_compact_job_records_progress_and_hosts_the_checkpoint_on_its_target(story, redis_url):
    job = compact_job(story)
    compact_adventure_task.delay(job.pk)
    job.refresh_from_db()
    assert (job.status, job.stage, job.error_code) == ("done", "finished", "")
    assert job.progress_total > 1 and job.progress_done == job.progress_total
    checkpoint = ContextCheckpoint.objects.get()
    assert checkpoint.host_node_id == job.target_node_id == job.result_node_id
    # A redelivered task finds the job claimed and does nothing.
    compact_adventure_task.delay(job.pk)
    assert ContextCheckpoint.objects.count() == 1


@pytest.mark.parametrize(
    ("script", "status", "code"),
    [
        (lambda fake: fake.add_error(429), "failed", "model_rate_limited"),
        (lambda fake: fake.add_text("no tool"), "failed", "model_malformed"),
        (lambda fake: (ok(fake), fake.add_delay(2.0)), "failed", "model_timeout"),
    ],
)
def test_a_failed_compact_job_saves_nothing(story, fake_openai, redis_url, script, status, code):
    before = state(story)
    script(fake_openai)
    job = compact_job(story)
    compact_adventure_task.delay(job.pk)
    job.refresh_from_db()
    assert (job.status, job.error_code) == (status, code)
    assert job.error_message and "fake error" not in job.error_message
    assert state(story) == before


def test_a_cancelled_compact_job_saves_nothing(story, redis_url):
    before = state(story)
    job = compact_job(story, cancel_requested=True)
    compact_adventure_task.delay(job.pk)
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("cancelled", "cancelled")
    assert state(story) == before


# --- the commands ------------------------------------------------------------------------------


def test_manage_compact_and_context_report(story, capsys, redis_url):
    call_command("context_report", str(story.pk))
    report = capsys.readouterr().out
    assert "hard input budget" in report and "the next turn compacts first" in report
    assert "ASSUMED" not in report

    call_command("compact", str(story.pk))
    out = capsys.readouterr().out
    checkpoint = ContextCheckpoint.objects.get()
    assert "chunk 1/" in out and f"checkpoint {checkpoint.pk} on node {checkpoint.host_node_id}" in out

    call_command("compact", str(story.pk), "--no-lock")
    assert "nothing to compact" in capsys.readouterr().out

    call_command("context_report", str(story.pk))
    report = capsys.readouterr().out
    assert f"checkpoint: {checkpoint.pk}" in report and "verbatim: depths" in report
