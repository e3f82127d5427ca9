"""Reading and writing checkpoint rows: the nearest usable one on a path, validation on
read, and saving a pending one beside (or instead of) what its host already has.

A checkpoint is a cache. Anything wrong with the row itself (schema version, a hash, its
range, its summary, its size, the operator's invalidate flag, another model) is a cache
miss: the next older checkpoint on the path is tried, and the turn rebuilds what it needs.
A broken *authoritative* parent chain is not a cache problem: `BrokenAncestry`, always.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet

from stories import paths
from stories.models import Adventure, Node

from .hashing import SourceHasher, summary_digest
from .models import ContextCheckpoint
from .prompt import (
    CHECKPOINT_SCHEMA_VERSION,
    PROMPT_SCHEMA_VERSION,
    SUMMARY_CLASSIFICATION,
    BrokenAncestry,
    check_chain,
    checkpoint_part,
    checkpoint_tokens,
    current_stable_prefix_hash,
    turn_budget,
)

if TYPE_CHECKING:
    from stories.models import ModelProfile

__all__ = [
    "BrokenAncestry",
    "Miss",
    "candidates",
    "model_identity",
    "nearest_usable",
    "save_checkpoint",
    "source_hash_for",
    "validate",
    "validate_checkpoint",
]

SUMMARY_KEYS = frozenset({"classification", "summary", "key_points", "digest"})
# Source hashes verified in this process, keyed by everything the recomputation depends on
# in the row. Committed nodes are immutable, so a row that verified once verifies again:
# re-reading its whole covered path on every turn would make each turn O(depth). A changed
# row is a new key (and is verified again); tampering with committed nodes themselves is
# what `checkpoints.integrity` (which always recomputes) is for.
_VERIFIED: OrderedDict[tuple, None] = OrderedDict()
_VERIFIED_LOCK = threading.Lock()  # the web process may validate from several threads
VERIFIED_MEMO_SIZE = 4096
RELATED = ("host_node__branch", "covered_through", "retained_from")


def model_identity(profile: ModelProfile) -> str:
    """Which model a summary came from: a checkpoint is used only with the same one."""
    return f"{profile.provider}:{profile.model_name or '-'}"[:200]


@dataclass(frozen=True)
class Miss:
    checkpoint_id: int
    reason: str


def summary_problem(summary_json: Any, source_hash: str) -> str | None:
    """Why a stored summary is unusable (shape, classification, digest), or None."""
    if not isinstance(summary_json, dict) or set(summary_json) != SUMMARY_KEYS:
        return "summary_shape"
    if summary_json["classification"] != SUMMARY_CLASSIFICATION:
        return "summary_classification"
    summary, points = summary_json["summary"], summary_json["key_points"]
    if not isinstance(summary, str) or not summary.strip():
        return "summary_blank"
    if not isinstance(points, list) or not all(isinstance(p, str) and p.strip() for p in points):
        return "summary_shape"
    expected = summary_digest(
        summary=summary, key_points=points, classification=SUMMARY_CLASSIFICATION, source_hash=source_hash
    )
    if summary_json["digest"] != expected:
        return "summary_digest"
    return None


def source_hash_for(
    *, adventure_id: int, covered: Node, stable_prefix_hash: str, nodes: list[Node] | None = None
) -> tuple[str, int]:
    """(source_hash, covered UTF-8 bytes) of root..covered, verifying the parent chain as it
    reads (BrokenAncestry when it is broken). `nodes`: the path already in memory."""
    hasher = SourceHasher(
        checkpoint_schema_version=CHECKPOINT_SCHEMA_VERSION,
        prompt_schema_version=PROMPT_SCHEMA_VERSION,
        stable_prefix_hash=stable_prefix_hash,
        adventure_id=adventure_id,
    )
    previous = None
    size = 0
    for node in nodes if nodes is not None else paths.iter_path(covered):
        check_chain(previous, node)
        hasher.add(node)
        size += len(node.player_input.encode()) + len(node.narration.encode())
        previous = node
    if previous is None or previous.pk != covered.pk:
        # The path read at covered's coordinate is not covered's own (e.g. it is no longer live).
        return "", size
    return hasher.hexdigest(), size


def validate(
    checkpoint: ContextCheckpoint,
    *,
    head: Node | None = None,
    stable_prefix_hash: str | None = None,
    model_name: str | None = None,
    max_summary_tokens: int | None = None,
    verify_source: bool = True,
) -> str | None:
    """Why `checkpoint` is unusable for a turn at `head` (None: usable). Cheap checks first;
    `verify_source` recomputes the source hash over root..covered. The expectations left
    None are not checked. Raises BrokenAncestry for a broken parent chain."""
    cp = checkpoint
    if cp.invalidated:
        return "invalidated"
    if cp.checkpoint_schema_version != CHECKPOINT_SCHEMA_VERSION or cp.prompt_schema_version != PROMPT_SCHEMA_VERSION:
        return "schema_version"
    if stable_prefix_hash is not None and cp.stable_prefix_hash != stable_prefix_hash:
        return "stable_prefix_changed"
    if model_name is not None and cp.model_name != model_name:
        return "model_changed"
    problem = summary_problem(cp.summary_json, cp.source_hash)
    if problem:
        return problem
    size = checkpoint_tokens(checkpoint_part(cp.summary_json, cp.covered_depth))
    if cp.summary_bytes != size:
        return "summary_size_mismatch"
    if max_summary_tokens is not None and size > max_summary_tokens:
        return "oversize"
    host, covered, retained = cp.host_node, cp.covered_through, cp.retained_from
    if retained is None or not host.live or host.adventure_id != cp.adventure_id:
        return "bad_range"
    if (host.branch_id, host.depth) != (cp.branch_id, cp.depth):
        return "bad_range"
    if covered.adventure_id != cp.adventure_id or retained.adventure_id != cp.adventure_id:
        return "bad_range"
    if not (covered.depth == cp.covered_depth < host.depth and retained.depth == covered.depth + 1 <= host.depth):
        return "bad_range"
    if retained.parent_id != covered.pk:
        return "bad_range"
    # Host, retained and covered on one root path, in order: both lie on host's path.
    if not (paths.on_path(host, retained) and paths.on_path(host, covered)):
        return "bad_range"
    if head is not None and not (paths.on_path(head, host) and paths.on_path(head, covered)):
        return "not_on_path"
    if verify_source:
        key = _verified_key(cp)
        with _VERIFIED_LOCK:
            if key in _VERIFIED:
                _VERIFIED.move_to_end(key)
                return None
        expected, _size = source_hash_for(
            adventure_id=cp.adventure_id, covered=covered, stable_prefix_hash=cp.stable_prefix_hash
        )
        if expected != cp.source_hash:
            return "source_hash_mismatch"
        with _VERIFIED_LOCK:
            _VERIFIED[key] = None
            while len(_VERIFIED) > VERIFIED_MEMO_SIZE:
                _VERIFIED.popitem(last=False)
    return None


def _verified_key(cp: ContextCheckpoint) -> tuple:
    return (
        cp.pk,
        cp.created_at,
        cp.adventure_id,
        cp.covered_through_id,
        cp.covered_depth,
        cp.checkpoint_schema_version,
        cp.prompt_schema_version,
        cp.stable_prefix_hash,
        cp.source_hash,
    )


def validate_checkpoint(checkpoint: ContextCheckpoint) -> tuple[bool, str]:
    """(usable, reason) for the operator's validity column: every check, against the
    adventure's current stable prefix, model and budget."""
    adventure = checkpoint.adventure
    try:
        reason = validate(
            checkpoint,
            stable_prefix_hash=current_stable_prefix_hash(adventure),
            model_name=model_identity(adventure.model_profile),
            max_summary_tokens=_summary_cap(adventure),
        )
    except BrokenAncestry:
        return False, "broken_ancestry"
    return reason is None, reason or "ok"


