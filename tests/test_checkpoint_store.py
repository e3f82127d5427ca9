"""The checkpoint store: the nearest usable row in one path query, validation on read
(every corrupted field is a cache miss that the next turn rebuilds), broken ancestry as a
hard error, cache deletion changing nothing a player sees, invariant 5, and the commit."""

from __future__ import annotations

import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import store
from checkpoints.budget import ContextError
from checkpoints.context import (
    TURN_TOOLS,
    CheckpointMismatch,
    build_dynamic_tail,
    commit_turn,
    compact_now,
    context_report,
    prepare,
)
from checkpoints.hashing import summary_digest
from checkpoints.integrity import check
from checkpoints.models import ContextCheckpoint
from checkpoints.prompt import (
    BrokenAncestry,
    checkpoint_part,
    checkpoint_tokens,
    current_stable_prefix_hash,
    turn_budget,
)
from checkpoints.testing import make_profile, play, snapshot, use_profile
from stories import paths, tree
from stories.integrity import check_adventure
from stories.models import Adventure, Node
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model):
    # No password: hashing one costs ~0.4 s per test, and nobody signs in here.
    return django_user_model.objects.create(username="owner")


@pytest.fixture
def other_owner(django_user_model):
    return django_user_model.objects.create(username="other")


@pytest.fixture
def profile():
    return make_profile("store-window", context_window=9_000, max_output_tokens=1_024)


@pytest.fixture
def story(owner, profile):
    """60 nodes on one branch, compacted at the head."""
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), profile)
    result = compact_now(adventure)
    assert result.created
    return adventure, result.checkpoint


def nearest(adventure: Adventure, head: Node | None = None):
    adventure = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
    head = head or Node.objects.select_related("branch").get(pk=adventure.head_id)
    return store.nearest_usable(
        adventure,
        head,
        stable_prefix_hash=current_stable_prefix_hash(adventure),
        model_name=store.model_identity(adventure.model_profile),
        max_summary_tokens=turn_budget(adventure, TURN_TOOLS).summary_cap,
    )


def reseal(cp: ContextCheckpoint, **summary) -> None:
    """Rewrite the summary with a consistent digest and size (a well-formed forgery)."""
    cp.summary_json = {**cp.summary_json, **summary}
    cp.summary_json["digest"] = summary_digest(
        summary=cp.summary_json["summary"],
        key_points=cp.summary_json["key_points"],
        classification=cp.summary_json["classification"],
        source_hash=cp.source_hash,
    )
    cp.summary_bytes = checkpoint_tokens(checkpoint_part(cp.summary_json, cp.covered_depth))


def test_the_nearest_checkpoint_is_one_query_whatever_the_forks(owner, profile, django_assert_num_queries):
    adventure = use_profile(build_story(nodes=400, forks=40, bytes_per_node=200, owner=owner), profile)
    checkpoint = compact_now(adventure).checkpoint
    head = Node.objects.select_related("branch").get(pk=adventure.head_id)
    with django_assert_num_queries(1):
        assert paths.nearest(store.candidates(adventure), head) == checkpoint
    # Validation adds the covered path read (chunks of 500 depths), never a per-node walk.
    with CaptureQueriesContext(connection) as queries:
        found, misses = nearest(adventure, head)
    assert found == checkpoint and misses == []
    assert len(queries) <= 6 + math.ceil(checkpoint.covered_depth / 500), [q["sql"][:80] for q in queries]


def test_a_verified_checkpoint_is_not_reread_on_every_turn(story):
    adventure, checkpoint = story
    adventure = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
    head = Node.objects.select_related("branch").get(pk=adventure.head_id)
    expectations = {
        "stable_prefix_hash": current_stable_prefix_hash(adventure),
        "model_name": store.model_identity(adventure.model_profile),
        "max_summary_tokens": turn_budget(adventure, TURN_TOOLS).summary_cap,
    }
    with CaptureQueriesContext(connection) as first:
        assert store.nearest_usable(adventure, head, **expectations) == (checkpoint, [])
    with CaptureQueriesContext(connection) as again:
        assert store.nearest_usable(adventure, head, **expectations) == (checkpoint, [])
    # The covered path was read once; now only the one nearest query remains.
    assert len(again) == 1 < len(first)
    # A changed row is a different fact: verified again (and here, found wrong).
    checkpoint.source_hash = "e" * 64
    reseal(checkpoint)
    checkpoint.save()
    _found, misses = store.nearest_usable(adventure, head, **expectations)
    assert [m.reason for m in misses] == ["source_hash_mismatch"]


