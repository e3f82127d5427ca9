"""Every operation that writes the story tree (stories/tree.py): success and refusals."""

from __future__ import annotations

import pytest
from django.db import transaction

from stories import paths, tree
from stories.integrity import check_adventure
from stories.models import Adventure, Branch, Memory, Node
from stories.tree import (
    AlreadyTheStory,
    AttemptIsLive,
    CapReached,
    EmptyBranch,
    InvalidInput,
    NotATip,
    NothingToRedo,
    NothingToUndo,
    NotInAdventure,
    ProtectedBranch,
    StaleVersion,
    TreeError,
)

pytestmark = pytest.mark.django_db


# These tests never log in: skip the deliberately slow password hashing of conftest's users.
@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create(username="alice")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create(username="mallory")


def content(text: str, **extra) -> dict:
    return {
        "narration": f"Narration for {text}",
        "suggestions": [f"after {text}"],
        "state_delta": [{"op": "add_fact", "fact": text}],
        "state_after": {"facts": [text]},
        "checks": [],
        **extra,
    }


def play(adventure: Adventure, text: str = "I look around.", **extra) -> Node:
    return tree.node_append(
        adventure=adventure, kind="do", player_input=text, expected_version=adventure.version, **content(text), **extra
    )


def retry(adventure: Adventure, tip: Node, text: str) -> Node:
    return tree.attempt_add(adventure=adventure, tip=tip, expected_version=adventure.version, **content(text))


def reload(adventure: Adventure) -> Adventure:
    return Adventure.objects.get(pk=adventure.pk)


def story(adventure: Adventure) -> list[str]:
    head = Node.objects.get(pk=reload(adventure).head_id)
    return [node.player_input or "opening" for node in paths.newest(head, 100)]


@pytest.fixture
def adventure(user):
    return tree.adventure_create(owner=user, title="The Dark Lighthouse", premise="Rain on slate roofs.")


@pytest.fixture(autouse=True)
def _tree_stays_consistent(request):
    """Whatever a test does, the tree it leaves behind satisfies every invariant."""
    yield
    if "adventure" in request.fixturenames:
        for adventure in Adventure.objects.all():
            assert check_adventure(adventure) == []


# --- creating -----------------------------------------------------------------------------------


def test_creating_an_adventure_writes_its_root(adventure):
    adventure = reload(adventure)
    root = adventure.head
    assert (root.depth, root.kind, root.narration, root.parent_id, root.live) == (
        0,
        "opening",
        "Rain on slate roofs.",
        None,
        True,
    )
    assert root.branch.lineage == [[root.branch_id, None]] and root.branch.parent_branch_id is None
    assert adventure.version == 1
    assert tree.current_state(adventure) == {"flags": {}, "relationships": {}, "inventory": [], "facts": []}


def test_deleting_an_adventure_deletes_everything_in_it(adventure):
    play(adventure, "one")
    tree.memory_add(adventure=adventure, text="m")
    rows = tree.adventure_delete(adventure=adventure)
    assert rows["stories.Node"] == 2 and rows["stories.Branch"] == 1 and rows["stories.Memory"] == 1
    assert not Adventure.objects.filter(pk=adventure.pk).exists() and not Node.objects.exists()


# --- playing ------------------------------------------------------------------------------------


def test_playing_at_the_tip_extends_the_heads_branch(adventure):
    root = adventure.head
    node = play(adventure, "I knock.", model_name="m1", prompt_bytes=10, prompt_stable_bytes=4)
    node.refresh_from_db()
    adventure = reload(adventure)
    assert (node.branch_id, node.depth, node.parent_id, node.live) == (root.branch_id, 1, root.pk, True)
    assert (node.model_name, node.prompt_bytes, node.prompt_stable_bytes) == ("m1", 10, 4)
    assert adventure.head_id == node.pk and adventure.version == 2
    assert tree.current_state(adventure) == {"facts": ["I knock."]}
    assert Branch.objects.filter(adventure=adventure).count() == 1