def _summary_cap(adventure: Adventure) -> int | None:
    from stories.llm.tools import REQUEST_CHECK, SUBMIT_TURN_PLAN

    from .budget import ContextError

    try:
        return turn_budget(adventure, [REQUEST_CHECK, SUBMIT_TURN_PLAN]).summary_cap
    except ContextError:
        return 0


def candidates(adventure: Adventure) -> QuerySet[ContextCheckpoint]:
    """Rows that may serve a path of `adventure`: hosted on a live node (a checkpoint on a
    non-live attempt shares its coordinate with the live one, but is not on any path).

    No `adventure=` filter: the path clause names this adventure's branches already, and
    with that filter SQLite picks the adventure index and scans every checkpoint of the
    story instead of probing (branch, depth) per lineage entry."""
    return ContextCheckpoint.objects.filter(host_node__live=True).select_related(*RELATED)


def nearest_usable(
    adventure: Adventure,
    head: Node,
    *,
    stable_prefix_hash: str,
    model_name: str,
    max_summary_tokens: int,
) -> tuple[ContextCheckpoint | None, list[Miss]]:
    """The nearest checkpoint on head's path that passes validation, and the misses skipped
    on the way. One query finds the nearest (the path clause over the host's coordinates,
    live hosts only: a checkpoint on a non-live attempt is never on a path); each miss
    costs one more query for the next older one."""
    queryset = candidates(adventure)
    misses: list[Miss] = []
    while True:
        checkpoint = paths.nearest(queryset, head)
        if checkpoint is None:
            return None, misses
        if checkpoint.covered_depth < head.depth:
            reason = validate(
                checkpoint,
                head=head,
                stable_prefix_hash=stable_prefix_hash,
                model_name=model_name,
                max_summary_tokens=max_summary_tokens,
            )
        else:
            reason = "bad_range"
        if reason is None:
            return checkpoint, misses
        misses.append(Miss(checkpoint.pk, reason))
        queryset = queryset.filter(depth__lt=checkpoint.depth)


