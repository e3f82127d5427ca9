"""Checkpoints follow the path: the root has none, a shared ancestor's is shared, a fork
before a checkpoint never sees it, regenerate's history ends at the target's parent, and
text that exists only on a sibling branch never reaches a request or a summary.

The offline narrator summarizes extractively (it copies the text it is sent), so a leak into
a summary request would show up in the stored summary too."""

from __future__ import annotations

import json

import pytest

from checkpoints.context import compact_now
from checkpoints.models import ContextCheckpoint
from checkpoints.testing import make_profile, play, record_builtin, use_profile
from stories import paths, tree
from stories.models import Adventure, Node
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


@pytest.fixture
def small():
    return make_profile("isolation-window", context_window=9_000, max_output_tokens=1_024)


def version(adventure) -> int:
    return Adventure.objects.get(pk=adventure.pk).version


def undo(adventure, times: int = 1) -> None:
    for _ in range(times):
        tree.undo(adventure=adventure, expected_version=version(adventure))


def raw_depths(messages) -> list[int]:
    return [json.loads(m["content"])["raw_tail"]["depth"] for m in messages[1:-1] if m["role"] == "user"]


def request_text(call) -> str:
    return json.dumps(call.messages, ensure_ascii=False) + json.dumps(call.arguments, ensure_ascii=False)


def test_the_root_has_no_checkpoint_and_sends_only_itself(owner):
    adventure = tree.adventure_create(owner=owner, title="Root", premise="A beginning.")
    turn = play(adventure, "I begin.")
    assert turn.prepared.checkpoint is None and turn.prepared.pending_checkpoint is None
    assert raw_depths(turn.prepared.messages) == [0]
    assert not ContextCheckpoint.objects.exists()


def test_a_shared_ancestor_shares_its_checkpoint_and_a_fork_before_it_never_sees_it(owner, small, monkeypatch):
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), small)
    shared = compact_now(adventure).checkpoint
    host = shared.host_node
    trunk = play(adventure, "I take the left stair.")
    play(adventure, "I keep climbing.")

    # Fork after the checkpoint: back to its host, then a different turn on a new branch.
    undo(adventure, 2)
    after = play(adventure, "I take the right stair.")
    assert after.node.branch_id != trunk.node.branch_id and after.node.parent_id == host.pk
    assert trunk.prepared.checkpoint == shared == after.prepared.checkpoint

    # Fork before the checkpoint: its host is not on this path, so it is never used.
    calls = record_builtin(monkeypatch)
    fork_depth = 40
    while Adventure.objects.get(pk=adventure.pk).head.depth > fork_depth:
        undo(adventure)
    before = play(adventure, "I jump from the window instead.")
    assert before.node.depth == fork_depth + 1 and before.node.branch_id not in (host.branch_id, after.node.branch_id)
    assert before.prepared.checkpoint != shared
    assert all(
        m.get("content") is None or shared.summary_json["summary"] not in m["content"] for m in before.prepared.messages
    )
    # Its own compaction summarized only its own path (the trunk up to the fork).
    summary_nodes = [
        node["depth"] for call in calls if "submit_context_summary" in call.tools
        for node in json.loads(call.messages[-1]["content"])["summary_request"]["nodes"]
    ]  # fmt: skip
    assert summary_nodes and max(summary_nodes) <= fork_depth
    pending = before.prepared.pending_checkpoint
    assert pending is not None and pending.host_node_id == before.node.parent_id
    assert paths.on_path(Node.objects.get(pk=after.node.pk), pending.host_node)  # a shared ancestor for both


def test_regenerate_ends_history_at_the_target_parent_and_reuses_its_outcomes(owner, small):
    adventure = use_profile(tree.adventure_create(owner=owner, title="Regen", premise="A ruined tower."), small)
    for text in ["I look up at the tower.", "I walk to its door.", "I climb the broken wall!"]:
        play(adventure, text)
    target = Adventure.objects.get(pk=adventure.pk).head
    assert target.checks and {"roll", "dc"} <= set(target.checks[0])  # an exact, private record
    play(adventure, "I look around from the top.")

    regenerated = play(adventure, regenerate=target)
    messages = regenerated.prepared.messages
    assert raw_depths(messages)[-1] == target.parent.depth
    assert all(target.narration not in (m["content"] or "") for m in messages)
    tail = json.loads(messages[-1]["content"])["dynamic_tail"]
    assert tail["input"] == {"kind": target.kind, "text": target.player_input}
    assert tail["fixed_outcomes"] == [{"skill": target.checks[0]["skill"], "outcome": target.checks[0]["outcome"]}]
    assert str(target.checks[0]["seed"]) not in json.dumps(messages)
    assert [t.name for t in regenerated.prepared.tools] == ["submit_turn_plan"]  # no new roll
    node = regenerated.node
    assert node.parent_id == target.parent_id and node.branch_id != target.branch_id
    assert node.regenerated_from_id == target.pk and node.state_after == target.state_after
    assert node.checks == target.checks
    assert Node.objects.get(pk=target.pk).narration == target.narration  # the old line is untouched


def test_regenerate_after_compaction_hosts_its_checkpoint_on_the_target_parent(owner, small):
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), small)
    target = play(adventure, "I cross the yard.").node
    play(adventure, "I open the gate.")
    play(adventure, "I step through.")
    # With the cache gone, regenerating must compact again: on the target's parent, never past it.
    ContextCheckpoint.objects.all().delete()
    regenerated = play(adventure, regenerate=target)
    pending = regenerated.prepared.pending_checkpoint
    assert pending is not None and pending.pk is not None
    assert pending.host_node_id == target.parent_id and pending.covered_depth < target.depth - 1
    assert raw_depths(regenerated.prepared.messages)[-1] == target.depth - 1
    assert all(target.narration not in (m["content"] or "") for m in regenerated.prepared.messages)


def test_sibling_branch_text_never_reaches_a_request_or_a_summary(owner, small, monkeypatch):
    adventure = use_profile(tree.adventure_create(owner=owner, title="Canary", premise="Two roads."), small)
    for index in range(10):
        play(adventure, f"I walk the common road, milestone {index}.")
    trunk_branch = Adventure.objects.get(pk=adventure.pk).head.branch
    # A sibling branch from depth 8, full of a marker that exists nowhere else.
    undo(adventure, 2)
    for index in range(3):
        play(adventure, f"I follow the SIBLINGCANARY trail, step {index}.")
    sibling_branch = Adventure.objects.get(pk=adventure.pk).head.branch
    assert sibling_branch != trunk_branch
    tree.branch_switch(adventure=adventure, branch=trunk_branch, expected_version=version(adventure))

    calls = record_builtin(monkeypatch)
    for index in range(30):
        play(adventure, f"I walk the common road on, milestone {index + 10}.")
    assert any("submit_context_summary" in call.tools for call in calls)
    for call in calls:
        assert "SIBLINGCANARY" not in request_text(call)
    head = Adventure.objects.get(pk=adventure.pk).head
    on_path = [cp for cp in ContextCheckpoint.objects.all() if paths.on_path(head, cp.host_node)]
    assert on_path and all("SIBLINGCANARY" not in json.dumps(cp.summary_json) for cp in on_path)

    # And the other way round: the sibling never sees what the trunk wrote after the fork.
    tree.branch_switch(adventure=adventure, branch=sibling_branch, expected_version=version(adventure))
    calls.clear()
    for index in range(25):
        play(adventure, f"I follow the SIBLINGCANARY trail on, step {index + 3}.")
    for call in calls:
        assert "milestone 9" not in request_text(call) and "milestone 12" not in request_text(call)
