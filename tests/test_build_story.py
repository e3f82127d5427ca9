"""The synthetic adventure builder (stories/synthetic.py) and `manage.py build_story`."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from stories import paths, tree
from stories.integrity import check_adventure
from stories.models import Adventure, Branch, Node
from stories.paths import Path
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


# These tests never log in: skip the deliberately slow password hashing of conftest's users.
@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create(username="alice")


def test_it_builds_the_tree_the_tree_functions_would(user):
    adventure = build_story(nodes=21, forks=3, bytes_per_node=300, owner=user)
    assert check_adventure(adventure) == []
    assert Node.objects.filter(adventure=adventure).count() == 21
    head = Node.objects.get(pk=adventure.head_id)
    assert head.depth == 21 - 3 - 1
    branches = list(Branch.objects.filter(adventure=adventure).order_by("id"))
    assert len(branches) == 4
    # Forks of forks: each branch forked from the previous one, lineage capped below each fork.
    assert Path.for_node(head).entries == [
        (branches[3].pk, head.depth),
        (branches[2].pk, branches[3].fork_depth - 1),
        (branches[1].pk, branches[2].fork_depth - 1),
        (branches[0].pk, branches[1].fork_depth - 1),
    ]
    for parent, child in zip(branches, branches[1:], strict=False):
        assert child.parent_branch_id == parent.pk
        # What made it a fork: the parent continues one node past the fork point.
        left = Node.objects.get(branch=parent, depth=child.fork_depth)
        assert left.live and left.parent.depth == child.fork_depth - 1
    story = paths.newest(head, 100)
    assert [n.depth for n in story] == list(range(head.depth + 1))
    assert all(280 <= len(n.narration.encode()) <= 300 for n in story)
    assert story[-1].state_after["relationships"]["Maren"] == sum(d["by"] for n in story[1:] for d in n.state_delta)


def test_the_tree_functions_work_on_it(user):
    adventure = build_story(nodes=41, forks=4, bytes_per_node=50, owner=user)
    root_branch = Branch.objects.get(adventure=adventure, parent_branch=None)
    tree.branch_switch(adventure=adventure, branch=root_branch, expected_version=adventure.version)
    tip = Node.objects.get(pk=adventure.head_id)
    assert tip.player_input.startswith("Abandoned")
    assert tree.current_state(adventure)["relationships"]["Maren"] == tip.state_after["relationships"]["Maren"]
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.node_append(
        adventure=adventure,
        kind="do",
        player_input="a fifth way",
        narration="n",
        suggestions=[],
        state_delta=[],
        state_after={},
        checks=[],
        expected_version=adventure.version,
    )
    assert check_adventure(adventure) == []


def test_ten_thousand_nodes_and_two_hundred_forks_in_a_few_seconds(user):
    started = time.monotonic()
    adventure = build_story(nodes=10_000, forks=200, bytes_per_node=1000, owner=user)
    elapsed = time.monotonic() - started
    assert elapsed < 15  # "a few seconds"; generous for a loaded CI machine
    head = Node.objects.get(pk=adventure.head_id)
    assert Node.objects.filter(adventure=adventure).count() == 10_000
    assert head.depth == 10_000 - 200 - 1 and len(Path.for_node(head).entries) == 201
    assert check_adventure(adventure) == []


def test_it_refuses_impossible_shapes(user):
    with pytest.raises(ValueError):
        build_story(nodes=4, forks=2, owner=user)
    with pytest.raises(ValueError):
        build_story(nodes=10, forks=-1, owner=user)
    assert not Adventure.objects.exists()


def test_the_command_prints_the_new_adventures_id(user, capsys):
    call_command("build_story", "--nodes", "30", "--forks", "2", "--bytes", "100", "--owner", "alice")
    adventure = Adventure.objects.get(pk=int(capsys.readouterr().out.strip()))
    assert adventure.owner == user and adventure.nodes.count() == 30
    call_command("build_story", "--nodes", "5")
    adventure = Adventure.objects.get(pk=int(capsys.readouterr().out.strip()))
    assert adventure.owner.username == "synthetic" and not adventure.owner.has_usable_password()
    with pytest.raises(CommandError, match="No user"):
        call_command("build_story", "--nodes", "5", "--owner", "nobody")
    with pytest.raises(CommandError, match="at least"):
        call_command("build_story", "--nodes", "5", "--forks", "3")
