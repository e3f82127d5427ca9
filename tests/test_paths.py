"""Path selection (stories/paths.py): which nodes are "the story", and what reading them costs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from stories import paths, tree
from stories.models import Branch, Memory, Node
from stories.paths import BrokenLineage, Path
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


# These tests never log in: skip the deliberately slow password hashing of conftest's users.
@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create(username="alice")


def play(adventure, text: str = "I look around.") -> Node:
    return tree.node_append(
        adventure=adventure,
        kind="do",
        player_input=text,
        narration=f"Narration for {text}",
        suggestions=[],
        state_delta=[],
        state_after={"flags": {text: True}},
        checks=[],
        expected_version=adventure.version,
    )


def fresh(node_id: int) -> Node:
    """A head as a view would load it: nothing related cached."""
    return Node.objects.get(pk=node_id)


def naive_path(head: Node) -> list[int]:
    """Walk parent pointers (one query a node): the reference the windowed reads must equal."""
    ids = []
    node = head
    while node is not None:
        ids.append(node.pk)
        node = node.parent
    return ids[::-1]


@pytest.fixture
def seed_example(user):
    """DESIGN's example: A forks into B at depth 4 and B into C at depth 6, so C's tip at 7
    has lineage [(C,7), (B,5), (A,3)]. A4 A5 B6 B7 are the lines left behind."""
    adventure = tree.adventure_create(owner=user, title="Seed", premise="A0")
    n = {"A0": adventure.head}
    for name in ("A1", "A2", "A3", "A4", "A5"):
        n[name] = play(adventure, name)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    for name in ("B4", "B5", "B6", "B7"):
        n[name] = play(adventure, name)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    for name in ("C6", "C7"):
        n[name] = play(adventure, name)
    return adventure, n


def test_the_seed_example_reads_back_along_its_lineage(seed_example):
    adventure, n = seed_example
    a, b, c = n["A0"].branch_id, n["B4"].branch_id, n["C6"].branch_id
    assert len({a, b, c}) == 3
    assert Branch.objects.get(pk=c).lineage == [[c, None], [b, 5], [a, 3]]
    assert n["A4"].branch_id == a and n["B6"].branch_id == b  # the lines left behind

    head = fresh(n["C7"].pk)
    assert Path.for_node(head).entries == [(c, 7), (b, 5), (a, 3)]
    story = paths.newest(head, 32)
    assert [node.narration.split()[-1] for node in story] == ["A0", "A1", "A2", "A3", "B4", "B5", "C6", "C7"]
    assert [node.pk for node in story] == naive_path(head)


def test_a_siblings_nodes_are_invisible(seed_example):
    _adventure, n = seed_example
    from_b = [node.pk for node in paths.newest(fresh(n["B7"].pk), 32)]
    assert from_b == [n[x].pk for x in ("A0", "A1", "A2", "A3", "B4", "B5", "B6", "B7")]
    from_a = [node.pk for node in paths.newest(fresh(n["A5"].pk), 32)]
    assert from_a == [n[x].pk for x in ("A0", "A1", "A2", "A3", "A4", "A5")]
    assert not any(n[x].pk in from_a for x in ("B4", "B5", "C6", "C7"))


def test_newest_pages_up_in_ascending_order(seed_example):
    _adventure, n = seed_example
    head = fresh(n["C7"].pk)
    assert [x.depth for x in paths.newest(head, 3)] == [5, 6, 7]
    assert [x.depth for x in paths.newest(head, 3, before_depth=5)] == [2, 3, 4]
    assert [x.pk for x in paths.newest(head, 3, before_depth=2)] == [n["A0"].pk, n["A1"].pk]
    assert paths.newest(head, 3, before_depth=0) == []
    assert paths.newest(head, 0) == []

    page = paths.page(head, 3, before_depth=5)
    assert [x.depth for x in page.nodes] == [2, 3, 4] and page.has_more
    assert not paths.page(head, 3, before_depth=3).has_more
    assert paths.has_more_before(head, 5) and paths.has_more_before(head, 1)
    assert not paths.has_more_before(head, 0)


def test_a_mid_path_head_reads_only_up_to_itself(seed_example):
    _adventure, n = seed_example
    assert [x.pk for x in paths.newest(fresh(n["B5"].pk), 32)][-2:] == [n["B4"].pk, n["B5"].pk]


def test_path_questions_are_pure(seed_example):
    _adventure, n = seed_example
    head = Node.objects.select_related("branch").get(pk=n["C7"].pk)
    a, b, c = n["A0"].branch_id, n["B4"].branch_id, n["C6"].branch_id
    with CaptureQueriesContext(connection) as queries:
        path = Path.for_node(head)
        assert path.head_depth == 7
        assert path.covers(a, 0) and path.covers(a, 3) and not path.covers(a, 4)
        assert path.covers(b, 4) and path.covers(b, 5) and not path.covers(b, 6) and not path.covers(b, 3)
        assert path.covers(c, 6) and path.covers(c, 7) and not path.covers(c, 8)
        assert not path.covers(999_999, 1)
        assert path.branch_at(4) == b and path.branch_at(0) == a and path.branch_at(8) is None
        assert path.entries_between(5, 6) == [(c, 7), (b, 5)]
        assert paths.on_path(head, n["B5"]) and paths.on_path(head, n["A0"])
        assert not paths.on_path(head, n["A4"]) and not paths.on_path(head, n["B6"])
    assert len(queries) == 0


def test_on_path_excludes_a_sibling_attempt_at_a_covered_coordinate(user):
    adventure = tree.adventure_create(owner=user, title="t")
    first = play(adventure, "first")
    second = tree.attempt_add(
        adventure=adventure,
        tip=first,
        narration="again",
        suggestions=[],
        state_delta=[],
        state_after={},
        checks=[],
        expected_version=adventure.version,
    )
    first.refresh_from_db()
    assert paths.on_path(fresh(second.pk), second)
    assert not paths.on_path(fresh(second.pk), first)  # same coordinate, not the story


def test_clause_prefixes_field_names(seed_example):
    _adventure, n = seed_example
    path = Path.for_node(fresh(n["C7"].pk))
    c = n["C6"].branch_id
    q = path.clause(prefix="host_node__", entries=[(c, 7)])
    assert q.children == [("host_node__branch", c), ("host_node__depth__lte", 7)]
    # The clause works through a relation: memories whose source node is on the path.
    Memory.objects.create(adventure_id=n["C7"].adventure_id, branch_id=c, depth=7, text="m", source_node=n["C7"])
    assert Memory.objects.filter(path.clause(prefix="source_node__")).count() == 1


def test_iter_path_reads_root_to_head_in_bounded_chunks(seed_example):
    _adventure, n = seed_example
    head = fresh(n["C7"].pk)
    head.branch  # noqa: B018 - load it, so only the chunk queries are counted
    with CaptureQueriesContext(connection) as queries:
        ids = [x.pk for x in paths.iter_path(head, chunk=3)]
    assert ids == naive_path(head)
    assert len(queries) == 3  # depths 0-2, 3-5, 6-7
    with pytest.raises(ValueError):
        list(paths.iter_path(head, chunk=0))


def test_node_at_and_nearest(seed_example):
    adventure, n = seed_example
    head = fresh(n["C7"].pk)
    assert paths.node_at(head, 4).pk == n["B4"].pk
    assert paths.node_at(head, 8) is None and paths.node_at(head, -1) is None

    b, a = n["B4"].branch_id, n["A0"].branch_id
    for branch_id, depth in ((a, 2), (a, 4), (b, 5), (b, 6)):
        Memory.objects.create(adventure=adventure, branch_id=branch_id, depth=depth, text=f"{branch_id}:{depth}")
    found = paths.nearest(Memory.objects.all(), head)
    assert (found.branch_id, found.depth) == (b, 5)  # (b, 6) is past the fork; (a, 4) is A's own line
    assert paths.nearest(Memory.objects.filter(depth__lt=4), head).depth == 2
    assert paths.nearest(Memory.objects.filter(depth__gt=6), head) is None
    # Custom field names: nodes' parents on the path, newest first.
    found = paths.nearest(Node.objects.all(), head, branch_field="parent__branch", depth_field="parent__depth")
    assert found.parent_id == n["C6"].pk


@pytest.mark.parametrize(("nodes", "forks"), [(100, 1), (10_000, 200)])
def test_newest_32_costs_the_same_few_queries_at_any_depth_or_fork_count(nodes, forks):
    adventure = build_story(nodes=nodes, forks=forks, bytes_per_node=64)
    head = fresh(adventure.head_id)
    with CaptureQueriesContext(connection) as queries:
        window = paths.newest(head, 32)
    assert len(queries) == 2  # head's branch lineage, then one window query
    assert [x.depth for x in window] == list(range(head.depth - 31, head.depth + 1))
    walked = []
    node = head
    while len(walked) < 32:
        walked.append(node.pk)
        node = node.parent
    assert [x.pk for x in window] == walked[::-1]
    # Paging deep into the story costs the same.
    head = fresh(adventure.head_id)
    with CaptureQueriesContext(connection) as queries:
        older = paths.newest(head, 32, before_depth=head.depth // 2)
    assert len(queries) == 2 and len(older) == 32


def test_a_path_with_a_hole_widens_once_and_stays_bounded(user):
    adventure = build_story(nodes=41, forks=5, bytes_per_node=10, owner=user)
    head = fresh(adventure.head_id)
    # Corrupt: the node at depth 20 of the path stops being live (integrity would report it).
    hole = paths.node_at(head, 20)
    Node.objects.filter(pk=hole.pk).update(live=False)
    head = fresh(adventure.head_id)
    with CaptureQueriesContext(connection) as queries:
        window = paths.newest(head, 20)
    assert len(queries) == 3
    assert len(window) == 20 and 20 not in [x.depth for x in window]


def test_very_long_lineages_still_read_on_sqlite(user):
    """1,100 nested forks: an OR chain that long is deeper than SQLite parses."""
    adventure = build_story(nodes=2 * 1100 + 1, forks=1100, bytes_per_node=8, owner=user)
    head = fresh(adventure.head_id)
    assert len(Path.for_node(head).entries) == 1101
    root = Node.objects.get(adventure=adventure, depth=0)
    Memory.objects.create(adventure=adventure, branch_id=root.branch_id, depth=0, text="from the start")
    assert [m.text for m in paths.memories_on_path(head)] == ["from the start"]
    assert paths.nearest(Memory.objects.all(), head).text == "from the start"
    assert paths.has_more_before(head, 5)
    assert len(list(paths.iter_path(head, chunk=2000))) == head.depth + 1


def test_a_broken_lineage_is_an_error_not_an_empty_story(user):
    adventure = tree.adventure_create(owner=user, title="t")
    Branch.objects.filter(adventure=adventure).update(lineage=[])
    with pytest.raises(BrokenLineage):
        paths.newest(fresh(adventure.head_id), 10)
    Branch.objects.filter(adventure=adventure).update(lineage=[[999_999, None]])
    with pytest.raises(BrokenLineage):
        Path.for_node(fresh(adventure.head_id))
