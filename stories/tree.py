"""Every operation that writes the story tree. Each runs in one transaction.

Rules this module owns (and nothing else re-implements):

- Where a new node goes (DESIGN.md, Turns): on the head's branch when the head
  is its tip; as a new attempt at the next coordinate when the only thing past
  the head is one undone tip; otherwise on a new branch.
- A coordinate's attempts may change (retry, switch) only while it is a tip:
  no node anywhere has one of its attempts as parent. Otherwise a branch
  hanging off it would silently change its history.
- Every head move locks the adventure row, refuses a stale `expected_version`
  with `StaleVersion`, bumps `version`, and clears redo unless it is undo/redo.
- Nothing is deleted implicitly. Deleting a branch refuses the head's branch and
  every branch the head borrows from, and takes descendant branches with it.

Refusals are `TreeError` subclasses carrying a player-facing `message` (also
`str(exc)`), a stable `code`, and `http_status` (`conflict` is True for 409).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.db.models import Count, IntegerField, Max, Q, QuerySet, Sum
from django.db.models.expressions import Func
from django.db.models.fields import CharField, TextField
from django.db.models.fields.json import JSONField
from django.utils import timezone

from . import paths
from .models import Adventure, Branch, Memory, ModelProfile, Node

BRANCH_NAME_MAX = Branch._meta.get_field("name").max_length
PLAYABLE_KINDS = {Node.Kind.DO, Node.Kind.SAY, Node.Kind.STORY, Node.Kind.CONTINUE}


# --- Refusals ---------------------------------------------------------------------------------


class TreeError(Exception):
    """A refused tree operation. `message` is safe to show a player."""

    code = "tree_error"
    http_status = 409
    default_message = "That change to the story tree isn't possible."

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)

    @property
    def conflict(self) -> bool:
        return self.http_status == 409


class NotATip(TreeError):
    code = "not_a_tip"
    default_message = (
        "Only the newest turn of a line can be retried or switched: the story already continues from this one. "
        "Fork from it instead."
    )


class NothingToUndo(TreeError):
    code = "nothing_to_undo"
    default_message = "You are at the opening; there is nothing to undo."


class NothingToRedo(TreeError):
    code = "nothing_to_redo"
    default_message = "There is nothing to redo."


class ProtectedBranch(TreeError):
    code = "protected_branch"
    default_message = (
        "This branch holds part of the story you are reading, so it can't be deleted. Switch to another branch first."
    )


class CapReached(TreeError):
    code = "cap_reached"


class AlreadyTheStory(TreeError):
    code = "already_the_story"
    default_message = "This attempt is already part of the story; there is nothing to fork."


class AttemptIsLive(TreeError):
    code = "attempt_is_live"
    default_message = "This attempt is the one the story tells; switch to another attempt before deleting it."


class EmptyBranch(TreeError):
    code = "empty_branch"
    default_message = "This branch has no turns yet."


class NotInAdventure(TreeError):
    code = "not_found"
    http_status = 404
    default_message = "That belongs to another adventure."


class Gone(TreeError):
    code = "gone"
    http_status = 404
    default_message = "That no longer exists: it was deleted, perhaps in another tab."


class InvalidInput(TreeError):
    code = "invalid"
    http_status = 400


class StaleVersion(Exception):
    """`expected_version` no longer matches: another tab or request moved the head first.
    Deliberately not a TreeError: nothing is wrong with the request except its timing."""

    code = "stale_version"
    http_status = 409

    def __init__(self, *, expected: int, current: int) -> None:
        self.expected = expected
        self.current = current
        self.message = "The story changed in another window. Reload to see where it stands now."
        super().__init__(f"{self.message} (expected version {expected}, current {current})")


# --- Creating and deleting adventures -----------------------------------------------------------


def default_profile() -> ModelProfile:
    profile = ModelProfile.objects.filter(is_default=True).first() or ModelProfile.objects.order_by("id").first()
    if profile is None:
        profile = ModelProfile.objects.create(
            name="Offline narrator",
            provider=ModelProfile.Provider.BUILTIN,
            model_name="storytree-builtin",
            is_default=True,
        )
    return profile


INITIAL_STATE: dict[str, Any] = {"flags": {}, "relationships": {}, "inventory": [], "facts": []}


@transaction.atomic
def adventure_create(
    *,
    owner,
    title: str,
    premise: str = "",
    persona: str = "",
    style: str = "",
    model_profile: ModelProfile | None = None,
) -> Adventure:
    """Create an adventure with its root branch and root node (depth 0, the premise as narration)."""
    adventure = Adventure.objects.create(
        owner=owner,
        title=title,
        premise=premise,
        persona=persona,
        style=style,
        model_profile=model_profile or default_profile(),
        last_played_at=timezone.now(),
    )
    branch = Branch.objects.create(adventure=adventure, fork_depth=0)
    branch.lineage = [[branch.pk, None]]
    branch.save(update_fields=["lineage"])
    root = Node.objects.create(
        adventure=adventure,
        branch=branch,
        depth=0,
        kind=Node.Kind.OPENING,
        narration=premise,
        state_after={key: type(value)() for key, value in INITIAL_STATE.items()},
    )
    adventure.head = root
    adventure.version = 1
    adventure.save(update_fields=["head", "version"])
    return adventure


@transaction.atomic
def adventure_delete(*, adventure: Adventure) -> dict[str, int]:
    """Delete the adventure and everything in it. Returns rows deleted per table."""
    _total, per_model = Adventure.objects.filter(pk=adventure.pk).delete()
    return per_model


# --- Shared plumbing ---------------------------------------------------------------------------


def _lock(adventure: Adventure) -> Adventure:
    return _reread(Adventure.objects.select_for_update(), adventure.pk)


def _check_version(locked: Adventure, expected_version: int | None) -> None:
    if expected_version is not None and locked.version != expected_version:
        raise StaleVersion(expected=expected_version, current=locked.version)


def _head(locked: Adventure) -> Node:
    if locked.head_id is None:
        raise TreeError("This adventure has no opening yet.")
    return Node.objects.select_related("branch").get(pk=locked.head_id)


def _reread(queryset: QuerySet, pk: int):
    """Read a row again under the adventure lock; another request may have deleted it
    between the caller's lookup and the lock."""
    row = queryset.filter(pk=pk).first()
    if row is None:
        raise Gone()
    return row


