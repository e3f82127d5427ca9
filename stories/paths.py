"""Path selection: the only code that decides which nodes are "the story".

A path is read from a branch's cached lineage, `[[branch_id, max_depth], ...]`
newest first. The head's own entry is capped at the head's depth; every
ancestor entry is already capped one below the fork of the branch beneath it,
so the entries cover disjoint, contiguous depth ranges:

    entry i covers (cap of entry i+1, cap of entry i]      (the last one from 0)

and a path holds exactly one live node per depth from 0 to the head. That is
what lets a window be read with one query naming only the entries it needs:
the depth range decides the entries, no row has to be fetched to find out.

Everything that reads "the story" goes through this module; a forgotten
clause shows the wrong story quietly. Parent pointers are for integrity and
hashing, never walked one query per node here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db.models import Expression, F, IntegerField, Q, QuerySet

from .models import Branch, Memory, Node

Entry = tuple[int, int | None]

# Longer clauses switch from an OR chain to an IN + CASE form: SQLite parses
# `a OR b OR c ...` into a tree as deep as the chain and refuses depth 1,000,
# which a story forked a thousand times inside itself would reach.
OR_CLAUSE_LIMIT = 64
# nearest() asks the newest few entries first; a checkpoint is usually near the head.
NEAREST_FIRST_ENTRIES = 8
_UNBOUNDED = 2_147_483_647


class BrokenLineage(ValueError):
    """A branch's cached lineage cannot describe a path. Authority is broken: never a cache miss."""


@dataclass(frozen=True)
class Path:
    """The coordinates of one root-to-head path. Pure: building and asking it costs no query
    (except `for_node`, which reads `node.branch` if it is not already loaded)."""

    head_depth: int | None
    entries: list[Entry]

    @classmethod
    def for_node(cls, node: Node) -> Path:
        """The path ending at `node`'s coordinate (its own entry capped at node.depth)."""
        lineage = node.branch.lineage
        path = cls.from_lineage(lineage, node.depth)
        if path.entries[0][0] != node.branch_id:
            raise BrokenLineage(f"branch {node.branch_id}'s lineage does not start with itself: {lineage!r}")
        return path

    @classmethod
    def for_branch(cls, branch: Branch) -> Path:
        """Every depth of `branch` and the ancestors it borrows from (own entry unbounded)."""
        return cls.from_lineage(branch.lineage, None)

    @classmethod
    def from_lineage(cls, lineage: Sequence[Sequence[Any]], head_depth: int | None) -> Path:
        if not lineage:
            raise BrokenLineage("empty lineage")
        try:
            entries: list[Entry] = [(int(lineage[0][0]), head_depth)]
            entries += [(int(branch_id), int(cap)) for branch_id, cap in lineage[1:]]
        except (TypeError, ValueError) as exc:
            raise BrokenLineage(f"malformed lineage {lineage!r}") from exc
        return cls(head_depth=head_depth, entries=entries)

    # --- pure questions -------------------------------------------------------------------

    @cached_property
    def _ranges(self) -> list[tuple[int, int, int | None]]:
        out = []
        for i, (branch_id, cap) in enumerate(self.entries):
            low = self.entries[i + 1][1] + 1 if i + 1 < len(self.entries) else 0  # type: ignore[operator]
            out.append((branch_id, low, cap))
        return out

    def ranges(self) -> list[tuple[int, int, int | None]]:
        """(branch_id, lowest depth, highest depth or None) per entry, newest first."""
        return list(self._ranges)

    def covers(self, branch_id: int, depth: int) -> bool:
        """Is coordinate (branch_id, depth) on this path? No query."""
        for entry_branch, low, high in self._ranges:
            if entry_branch == branch_id:
                return depth >= low and (high is None or depth <= high)
        return False

    def branch_at(self, depth: int) -> int | None:
        """The branch whose node this path reads at `depth` (None past the head)."""
        if depth < 0 or (self.head_depth is not None and depth > self.head_depth):
            return None
        for entry_branch, low, high in self._ranges:
            if depth >= low and (high is None or depth <= high):
                return entry_branch
        return None

    def entries_between(self, low: int, high: int) -> list[Entry]:
        """Only the entries whose depth range meets [low, high], newest first."""
        return [
            (branch_id, cap)
            for (branch_id, cap), (_b, entry_low, entry_high) in zip(self.entries, self._ranges, strict=True)
            if entry_low <= high and (entry_high is None or entry_high >= low)
        ]

    # --- the clause --------------------------------------------------------------------------

    def clause(self, prefix: str = "", entries: Iterable[Entry] | None = None) -> Q:
        """OR of (branch = X AND depth <= cap) over `entries` (default: all of them), field
        names prefixed with `prefix` (e.g. "host_node__"). Does not add `live`: a caller
        reading nodes must (see `live_nodes`)."""
        return coordinate_clause(
            self.entries if entries is None else list(entries),
            branch_field=f"{prefix}branch",
            depth_field=f"{prefix}depth",
        )


