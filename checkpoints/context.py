"""What the turn pipeline calls: prepare a prompt (compacting first when the budget says
so), continue it after a hidden check, prove the next turn still fits, and commit the node
with any pending checkpoint in one transaction. Also `compact_now` (the "compact this
branch now" job and `manage.py compact`) and `context_report` (the context panel).

A turn, in order (`stories/turns.py`)::

    prepared = prepare(adventure=a, head=parent, dynamic_tail=tail, tools=tools,
                       on_progress=..., cancel=...)      # may call the model to compact
    result = client.chat(messages=prepared.messages, tools=tools, ...)
    if result asks request_check:
        messages = continuation(prepared, call, outcome)  # then offer only CONTINUATION_TOOLS
        result = client.chat(messages=messages, tools=CONTINUATION_TOOLS, ...)
    assert_next_turn_fits(adventure=a, head=parent, candidate=fields, prepared=prepared)
    commit_turn(adventure=a, expected_version=v, pending_checkpoint=prepared.pending_checkpoint,
                write_node=lambda: tree.node_append(...))

`head` is the node the new one will be a child of: the head for play, the target's parent
for retry, regenerate and edit (history ends at the target's parent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from stories import paths, worldbook
from stories.llm.base import effective_limits, profile_label
from stories.llm.errors import ModelCancelled
from stories.llm.tools import REQUEST_CHECK, SUBMIT_TURN_PLAN, ToolSpec
from stories.models import Adventure, Node
from stories.state import player_projection

from . import compaction, store
from .budget import (
    CONTINUATION_TOOLS,
    Budget,
    ContextError,
    DynamicTailTooLarge,
    HistoryEntryTooLarge,
    NeedsCompaction,
    estimate_tokens,
)
from .budget import request_bytes as request_bytes
from .models import ContextCheckpoint
from .prompt import (
    PROMPT_SCHEMA_VERSION,
    ComposedPrompt,
    compose_turn,
    dynamic_tail_message,
    node_tokens,
    read_tail,
    stable_prefix_hash,
    summary_floor,
    system_message,
    turn_budget,
)
from .prompt import continuation as continuation
from .summarizer import CancelCallback, ProgressCallback

__all__ = [
    "CONTINUATION_TOOLS",
    "TURN_TOOLS",
    "CheckpointMismatch",
    "CompactResult",
    "Prepared",
    "assert_next_turn_fits",
    "build_dynamic_tail",
    "commit_turn",
    "compact_now",
    "context_report",
    "continuation",
    "prepare",
    "request_bytes",
]

# The tools of an ordinary turn (a regenerate offers only submit_turn_plan).
TURN_TOOLS: list[ToolSpec] = [REQUEST_CHECK, SUBMIT_TURN_PLAN]
# When no turn is known (compact_now, the report), room kept for a player's input.
INPUT_ALLOWANCE = 1024


class CheckpointMismatch(ContextError):
    """A pending checkpoint that does not belong under the node being committed."""

    code = "checkpoint_mismatch"
    default_message = "The story's summary no longer matches where the story stands. Nothing was saved; try again."


# --- preparing a turn ------------------------------------------------------------------------


@dataclass
class Prepared:
    """A composed prompt, plus the unsaved checkpoint that compaction produced for it."""

    composed: ComposedPrompt
    pending_checkpoint: ContextCheckpoint | None = None
    compaction_calls: int = 0
    compaction_chunks: list[int] = field(default_factory=list)
    misses: list[store.Miss] = field(default_factory=list)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.composed.messages

    @property
    def tools(self) -> list[ToolSpec]:
        return self.composed.tools

    @property
    def budget(self) -> Budget:
        return self.composed.budget

    @property
    def checkpoint(self) -> ContextCheckpoint | None:
        """The checkpoint the prompt uses (the pending one, or a stored one)."""
        return self.composed.checkpoint

    @property
    def prompt_bytes(self) -> int:
        return self.composed.prompt_bytes

    @property
    def stable_prefix_bytes(self) -> int:
        return self.composed.stable_prefix_bytes

    @property
    def total_tokens(self) -> int:
        return self.composed.total_tokens

    @property
    def verbatim_from_depth(self) -> int:
        return self.composed.verbatim_from_depth


def prepare(
    *,
    adventure: Adventure,
    head: Node,
    dynamic_tail: dict[str, Any],
    tools: list[ToolSpec],
    on_progress: ProgressCallback | None = None,
    cancel: CancelCallback | None = None,
) -> Prepared:
    """Compose the turn's prompt within the budget of the adventure's model, compacting with
    that same model first when the history passes the high watermark. Nothing is written:
    a compaction's checkpoint is returned as `pending_checkpoint` (hosted on `head`) for
    `commit_turn`. Raises ContextError subclasses, ModelError subclasses (compaction),
    or whatever `on_progress` raises."""
    system = system_message(adventure)
    prefix_hash = stable_prefix_hash(system["content"])
    budget = turn_budget(adventure, tools, system)
    dynamic_tokens = estimate_tokens(dynamic_tail_message(dynamic_tail)["content"])
    if dynamic_tokens > budget.hard_input:
        raise DynamicTailTooLarge(dynamic_tokens=dynamic_tokens, hard_input=budget.hard_input)
    checkpoint, misses = store.nearest_usable(
        adventure,
        head,
        stable_prefix_hash=prefix_hash,
        model_name=store.model_identity(adventure.model_profile),
        max_summary_tokens=budget.summary_cap,
    )
    try:
        composed = compose_turn(
            adventure=adventure, head=head, dynamic_tail=dynamic_tail, tools=tools, checkpoint=checkpoint
        )
        return Prepared(composed=composed, misses=misses)
    except NeedsCompaction:
        pass
    result = compaction.compact(
        adventure=adventure,
        head=head,
        budget=budget,
        dynamic_tokens=dynamic_tokens,
        checkpoint=checkpoint,
        stable_prefix_hash=prefix_hash,
        force=True,
        on_progress=on_progress,
        cancel=cancel,
    )
    if result is None:  # pragma: no cover - compose and plan agree on what needs compacting
        raise NeedsCompaction()
    if cancel and cancel():
        raise ModelCancelled()
    composed = compose_turn(
        adventure=adventure, head=head, dynamic_tail=dynamic_tail, tools=tools, checkpoint=result.checkpoint
    )
    return Prepared(
        composed=composed,
        pending_checkpoint=result.checkpoint,
        compaction_calls=result.calls,
        compaction_chunks=result.chunks,
        misses=misses,
    )


# --- the dynamic tail ----------------------------------------------------------------------


def build_dynamic_tail(
    adventure: Adventure,
    *,
    head: Node,
    kind: str,
    text: str,
    state: dict[str, Any] | None,
    extra_recent: list[Node] | None = None,
    fixed_outcomes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The dynamic tail of a turn after `head` (plus `extra_recent`, a not yet committed
    node): the same shape and selection as the turn pipeline's, for the checks that must
    imagine a turn (the minimal next turn, the report's reserve)."""
    extra = list(extra_recent or [])
    scan = max(adventure.world_scan_depth, 1)
    recent = [*paths.newest(head, max(scan - len(extra), 0)), *extra][-scan:]
    entries = worldbook.triggered_entries(adventure, input_text=text, recent_nodes=recent)
    memories = worldbook.relevant_memories(paths.memories_on_path(head), input_text=text)
    return {
        "input": {"kind": kind, "text": text},
        "world_entries": [{"keys": list(e.keys), "content": e.content} for e in entries],
        "memories": [m.text for m in memories],
        "state": player_projection(state or {}),
        "fixed_outcomes": fixed_outcomes,
    }