def _own(obj: Node | Branch | Memory, adventure: Adventure) -> None:
    if obj.adventure_id != adventure.pk:
        raise NotInAdventure()


def _move_head(adventure: Adventure, locked: Adventure, node: Node, *, redo_tip: Node | None = None) -> None:
    locked.head = node
    locked.redo_tip = redo_tip
    locked.version += 1
    locked.save(update_fields=["head", "redo_tip", "version"])
    # The caller's instance reflects the move without a refresh.
    adventure.head = node
    adventure.redo_tip = redo_tip
    adventure.version = locked.version


def _check_node_cap(adventure_id: int) -> None:
    limit = settings.STORYTREE_MAX_NODES_PER_ADVENTURE
    if Node.objects.filter(adventure_id=adventure_id).count() >= limit:
        raise CapReached(
            f"This adventure has reached its limit of {limit:,} turns. The limit counts every turn on every "
            "branch, retried attempts included, not just the story you are reading. Delete a branch you no "
            "longer need to make room."
        )


def _check_branch_cap(adventure_id: int) -> None:
    limit = settings.STORYTREE_MAX_BRANCHES_PER_ADVENTURE
    if Branch.objects.filter(adventure_id=adventure_id).count() >= limit:
        raise CapReached(
            f"This adventure has reached its limit of {limit:,} branches. The limit counts every branch in the "
            "tree, including ones you are not reading. Delete a branch you no longer need to make room."
        )


def _attempt_cap_message(limit: int) -> str:
    return (
        f"This turn already has {limit} attempts, the most one turn can hold. Delete an attempt you don't want, "
        "or fork from one to continue differently."
    )


