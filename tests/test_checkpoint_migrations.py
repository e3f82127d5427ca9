"""The checkpoint table is a cache in its own app: migrating it away (the schema before
checkpoints) and back leaves every story byte-identical, and stories keep playing. A
compaction interrupted part-way leaves no checkpoint, and the next attempt redoes it."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from checkpoints.context import compact_now
from checkpoints.models import ContextCheckpoint
from checkpoints.testing import make_profile, play, snapshot, use_profile
from stories.integrity import check_adventure
from stories.llm.errors import ModelCancelled, ModelUnavailable
from stories.synthetic import build_story

TABLE = ContextCheckpoint._meta.db_table


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_migrating_checkpoints_to_zero_and_back_leaves_every_story_byte_identical(owner):
    profile = make_profile("migration-window", context_window=9_000, max_output_tokens=1_024)
    adventures = [
        use_profile(build_story(nodes=50, forks=2, bytes_per_node=300, owner=owner), profile) for _ in range(2)
    ]
    for adventure in adventures:
        for index in range(4):
            play(adventure, f"I check the moorings, rope {index}.")
    assert ContextCheckpoint.objects.count() >= 2
    before = [snapshot(adventure) for adventure in adventures]
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("checkpoints")
    try:
        migrate([("checkpoints", None)])
        assert TABLE not in connection.introspection.table_names()
        assert [snapshot(adventure) for adventure in adventures] == before
    finally:
        migrate(latest)
    assert TABLE in connection.introspection.table_names()
    assert ContextCheckpoint.objects.count() == 0
    assert [snapshot(adventure) for adventure in adventures] == before
    # Playing on rebuilds the cache.
    turn = play(adventures[0], "I cast off.")
    assert turn.prepared.pending_checkpoint is not None and ContextCheckpoint.objects.count() == 1
    assert check_adventure(adventures[0]) == []


def summary_requests(fake, start: int) -> list[dict]:
    return [
        json.loads(r.body["messages"][-1]["content"])["summary_request"]
        for r in fake.requests[start:]
        if [t["function"]["name"] for t in r.body.get("tools", [])] == ["submit_context_summary"]
    ]


@pytest.mark.django_db
def test_an_interrupted_compaction_leaves_nothing_and_the_next_attempt_redoes_it(owner, fake_openai):
    adventure = use_profile(build_story(nodes=300, bytes_per_node=250, owner=owner), fake_openai.profile())
    before = snapshot(adventure)

    # The model fails on chunk 2.
    fake_openai.add_tool_call("submit_context_summary", {"summary": "Chunk one.", "key_points": []})
    fake_openai.add_error(500)
    with pytest.raises(ModelUnavailable):
        compact_now(adventure)
    assert len(summary_requests(fake_openai, 0)) == 2
    assert not ContextCheckpoint.objects.exists() and snapshot(adventure) == before

    # Cancelled between chunks 2 and 3.
    progress: list[tuple[int, int]] = []
    start = len(fake_openai.requests)
    with pytest.raises(ModelCancelled):
        compact_now(adventure, on_progress=lambda d, t: progress.append((d, t)), cancel=lambda: len(progress) > 2)
    assert len(summary_requests(fake_openai, start)) == 2
    assert not ContextCheckpoint.objects.exists() and snapshot(adventure) == before

    # The next attempt starts over from the root and finishes.
    start = len(fake_openai.requests)
    result = compact_now(adventure)
    requests = summary_requests(fake_openai, start)
    assert result.created and len(requests) == result.calls == progress[0][1]
    assert requests[0]["previous_summary"] is None and requests[0]["nodes"][0]["depth"] == 0
    assert ContextCheckpoint.objects.count() == 1