def test_playing_after_one_undo_adds_an_attempt_beside_the_undone_tip(adventure):
    play(adventure, "one")
    undone = play(adventure, "two")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    again = play(adventure, "two again")
    undone.refresh_from_db()
    assert (again.branch_id, again.depth) == (undone.branch_id, undone.depth)
    assert again.live and not undone.live
    assert [a.pk for a in tree.attempts_at(again)] == [undone.pk, again.pk]
    assert story(adventure) == ["opening", "one", "two again"]
    assert Branch.objects.filter(adventure=adventure).count() == 1


def test_playing_further_back_starts_a_new_branch_and_leaves_the_line_untouched(adventure):
    one = play(adventure, "one")
    play(adventure, "two")
    play(adventure, "three")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    fork = play(adventure, "two, differently")
    root_branch = one.branch
    assert fork.branch_id != root_branch.pk and fork.parent_id == one.pk and fork.depth == 2
    assert fork.branch.parent_branch_id == root_branch.pk and fork.branch.fork_depth == 2
    assert fork.branch.lineage == [[fork.branch_id, None], [root_branch.pk, 1]]
    assert story(adventure) == ["opening", "one", "two, differently"]
    # The line left behind still reads the same.
    old_tip = Node.objects.get(branch=root_branch, depth=3)
    assert [n.player_input for n in paths.newest(old_tip, 10)] == ["", "one", "two", "three"]


def test_an_undone_tip_that_was_continued_elsewhere_is_not_an_attempt_slot(adventure):
    one = play(adventure, "one")
    two = play(adventure, "two")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    play(adventure, "one-b")  # "one" is undone but was continued ("two"): not an attempt slot
    assert Node.objects.get(player_input="one-b").branch_id != one.branch_id
    two.refresh_from_db()
    assert two.live


def test_a_full_attempt_slot_plays_onto_a_new_branch_instead_of_refusing(adventure, settings):
    settings.STORYTREE_MAX_ATTEMPTS_PER_COORDINATE = 2
    tip = play(adventure, "one")
    retry(adventure, tip, "one again")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    node = play(adventure, "one, a third time")
    assert node.branch_id != tip.branch_id and node.depth == 1
    assert tree.attempts_at(tip).count() == 2


def test_playing_records_what_it_was_regenerated_from(adventure):
    first = play(adventure, "one")
    second = play(adventure, "two", regenerated_from=first)
    second.refresh_from_db()
    assert second.regenerated_from_id == first.pk


def test_a_stale_version_is_refused_and_writes_nothing(adventure):
    version = adventure.version
    play(adventure, "one")
    with pytest.raises(StaleVersion) as caught:
        tree.node_append(
            adventure=adventure, kind="do", player_input="late", expected_version=version, **content("late")
        )
    assert caught.value.current == version + 1 and not isinstance(caught.value, TreeError)
    assert not Node.objects.filter(player_input="late").exists()
    assert reload(adventure).version == version + 1
    # None means "don't check".
    tree.node_append(adventure=adventure, kind="say", player_input="any", expected_version=None, **content("any"))


def test_play_refuses_malformed_content(adventure):
    with pytest.raises(InvalidInput):
        tree.node_append(adventure=adventure, kind="opening", player_input="x", expected_version=None, **content("x"))
    with pytest.raises(InvalidInput):
        tree.node_append(
            adventure=adventure, kind="do", player_input="x", expected_version=None, **content("x", state_after=None)
        )
    assert Node.objects.count() == 1


def test_append_joins_an_outer_transaction(adventure):
    with pytest.raises(RuntimeError), transaction.atomic():
        play(adventure, "inside")
        raise RuntimeError("the pipeline failed after writing the node")
    adventure = reload(adventure)
    assert not Node.objects.filter(player_input="inside").exists() and adventure.version == 1
    with transaction.atomic():
        node = play(adventure, "committed together")
        Memory.objects.create(adventure=adventure, branch_id=node.branch_id, depth=node.depth, text="with it")
    assert reload(adventure).head_id == node.pk