def _content(
    *,
    kind: str,
    player_input: str,
    narration: str,
    suggestions: list,
    state_delta: list,
    state_after: dict,
    checks: list,
    model_name: str = "",
    prompt_bytes: int = 0,
    prompt_stable_bytes: int = 0,
    regenerated_from: Node | None = None,
) -> dict[str, Any]:
    if kind not in PLAYABLE_KINDS:
        raise InvalidInput(f"Unknown turn kind {kind!r}.")
    if not isinstance(state_after, dict):
        raise InvalidInput("A turn must record the state it leaves behind (state_after).")
    for name, value in (("suggestions", suggestions), ("state_delta", state_delta), ("checks", checks)):
        if not isinstance(value, list):
            raise InvalidInput(f"{name} must be a list.")
    return {
        "kind": kind,
        "player_input": player_input or "",
        "narration": narration or "",
        "suggestions": suggestions,
        "state_delta": state_delta,
        "state_after": state_after,
        "checks": checks,
        "model_name": (model_name or "")[:200],
        "prompt_bytes": prompt_bytes,
        "prompt_stable_bytes": prompt_stable_bytes,
        "regenerated_from": regenerated_from,
    }


def _has_children_at(branch_id: int, depth: int) -> bool:
    """Does any node, on any branch, continue from an attempt at this coordinate?"""
    return Node.objects.filter(parent__branch_id=branch_id, parent__depth=depth).exists()


# --- Reads the views need (not path selection: that is stories/paths.py) ------------------------


def is_tip(node: Node) -> bool:
    """True when nothing continues from node's coordinate: its attempts may be retried or switched."""
    return not _has_children_at(node.branch_id, node.depth)


def attempts_at(node: Node) -> QuerySet[Node]:
    """Every attempt at node's coordinate, oldest first (exactly one is live)."""
    return Node.objects.filter(branch_id=node.branch_id, depth=node.depth).order_by("id")


def current_state(adventure: Adventure) -> dict:
    """The authoritative state: the head's `state_after`. There is no other mutable copy."""
    return dict(Node.objects.values_list("state_after", flat=True).get(pk=adventure.head_id) or {})


def branch_label(branch: Branch) -> str:
    """A stored name, or one derived from the fork depth (a coordinate nothing can shift)."""
    if branch.name:
        return branch.name
    if branch.parent_branch_id is None:
        return "Main story"
    return f"Fork at turn {branch.fork_depth}"


def branch_descendants(branch: Branch) -> list[Branch]:
    """Branches forked from `branch`, directly or through others, oldest first."""
    rows = list(
        Branch.objects.filter(adventure_id=branch.adventure_id).only("id", "parent_branch_id", "name", "fork_depth")
    )
    children: dict[int, list[Branch]] = {}
    for row in rows:
        if row.parent_branch_id is not None:
            children.setdefault(row.parent_branch_id, []).append(row)
    found: list[Branch] = []
    stack = [branch.pk]
    seen = {branch.pk}
    while stack:
        for child in children.get(stack.pop(), []):
            if child.pk not in seen:  # a cycle is an integrity violation; never loop on it
                seen.add(child.pk)
                found.append(child)
                stack.append(child.pk)
    found.sort(key=lambda b: b.pk)
    return found


def branch_tree(adventure: Adventure) -> list[dict[str, Any]]:
    """Every branch with what the branch rail draws. Two queries whatever the size."""
    head = Node.objects.select_related("branch").filter(pk=adventure.head_id).first()
    path = paths.Path.for_node(head) if head is not None else None
    rows = Branch.objects.filter(adventure_id=adventure.pk).annotate(
        node_count=Count("nodes"), tip_depth=Max("nodes__depth", filter=Q(nodes__live=True))
    )
    return [
        {
            "id": branch.pk,
            "name": branch.name,
            "label": branch_label(branch),
            "parent": branch.parent_branch_id,
            "fork_depth": branch.fork_depth,
            "nodes": branch.node_count,
            "tip_depth": branch.tip_depth,
            "current": head is not None and head.branch_id == branch.pk,
            "on_head_path": path is not None and path.covers(branch.pk, branch.fork_depth),
        }
        for branch in rows.order_by("id")
    ]


