"""The retention pass: delete cache rows (context checkpoints) and log rows (finished turn
jobs) that nobody can need, and never anything else. The contract is `docs/retention.md`.

One pass over one adventure:

1. computes the **protected set** over the whole adventure: the nearest usable checkpoint
   (as `store.nearest_usable` finds it, for every tool set a turn may offer) of every
   *resume target*, i.e. every node a turn may be composed at without anything being
   written first: each branch tip, the head, the undo/redo neighbours of the head, every
   attempt the attempt pager switches to with one click (at the head's coordinate and at
   tips; a non-live attempt counts as if switched to), and every node a queued, running
   or still retryable job expects (`expected_head`, the target, the target's parent). A
   turn at a node may also be a retry there, composed at its parent: when the nearest
   checkpoint is hosted on the node itself, the parent's nearest is protected as well;
2. marks as **reclaimable** every checkpoint of the adventure outside that set (invalid
   ones included: the validator decides, nothing here re-implements validity), and every
   finished job older than STORYTREE_JOB_RETENTION_DAYS that is not protected;
3. deletes, in one transaction that first locks the adventure row (every turn commit,
   head move and job creation locks it too) and **recomputes** the plan, so that nothing
   a racing turn committed or made protected is ever deleted. Rows are deleted by the ids
   the locked recompute saw, so a checkpoint committed after it (a compaction saved
   without the adventure lock) is never among them.

Nodes, branches, memories and world entries are authority: this module never deletes
them. If the protected set cannot be computed (broken ancestry or lineage, a profile whose
window cannot hold a turn), no checkpoint of that adventure is reclaimable: a deletion
that cannot be proven safe does not happen.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from stories import paths
from stories.llm.tools import SUBMIT_TURN_PLAN
from stories.models import Adventure, Node, TurnJob
from stories.tree import text_bytes

from . import store
from .budget import ContextError
from .context import TURN_TOOLS
from .models import ContextCheckpoint
from .prompt import BrokenAncestry, current_stable_prefix_hash, turn_budget

log = logging.getLogger(__name__)

__all__ = [
    "KindReport",
    "Measure",
    "Plan",
    "PruneReport",
    "plan",
    "prune_adventure",
    "prune_all",
    "resume_targets",
    "total",
]

# Every tool set a turn may offer: a play or retry turn, and regenerate (submit_turn_plan
# only). The budget, and so the largest usable summary, depends on the tools.
TOOL_SETS: tuple[list, ...] = (TURN_TOOLS, [SUBMIT_TURN_PLAN])
FINISHED = (TurnJob.Status.DONE, TurnJob.Status.FAILED, TurnJob.Status.CANCELLED)
UNFINISHED = (TurnJob.Status.QUEUED, TurnJob.Status.RUNNING)
RETRYABLE = (TurnJob.Status.FAILED, TurnJob.Status.CANCELLED)
# Ids per DELETE / measuring query (well under any database's bound-parameter limit).
CHUNK = 500


# --- the report -------------------------------------------------------------------------------


@dataclass
class Measure:
    rows: int = 0
    bytes: int = 0

    def __add__(self, other: Measure) -> Measure:
        return Measure(self.rows + other.rows, self.bytes + other.bytes)

    def __sub__(self, other: Measure) -> Measure:
        return Measure(self.rows - other.rows, self.bytes - other.bytes)


@dataclass
class KindReport:
    """Rows and bytes (stored size of text and JSON columns, as `tree.branch_delete`
    reports them) before the pass, reclaimable by it, and after it (for a dry run: what
    would remain)."""

    before: Measure = field(default_factory=Measure)
    reclaimable: Measure = field(default_factory=Measure)
    after: Measure = field(default_factory=Measure)

    def __add__(self, other: KindReport) -> KindReport:
        return KindReport(self.before + other.before, self.reclaimable + other.reclaimable, self.after + other.after)


@dataclass
class PruneReport:
    adventure_id: int | None  # None: a total over several adventures
    dry_run: bool
    checkpoints: KindReport = field(default_factory=KindReport)
    jobs: KindReport = field(default_factory=KindReport)
    protected_checkpoints: int = 0
    protected_jobs: int = 0
    # Reclaimable checkpoints by why they go: "unreferenced" (usable, but nobody's nearest)
    # or the validator's reason ("invalidated", "model_changed", "bad_range", ...).
    reasons: dict[str, int] = field(default_factory=dict)
    # Why no checkpoint of this adventure was reclaimable although some exist ("" when none).
    skipped: str = ""
    adventures: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def total(reports: Iterable[PruneReport], *, dry_run: bool) -> PruneReport:
    """One report summing `reports` (adventure_id None)."""
    out = PruneReport(adventure_id=None, dry_run=dry_run, adventures=0)
    for report in reports:
        out.adventures += report.adventures
        out.checkpoints = out.checkpoints + report.checkpoints
        out.jobs = out.jobs + report.jobs
        out.protected_checkpoints += report.protected_checkpoints
        out.protected_jobs += report.protected_jobs
        for reason, count in report.reasons.items():
            out.reasons[reason] = out.reasons.get(reason, 0) + count
    return out


# --- the plan -----------------------------------------------------------------------------------


@dataclass
class Plan:
    """What a pass over one adventure keeps and what it may delete."""

    adventure_id: int
    protected_checkpoints: set[int] = field(default_factory=set)
    protected_jobs: set[int] = field(default_factory=set)
    reclaimable_checkpoints: list[int] = field(default_factory=list)
    reclaimable_jobs: list[int] = field(default_factory=list)
    skipped: str = ""

    @property
    def empty(self) -> bool:
        return not (self.reclaimable_checkpoints or self.reclaimable_jobs)


def job_retention_days() -> int:
    return int(getattr(settings, "STORYTREE_JOB_RETENTION_DAYS", 30))


def protected_jobs(adventure: Adventure) -> QuerySet[TurnJob]:
    """Jobs that are pending work or an explicit resume target: queued and running ones, and
    failed or cancelled ones the player can still retry (`turns.job_retry` accepts a job
    only while the story has not moved since it was requested)."""
    return TurnJob.objects.filter(
        Q(status__in=UNFINISHED) | Q(status__in=RETRYABLE, expected_version=adventure.version),
        adventure_id=adventure.pk,
    )


def _tips(adventure_id: int) -> QuerySet[Node]:
    """Each branch's tip: its live node of greatest depth (where `branch_switch` lands)."""
    deeper = Node.objects.filter(branch_id=OuterRef("branch_id"), live=True, depth__gt=OuterRef("depth"))
    return Node.objects.filter(adventure_id=adventure_id, live=True).exclude(Exists(deeper))