def _candidate_node(head: Node, candidate: Any) -> Node:
    if isinstance(candidate, Node):
        return candidate
    return Node(
        adventure_id=head.adventure_id,
        branch_id=head.branch_id,
        depth=head.depth + 1,
        parent_id=head.pk,
        kind=candidate.get("kind", Node.Kind.CONTINUE),
        player_input=candidate.get("player_input", ""),
        narration=candidate.get("narration", ""),
        state_after=candidate.get("state_after") or {},
    )


def assert_next_turn_fits(
    *,
    adventure: Adventure,
    head: Node,
    candidate: dict[str, Any] | Node,
    prepared: Prepared | None = None,
    pending_checkpoint: ContextCheckpoint | None = None,
    tools: list[ToolSpec] | None = None,
    next_dynamic_tail: dict[str, Any] | None = None,
) -> None:
    """Prove that after committing `candidate` (a child of `head`: its node fields, e.g.
    kind, player_input, narration, state_after) the minimal next turn can be composed:
    a "continue" with no input, the candidate's state, the world entries and memories it
    would trigger, the candidate verbatim, and everything older summarized (at least a
    minimal summary's room). Raises DynamicTailTooLarge or HistoryEntryTooLarge, so a
    reply that would leave the story unable to continue is never committed.

    `prepared` / `pending_checkpoint` are accepted for the caller's convenience; the proof
    does not depend on them (the next turn may compact again)."""
    node = _candidate_node(head, candidate)
    budget = turn_budget(adventure, tools or TURN_TOOLS)
    tail = next_dynamic_tail or build_dynamic_tail(
        adventure, head=head, kind=Node.Kind.CONTINUE, text="", state=node.state_after, extra_recent=[node]
    )
    dynamic_tokens = estimate_tokens(dynamic_tail_message(tail)["content"])
    if dynamic_tokens > budget.hard_input:
        raise DynamicTailTooLarge(
            "After this reply, the story's state and world entries would no longer fit the model's context "
            "window. Nothing was saved.",
            dynamic_tokens=dynamic_tokens,
        )
    try:
        summary_floor(budget, dynamic_tokens, node_tokens(node))
    except HistoryEntryTooLarge as exc:
        raise HistoryEntryTooLarge(
            "The model's reply is too long to continue the story from within its context window. "
            "Nothing was saved; try again.",
            **exc.details,
        ) from None


