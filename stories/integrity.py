"""The story tree's invariant checker (DESIGN.md, "Invariants"). Used by tests and by
`manage.py check_story_integrity`.

1. Live nodes on a path form a parent chain: each node's `parent` is the live node
   one depth up on its branch's path.
2. Exactly one live node per occupied (branch, depth).
3. The head is a live node; its branch's lineage reaches the root branch.
4. Lineages are acyclic and each ancestor entry is capped below the fork.
5. Checkpoints: delegated to `checkpoints.integrity.check(adventure)` when that module exists.

Reads the whole adventure in two queries (branches, then node coordinates), so it
costs the same on any shape of tree and never walks parent pointers one query at a time.
"""

from __future__ import annotations

import importlib
import importlib.util
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .models import Adventure, Branch, Node


@dataclass(frozen=True)
class Violation:
    code: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


def check_adventure(adventure: Adventure) -> list[Violation]:
    branches = {
        row["id"]: row
        for row in Branch.objects.filter(adventure_id=adventure.pk).values(
            "id", "parent_branch_id", "fork_depth", "lineage"
        )
    }
    nodes = list(
        Node.objects.filter(adventure_id=adventure.pk).values_list("id", "branch_id", "depth", "parent_id", "live")
    )
    head_id = Adventure.objects.values_list("head_id", flat=True).get(pk=adventure.pk)

    violations: list[Violation] = []
    valid = _check_lineages(branches, violations)
    live = _check_live_per_coordinate(branches, nodes, violations)
    _check_parent_chain(branches, valid, nodes, live, violations)
    _check_head(branches, valid, nodes, head_id, violations)
    violations += _checkpoint_violations(adventure)
    return violations


# --- 4. lineages ------------------------------------------------------------------------------


def _lineage_entries(raw: Any) -> list[tuple[int, int | None]] | None:
    if not isinstance(raw, list) or not raw:
        return None
    out: list[tuple[int, int | None]] = []
    for entry in raw:
        if not isinstance(entry, list | tuple) or len(entry) != 2 or not isinstance(entry[0], int):
            return None
        if entry[1] is not None and not isinstance(entry[1], int):
            return None
        out.append((entry[0], entry[1]))
    return out


def _check_lineages(branches: dict[int, dict], violations: list[Violation]) -> dict[int, list]:
    """Returns {branch_id: entries} for branches whose lineage can describe a path."""
    valid: dict[int, list] = {}
    roots = [b for b in branches.values() if b["parent_branch_id"] is None]
    if len(roots) != 1:
        violations.append(Violation("root_branch_count", f"expected one root branch, found {len(roots)}"))

    for branch_id, row in branches.items():
        # Parent-branch chain must end at a root without revisiting a branch.
        seen = {branch_id}
        parent = row["parent_branch_id"]
        while parent is not None:
            if parent in seen or parent not in branches:
                violations.append(
                    Violation("branch_cycle", f"branch {branch_id}'s parent chain loops or leaves the adventure")
                )
                break
            seen.add(parent)
            parent = branches[parent]["parent_branch_id"]

    for branch_id, row in branches.items():
        entries = _lineage_entries(row["lineage"])
        label = f"branch {branch_id}"
        if entries is None:
            violations.append(
                Violation("lineage_malformed", f"{label} lineage is not [[id, cap], ...]: {row['lineage']!r}")
            )
            continue
        ok = True
        if entries[0] != (branch_id, None):
            violations.append(Violation("lineage_head", f"{label} lineage must start with [{branch_id}, null]"))
            ok = False
        ids = [b for b, _ in entries]
        if len(set(ids)) != len(ids):
            violations.append(Violation("lineage_cycle", f"{label} lineage names a branch twice: {ids}"))
            ok = False
        foreign = [b for b in ids if b not in branches]
        if foreign:
            violations.append(
                Violation("lineage_foreign", f"{label} lineage names branches not in this adventure: {foreign}")
            )
            ok = False
        caps = [cap for _, cap in entries[1:]]
        if any(cap is None or cap < 0 for cap in caps) or any(a <= b for a, b in zip(caps, caps[1:], strict=False)):
            violations.append(
                Violation("lineage_cap", f"{label} ancestor caps must be non-negative and decreasing: {caps}")
            )
            ok = False
        parent = row["parent_branch_id"]
        if parent is None:
            if len(entries) != 1 or row["fork_depth"] != 0:
                violations.append(Violation("root_lineage", f"root {label} must fork at 0 with a one-entry lineage"))
                ok = False
        elif parent in branches:
            expected_next = (parent, row["fork_depth"] - 1)
            parent_entries = _lineage_entries(branches[parent]["lineage"]) or []
            if len(entries) < 2 or entries[1] != expected_next or entries[2:] != parent_entries[1:]:
                violations.append(
                    Violation(
                        "lineage_mismatch",
                        f"{label} lineage must be itself, [{parent}, {row['fork_depth'] - 1}] (capped below its fork), "
                        f"then its parent's ancestors",
                    )
                )
                ok = False
            if row["fork_depth"] < 1:
                violations.append(Violation("lineage_cap", f"{label} forks at depth {row['fork_depth']}"))
                ok = False
        if ok:
            valid[branch_id] = entries
    return valid


