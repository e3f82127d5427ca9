"""Invariant 5 (DESIGN.md): a checkpoint's host, covered and retained nodes lie on one root
path, in order, and its hashes recompute. Called by `stories.integrity.check_adventure`
(and so by `manage.py check_story_integrity`) through `check(adventure)`.

A checkpoint whose stable prefix or model no longer matches the adventure is stale, not
broken: the store treats it as a cache miss, and it is not reported here.
"""

from __future__ import annotations

from stories import paths
from stories.integrity import Violation
from stories.models import Adventure

from .models import ContextCheckpoint
from .prompt import BrokenAncestry, checkpoint_part, checkpoint_tokens
from .store import source_hash_for, summary_problem


def check(adventure: Adventure) -> list[Violation]:
    violations: list[Violation] = []
    rows = ContextCheckpoint.objects.filter(adventure_id=adventure.pk).select_related(
        "host_node__branch", "covered_through", "retained_from"
    )
    for cp in rows.order_by("pk"):
        violations += _check_one(cp)
    return violations


def _check_one(cp: ContextCheckpoint) -> list[Violation]:
    name = f"checkpoint {cp.pk}"
    host, covered, retained = cp.host_node, cp.covered_through, cp.retained_from
    if host.adventure_id != cp.adventure_id or covered.adventure_id != cp.adventure_id:
        return [Violation("checkpoint_adventure", f"{name} refers to nodes of another adventure")]
    if retained is not None and retained.adventure_id != cp.adventure_id:
        return [Violation("checkpoint_adventure", f"{name} refers to nodes of another adventure")]
    problems = []
    if (host.branch_id, host.depth) != (cp.branch_id, cp.depth):
        problems.append(
            Violation(
                "checkpoint_coordinates",
                f"{name} records ({cp.branch_id}, {cp.depth}) but its host node {host.pk} is at "
                f"({host.branch_id}, {host.depth})",
            )
        )
    in_order = covered.depth == cp.covered_depth < host.depth and (
        retained is None or (retained.parent_id == covered.pk and retained.depth == covered.depth + 1 <= host.depth)
    )
    # The host itself is on its own path even when a retry has made it a non-live attempt.
    on_one_path = _on_host_path(host, covered) and (retained is None or _on_host_path(host, retained))
    if not (in_order and on_one_path):
        problems.append(
            Violation(
                "checkpoint_range",
                f"{name}: host {host.pk} (depth {host.depth}), covered {covered.pk} (depth {covered.depth}, "
                f"recorded {cp.covered_depth}) and retained {cp.retained_from_id} are not one root path in order",
            )
        )
        return problems
    try:
        source, _size = source_hash_for(
            adventure_id=cp.adventure_id, covered=covered, stable_prefix_hash=cp.stable_prefix_hash
        )
    except BrokenAncestry:
        problems.append(Violation("checkpoint_ancestry", f"{name}: the path to covered node {covered.pk} is broken"))
        return problems
    if source != cp.source_hash:
        problems.append(Violation("checkpoint_source_hash", f"{name}: source_hash does not recompute"))
    summary = summary_problem(cp.summary_json, cp.source_hash)
    if summary:
        problems.append(Violation("checkpoint_summary", f"{name}: stored summary is unusable ({summary})"))
    elif cp.summary_bytes != checkpoint_tokens(checkpoint_part(cp.summary_json, cp.covered_depth)):
        problems.append(Violation("checkpoint_summary", f"{name}: summary_bytes does not match the summary"))
    return problems


def _on_host_path(host, node) -> bool:
    return node.pk == host.pk or paths.on_path(host, node)