def test_the_node_cap_counts_the_whole_tree(adventure, settings):
    play(adventure, "one")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    play(adventure, "one-b")  # two attempts: 3 nodes, a story 2 long
    settings.STORYTREE_MAX_NODES_PER_ADVENTURE = 3
    with pytest.raises(CapReached) as caught:
        play(adventure, "two")
    assert "every branch" in caught.value.message and caught.value.code == "cap_reached"
    assert Node.objects.count() == 3


# --- retry and attempts ----------------------------------------------------------------------------


def test_retry_adds_a_live_attempt_and_keeps_the_old_one(adventure):
    tip = play(adventure, "one")
    new = retry(adventure, tip, "one, retold")
    tip.refresh_from_db()
    adventure = reload(adventure)
    assert (new.branch_id, new.depth, new.parent_id) == (tip.branch_id, tip.depth, tip.parent_id)
    assert new.live and not tip.live and new.player_input == "one" and new.kind == "do"
    assert adventure.head_id == new.pk and adventure.version == 3
    assert tree.current_state(adventure) == {"facts": ["one, retold"]}


def test_retry_refuses_a_turn_the_story_continues_from(adventure):
    one = play(adventure, "one")
    play(adventure, "two")
    with pytest.raises(NotATip):
        retry(adventure, one, "again")
    with pytest.raises(TreeError):
        retry(adventure, Node.objects.get(depth=0), "opening again")
    with pytest.raises(StaleVersion):
        tree.attempt_add(
            adventure=adventure, tip=Node.objects.get(player_input="two"), expected_version=1, **content("x")
        )


def test_retry_refuses_past_the_attempt_cap(adventure, settings):
    settings.STORYTREE_MAX_ATTEMPTS_PER_COORDINATE = 2
    tip = play(adventure, "one")
    retry(adventure, tip, "b")
    with pytest.raises(CapReached):
        retry(adventure, tip, "c")
    assert tree.attempts_at(tip).count() == 2


def test_switching_attempts_moves_live_and_head_and_restores_state(adventure):
    first = play(adventure, "first")
    second = retry(adventure, first, "second")
    assert tree.is_tip(first)
    tree.attempt_switch(adventure=adventure, node=first, expected_version=adventure.version)
    first.refresh_from_db()
    second.refresh_from_db()
    adventure = reload(adventure)
    assert first.live and not second.live and adventure.head_id == first.pk and adventure.version == 4
    assert tree.current_state(adventure) == {"facts": ["first"]}
    # Repeating it (a double click with the old version) changes nothing.
    tree.attempt_switch(adventure=adventure, node=first, expected_version=3)
    assert reload(adventure).version == 4


def test_switching_refuses_a_coordinate_the_story_continues_from(adventure):
    first = play(adventure, "first")
    retry(adventure, first, "second")
    play(adventure, "onwards")
    assert not tree.is_tip(first)
    with pytest.raises(NotATip):
        tree.attempt_switch(adventure=adventure, node=first, expected_version=adventure.version)
    with pytest.raises(StaleVersion):
        tree.attempt_switch(adventure=adventure, node=first, expected_version=1)
    first.refresh_from_db()
    assert not first.live


def test_deleting_an_attempt(adventure):
    first = play(adventure, "first")
    second = retry(adventure, first, "second")
    with pytest.raises(AttemptIsLive):
        tree.attempt_delete(adventure=adventure, node=second)
    report = tree.attempt_delete(adventure=adventure, node=first)
    assert report.rows == {"stories.Node": 1} and report.bytes["stories.Node"] > 0
    assert list(tree.attempts_at(second)) == [second]


def test_objects_of_another_adventure_are_refused(adventure, other_user):
    other = tree.adventure_create(owner=other_user, title="other")
    mine = play(adventure, "mine")
    with pytest.raises(NotInAdventure):
        tree.attempt_switch(adventure=other, node=mine, expected_version=None)
    with pytest.raises(NotInAdventure):
        tree.branch_switch(adventure=other, branch=mine.branch, expected_version=None)
    with pytest.raises(NotInAdventure):
        tree.memory_add(adventure=other, text="x", source_node=mine)