# --- committing a turn -----------------------------------------------------------------------


def _check_pending(pending: ContextCheckpoint, node: Node) -> None:
    """A pending checkpoint must be hosted on the new node's parent and lie on its path."""
    if pending.host_node_id != node.parent_id or pending.adventure_id != node.adventure_id:
        raise CheckpointMismatch(reason="host", host=pending.host_node_id, parent=node.parent_id)
    host = Node.objects.select_related("branch").get(pk=pending.host_node_id)
    covered = Node.objects.get(pk=pending.covered_through_id)
    retained = Node.objects.get(pk=pending.retained_from_id) if pending.retained_from_id else None
    ok = (
        (pending.branch_id, pending.depth) == (host.branch_id, host.depth)
        and retained is not None
        and retained.parent_id == covered.pk
        and covered.depth == pending.covered_depth < host.depth
        and paths.on_path(node, host)
        and paths.on_path(node, covered)
        and paths.on_path(node, retained)
    )
    if not ok:
        raise CheckpointMismatch(reason="path", host=pending.host_node_id)


def commit_turn(
    *,
    adventure: Adventure,
    expected_version: int,
    pending_checkpoint: ContextCheckpoint | None,
    write_node: Callable[[], Node],
    cancel: CancelCallback | None = None,
) -> Node:
    """In ONE transaction: `write_node()` (which calls tree.node_append / attempt_add /
    sibling_branch_add and moves the head) and the pending checkpoint, which must be hosted
    on the new node's parent and lie on its path (else CheckpointMismatch and nothing
    lands). When the host already has a checkpoint, the pending one replaces it only if it
    covers more (or the existing row is unusable). `cancel` is checked once, before
    anything is written: after that the commit is not raced."""
    from stories.tree import StaleVersion

    with transaction.atomic():
        if cancel and cancel():
            raise ModelCancelled()
        current = Adventure.objects.select_for_update().values_list("version", flat=True).get(pk=adventure.pk)
        if current != expected_version:
            raise StaleVersion(expected=expected_version, current=current)
        node = write_node()
        if pending_checkpoint is not None:
            _check_pending(pending_checkpoint, node)
            try:
                store.save_checkpoint(pending_checkpoint)
            except BaseException:
                pending_checkpoint.pk = None
                raise
    return node


