"""Random sequences of tree operations never break an invariant, and the windowed path read
always equals a naive walk up the parent pointers from the head."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stories import paths, tree
from stories.integrity import check_adventure
from stories.models import Adventure, Branch, Memory, Node

pytestmark = pytest.mark.django_db

OPS = (
    "play",
    "play",
    "play",
    "retry",
    "switch_attempt",
    "fork",
    "undo",
    "undo",
    "redo",
    "undo_redo",
    "regenerate",
    "switch_branch",
    "delete_branch",
    "delete_attempt",
    "memory",
    "stale",
)


def content(step: int) -> dict:
    return {
        "narration": f"narration {step}",
        "suggestions": [],
        "state_delta": [],
        "state_after": {"step": step},
        "checks": [],
    }


def pick(queryset, seed: int):
    rows = list(queryset.order_by("id"))
    return rows[seed % len(rows)] if rows else None


def naive_path(adventure: Adventure) -> list[int]:
    """The reference: every node of the adventure in memory, walked up from the head."""
    parent = dict(Node.objects.filter(adventure=adventure).values_list("id", "parent_id"))
    node_id = Adventure.objects.values_list("head_id", flat=True).get(pk=adventure.pk)
    walked = []
    while node_id is not None:
        walked.append(node_id)
        node_id = parent[node_id]
    return walked[::-1]


def apply(adventure: Adventure, op: str, seed: int, step: int) -> None:
    version = adventure.version
    head = Node.objects.get(pk=adventure.head_id)
    if op == "play":
        tree.node_append(
            adventure=adventure, kind="do", player_input=f"p{step}", expected_version=version, **content(step)
        )
    elif op == "retry":
        tree.attempt_add(adventure=adventure, tip=head, expected_version=version, **content(step))
    elif op == "switch_attempt":
        tree.attempt_switch(adventure=adventure, node=pick(adventure.nodes, seed), expected_version=version)
    elif op == "fork":
        node = pick(adventure.nodes.filter(live=False), seed) or pick(adventure.nodes, seed)
        tree.fork_from(adventure=adventure, node=node, expected_version=version)
    elif op == "undo":
        tree.undo(adventure=adventure, expected_version=version)
    elif op == "redo":
        tree.redo(adventure=adventure, expected_version=version)
    elif op == "undo_redo":
        tree.undo(adventure=adventure, expected_version=version)
        tree.redo(adventure=adventure, expected_version=adventure.version)
        assert adventure.head_id == head.pk  # redo goes back exactly where undo left
    elif op == "regenerate":
        target = pick(adventure.nodes.exclude(depth=0), seed)
        if target is not None:
            tree.sibling_branch_add(
                adventure=adventure, target=target, expected_version=version, regenerated_from=target, **content(step)
            )
    elif op == "switch_branch":
        tree.branch_switch(adventure=adventure, branch=pick(adventure.branches, seed), expected_version=version)
    elif op == "delete_branch":
        # Mostly a branch it may delete; sometimes one it must refuse.
        protected = [entry[0] for entry in head.branch.lineage]
        branch = pick(adventure.branches.exclude(pk__in=protected), seed) if seed % 4 else None
        branch = branch or pick(adventure.branches, seed)
        tree.branch_delete(adventure=adventure, branch=branch, dry_run=seed % 5 == 0)
    elif op == "delete_attempt":
        node = pick(adventure.nodes.filter(live=False), seed) if seed % 4 else None
        tree.attempt_delete(adventure=adventure, node=node or pick(adventure.nodes, seed))
    elif op == "memory":
        tree.memory_add(
            adventure=adventure, text=f"m{step}", source_node=pick(adventure.nodes, seed) if seed % 2 else None
        )
    elif op == "stale":
        with pytest.raises(tree.StaleVersion):
            tree.undo(adventure=adventure, expected_version=version - 1)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(st.tuples(st.sampled_from(OPS), st.integers(min_value=0, max_value=10_000)), max_size=30))
def test_random_operations_keep_the_tree_consistent(django_user_model, steps):
    owner, _ = django_user_model.objects.get_or_create(username="property")
    adventure = tree.adventure_create(owner=owner, title="property")
    # Start from a small tree with something to delete (a branch off the head's path, a
    # discarded attempt), so random sequences reach the deletions often, not only by luck.
    prelude = ["play", "play", "play", "undo", "undo", "play", "retry", "play"]
    for step, op in enumerate(prelude):
        apply(adventure, op, 0, -1 - step)
    tree.branch_switch(adventure=adventure, branch=adventure.branches.order_by("id")[0], expected_version=None)
    for step, (op, seed) in enumerate(steps):
        before = (adventure.head_id, adventure.version)
        try:
            apply(adventure, op, seed, step)
            event(f"{op}: done")  # --hypothesis-show-statistics tells how often each op got through
        except tree.TreeError as exc:
            event(f"{op}: refused ({exc.code})")  # allowed; what a refusal must not do is damage the tree
        stored = Adventure.objects.get(pk=adventure.pk)
        assert (stored.head_id, stored.version) == (adventure.head_id, adventure.version)
        # The version moves exactly when the head does (undo_redo moves it twice, and back).
        moves = 2 if op == "undo_redo" and stored.version != before[1] else int(stored.head_id != before[0])
        assert stored.version - before[1] == moves, op

        assert check_adventure(adventure) == [], (op, seed)
        expected = naive_path(adventure)
        head = Node.objects.get(pk=stored.head_id)
        assert [n.pk for n in paths.newest(head, 1000)] == expected
        assert [n.pk for n in paths.iter_path(head, chunk=4)] == expected
        assert [n.pk for n in paths.newest(head, 3)] == expected[-3:]
        on_path = {(n.branch_id, n.depth) for n in Node.objects.filter(pk__in=expected)}
        assert {(m.branch_id, m.depth) for m in paths.memories_on_path(head)} <= on_path
        assert tree.current_state(stored) == head.state_after
    # Whatever happened, no row belongs to a branch of another adventure.
    assert not Node.objects.filter(adventure=adventure).exclude(branch__adventure=adventure).exists()
    assert not Memory.objects.filter(adventure=adventure).exclude(branch__adventure=adventure).exists()
    assert Branch.objects.filter(adventure=adventure).exists()