# --- Branches ---------------------------------------------------------------------------------


def _sibling_branch(adventure_id: int, parent: Node) -> Branch:
    """The branch a new child of `parent` goes on when it cannot go on parent's branch.
    Reuses an empty branch left at the same fork (a turn that failed after asking for it)."""
    if not parent.live:
        raise TreeError("Only a node that is part of a story can be continued.")
    fork_depth = parent.depth + 1
    empty = (
        Branch.objects.filter(adventure_id=adventure_id, parent_branch_id=parent.branch_id, fork_depth=fork_depth)
        .annotate(node_count=Count("nodes"))
        .filter(node_count=0)
        .order_by("id")
        .first()
    )
    if empty is not None:
        return empty
    _check_branch_cap(adventure_id)
    parent_branch = parent.branch
    branch = Branch.objects.create(adventure_id=adventure_id, parent_branch=parent_branch, fork_depth=fork_depth)
    # Computed once: this branch unbounded, the parent capped at the fork, the parent's ancestors as they were.
    branch.lineage = [[branch.pk, None], [parent_branch.pk, parent.depth], *parent_branch.lineage[1:]]
    branch.save(update_fields=["lineage"])
    return branch


@transaction.atomic
def branch_for_sibling(*, adventure: Adventure, parent: Node) -> Branch:
    """Create (or reuse an empty) branch forked from `parent`'s branch at parent.depth + 1:
    where a new child of `parent` goes when parent's own branch already continues."""
    _own(parent, adventure)
    parent = _reread(Node.objects.select_related("branch"), parent.pk)
    return _sibling_branch(adventure.pk, parent)


@transaction.atomic
def branch_switch(*, adventure: Adventure, branch: Branch, expected_version: int | None) -> Adventure:
    """Move the head to `branch`'s tip (its live node of greatest depth)."""
    _own(branch, adventure)
    locked = _lock(adventure)
    _check_version(locked, expected_version)
    tip = Node.objects.filter(branch_id=branch.pk, live=True).order_by("-depth").first()
    if tip is None:
        raise EmptyBranch()
    if tip.pk != locked.head_id:
        _move_head(adventure, locked, tip)
    return adventure


@transaction.atomic
def branch_rename(*, branch: Branch, name: str | None) -> Branch:
    """Name a branch. None clears the name (the label is then derived); a blank name is refused."""
    if name is None:
        cleaned = ""
    else:
        cleaned = " ".join(str(name).split())
        if not cleaned:
            raise InvalidInput("A branch name can't be blank.")
        if len(cleaned) > BRANCH_NAME_MAX:
            raise InvalidInput(f"A branch name can be at most {BRANCH_NAME_MAX} characters.")
    if not Branch.objects.filter(pk=branch.pk).update(name=cleaned):
        raise Gone()
    branch.name = cleaned
    return branch


# --- Deletion -------------------------------------------------------------------------------


class Octets(Func):
    """Stored size of a text or JSON column in bytes."""

    function = "LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra)

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="OCTET_LENGTH(CAST(%(expressions)s AS TEXT))", **extra)


def text_bytes(queryset: QuerySet) -> int:
    columns = [f.name for f in queryset.model._meta.concrete_fields if isinstance(f, CharField | TextField | JSONField)]
    if not columns:
        return 0
    sums = queryset.aggregate(**{f"b_{name}": Sum(Octets(name)) for name in columns})
    return sum(value or 0 for value in sums.values())


@dataclass
class DeletionReport:
    """What a deletion removed (or, with dry_run, would remove). `rows` is exact per table
    (cascades included); `bytes` is the stored size of text and JSON columns per table."""

    branch_ids: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_rows": self.total_rows, "total_bytes": self.total_bytes}


