"""Memories are path-scoped: visible exactly from paths through their anchor."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from stories import paths, tree
from stories.models import Adventure, Memory, Node
from stories.synthetic import build_story
from stories.tree import InvalidInput, NotInAdventure

pytestmark = pytest.mark.django_db


# These tests never log in: skip the deliberately slow password hashing of conftest's users.
@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create(username="alice")


def play(adventure: Adventure, text: str) -> Node:
    return tree.node_append(
        adventure=adventure,
        kind="do",
        player_input=text,
        narration=text,
        suggestions=[],
        state_delta=[],
        state_after={},
        checks=[],
        expected_version=adventure.version,
    )


def visible(head: Node) -> list[str]:
    return [m.text for m in paths.memories_on_path(Node.objects.get(pk=head.pk))]


@pytest.fixture
def two_lines(user):
    """A: opening, one, two-a, three-a.  B forks after "one": two-b (the head)."""
    adventure = tree.adventure_create(owner=user, title="t")
    one = play(adventure, "one")
    play(adventure, "two-a")
    a_tip = play(adventure, "three-a")
    for _ in range(2):
        tree.undo(adventure=adventure, expected_version=adventure.version)
    b_tip = play(adventure, "two-b")
    assert b_tip.branch_id != a_tip.branch_id
    return adventure, one, a_tip, b_tip


def test_a_memory_written_on_b_is_invisible_from_a(two_lines):
    adventure, _one, a_tip, b_tip = two_lines
    memory = tree.memory_add(adventure=adventure, text="The cellar door was open.")
    assert (memory.branch_id, memory.depth) == (b_tip.branch_id, b_tip.depth)  # anchored at the head
    assert visible(b_tip) == ["The cellar door was open."]
    assert visible(a_tip) == []


def test_a_memory_on_a_shared_ancestor_is_visible_from_both(two_lines):
    adventure, one, a_tip, b_tip = two_lines
    tree.memory_add(adventure=adventure, text="Maren is nervous.", source_node=one)
    assert visible(a_tip) == ["Maren is nervous."]
    assert visible(b_tip) == ["Maren is nervous."]


def test_a_memory_ahead_of_the_head_is_not_yet_visible(two_lines):
    adventure, one, a_tip, _b_tip = two_lines
    tree.memory_add(adventure=adventure, text="Late on A.", source_node=a_tip)
    assert visible(a_tip) == ["Late on A."]
    assert visible(one) == []


def test_forking_leaves_memories_with_the_line_they_describe(user):
    """A memory at a coordinate describes its live attempt, which stays on the parent."""
    adventure = tree.adventure_create(owner=user, title="t")
    first = play(adventure, "first")
    tree.attempt_add(
        adventure=adventure,
        tip=first,
        narration="second",
        suggestions=[],
        state_delta=[],
        state_after={},
        checks=[],
        expected_version=adventure.version,
    )
    tree.memory_add(adventure=adventure, text="about the second attempt")
    branch = tree.fork_from(adventure=adventure, node=first, expected_version=adventure.version)
    assert Memory.objects.get().branch_id != branch.pk
    assert visible(Node.objects.get(pk=first.pk)) == []


def test_memory_text_is_validated_and_editable(two_lines, settings):
    adventure, _one, _a_tip, _b_tip = two_lines
    with pytest.raises(InvalidInput):
        tree.memory_add(adventure=adventure, text="   ")
    settings.STORYTREE_MAX_INPUT_CHARS = 10
    with pytest.raises(InvalidInput):
        tree.memory_add(adventure=adventure, text="x" * 11)
    memory = tree.memory_add(adventure=adventure, text="  short  ", pinned=True)
    assert (memory.text, memory.pinned) == ("short", True)

    anchor = (memory.branch_id, memory.depth)
    tree.memory_update(memory=memory, text="changed")
    tree.memory_update(memory=memory, pinned=False)
    memory.refresh_from_db()
    assert (memory.text, memory.pinned, (memory.branch_id, memory.depth)) == ("changed", False, anchor)
    with pytest.raises(InvalidInput):
        tree.memory_update(memory=memory, text="")
    memory.refresh_from_db()
    assert memory.text == "changed"
    tree.memory_delete(memory=memory)
    assert not Memory.objects.filter(pk=memory.pk).exists()


def test_a_source_node_must_belong_to_the_adventure(two_lines, user):
    _adventure, one, _a, _b = two_lines
    other = tree.adventure_create(owner=user, title="other")
    with pytest.raises(NotInAdventure):
        tree.memory_add(adventure=other, text="x", source_node=one)


def test_memory_recall_reads_the_full_lineage_in_one_query(user):
    adventure = build_story(nodes=2001, forks=200, bytes_per_node=8, owner=user)
    head = Node.objects.select_related("branch").get(pk=adventure.head_id)
    root = Node.objects.get(adventure=adventure, depth=0)
    tree.memory_add(adventure=adventure, text="from the opening", source_node=root)
    tree.memory_add(adventure=adventure, text="at the head")
    # On an abandoned line: invisible.
    abandoned = Node.objects.filter(adventure=adventure, player_input__startswith="Abandoned").first()
    tree.memory_add(adventure=adventure, text="abandoned", source_node=abandoned)
    with CaptureQueriesContext(connection) as queries:
        texts = [m.text for m in paths.memories_on_path(head)]
    assert texts == ["from the opening", "at the head"] and len(queries) == 1