def resume_targets(adventure: Adventure, jobs: Iterable[TurnJob] = ()) -> dict[int, Node]:
    """Every node a turn may be composed at without anything being written first, by id:
    branch tips, the head, the head's parent (undo) and the next node redo reaches, every
    attempt the pager switches to (at the head's coordinate and at tips), and the nodes
    `jobs` expect (expected head, target, the target's parent). Loaded with their branch."""
    ids: set[int] = set()
    head = Node.objects.select_related("branch").get(pk=adventure.head_id)
    tips = list(_tips(adventure.pk).values_list("id", "branch_id", "depth"))
    ids.update(pk for pk, _branch, _depth in tips)
    ids.add(head.pk)
    if head.parent_id is not None:
        ids.add(head.parent_id)
    if adventure.redo_tip_id is not None:
        redo_tip = Node.objects.select_related("branch").filter(pk=adventure.redo_tip_id, live=True).first()
        if redo_tip is not None and redo_tip.depth > head.depth:
            ids.add(redo_tip.pk)
            forward = paths.node_at(redo_tip, head.depth + 1)
            if forward is not None:
                ids.add(forward.pk)
    coordinates = {(branch, depth) for _pk, branch, depth in tips} | {(head.branch_id, head.depth)}
    # Attempts the pager offers: every non-live attempt at one of those coordinates.
    for pk, branch, depth in Node.objects.filter(adventure_id=adventure.pk, live=False).values_list(
        "id", "branch_id", "depth"
    ):
        if (branch, depth) in coordinates:
            ids.add(pk)
    for job in jobs:
        ids.update(pk for pk in (job.expected_head_id, job.target_node_id) if pk is not None)
        if job.target_node_id is not None:
            parent = Node.objects.filter(pk=job.target_node_id).values_list("parent_id", flat=True).first()
            if parent is not None:
                ids.add(parent)
    nodes = Node.objects.select_related("branch").filter(adventure_id=adventure.pk, pk__in=ids)
    return {node.pk: node for node in nodes}


@dataclass(frozen=True)
class _Lookup:
    """What `store.nearest_usable` needs besides the node: one per distinct summary cap."""

    stable_prefix_hash: str
    model_name: str
    max_summary_tokens: int


def _lookups(adventure: Adventure) -> list[_Lookup]:
    prefix_hash = current_stable_prefix_hash(adventure)
    model_name = store.model_identity(adventure.model_profile)
    caps = {turn_budget(adventure, tools).summary_cap for tools in TOOL_SETS}
    return [_Lookup(prefix_hash, model_name, cap) for cap in sorted(caps)]