def coordinate_clause(entries: Sequence[Entry], *, branch_field: str = "branch", depth_field: str = "depth") -> Q:
    if not entries:
        return Q(pk__in=[])
    if len(entries) <= OR_CLAUSE_LIMIT:
        q = Q()
        for branch_id, cap in entries:
            term = Q(**{branch_field: branch_id})
            if cap is not None:
                term &= Q(**{f"{depth_field}__lte": cap})
            q |= term
        return q
    # Same meaning, flat SQL: branch IN (...) AND depth <= CASE branch WHEN X THEN cap ... END
    return Q(
        **{
            f"{branch_field}__in": [branch_id for branch_id, _ in entries],
            f"{depth_field}__lte": _CapOf(branch_field, entries),
        }
    )


class _CapOf(Expression):
    """`CASE <branch> WHEN X THEN cap ... END`, compiled straight to SQL: Django's Case/When
    costs about 11 ms to build and compile at 200 entries, this well under one."""

    output_field = IntegerField()

    def __init__(self, branch_field: str, entries: Sequence[Entry]) -> None:
        super().__init__()
        self.branch = F(branch_field)
        self.entries = list(entries)

    def get_source_expressions(self) -> list:
        return [self.branch]

    def set_source_expressions(self, exprs) -> None:
        (self.branch,) = exprs

    def as_sql(self, compiler, connection):
        column, params = compiler.compile(self.branch)
        whens = " ".join(["WHEN %s THEN %s"] * len(self.entries))
        caps = [value for branch_id, cap in self.entries for value in (branch_id, _UNBOUNDED if cap is None else cap)]
        return f"CASE {column} {whens} END", [*params, *caps]


# --- reading nodes ----------------------------------------------------------------------------


def _window(path: Path, low: int, high: int) -> QuerySet[Node]:
    return Node.objects.filter(
        path.clause(entries=path.entries_between(low, high)), live=True, depth__gte=low, depth__lte=high
    )


def _window_newest_first(entries: list[Entry], low: int, high: int) -> list[Node]:
    """`_window(...).order_by("-depth")` as one hand-written statement.

    This is the hottest read in the product (every page, every turn). The ORM spends
    longer building and compiling the OR clause than SQLite spends running it, so the
    same SQL is written here directly; the selection is the one `_window` makes."""
    if not entries:
        return []
    terms, params = [], []
    for branch_id, cap in entries:
        if cap is None:
            terms.append("branch_id = %s")
            params.append(branch_id)
        else:
            terms.append("(branch_id = %s AND depth <= %s)")
            params += [branch_id, cap]
    sql = (
        f"SELECT * FROM {Node._meta.db_table} WHERE live = %s AND depth >= %s AND depth <= %s "
        f"AND ({' OR '.join(terms)}) ORDER BY depth DESC"
    )
    return list(Node.objects.raw(sql, [True, low, high, *params]))