def test_deleting_every_checkpoint_changes_nothing_a_player_sees(owner, profile):
    adventure = use_profile(build_story(nodes=50, forks=3, bytes_per_node=300, owner=owner), profile)
    for index in range(8):
        play(adventure, f"I search the warehouse, row {index}.")
    assert ContextCheckpoint.objects.filter(adventure=adventure).count() >= 2
    assert check_adventure(adventure) == []
    before = snapshot(adventure)
    ContextCheckpoint.objects.all().delete()
    assert snapshot(adventure) == before
    assert check_adventure(adventure) == []
    # The next turn simply rebuilds what it needs.
    turn = play(adventure, "I leave.")
    assert turn.prepared.pending_checkpoint is not None and turn.prepared.pending_checkpoint.pk
    after = snapshot(adventure)
    assert after["story"][: len(before["story"])] == before["story"]


def _other(cp):
    return Node.objects.get(pk=cp.covered_through.parent_id)


CORRUPTIONS = {
    "checkpoint schema version": (lambda cp: setattr(cp, "checkpoint_schema_version", 99), "schema_version"),
    "prompt schema version": (lambda cp: setattr(cp, "prompt_schema_version", 2), "schema_version"),
    "stable prefix hash": (lambda cp: setattr(cp, "stable_prefix_hash", "0" * 64), "stable_prefix_changed"),
    "model name": (lambda cp: setattr(cp, "model_name", "openai:another-model"), "model_changed"),
    "source hash": (lambda cp: setattr(cp, "source_hash", "f" * 64), "summary_digest"),
    "forged source hash": (lambda cp: (setattr(cp, "source_hash", "f" * 64), reseal(cp)), "source_hash_mismatch"),
    "summary text": (lambda cp: cp.summary_json.update(summary="Someone else's story."), "summary_digest"),
    "classification": (lambda cp: reseal(cp, classification="authoritative"), "summary_classification"),
    "unknown summary field": (lambda cp: cp.summary_json.update(state={"flags": {}}), "summary_shape"),
    "blank summary": (lambda cp: reseal(cp, summary="   "), "summary_blank"),
    "summary bytes": (lambda cp: setattr(cp, "summary_bytes", cp.summary_bytes + 1), "summary_size_mismatch"),
    "oversize summary": (lambda cp: reseal(cp, summary="word " * 4000), "oversize"),
    "covered depth": (lambda cp: setattr(cp, "covered_depth", cp.covered_depth - 1), "bad_range"),
    "covered node": (lambda cp: setattr(cp, "covered_through", _other(cp)), "bad_range"),
    "shifted range": (
        lambda cp: (
            setattr(cp, "retained_from", cp.covered_through),
            setattr(cp, "covered_through", _other(cp)),
            setattr(cp, "covered_depth", cp.covered_depth - 1),
            reseal(cp),
        ),
        "source_hash_mismatch",
    ),
    "retained node": (lambda cp: setattr(cp, "retained_from", None), "bad_range"),
    "host coordinate": (lambda cp: setattr(cp, "depth", cp.depth - 1), "bad_range"),
    "invalidated": (lambda cp: setattr(cp, "invalidated", True), "invalidated"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_each_corrupted_field_is_a_cache_miss_and_is_rebuilt(story, monkeypatch, name):
    adventure, checkpoint = story
    corrupt, reason = CORRUPTIONS[name]
    corrupt(checkpoint)
    checkpoint.save()
    bad_summary = checkpoint.summary_json.get("summary")

    found, misses = nearest(adventure)
    assert found is None
    assert [(m.checkpoint_id, m.reason) for m in misses] == [(checkpoint.pk, reason)]

    turn = play(adventure, "I count the crates again.")
    assert all(bad_summary not in (m["content"] or "") for m in turn.prepared.messages)
    rebuilt = turn.prepared.pending_checkpoint
    assert rebuilt is not None and rebuilt.pk is not None
    found, misses = nearest(adventure)
    assert found == rebuilt and misses == []
    # The broken row was on the same host: it was replaced, not left to miss again.
    assert not ContextCheckpoint.objects.filter(pk=checkpoint.pk).exists()


def test_a_miss_falls_back_to_the_next_older_checkpoint_on_the_path(owner, profile):
    adventure = use_profile(build_story(nodes=70, bytes_per_node=300, owner=owner), profile)
    older = compact_now(adventure, paths.node_at(adventure.head, 45)).checkpoint
    newer = compact_now(adventure).checkpoint
    assert older.host_node.depth == 45 and newer.host_node_id == adventure.head_id
    assert newer.covered_depth > older.covered_depth
    newer.summary_json["summary"] = "tampered"
    newer.save()
    found, misses = nearest(adventure)
    assert found == older
    assert [m.reason for m in misses] == ["summary_digest"]


def test_broken_ancestry_is_a_hard_error_not_a_miss(story):
    adventure, checkpoint = story
    covered = checkpoint.covered_through
    grandparent = Node.objects.get(pk=Node.objects.get(pk=covered.parent_id).parent_id)
    Node.objects.filter(pk=covered.pk).update(parent_id=grandparent.pk)
    with pytest.raises(BrokenAncestry) as raised:
        nearest(adventure)
    assert raised.value.code == "broken_ancestry"
    with pytest.raises(BrokenAncestry):
        play(adventure, "I go on.")
    assert any(v.code.startswith("checkpoint") for v in check_adventure(adventure))
    # The context panel says so instead of failing.
    assert context_report(adventure)["error"]["code"] == "broken_ancestry"


def test_a_broken_verbatim_tail_is_a_hard_error(owner):
    adventure = tree.adventure_create(owner=owner, title="Tail", premise="A road.")
    for text in ["I walk.", "I walk on.", "I rest."]:
        play(adventure, text)
    head = Adventure.objects.get(pk=adventure.pk).head
    Node.objects.filter(pk=head.pk).update(parent_id=head.parent.parent_id)
    with pytest.raises(BrokenAncestry):
        play(adventure, "I stand.")


def test_a_checkpoint_on_an_undone_attempt_is_never_used(owner, profile):
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), profile)
    checkpoint = compact_now(adventure).checkpoint
    tip = adventure.head
    tree.undo(adventure=adventure, expected_version=Adventure.objects.get(pk=adventure.pk).version)
    turn = play(adventure, "I choose differently.")
    assert turn.node.depth == tip.depth and turn.node.branch_id == tip.branch_id  # a new attempt beside the tip
    assert not Node.objects.get(pk=tip.pk).live
    assert turn.prepared.checkpoint != checkpoint
    found, _misses = nearest(adventure)
    assert found != checkpoint