# --- 2. one live node per coordinate ------------------------------------------------------------


def _check_live_per_coordinate(branches, nodes, violations) -> dict[tuple[int, int], int]:
    live: dict[tuple[int, int], list[int]] = defaultdict(list)
    occupied: set[tuple[int, int]] = set()
    for node_id, branch_id, depth, _parent, is_live in nodes:
        occupied.add((branch_id, depth))
        if branch_id not in branches:
            violations.append(
                Violation("node_branch", f"node {node_id} is on branch {branch_id}, not of this adventure")
            )
        if is_live:
            live[(branch_id, depth)].append(node_id)
        if branch_id in branches and depth < branches[branch_id]["fork_depth"]:
            violations.append(
                Violation("node_before_fork", f"node {node_id} sits at depth {depth}, before its branch's fork")
            )
    for coordinate in sorted(occupied):
        count = len(live.get(coordinate, []))
        if count != 1:
            violations.append(
                Violation(
                    "live_count", f"coordinate (branch {coordinate[0]}, depth {coordinate[1]}) has {count} live nodes"
                )
            )
    return {coordinate: ids[0] for coordinate, ids in live.items() if len(ids) == 1}


# --- 1. parent chains --------------------------------------------------------------------------


def _check_parent_chain(branches, valid, nodes, live, violations) -> None:
    # Per branch: the depths at which each lineage entry starts, ascending, for bisection.
    lookup: dict[int, tuple[list[int], list[int]]] = {}
    for branch_id, entries in valid.items():
        lows, owners = [], []
        for i in range(len(entries) - 1, -1, -1):
            low = entries[i + 1][1] + 1 if i + 1 < len(entries) else 0
            lows.append(low)
            owners.append(entries[i][0])
        lookup[branch_id] = (lows, owners)

    for node_id, branch_id, depth, parent_id, _live in nodes:
        if depth == 0:
            if parent_id is not None:
                violations.append(Violation("parent_chain", f"node {node_id} at depth 0 has a parent"))
            elif branch_id in branches and branches[branch_id]["parent_branch_id"] is not None:
                violations.append(Violation("parent_chain", f"node {node_id} at depth 0 is not on the root branch"))
            continue
        if branch_id not in lookup:
            continue  # its lineage is already reported
        lows, owners = lookup[branch_id]
        owner = owners[bisect_right(lows, depth - 1) - 1]
        expected = live.get((owner, depth - 1))
        if parent_id != expected:
            violations.append(
                Violation(
                    "parent_chain",
                    f"node {node_id} (branch {branch_id}, depth {depth}) has parent {parent_id}; its path's live "
                    f"node one depth up is {expected}",
                )
            )


# --- 3. the head --------------------------------------------------------------------------------


def _check_head(branches, valid, nodes, head_id, violations) -> None:
    if head_id is None:
        violations.append(Violation("head_missing", "the adventure has no head"))
        return
    head = next((n for n in nodes if n[0] == head_id), None)
    if head is None:
        violations.append(Violation("head_missing", f"head {head_id} is not a node of this adventure"))
        return
    _id, branch_id, _depth, _parent, is_live = head
    if not is_live:
        violations.append(Violation("head_not_live", f"head {head_id} is not the live attempt at its coordinate"))
    entries = valid.get(branch_id)
    if entries is None:
        violations.append(Violation("head_root", f"head {head_id}'s branch {branch_id} has no usable lineage"))
        return
    root = entries[-1][0]
    if branches[root]["parent_branch_id"] is not None:
        violations.append(Violation("head_root", f"head {head_id}'s lineage ends at branch {root}, not the root"))


# --- 5. checkpoints (owned by the checkpoints app) ---------------------------------------------


def _checkpoint_violations(adventure: Adventure) -> list[Violation]:
    # Looked up rather than imported so the checker works before (and without) that module;
    # an error inside it is a real failure, not a missing module, and is not swallowed.
    if importlib.util.find_spec("checkpoints") is None or importlib.util.find_spec("checkpoints.integrity") is None:
        return []
    module = importlib.import_module("checkpoints.integrity")
    return list(module.check(adventure))