def newest(head: Node, k: int, before_depth: int | None = None) -> list[Node]:
    """The newest `k` live nodes of head's path (depth < before_depth when given), ascending.

    One query for the window (plus one for head.branch if it is not loaded). Because a
    path holds one node per depth, the window's depth range names exactly the lineage
    entries it needs; only a path with a hole (an integrity violation) widens, once, to
    the whole lineage below the window. At most 3 queries whatever the depth or fork count.
    """
    path = Path.for_node(head)
    high = head.depth if before_depth is None else min(head.depth, before_depth - 1)
    if k <= 0 or high < 0:
        return []
    low = max(0, high - k + 1)
    entries = path.entries_between(low, high)
    if len(entries) <= OR_CLAUSE_LIMIT:
        nodes = _window_newest_first(entries, low, high)
    else:
        nodes = list(_window(path, low, high).order_by("-depth"))
    if len(nodes) < high - low + 1:
        # Not covered: read the newest k below `high` over every entry.
        nodes = list(Node.objects.filter(path.clause(), live=True, depth__lte=high).order_by("-depth", "-id")[:k])
    nodes.reverse()
    return nodes


@dataclass(frozen=True)
class Page:
    nodes: list[Node]
    has_more: bool


def page(head: Node, k: int, before_depth: int | None = None) -> Page:
    """A window for the API: the newest k nodes before `before_depth` and whether earlier ones
    exist. `has_more` costs no query: a path holds a node at every depth down to 0
    (invariant 1), so anything above depth 0 has more before it."""
    nodes = newest(head, k, before_depth)
    return Page(nodes=nodes, has_more=bool(nodes) and nodes[0].depth > 0)


def has_more_before(head: Node, depth: int) -> bool:
    """Does head's path hold any live node above `depth`'s start (depth < `depth`)? One query."""
    path = Path.for_node(head)
    high = min(head.depth, depth - 1)
    if high < 0:
        return False
    return Node.objects.filter(path.clause(), live=True, depth__lte=high).exists()


def iter_path(head: Node, chunk: int = 500) -> Iterator[Node]:
    """Root to head, one bounded query per `chunk` depths."""
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    path = Path.for_node(head)
    for low in range(0, head.depth + 1, chunk):
        high = min(low + chunk - 1, head.depth)
        yield from _window(path, low, high).order_by("depth")


def node_at(head: Node, depth: int) -> Node | None:
    """The live node at `depth` on head's path (None outside 0..head.depth). One query."""
    path = Path.for_node(head)
    if depth < 0 or depth > head.depth:
        return None
    return _window(path, depth, depth).first()


def on_path(head: Node, node: Node) -> bool:
    """Is `node` on head's path? No query beyond head.branch: the coordinate must be covered
    and the node must be the live attempt there (a sibling attempt is not the story)."""
    return bool(node.live) and Path.for_node(head).covers(node.branch_id, node.depth)


def nearest(queryset: QuerySet, head: Node, *, branch_field: str = "branch", depth_field: str = "depth"):
    """The newest row of `queryset` whose (branch, depth) lies on head's path, or None.

    Asks the newest few lineage entries first and the rest only if they hold nothing: the
    entries cover descending depth ranges, so a hit in the first group is the newest.
    `queryset` supplies any other condition (e.g. `host_node__live=True`)."""
    path = Path.for_node(head)
    order = f"-{depth_field}"
    groups = [path.entries[:NEAREST_FIRST_ENTRIES], path.entries[NEAREST_FIRST_ENTRIES:]]
    for entries in groups:
        if not entries:
            continue
        clause = coordinate_clause(entries, branch_field=branch_field, depth_field=depth_field)
        row = queryset.filter(clause).order_by(order, "-pk").first()
        if row is not None:
            return row
    return None


def memories_on_path(head: Node) -> QuerySet[Memory]:
    """Every memory anchored on head's path: the full lineage (memories are sparse and
    recall is long-range, so this one read is not windowed)."""
    path = Path.for_node(head)
    return Memory.objects.filter(path.clause(), adventure_id=head.adventure_id)


def live_nodes(head: Node) -> QuerySet[Node]:
    """The whole path as a queryset (unordered). For aggregates over the path; prefer
    `newest` / `iter_path` for reading nodes."""
    return Node.objects.filter(Path.for_node(head).clause(), live=True)