def test_the_integrity_check_recomputes_each_checkpoint(story):
    adventure, checkpoint = story
    assert check(adventure) == [] and check_adventure(adventure) == []
    ContextCheckpoint.objects.filter(pk=checkpoint.pk).update(source_hash="e" * 64)
    assert "checkpoint_source_hash" in [v.code for v in check(adventure)]
    ContextCheckpoint.objects.filter(pk=checkpoint.pk).update(
        source_hash=checkpoint.source_hash, covered_depth=checkpoint.covered_depth + 1
    )
    assert [v.code for v in check(adventure)] == ["checkpoint_range"]
    assert "checkpoint_range" in [v.code for v in check_adventure(adventure)]


# --- committing ------------------------------------------------------------------------------


def _pending(adventure):
    adventure = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
    head = adventure.head
    tail = build_dynamic_tail(adventure, head=head, kind="do", text="I look.", state=head.state_after)
    prepared = prepare(adventure=adventure, head=head, dynamic_tail=tail, tools=TURN_TOOLS)
    assert prepared.pending_checkpoint is not None and prepared.pending_checkpoint.pk is None
    return adventure, prepared


def _content(text="I look."):
    return {
        "kind": "do",
        "player_input": text,
        "narration": "You look.",
        "suggestions": [],
        "state_delta": [],
        "state_after": {},
        "checks": [],
    }