# --- compaction on request ---------------------------------------------------------------------


@dataclass
class CompactResult:
    checkpoint: ContextCheckpoint | None  # the checkpoint that stands for the tip afterwards
    created: bool  # a new row was saved
    calls: int  # model calls made
    chunks: list[int] = field(default_factory=list)  # nodes summarized per call
    misses: list[store.Miss] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.created:
            return "compacted"
        return "kept_existing" if self.calls else "nothing_to_compact"


def reserve_dynamic_tokens(adventure: Adventure, tip: Node, budget: Budget) -> int:
    """Room to keep for a turn after `tip` when its input is not known yet: a "continue" at
    the tip (state, world entries, memories) plus an allowance for the player's words."""
    tail = build_dynamic_tail(adventure, head=tip, kind=Node.Kind.CONTINUE, text="", state=tip.state_after)
    return estimate_tokens(dynamic_tail_message(tail)["content"]) + min(INPUT_ALLOWANCE, budget.hard_input // 10)


def compact_now(
    adventure: Adventure,
    tip: Node | None = None,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: CancelCallback | None = None,
) -> CompactResult:
    """Compact the path ending at `tip` (default: the head) now, with the adventure's own
    model, and save the checkpoint hosted on the tip. Does nothing when the path already
    fits under the low watermark. Raises ContextError / ModelError subclasses; an
    interrupted compaction saves nothing."""
    adventure = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
    tip = Node.objects.select_related("branch").get(pk=(tip.pk if tip is not None else adventure.head_id))
    if tip.adventure_id != adventure.pk or not tip.live:
        raise ContextError("That node is not part of this story any more.")
    system = system_message(adventure)
    prefix_hash = stable_prefix_hash(system["content"])
    budget = turn_budget(adventure, TURN_TOOLS, system)
    reserve = reserve_dynamic_tokens(adventure, tip, budget)
    checkpoint, misses = store.nearest_usable(
        adventure,
        tip,
        stable_prefix_hash=prefix_hash,
        model_name=store.model_identity(adventure.model_profile),
        max_summary_tokens=budget.summary_cap,
    )
    result = compaction.compact(
        adventure=adventure,
        head=tip,
        budget=budget,
        dynamic_tokens=reserve,
        checkpoint=checkpoint,
        stable_prefix_hash=prefix_hash,
        force=False,
        on_progress=on_progress,
        cancel=cancel,
    )
    if result is None:
        return CompactResult(checkpoint=checkpoint, created=False, calls=0, misses=misses)
    if cancel and cancel():
        raise ModelCancelled()
    with transaction.atomic():
        if not Node.objects.filter(pk=tip.pk, live=True).exists():
            raise ContextError("That node is not part of this story any more.")
        row = store.save_checkpoint(result.checkpoint)
    return CompactResult(
        checkpoint=row, created=row is result.checkpoint, calls=result.calls, chunks=result.chunks, misses=misses
    )


# --- the context panel -------------------------------------------------------------------------


def _checkpoint_info(checkpoint: ContextCheckpoint | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    return {
        "id": checkpoint.pk,
        "host_node": checkpoint.host_node_id,
        "host_depth": checkpoint.depth,
        "covered_through": checkpoint.covered_through_id,
        "covered_depth": checkpoint.covered_depth,
        "retained_from": checkpoint.retained_from_id,
        "model_name": checkpoint.model_name,
        "summary_bytes": checkpoint.summary_bytes,
        "covered_bytes": checkpoint.covered_bytes,
        "created_at": checkpoint.created_at.isoformat() if checkpoint.created_at else None,
    }


@dataclass
class _Usage:
    """How the next turn at a head would use its budget (no model call)."""

    reserve: int
    checkpoint: ContextCheckpoint | None
    misses: list[store.Miss]
    tail: Any  # prompt.Tail
    content: int
    fits: bool
    needs_compaction: bool
    after: dict[str, int] | None


def _usage(adventure: Adventure, head: Node, budget: Budget, system: dict[str, Any]) -> _Usage:
    reserve = reserve_dynamic_tokens(adventure, head, budget)
    checkpoint, misses = store.nearest_usable(
        adventure,
        head,
        stable_prefix_hash=stable_prefix_hash(system["content"]),
        model_name=store.model_identity(adventure.model_profile),
        max_summary_tokens=budget.summary_cap,
    )
    cp_tokens = checkpoint.summary_bytes if checkpoint is not None else 0
    start = checkpoint.covered_depth + 1 if checkpoint is not None else 0
    tail = read_tail(head, start, limit=max(0, budget.hard_input - reserve - cp_tokens))
    content = reserve + cp_tokens + tail.tokens
    fits = tail.complete and content <= budget.hard_input
    needs_compaction = not fits or (content > budget.high_watermark and len(tail.nodes) > 1)
    after = None
    if needs_compaction:
        planned = compaction.plan(
            head=head, budget=budget, dynamic_tokens=min(reserve, budget.hard_input), checkpoint=checkpoint, force=True
        )
        if planned is not None:
            after = {"covered_through_depth": planned.covered.depth, "verbatim_from_depth": planned.retained_from.depth}
    return _Usage(reserve, checkpoint, misses, tail, content, fits, needs_compaction, after)


def context_report(adventure: Adventure) -> dict[str, Any]:
    """The budget of the next turn at the head, its parts, the checkpoint in use and what
    stays verbatim, without calling the model. JSON-ready (the API's context endpoint).
    A story that cannot be budgeted reports `error` ({code, message}) instead of raising."""
    adventure = Adventure.objects.select_related("model_profile", "head__branch").get(pk=adventure.pk)
    profile, head = adventure.model_profile, adventure.head
    window, assumed, requested_output = effective_limits(profile)
    report: dict[str, Any] = {
        "adventure": adventure.pk,
        "head": head.pk,
        "head_depth": head.depth,
        "prompt_schema_version": PROMPT_SCHEMA_VERSION,
        "model": {"profile": profile.name, "label": profile_label(profile), "identity": store.model_identity(profile)},
        "window": window,
        "window_assumed": assumed,
        "requested_output": requested_output,
    }
    system = system_message(adventure)
    try:
        budget = turn_budget(adventure, TURN_TOOLS, system)
    except ContextError as exc:  # WindowTooSmall: shown, not a server error
        report["error"] = {"code": exc.code, "message": exc.message}
        return report
    report["budget"] = budget.as_dict()
    try:
        usage = _usage(adventure, head, budget, system)
    except ContextError as exc:  # HistoryEntryTooLarge, BrokenAncestry, ...
        report["error"] = {"code": exc.code, "message": exc.message}
        return report
    checkpoint, tail, fits = usage.checkpoint, usage.tail, usage.fits
    report.update(
        parts={
            "stable_prefix": budget.stable_prefix,
            "tools": budget.tools,
            "framing": budget.framing,
            "continuation_reserve": budget.continuation_reserve,
            "safety_margin": budget.safety_margin,
            "checkpoint": checkpoint.summary_bytes if checkpoint is not None else 0,
            "verbatim_history": tail.tokens if fits else None,
            "dynamic_tail_reserve": usage.reserve,
            "free": budget.hard_input - usage.content if fits else None,
        },
        checkpoint=_checkpoint_info(checkpoint),
        covered={"from_depth": 0, "through_depth": checkpoint.covered_depth} if checkpoint is not None else None,
        verbatim={
            "from_depth": tail.nodes[0].depth if fits else None,
            "through_depth": head.depth,
            "nodes": len(tail.nodes) if fits else None,
            "tokens": tail.tokens if fits else None,
        },
        needs_compaction=usage.needs_compaction,
        after_compaction=usage.after,
        misses=[{"checkpoint": miss.checkpoint_id, "reason": miss.reason} for miss in usage.misses],
    )
    return report