def _measured_delete(queryset: QuerySet, measured: dict[str, QuerySet], *, dry_run: bool) -> DeletionReport:
    report = DeletionReport(dry_run=dry_run)
    report.bytes = {label: text_bytes(qs) for label, qs in measured.items()}
    # The delete runs either way, so the row counts are Django's own cascade; a dry run undoes it.
    savepoint = transaction.savepoint_create()
    _total, per_model = queryset.delete()
    if dry_run:
        transaction.savepoint_rollback(savepoint)
    else:
        transaction.savepoint_commit(savepoint)
    report.rows = {label: count for label, count in per_model.items() if count}
    report.bytes = {label: size for label, size in report.bytes.items() if label in report.rows}
    return report


def _checkpoint_model():
    """The checkpoint cache model, if that app is installed (this module must not need it)."""
    try:
        return apps.get_model("checkpoints", "ContextCheckpoint")
    except LookupError:
        return None


def _checkpoint_rows(*, branch_ids: list[int] | None = None, node_ids: list[int] | None = None) -> QuerySet | None:
    """Checkpoint rows a deletion cascades to: hosted on, covering or retaining a doomed node."""
    model = _checkpoint_model()
    if model is None:
        return None
    names = {f.name for f in model._meta.get_fields()}
    q = Q()
    for field_name in ("host_node", "covered_through", "retained_from"):
        if field_name in names:
            if branch_ids is not None:
                q |= Q(**{f"{field_name}__branch_id__in": branch_ids})
            if node_ids is not None:
                q |= Q(**{f"{field_name}_id__in": node_ids})
    if "branch" in names and branch_ids is not None:
        q |= Q(branch_id__in=branch_ids)
    return model.objects.filter(q) if q else None


@transaction.atomic
def branch_delete(*, adventure: Adventure, branch: Branch, dry_run: bool = False) -> DeletionReport:
    """Delete `branch` and every branch forked from it, with their nodes and memories.

    Refuses the head's branch and every branch the head borrows from (its lineage):
    deleting one of those would delete the story being read. `dry_run` reports the
    same rows and bytes and deletes nothing (for the confirmation step)."""
    _own(branch, adventure)
    locked = _lock(adventure)
    head = _head(locked)
    if branch.pk in {entry[0] for entry in head.branch.lineage}:
        raise ProtectedBranch()
    doomed = [branch, *branch_descendants(branch)]
    ids = [b.pk for b in doomed]
    measured: dict[str, QuerySet] = {
        "stories.Branch": Branch.objects.filter(pk__in=ids),
        "stories.Node": Node.objects.filter(branch_id__in=ids),
        "stories.Memory": Memory.objects.filter(branch_id__in=ids),
    }
    checkpoints = _checkpoint_rows(branch_ids=ids)
    if checkpoints is not None:
        measured[checkpoints.model._meta.label] = checkpoints
    report = _measured_delete(Branch.objects.filter(pk__in=ids), measured, dry_run=dry_run)
    report.branch_ids = ids
    report.labels = [branch_label(b) for b in doomed]
    if not dry_run:
        # A redo trail into a deleted branch was cleared by the cascade.
        adventure.redo_tip_id = Adventure.objects.values_list("redo_tip_id", flat=True).get(pk=adventure.pk)
    return report


@transaction.atomic
def attempt_delete(*, adventure: Adventure, node: Node) -> DeletionReport:
    """Delete one attempt the story does not tell (never the live one)."""
    _own(node, adventure)
    _lock(adventure)
    node = _reread(Node.objects, node.pk)
    if node.live:
        raise AttemptIsLive()
    if Node.objects.filter(parent_id=node.pk).exists():
        raise TreeError("Other turns continue from this attempt, so it can't be deleted.")
    measured: dict[str, QuerySet] = {"stories.Node": Node.objects.filter(pk=node.pk)}
    checkpoints = _checkpoint_rows(node_ids=[node.pk])
    if checkpoints is not None:
        measured[checkpoints.model._meta.label] = checkpoints
    return _measured_delete(Node.objects.filter(pk=node.pk), measured, dry_run=False)


# --- Turns ------------------------------------------------------------------------------------