def _state(adventure):
    fresh = Adventure.objects.get(pk=adventure.pk)
    return fresh.head_id, fresh.version, Node.objects.count(), ContextCheckpoint.objects.count()


def test_a_pending_checkpoint_lands_with_its_node_in_one_transaction(owner, profile):
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), profile)
    adventure, prepared = _pending(adventure)
    host = adventure.head_id
    node = commit_turn(
        adventure=adventure,
        expected_version=adventure.version,
        pending_checkpoint=prepared.pending_checkpoint,
        write_node=lambda: tree.node_append(adventure=adventure, expected_version=adventure.version, **_content()),
    )
    saved = ContextCheckpoint.objects.get()
    assert saved.host_node_id == node.parent_id == host
    assert Adventure.objects.get(pk=adventure.pk).head_id == node.pk


def test_a_pending_checkpoint_that_does_not_belong_under_the_node_lands_nothing(owner, profile):
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), profile)
    adventure, prepared = _pending(adventure)
    before = _state(adventure)
    head = adventure.head
    with pytest.raises(CheckpointMismatch):
        commit_turn(
            adventure=adventure,
            expected_version=adventure.version,
            pending_checkpoint=prepared.pending_checkpoint,
            # A sibling of the head: its parent is not the checkpoint's host.
            write_node=lambda: tree.sibling_branch_add(
                adventure=adventure, target=head, expected_version=adventure.version, **_content()
            ),
        )
    assert _state(adventure) == before
    assert prepared.pending_checkpoint.pk is None


def test_a_stale_version_or_a_cancel_at_commit_lands_nothing(owner, profile):
    from stories.llm.errors import ModelCancelled
    from stories.tree import StaleVersion

    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), profile)
    adventure, prepared = _pending(adventure)
    before = _state(adventure)
    with pytest.raises(StaleVersion):
        commit_turn(
            adventure=adventure,
            expected_version=adventure.version - 1,
            pending_checkpoint=prepared.pending_checkpoint,
            write_node=lambda: tree.node_append(adventure=adventure, expected_version=None, **_content()),
        )
    with pytest.raises(ModelCancelled):
        commit_turn(
            adventure=adventure,
            expected_version=adventure.version,
            pending_checkpoint=prepared.pending_checkpoint,
            write_node=lambda: tree.node_append(adventure=adventure, expected_version=adventure.version, **_content()),
            cancel=lambda: True,
        )
    assert _state(adventure) == before


def test_the_host_keeps_the_better_checkpoint(owner, profile):
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), profile)
    adventure, prepared = _pending(adventure)
    pending = prepared.pending_checkpoint
    # An existing valid row on the same host that covers more wins; the pending one is dropped.
    better = compact_now(adventure).checkpoint
    assert better.host_node_id == pending.host_node_id
    ContextCheckpoint.objects.filter(pk=better.pk).update(covered_depth=better.covered_depth)  # unchanged, valid
    if better.covered_depth >= pending.covered_depth:
        assert store.save_checkpoint(pending) == better
    # An unusable existing row is replaced even when the pending one covers no more.
    ContextCheckpoint.objects.filter(pk=better.pk).update(invalidated=True)
    saved = store.save_checkpoint(pending)
    assert saved is pending and saved.pk is not None
    assert list(ContextCheckpoint.objects.values_list("pk", flat=True)) == [pending.pk]


def test_compact_now_refuses_a_node_of_another_story(owner, profile, other_owner):
    adventure = use_profile(build_story(nodes=10, bytes_per_node=100, owner=owner), profile)
    other = build_story(nodes=10, bytes_per_node=100, owner=other_owner)
    with pytest.raises(ContextError):
        compact_now(adventure, other.head)