def _keeps_existing(existing: ContextCheckpoint, pending: ContextCheckpoint) -> bool:
    """Is the host's existing row usable and at least as good as `pending` (so pending is
    dropped)? A corrupt or stale row never survives: it would only miss again."""
    if existing.covered_depth < pending.covered_depth:
        return False
    same_basis = (
        existing.checkpoint_schema_version == pending.checkpoint_schema_version
        and existing.prompt_schema_version == pending.prompt_schema_version
        and existing.stable_prefix_hash == pending.stable_prefix_hash
        and existing.model_name == pending.model_name
    )
    if not same_basis:
        return False
    # Same coverage: pending's source hash was just computed, so equality proves existing's.
    same_source = (
        existing.covered_through_id == pending.covered_through_id and existing.source_hash == pending.source_hash
    )
    if existing.covered_depth == pending.covered_depth and not same_source:
        return False
    reason = validate(existing, max_summary_tokens=_summary_cap(existing.adventure), verify_source=not same_source)
    return reason is None


def save_checkpoint(pending: ContextCheckpoint) -> ContextCheckpoint:
    """Save `pending` on its host, replacing the host's row when pending covers more or that
    row is unusable; otherwise keep the existing row. Returns the row that stands. Call
    inside a transaction."""
    existing = ContextCheckpoint.objects.select_for_update().filter(host_node_id=pending.host_node_id).first()
    if existing is not None:
        if _keeps_existing(existing, pending):
            return existing
        existing.delete()
    # A pending row is built unsaved; a rolled-back earlier save may have given it a pk.
    pending.pk = None
    pending._state.adding = True
    pending.save()
    return pending