@transaction.atomic
def node_append(
    *,
    adventure: Adventure,
    kind: str,
    player_input: str,
    narration: str,
    suggestions: list,
    state_delta: list,
    state_after: dict,
    checks: list,
    model_name: str = "",
    prompt_bytes: int = 0,
    prompt_stable_bytes: int = 0,
    expected_version: int | None,
    regenerated_from: Node | None = None,
) -> Node:
    """Write a child of the head and move the head onto it (the turn pipeline's commit).

    Placement (DESIGN.md, Turns): on the head's branch when the head is its tip; as a new
    live attempt at the next coordinate when the only thing past the head is one undone
    tip (it stays in the attempt pager); otherwise on a new branch. Nests inside an outer
    transaction (a savepoint), so a caller can commit other rows with it."""
    content = _content(
        kind=kind,
        player_input=player_input,
        narration=narration,
        suggestions=suggestions,
        state_delta=state_delta,
        state_after=state_after,
        checks=checks,
        model_name=model_name,
        prompt_bytes=prompt_bytes,
        prompt_stable_bytes=prompt_stable_bytes,
        regenerated_from=regenerated_from,
    )
    locked = _lock(adventure)
    _check_version(locked, expected_version)
    head = _head(locked)
    _check_node_cap(locked.pk)
    depth = head.depth + 1
    next_here = list(Node.objects.filter(branch_id=head.branch_id, depth=depth).values_list("id", "live"))
    if not next_here:
        branch = head.branch
    else:
        live_ids = [pk for pk, live in next_here if live]
        undone_tip = (
            len(live_ids) == 1
            and len(next_here) < settings.STORYTREE_MAX_ATTEMPTS_PER_COORDINATE
            and not _has_children_at(head.branch_id, depth)
        )
        if undone_tip:
            # A new attempt beside the undone tip, which stays switchable in the pager.
            Node.objects.filter(pk=live_ids[0]).update(live=False)
            branch = head.branch
        else:
            branch = _sibling_branch(locked.pk, head)
    node = Node.objects.create(adventure=locked, branch=branch, depth=depth, parent=head, live=True, **content)
    _move_head(adventure, locked, node)
    return node


@transaction.atomic
def attempt_add(
    *,
    adventure: Adventure,
    tip: Node,
    narration: str,
    suggestions: list,
    state_delta: list,
    state_after: dict,
    checks: list,
    kind: str | None = None,
    player_input: str | None = None,
    model_name: str = "",
    prompt_bytes: int = 0,
    prompt_stable_bytes: int = 0,
    expected_version: int | None,
    regenerated_from: Node | None = None,
) -> Node:
    """Retry: a new live attempt at the tip's coordinate (kind and input default to the
    tip's). The previous attempts are kept and stay switchable. Moves the head onto it."""
    _own(tip, adventure)
    locked = _lock(adventure)
    _check_version(locked, expected_version)
    tip = _reread(Node.objects, tip.pk)
    if tip.depth == 0:
        raise TreeError("The opening can't be retried.")
    content = _content(
        kind=kind or tip.kind,
        player_input=tip.player_input if player_input is None else player_input,
        narration=narration,
        suggestions=suggestions,
        state_delta=state_delta,
        state_after=state_after,
        checks=checks,
        model_name=model_name,
        prompt_bytes=prompt_bytes,
        prompt_stable_bytes=prompt_stable_bytes,
        regenerated_from=regenerated_from,
    )
    if not is_tip(tip):
        raise NotATip()
    limit = settings.STORYTREE_MAX_ATTEMPTS_PER_COORDINATE
    if attempts_at(tip).count() >= limit:
        raise CapReached(_attempt_cap_message(limit))
    _check_node_cap(locked.pk)
    Node.objects.filter(branch_id=tip.branch_id, depth=tip.depth, live=True).update(live=False)
    node = Node.objects.create(
        adventure=locked, branch_id=tip.branch_id, depth=tip.depth, parent_id=tip.parent_id, live=True, **content
    )
    _move_head(adventure, locked, node)
    return node