def _own_checkpoint_if_switched(node: Node, lookup: _Lookup) -> ContextCheckpoint | None:
    """The checkpoint hosted on the non-live attempt `node`, if it would be usable once the
    pager switched to it. The validator is asked exactly as a turn would ask it; only the
    `live` flags are set in memory, as the switch would set them (nothing is written)."""
    own = ContextCheckpoint.objects.select_related(*store.RELATED).filter(host_node_id=node.pk).first()
    if own is None or own.covered_depth >= node.depth:
        return None
    switched = copy.copy(node)
    switched.live = True
    for loaded in (own.host_node, own.retained_from):  # retained_from may be the host itself
        if loaded is not None and loaded.pk == node.pk:
            loaded.live = True
    reason = store.validate(
        own,
        head=switched,
        stable_prefix_hash=lookup.stable_prefix_hash,
        model_name=lookup.model_name,
        max_summary_tokens=lookup.max_summary_tokens,
    )
    return own if reason is None else None


def _nearest(adventure: Adventure, node: Node, lookup: _Lookup) -> ContextCheckpoint | None:
    found, _misses = store.nearest_usable(
        adventure,
        node,
        stable_prefix_hash=lookup.stable_prefix_hash,
        model_name=lookup.model_name,
        max_summary_tokens=lookup.max_summary_tokens,
    )
    return found


def checkpoints_used_at(adventure: Adventure, node: Node, lookups: list[_Lookup]) -> set[int]:
    """Ids of the checkpoints a turn composed at `node` would use: a play turn there (the
    node's nearest usable checkpoint) and a retry or regenerate of it (its parent's, which
    differs only when the nearest is hosted on the node itself). A non-live attempt is
    taken as the pager would leave it: switched to."""
    used: set[int] = set()
    parent: Node | None = None
    for lookup in lookups:
        if node.live:
            found = _nearest(adventure, node, lookup)
            need_parent = found is not None and found.host_node_id == node.pk
        else:
            found = _own_checkpoint_if_switched(node, lookup)
            need_parent = True  # a switched-to attempt without its own row uses its parent's
        if found is not None:
            used.add(found.pk)
        if need_parent and node.parent_id is not None:
            if parent is None:
                parent = Node.objects.select_related("branch").get(pk=node.parent_id)
            found = _nearest(adventure, parent, lookup)
            if found is not None:
                used.add(found.pk)
    return used


def _reclaimable_jobs(adventure: Adventure, protected: set[int], now: datetime) -> list[int]:
    """Finished AND older than the retention age AND not protected: never age alone."""
    cutoff = now - timedelta(days=job_retention_days())
    rows = TurnJob.objects.filter(adventure_id=adventure.pk, status__in=FINISHED, finished_at__lt=cutoff)
    return sorted(pk for pk in rows.values_list("pk", flat=True) if pk not in protected)


def plan(adventure: Adventure, *, now: datetime | None = None) -> Plan:
    """What a pass over `adventure` would keep and delete, computed over the whole
    adventure from what is stored now. Reads only."""
    adventure = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
    now = now or timezone.now()
    result = Plan(adventure_id=adventure.pk)
    jobs = list(protected_jobs(adventure))
    result.protected_jobs = {job.pk for job in jobs}
    result.reclaimable_jobs = _reclaimable_jobs(adventure, result.protected_jobs, now)

    all_checkpoints = set(ContextCheckpoint.objects.filter(adventure_id=adventure.pk).values_list("pk", flat=True))
    if not all_checkpoints:
        return result
    if adventure.head_id is None:
        result.skipped = "no_head"
        result.protected_checkpoints = all_checkpoints
        return result
    try:
        lookups = _lookups(adventure)
        targets = resume_targets(adventure, jobs)
        for node in targets.values():
            result.protected_checkpoints |= checkpoints_used_at(adventure, node, lookups)
    except (BrokenAncestry, paths.BrokenLineage, ContextError) as exc:
        # The protected set cannot be computed, so no deletion can be proven safe.
        result.skipped = getattr(exc, "code", "broken_lineage")
        result.protected_checkpoints = all_checkpoints
        return result
    result.reclaimable_checkpoints = sorted(all_checkpoints - result.protected_checkpoints)
    return result


# --- measuring and deleting ---------------------------------------------------------------------


def _chunks(ids: list[int]) -> Iterable[list[int]]:
    for start in range(0, len(ids), CHUNK):
        yield ids[start : start + CHUNK]


def _measure_all(queryset: QuerySet) -> Measure:
    return Measure(queryset.count(), text_bytes(queryset))


def _measure_ids(model, ids: list[int]) -> Measure:
    out = Measure()
    for chunk in _chunks(ids):
        out = out + _measure_all(model.objects.filter(pk__in=chunk))
    return out


def _delete_ids(model, adventure_id: int, ids: list[int]) -> int:
    deleted = 0
    for chunk in _chunks(ids):
        _total, per_model = model.objects.filter(adventure_id=adventure_id, pk__in=chunk).delete()
        deleted += per_model.get(model._meta.label, 0)
    return deleted