# --- forks -----------------------------------------------------------------------------------------


def test_forking_from_an_attempt_gives_it_its_own_branch(adventure):
    one = play(adventure, "one")
    left = play(adventure, "two")
    kept = retry(adventure, left, "two, retold")
    before = list(Node.objects.filter(branch=one.branch).values_list("id", "depth", "live"))
    left_id = left.pk

    branch = tree.fork_from(adventure=adventure, node=left, expected_version=adventure.version)
    left = Node.objects.get(pk=left_id)
    adventure = reload(adventure)
    assert left.branch_id == branch.pk and left.live and left.depth == 2 and left.parent_id == one.pk
    assert branch.parent_branch_id == one.branch_id and branch.fork_depth == 2
    assert branch.lineage == [[branch.pk, None], [one.branch_id, 1]]
    assert adventure.head_id == left.pk and tree.current_state(adventure) == {"facts": ["two"]}
    # The line left behind: same live attempt, one attempt fewer in its pager, nothing else.
    after = list(Node.objects.filter(branch=one.branch).values_list("id", "depth", "live"))
    assert after == [row for row in before if row[0] != left_id]
    assert Node.objects.get(pk=kept.pk).live
    # Idempotent: a repeat (double click, old version) returns the same branch and moves nothing.
    version = adventure.version
    assert tree.fork_from(adventure=adventure, node=left, expected_version=version - 1).pk == branch.pk
    assert reload(adventure).version == version and Branch.objects.filter(adventure=adventure).count() == 2


def test_forking_an_attempt_at_a_branchs_first_turn_forks_from_the_grandparent(adventure):
    one = play(adventure, "one")
    play(adventure, "two")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    b_first = play(adventure, "one-b")  # "one" was continued, so this starts branch B at depth 1
    b_retry = retry(adventure, b_first, "one-b again")
    branch = tree.fork_from(adventure=adventure, node=b_first, expected_version=adventure.version)
    assert branch.parent_branch_id == one.branch_id and branch.fork_depth == 1
    assert Node.objects.get(pk=b_retry.pk).live


def test_forking_refuses_the_story_itself(adventure):
    one = play(adventure, "one")
    with pytest.raises(AlreadyTheStory):
        tree.fork_from(adventure=adventure, node=one, expected_version=adventure.version)
    two = retry(adventure, one, "two")
    with pytest.raises(StaleVersion):
        tree.fork_from(adventure=adventure, node=one, expected_version=1)
    with pytest.raises(AlreadyTheStory):
        tree.fork_from(adventure=adventure, node=two, expected_version=adventure.version)


def test_the_branch_cap_counts_every_branch(adventure, settings):
    first = play(adventure, "first")
    retry(adventure, first, "second")
    settings.STORYTREE_MAX_BRANCHES_PER_ADVENTURE = 1
    with pytest.raises(CapReached) as caught:
        tree.fork_from(adventure=adventure, node=first, expected_version=adventure.version)
    assert "every branch" in caught.value.message
    assert Branch.objects.count() == 1 and not Node.objects.get(pk=first.pk).live


def test_branch_for_sibling_creates_once_and_reuses_an_empty_branch(adventure):
    one = play(adventure, "one")
    play(adventure, "two")
    branch = tree.branch_for_sibling(adventure=adventure, parent=one)
    assert branch.parent_branch_id == one.branch_id and branch.fork_depth == 2
    assert branch.lineage == [[branch.pk, None], [one.branch_id, 1]]
    assert tree.branch_for_sibling(adventure=adventure, parent=one).pk == branch.pk
    two = Node.objects.get(player_input="two")
    retry(adventure, two, "two again")
    with pytest.raises(TreeError):  # a discarded attempt is not a story to continue
        tree.branch_for_sibling(adventure=adventure, parent=two)
    # An empty branch is refused as a switch target and reused by the next fork there.
    with pytest.raises(EmptyBranch):
        tree.branch_switch(adventure=adventure, branch=branch, expected_version=adventure.version)