@transaction.atomic
def sibling_branch_add(
    *,
    adventure: Adventure,
    target: Node,
    expected_version: int | None,
    regenerated_from: Node | None = None,
    **content: Any,
) -> Node:
    """Regenerate or edit a past input: a sibling of `target` (same parent, same depth) on a
    new branch, the line `target` is on left untouched. Moves the head onto it.
    `content` takes node_append's content fields; kind and input default to target's."""
    _own(target, adventure)
    locked = _lock(adventure)
    _check_version(locked, expected_version)
    target = _reread(Node.objects.select_related("parent__branch"), target.pk)
    if target.parent is None:
        raise TreeError("The opening can't be rewritten.")
    content.setdefault("kind", target.kind)
    content.setdefault("player_input", target.player_input)
    fields = _content(regenerated_from=regenerated_from, **content)
    _check_node_cap(locked.pk)
    branch = _sibling_branch(locked.pk, target.parent)
    node = Node.objects.create(
        adventure=locked, branch=branch, depth=target.depth, parent=target.parent, live=True, **fields
    )
    _move_head(adventure, locked, node)
    return node


@transaction.atomic
def attempt_switch(*, adventure: Adventure, node: Node, expected_version: int | None) -> Adventure:
    """Make `node` the live attempt at its coordinate and stand on it (tip coordinates only).
    Its `state_after` becomes the current state. Repeating it is a no-op."""
    _own(node, adventure)
    locked = _lock(adventure)
    node = _reread(Node.objects, node.pk)
    if node.live and locked.head_id == node.pk:
        return adventure
    _check_version(locked, expected_version)
    if not is_tip(node):
        raise NotATip()
    if not node.live:
        Node.objects.filter(branch_id=node.branch_id, depth=node.depth, live=True).update(live=False)
        Node.objects.filter(pk=node.pk).update(live=True)
        node.live = True
    _move_head(adventure, locked, node)
    return adventure


def _is_own_fork(node: Node) -> bool:
    return node.live and node.branch.parent_branch_id is not None and node.depth == node.branch.fork_depth


@transaction.atomic
def fork_from(*, adventure: Adventure, node: Node, expected_version: int | None) -> Branch:
    """Give an attempt the story does not tell a branch of its own and stand on it.

    The attempt moves (same row, same content) to a new branch forked where its
    coordinate is; the line it leaves keeps its live attempt and is otherwise untouched.
    Idempotent: forking the attempt you are already standing on, as the first node of
    its own branch, returns that branch and changes nothing (a double click)."""
    _own(node, adventure)
    locked = _lock(adventure)
    node = _reread(Node.objects.select_related("branch", "parent__branch"), node.pk)
    if locked.head_id == node.pk and _is_own_fork(node):
        return node.branch
    _check_version(locked, expected_version)
    if node.live:
        raise AlreadyTheStory()
    if node.parent is None:
        raise TreeError("The opening can't be forked.")
    if Node.objects.filter(parent_id=node.pk).exists():
        raise TreeError("Other turns already continue from this attempt.")
    branch = _sibling_branch(locked.pk, node.parent)
    node.branch = branch
    node.live = True
    node.save(update_fields=["branch", "live"])
    checkpoint = _checkpoint_model()
    if checkpoint is not None and "branch" in {f.name for f in checkpoint._meta.get_fields()}:
        # A cache row copying its host's coordinate must follow the host.
        checkpoint.objects.filter(host_node_id=node.pk).update(branch_id=branch.pk)
    _move_head(adventure, locked, node)
    return branch


# --- Undo / redo ------------------------------------------------------------------------------


@transaction.atomic
def undo(*, adventure: Adventure, expected_version: int | None) -> Adventure:
    """Move the head one node back along its path. Deletes nothing; redo walks it forward."""
    locked = _lock(adventure)
    _check_version(locked, expected_version)
    head = _head(locked)
    if head.parent_id is None:
        raise NothingToUndo()
    redo_tip = None
    if locked.redo_tip_id is not None:
        redo_tip = Node.objects.select_related("branch").filter(pk=locked.redo_tip_id).first()
    if redo_tip is None or not paths.on_path(redo_tip, head):
        redo_tip = head
    _move_head(adventure, locked, Node.objects.get(pk=head.parent_id), redo_tip=redo_tip)
    return adventure


