"""Synthetic adventures for tests and benchmarks: `build_story(nodes=N, forks=F, bytes_per_node=B)`.

The rows are the ones the tree functions would have written for a player who
played a long story and, F times, went back one turn and played differently:

    root branch ── ... ── f1 ── (one abandoned node at f1, left on the parent)
                           └─ branch 1 ── ... ── f2 ── (abandoned at f2)
                                                  └─ branch 2 ...  ── head

so the head's path crosses F forks, each a fork of the previous one (a lineage
of F + 1 entries), and every fork has what made it a fork: the parent branch
continues one node past the fork point. N counts every node: N - F on the
head's path (depths 0..N-F-1) plus the F abandoned ones. Parents, lineages, live
flags and `state_after` are exactly what `stories.tree` produces; the integrity
checker passes on the result. Written with bulk_create: 10,000 nodes with 200
forks take a second or two on SQLite.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from .models import Adventure, Branch, Node
from .tree import INITIAL_STATE, adventure_create

SYNTHETIC_USERNAME = "synthetic"
KINDS = (Node.Kind.DO, Node.Kind.SAY, Node.Kind.CONTINUE, Node.Kind.STORY)
PROSE = (
    "The lantern light trembles on wet stone as the tide pulls at the pilings below, and somewhere above "
    "a shutter bangs against the wind. "
)


def _text(depth: int, size: int) -> str:
    prefix = f"[{depth}] "
    if size <= len(prefix):
        return prefix[: max(size, 0)]
    body = PROSE * (size // len(PROSE) + 1)
    return prefix + body[: size - len(prefix)]


def _state(maren: int) -> dict:
    state = {key: type(value)() for key, value in INITIAL_STATE.items()}
    state["relationships"] = {"Maren": maren}
    return state


def fork_depths(path_nodes: int, forks: int) -> list[int]:
    """Evenly spaced, strictly increasing fork depths in 1..path_nodes-1."""
    return [k * path_nodes // (forks + 1) for k in range(1, forks + 1)]


@transaction.atomic
def build_story(
    *, nodes: int, forks: int = 0, bytes_per_node: int = 1000, owner=None, title: str | None = None
) -> Adventure:
    if forks < 0 or bytes_per_node < 0:
        raise ValueError("forks and bytes must not be negative")
    if nodes < 2 * forks + 1:
        raise ValueError(
            f"{forks} forks need at least {2 * forks + 1} nodes (each fork adds a branch and leaves one behind)"
        )
    if owner is None:
        owner, created = get_user_model().objects.get_or_create(username=SYNTHETIC_USERNAME)
        if created:
            owner.set_unusable_password()
            owner.save(update_fields=["password"])

    path_nodes = nodes - forks
    adventure = adventure_create(
        owner=owner,
        title=title or f"Synthetic: {nodes} nodes, {forks} forks",
        premise=_text(0, bytes_per_node),
    )
    root_branch = Branch.objects.get(adventure=adventure)
    root = Node.objects.get(pk=adventure.head_id)
    root.state_after = _state(0)
    root.save(update_fields=["state_after"])

    # Branches: a chain, each forked from the previous one.
    splits = fork_depths(path_nodes, forks)
    chain = [root_branch]
    if forks:
        created = Branch.objects.bulk_create(
            [Branch(adventure=adventure, fork_depth=depth, lineage=[]) for depth in splits]
        )
        for parent, branch in zip([root_branch, *created], created, strict=False):
            branch.parent_branch = parent
            branch.lineage = [[branch.pk, None], [parent.pk, branch.fork_depth - 1], *parent.lineage[1:]]
        Branch.objects.bulk_update(created, ["parent_branch", "lineage"], batch_size=500)
        chain += created

    def branch_for(depth: int) -> Branch:
        index = 0
        while index < len(splits) and depth >= splits[index]:
            index += 1
        return chain[index]

    # The head's path, depth 1.., parents filled in after the ids exist.
    maren = 0
    states = {0: 0}
    path = []
    for depth in range(1, path_nodes):
        step = 1 if (depth // 10) % 2 == 0 else -1
        maren = max(-100, min(100, maren + step))
        states[depth] = maren
        path.append(
            Node(
                adventure=adventure,
                branch=branch_for(depth),
                depth=depth,
                live=True,
                kind=KINDS[depth % len(KINDS)],
                player_input=f"Action {depth}",
                narration=_text(depth, bytes_per_node),
                suggestions=["Look around", "Press on"],
                state_delta=[{"op": "adjust_relationship", "npc": "Maren", "by": step}],
                state_after=_state(maren),
                model_name="storytree-builtin",
            )
        )
    Node.objects.bulk_create(path, batch_size=1000)
    ids = [root.pk] + [node.pk for node in path]
    if any(pk is None for pk in ids):
        raise RuntimeError("bulk_create did not return ids on this database")
    table = connection.ops.quote_name(Node._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET {connection.ops.quote_name('parent_id')} = %s WHERE {connection.ops.quote_name('id')} = %s",
            [(ids[depth - 1], ids[depth]) for depth in range(1, path_nodes)],
        )

    # What made each fork a fork: the parent branch's own node at the fork depth, left behind.
    abandoned = [
        Node(
            adventure=adventure,
            branch=chain[k],
            depth=depth,
            parent_id=ids[depth - 1],
            live=True,
            kind=Node.Kind.DO,
            player_input=f"Abandoned action {depth}",
            narration=_text(depth, bytes_per_node),
            suggestions=["Look around", "Press on"],
            state_delta=[{"op": "adjust_relationship", "npc": "Maren", "by": -1}],
            state_after=_state(max(-100, states[depth - 1] - 1)),
            model_name="storytree-builtin",
        )
        for k, depth in enumerate(splits)
    ]
    Node.objects.bulk_create(abandoned, batch_size=1000)

    adventure.head_id = ids[-1]
    adventure.version = nodes
    adventure.last_played_at = timezone.now()
    adventure.save(update_fields=["head", "version", "last_played_at"])
    adventure.refresh_from_db()
    return adventure