def test_regenerate_writes_a_sibling_on_a_new_branch(adventure):
    one = play(adventure, "one")
    two = play(adventure, "two")
    play(adventure, "three")
    node = tree.sibling_branch_add(
        adventure=adventure,
        target=two,
        expected_version=adventure.version,
        regenerated_from=two,
        **content("two, again"),
    )
    node.refresh_from_db()
    assert node.parent_id == one.pk and node.depth == 2 and node.branch_id != two.branch_id
    assert node.regenerated_from_id == two.pk and node.player_input == "two" and node.kind == "do"
    assert story(adventure) == ["opening", "one", "two"]
    assert Node.objects.get(pk=two.pk).live  # the line it came from is untouched
    # Edit a past input: same helper, a new input.
    edited = tree.sibling_branch_add(
        adventure=adventure, target=one, expected_version=adventure.version, player_input="one, edited", **content("e")
    )
    assert edited.depth == 1 and story(adventure) == ["opening", "one, edited"]
    with pytest.raises(TreeError):
        tree.sibling_branch_add(
            adventure=adventure, target=Node.objects.get(depth=0), expected_version=None, **content("x")
        )


# --- undo / redo ------------------------------------------------------------------------------------


def test_undo_moves_back_and_deletes_nothing(adventure):
    one = play(adventure, "one")
    play(adventure, "two")
    count = Node.objects.count()
    tree.undo(adventure=adventure, expected_version=adventure.version)
    adventure = reload(adventure)
    assert adventure.head_id == one.pk and adventure.version == 4 and Node.objects.count() == count
    assert tree.current_state(adventure) == {"facts": ["one"]}
    tree.undo(adventure=adventure, expected_version=adventure.version)
    with pytest.raises(NothingToUndo):
        tree.undo(adventure=adventure, expected_version=adventure.version)
    with pytest.raises(StaleVersion):
        tree.undo(adventure=adventure, expected_version=1)


def test_redo_walks_forward_along_the_path_undo_came_from(adventure):
    play(adventure, "one")
    play(adventure, "two")
    play(adventure, "three")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    b2 = play(adventure, "two-b")  # a new branch at depth 2
    b3 = play(adventure, "three-b")
    for _ in range(3):
        tree.undo(adventure=adventure, expected_version=adventure.version)
    assert story(adventure) == ["opening"]
    # Both lines continue from "one"; redo follows the one the player came back from.
    tree.redo(adventure=adventure, expected_version=adventure.version)
    tree.redo(adventure=adventure, expected_version=adventure.version)
    assert reload(adventure).head_id == b2.pk
    tree.redo(adventure=adventure, expected_version=adventure.version)
    assert reload(adventure).head_id == b3.pk and tree.current_state(adventure) == {"facts": ["three-b"]}
    with pytest.raises(NothingToRedo):
        tree.redo(adventure=adventure, expected_version=adventure.version)


def test_a_new_move_clears_redo(adventure):
    with pytest.raises(NothingToRedo):
        tree.redo(adventure=adventure, expected_version=adventure.version)
    play(adventure, "one")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    play(adventure, "one-b")
    with pytest.raises(NothingToRedo):
        tree.redo(adventure=adventure, expected_version=adventure.version)
    with pytest.raises(StaleVersion):
        tree.redo(adventure=adventure, expected_version=1)


# --- branches ----------------------------------------------------------------------------------------


@pytest.fixture
def forked(adventure):
    """Main: one two three; B forks at two (two-b, three-b); C forks from B at three (three-c)."""
    play(adventure, "one")
    play(adventure, "two")
    play(adventure, "three")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    b = play(adventure, "two-b")
    play(adventure, "three-b")
    play(adventure, "four-b")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    c = play(adventure, "three-c")
    main = Node.objects.get(depth=0).branch
    return adventure, main, b.branch, c.branch