@transaction.atomic
def rewind_to(*, adventure: Adventure, node: Node, expected_version: int | None) -> Adventure:
    """Stand on an earlier turn of the story being read ("continue from here"): undo as many
    steps as it takes, in one move. The next turn played from there starts a new line (by the
    placement rule of `node_append`); redo still walks forward along the line left."""
    locked = _lock(adventure)
    _check_version(locked, expected_version)
    head = _head(locked)
    if node.adventure_id != locked.pk:
        raise NotInAdventure()
    node = _reread(Node.objects, node.pk)
    if node.pk == head.pk:
        raise AlreadyTheStory("You are already at this turn.")
    if node.depth > head.depth or not paths.on_path(head, node):
        raise InvalidInput("You can only go back to a turn of the story you are reading.")
    redo_tip = None
    if locked.redo_tip_id is not None:
        redo_tip = Node.objects.select_related("branch").filter(pk=locked.redo_tip_id).first()
    if redo_tip is None or not paths.on_path(redo_tip, head):
        redo_tip = head
    _move_head(adventure, locked, node, redo_tip=redo_tip)
    return adventure


@transaction.atomic
def redo(*, adventure: Adventure, expected_version: int | None) -> Adventure:
    """Move the head one node forward along the path undo came back from."""
    locked = _lock(adventure)
    _check_version(locked, expected_version)
    head = _head(locked)
    tip = None
    if locked.redo_tip_id is not None:
        tip = Node.objects.select_related("branch").filter(pk=locked.redo_tip_id).first()
    if tip is None or not tip.live or tip.depth <= head.depth or not paths.on_path(tip, head):
        raise NothingToRedo()
    forward = paths.node_at(tip, head.depth + 1)
    if forward is None:
        raise NothingToRedo()
    _move_head(adventure, locked, forward, redo_tip=None if forward.pk == tip.pk else tip)
    return adventure


# --- Memories ---------------------------------------------------------------------------------


def _memory_text(text: str) -> str:
    cleaned = (text or "").strip()
    if not cleaned:
        raise InvalidInput("A memory can't be blank.")
    limit = settings.STORYTREE_MAX_INPUT_CHARS
    if len(cleaned) > limit:
        raise InvalidInput(f"A memory can be at most {limit:,} characters.")
    return cleaned


@transaction.atomic
def memory_add(*, adventure: Adventure, text: str, pinned: bool = False, source_node: Node | None = None) -> Memory:
    """Anchor a memory at `source_node`'s coordinate, or (hand-written) at the head's.
    It is then visible exactly from paths through that coordinate."""
    cleaned = _memory_text(text)
    if source_node is not None:
        _own(source_node, adventure)
        anchor = source_node
    else:
        head_id = Adventure.objects.values_list("head_id", flat=True).get(pk=adventure.pk)
        anchor = Node.objects.only("branch_id", "depth").get(pk=head_id)
    return Memory.objects.create(
        adventure_id=adventure.pk,
        branch_id=anchor.branch_id,
        depth=anchor.depth,
        text=cleaned,
        pinned=bool(pinned),
        source_node=source_node,
    )


@transaction.atomic
def memory_update(*, memory: Memory, text: str | None = None, pinned: bool | None = None) -> Memory:
    """Change a memory's text or pinned flag. Its anchor never moves."""
    fields = []
    if text is not None:
        memory.text = _memory_text(text)
        fields.append("text")
    if pinned is not None:
        memory.pinned = bool(pinned)
        fields.append("pinned")
    if fields:
        memory.save(update_fields=fields)
    return memory


@transaction.atomic
def memory_delete(*, memory: Memory) -> None:
    Memory.objects.filter(pk=memory.pk).delete()