def _reasons(adventure: Adventure, ids: list[int]) -> dict[str, int]:
    """Why each reclaimable checkpoint goes, for the report: the validator's reason from its
    cheap checks (the source hash is not recomputed here; the decision never depends on
    this), or "unreferenced" for a row that passes them and is simply nobody's nearest."""
    if not ids:
        return {}
    try:
        lookup = _lookups(adventure)[0]
    except ContextError:
        return {"unreferenced": len(ids)}
    reasons: dict[str, int] = {}
    for chunk in _chunks(ids):
        for cp in ContextCheckpoint.objects.select_related(*store.RELATED).filter(pk__in=chunk):
            try:
                reason = store.validate(
                    cp,
                    stable_prefix_hash=lookup.stable_prefix_hash,
                    model_name=lookup.model_name,
                    max_summary_tokens=lookup.max_summary_tokens,
                    verify_source=False,
                )
            except (BrokenAncestry, paths.BrokenLineage):
                reason = "broken_ancestry"
            reasons[reason or "unreferenced"] = reasons.get(reason or "unreferenced", 0) + 1
    return dict(sorted(reasons.items()))


def _report(adventure: Adventure, result: Plan, *, dry_run: bool) -> PruneReport:
    report = PruneReport(adventure_id=adventure.pk, dry_run=dry_run, skipped=result.skipped)
    report.checkpoints.before = _measure_all(ContextCheckpoint.objects.filter(adventure_id=adventure.pk))
    report.jobs.before = _measure_all(TurnJob.objects.filter(adventure_id=adventure.pk))
    report.checkpoints.reclaimable = _measure_ids(ContextCheckpoint, result.reclaimable_checkpoints)
    report.jobs.reclaimable = _measure_ids(TurnJob, result.reclaimable_jobs)
    report.checkpoints.after = report.checkpoints.before - report.checkpoints.reclaimable
    report.jobs.after = report.jobs.before - report.jobs.reclaimable
    report.protected_checkpoints = len(result.protected_checkpoints)
    report.protected_jobs = len(result.protected_jobs)
    report.reasons = _reasons(adventure, result.reclaimable_checkpoints)
    return report


def prune_adventure(
    *,
    adventure: Adventure,
    dry_run: bool = False,
    now: datetime | None = None,
    before_delete: Callable[[Plan], None] | None = None,
) -> PruneReport:
    """One retention pass over `adventure`. A dry run reports and deletes nothing (and takes
    no lock). Otherwise, when the plan reclaims anything, locks the adventure row,
    recomputes the plan inside that transaction and deletes what the recomputed plan
    reclaims, by id; "after" is then measured, not projected.

    `before_delete` (tests) runs between the unlocked plan and the locked transaction,
    where a racing turn could commit."""
    adventure = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
    first = plan(adventure, now=now)
    if dry_run or first.empty:
        return _report(adventure, first, dry_run=dry_run)
    if before_delete is not None:
        before_delete(first)
    with transaction.atomic():
        Adventure.objects.select_for_update().filter(pk=adventure.pk).values_list("pk", flat=True).get()
        locked = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
        final = plan(locked, now=now)
        report = _report(locked, final, dry_run=False)
        _delete_ids(ContextCheckpoint, locked.pk, final.reclaimable_checkpoints)
        _delete_ids(TurnJob, locked.pk, final.reclaimable_jobs)
        report.checkpoints.after = _measure_all(ContextCheckpoint.objects.filter(adventure_id=locked.pk))
        report.jobs.after = _measure_all(TurnJob.objects.filter(adventure_id=locked.pk))
    log.info(
        "pruned adventure %s: %s checkpoints (%s bytes), %s jobs (%s bytes)",
        adventure.pk,
        report.checkpoints.reclaimable.rows,
        report.checkpoints.reclaimable.bytes,
        report.jobs.reclaimable.rows,
        report.jobs.reclaimable.bytes,
    )
    return report


def prune_all(
    *, dry_run: bool = False, adventure_ids: Iterable[int] | None = None, now: datetime | None = None
) -> list[PruneReport]:
    """A pass over every adventure (or those in `adventure_ids`), each in its own
    transaction, most recently played first (they are the ones that gained checkpoints)."""
    adventures = Adventure.objects.order_by("-last_played_at", "-pk")
    if adventure_ids is not None:
        adventures = adventures.filter(pk__in=list(adventure_ids))
    reports = []
    for pk in list(adventures.values_list("pk", flat=True)):
        try:
            reports.append(prune_adventure(adventure=Adventure(pk=pk), dry_run=dry_run, now=now))
        except Adventure.DoesNotExist:
            continue  # deleted by its player since the list was read
    return reports