def test_switching_branch_moves_the_head_to_its_tip(forked):
    adventure, main, b, _c = forked
    tree.branch_switch(adventure=adventure, branch=main, expected_version=adventure.version)
    assert story(adventure) == ["opening", "one", "two", "three"]
    assert tree.current_state(adventure) == {"facts": ["three"]}
    tree.branch_switch(adventure=adventure, branch=b, expected_version=adventure.version)
    assert story(adventure) == ["opening", "one", "two-b", "three-b", "four-b"]
    version = reload(adventure).version
    tree.branch_switch(adventure=adventure, branch=b, expected_version=version)  # already there
    assert reload(adventure).version == version
    with pytest.raises(StaleVersion):
        tree.branch_switch(adventure=adventure, branch=main, expected_version=1)


def test_deleting_refuses_the_heads_branch_and_its_ancestors(forked):
    adventure, main, b, c = forked
    for branch in (main, b, c):
        with pytest.raises(ProtectedBranch):
            tree.branch_delete(adventure=adventure, branch=branch)
    assert Branch.objects.count() == 3


def test_deleting_a_branch_takes_its_descendants_and_reports_what_went(forked):
    adventure, main, b, c = forked
    tree.branch_switch(adventure=adventure, branch=main, expected_version=adventure.version)
    Memory.objects.create(adventure=adventure, branch=c, depth=3, text="on C")
    dry = tree.branch_delete(adventure=adventure, branch=b, dry_run=True)
    assert Branch.objects.count() == 3 and Memory.objects.count() == 1  # a dry run deletes nothing
    assert dry.branch_ids == [b.pk, c.pk] and dry.labels == ["Fork at turn 2", "Fork at turn 3"]
    assert dry.rows == {"stories.Branch": 2, "stories.Node": 4, "stories.Memory": 1}
    assert dry.bytes["stories.Node"] > 0 and dry.bytes["stories.Memory"] == len("on C")

    report = tree.branch_delete(adventure=adventure, branch=b)
    assert (report.rows, report.bytes, report.dry_run) == (dry.rows, dry.bytes, False)
    assert report.as_dict()["total_rows"] == 7
    assert list(Branch.objects.values_list("pk", flat=True)) == [main.pk]
    assert Node.objects.count() == 4 and not Memory.objects.exists()
    assert story(adventure) == ["opening", "one", "two", "three"]


def test_renaming_a_branch(forked):
    _adventure, main, b, _c = forked
    assert tree.branch_label(main) == "Main story" and tree.branch_label(b) == "Fork at turn 2"
    tree.branch_rename(branch=b, name="  The   cellar  ")
    b.refresh_from_db()
    assert b.name == "The cellar" and tree.branch_label(b) == "The cellar"
    with pytest.raises(InvalidInput):
        tree.branch_rename(branch=b, name="   ")
    with pytest.raises(InvalidInput):
        tree.branch_rename(branch=b, name="x" * 101)
    b.refresh_from_db()
    assert b.name == "The cellar"
    tree.branch_rename(branch=b, name=None)
    b.refresh_from_db()
    assert b.name == "" and tree.branch_label(b) == "Fork at turn 2"


def test_branch_tree_describes_every_branch(forked):
    adventure, main, b, c = forked
    rows = {row["id"]: row for row in tree.branch_tree(reload(adventure))}
    assert rows[main.pk] | {} == {
        "id": main.pk,
        "name": "",
        "label": "Main story",
        "parent": None,
        "fork_depth": 0,
        "nodes": 4,
        "tip_depth": 3,
        "current": False,
        "on_head_path": True,
    }
    assert (rows[b.pk]["parent"], rows[b.pk]["nodes"], rows[b.pk]["tip_depth"], rows[b.pk]["on_head_path"]) == (
        main.pk,
        3,
        4,
        True,
    )
    assert rows[c.pk]["current"] and rows[c.pk]["nodes"] == 1
