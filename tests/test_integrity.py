"""The invariant checker (stories/integrity.py) and `manage.py check_story_integrity`."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from stories import tree
from stories.integrity import Violation, check_adventure
from stories.models import Adventure, Branch, Node

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


@pytest.fixture
def forked(user):
    """Main: one two three; B forks after one (two-b, three-b), head on B's tip."""
    adventure = tree.adventure_create(owner=user, title="t")
    play(adventure, "one")
    play(adventure, "two")
    play(adventure, "three")
    for _ in range(2):
        tree.undo(adventure=adventure, expected_version=adventure.version)
    play(adventure, "two-b")
    play(adventure, "three-b")
    return adventure


def node(text: str) -> Node:
    return Node.objects.get(player_input=text)


def codes(adventure: Adventure) -> set[str]:
    return {v.code for v in check_adventure(adventure)}


def test_a_tree_built_by_the_tree_functions_is_clean(forked):
    assert check_adventure(forked) == []


def test_a_parent_that_is_not_the_paths_node_one_up(forked):
    Node.objects.filter(pk=node("three-b").pk).update(parent=node("two"))  # two is on Main, not on B's path
    violations = check_adventure(forked)
    assert [v.code for v in violations] == ["parent_chain"]
    assert str(node("three-b").pk) in violations[0].message


def test_a_child_of_a_discarded_attempt(forked):
    # Make "two" a discarded attempt while "three" still continues from it.
    extra = Node.objects.create(
        adventure=forked, branch=node("two").branch, depth=2, parent=node("one"), live=False, kind="do"
    )
    Node.objects.filter(pk=node("two").pk).update(live=False)
    Node.objects.filter(pk=extra.pk).update(live=True)
    assert codes(forked) == {"parent_chain"}


def test_a_coordinate_with_no_live_node(forked):
    Node.objects.filter(pk=node("two").pk).update(live=False)
    assert "live_count" in codes(forked)


def test_a_head_that_is_not_live_or_missing(forked):
    Node.objects.filter(pk=node("three-b").pk).update(live=False)
    assert "head_not_live" in codes(forked)
    Adventure.objects.filter(pk=forked.pk).update(head=None)
    assert "head_missing" in codes(forked)


def test_lineage_faults(forked):
    b = node("two-b").branch
    main = node("one").branch
    Branch.objects.filter(pk=b.pk).update(lineage=[[b.pk, None], [main.pk, 2]])  # capped at the fork, not below
    assert "lineage_mismatch" in codes(forked)
    Branch.objects.filter(pk=b.pk).update(lineage=[[b.pk, None], [b.pk, 1]])
    assert "lineage_cycle" in codes(forked)
    Branch.objects.filter(pk=b.pk).update(lineage="nonsense")
    assert {"lineage_malformed", "head_root"} <= codes(forked)
    Branch.objects.filter(pk=b.pk).update(lineage=[[b.pk, None], [main.pk, 1]])
    assert check_adventure(forked) == []
    Branch.objects.filter(pk=main.pk).update(parent_branch=b)
    assert {"branch_cycle", "root_branch_count"} <= codes(forked)


def test_a_node_on_another_adventures_branch(forked, user):
    other = tree.adventure_create(owner=user, title="other")
    Node.objects.filter(pk=node("three-b").pk).update(branch=other.head.branch)
    assert "node_branch" in codes(forked)


def test_the_checkpoint_hook_runs_when_that_module_exists(forked, monkeypatch):
    seen = []
    hook = types.ModuleType("checkpoints.integrity")
    hook.__spec__ = importlib.machinery.ModuleSpec("checkpoints.integrity", None)
    hook.check = lambda adventure: seen.append(adventure.pk) or [Violation("checkpoint_hash", "stale hash")]
    monkeypatch.setitem(sys.modules, "checkpoints.integrity", hook)
    assert check_adventure(forked) == [Violation("checkpoint_hash", "stale hash")]
    assert seen == [forked.pk]


def test_the_command_exits_non_zero_on_a_violation(forked, user, capsys):
    clean = tree.adventure_create(owner=user, title="clean")
    call_command("check_story_integrity", str(clean.pk))
    assert "no violations" in capsys.readouterr().out
    call_command("check_story_integrity")

    Node.objects.filter(pk=node("two").pk).update(live=False)
    call_command("check_story_integrity", str(clean.pk))  # the other adventure is still fine
    with pytest.raises(CommandError, match="1 of 2"):
        call_command("check_story_integrity")
    assert "live_count" in capsys.readouterr().out
    with pytest.raises(CommandError):
        call_command("check_story_integrity", str(forked.pk))
    with pytest.raises(CommandError, match="No adventure"):
        call_command("check_story_integrity", "999999")
