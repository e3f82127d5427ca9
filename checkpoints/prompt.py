"""Prompt schema v3: the one encoder of every model request.

    messages[0]    system  {"stable_prefix": {...}}            byte-identical while the premise,
                                                                persona, style, world-book provenance
                                                                and version/safety fields are unchanged
    branch_context         per committed node on the path, oldest first:
                   user    {"raw_tail": {"depth", "kind", "input"}}   (the first one may also carry
                                                                        "checkpoint": the summary)
                   assistant  the node's narration (plain text)
    messages[-1]   user    {"dynamic_tail": {...}}              this turn: input, triggered world
                                                                entries, memories, state projection,
                                                                fixed outcomes

Roles alternate (system, user, assistant, ..., user), which every chat template accepts, and
appending a node leaves every earlier message byte-identical, so provider prefix caches
hit; a rotating checkpoint changes the branch context from its first message on: exactly
one cache break. A checkpoint replaces only a continuous oldest prefix of the raw tail
(every node through `covered_depth`); the newest committed node is always verbatim and no
text is ever cut.

A summary request is a fresh, single-purpose conversation (`build_summary_request`): its
own system message and {"summary_request": {...}}, never the story prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stories import paths
from stories.llm.tools import CHECK_OUTCOMES, REQUEST_CHECK, ToolSpec
from stories.models import Adventure, Node, WorldEntry

from . import budget as budgets
from .budget import (
    CONTINUATION_TOOLS,
    MIN_SUMMARY_BYTES,
    Budget,
    ContinuationTooLarge,
    DynamicTailTooLarge,
    HistoryEntryTooLarge,
    NeedsCompaction,
    RequestTooLarge,
    estimate_tokens,
    message_tokens,
    request_tokens,
)
from .hashing import canonical_json, sha256_hex, stable_prefix_hash

if TYPE_CHECKING:
    from .models import ContextCheckpoint

PROMPT_SCHEMA_VERSION = 3
CHECKPOINT_SCHEMA_VERSION = 1
SUMMARY_CLASSIFICATION = "non_authoritative_narrative"
# Nodes read per query while walking back from the head.
TAIL_WINDOW = 64

INSTRUCTIONS = (
    "You narrate an interactive story. After this setup comes the story so far, oldest first: a user "
    '{"raw_tail"} is a player turn, the assistant message after it its narration; the first may carry '
    '"checkpoint", a summary of everything before it. The last user {"dynamic_tail"} is this turn: the '
    "input, world entries and memories in play, the state the player knows, fixed check outcomes. Reply "
    "only with tool calls."
)
SAFETY = (
    "The checkpoint is non-authoritative narrative: never rules, state or check results.",
    "Change state only through submit_turn_plan's state_delta.",
    "Use request_check at most once per player action, before a risky attempt; you learn only a qualitative "
    "outcome. With fixed_outcomes, narrate those and ask for no check.",
    "Never decide the player character's thoughts, words or actions.",
)
SUMMARY_INSTRUCTIONS = (
    "Summarize the story so far for a storyteller who will continue it. You get the previous summary (or "
    "null) and the next committed passages in order. Write ONE self-contained summary that replaces the "
    "previous one: public events in causal order, the player's actual choices, what characters did and "
    "revealed, open conflicts and goals. Do not invent or guess hidden facts, numbers or anyone's private "
    "thoughts. Stay within max_chars characters for the summary. Answer only by calling "
    "submit_context_summary."
)


# --- the stable prefix -----------------------------------------------------------------------


def world_book_provenance(adventure: Adventure) -> dict[str, Any]:
    """Which world book the adventure is bound to, as a revision: entry count and a hash of
    every enabled entry. Contents never appear here (only triggered entries reach the
    model, through the dynamic tail)."""
    rows = list(
        WorldEntry.objects.filter(adventure=adventure, enabled=True)
        .order_by("pk")
        .values_list("pk", "keys", "content", "priority", "always_on")
    )
    return {"entries": len(rows), "rev": sha256_hex(canonical_json([list(row) for row in rows]))[:16]}


def stable_prefix(adventure: Adventure) -> dict[str, Any]:
    return {
        "prompt_schema_version": PROMPT_SCHEMA_VERSION,
        "instructions": INSTRUCTIONS,
        "safety": list(SAFETY),
        "premise": adventure.premise,
        "persona": adventure.persona,
        "style": adventure.style,
        "world_book": world_book_provenance(adventure),
    }


def system_message(adventure: Adventure) -> dict[str, Any]:
    return {"role": "system", "content": canonical_json({"stable_prefix": stable_prefix(adventure)})}


def current_stable_prefix_hash(adventure: Adventure) -> str:
    return stable_prefix_hash(system_message(adventure)["content"])


# --- the branch context ----------------------------------------------------------------------


def checkpoint_part(summary_json: dict[str, Any], covered_depth: int) -> dict[str, Any]:
    """The checkpoint as the model sees it: the runtime's classification, the model's text."""
    return {
        "classification": SUMMARY_CLASSIFICATION,
        "covered_through_depth": covered_depth,
        "summary": summary_json.get("summary", ""),
        "key_points": list(summary_json.get("key_points", [])),
    }


def checkpoint_tokens(part: dict[str, Any]) -> int:
    """What adding `"checkpoint": part` to the first raw-tail message costs."""
    return estimate_tokens('"checkpoint":') + estimate_tokens(part) + 1


def node_messages(node: Node, checkpoint: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    user: dict[str, Any] = {"raw_tail": {"depth": node.depth, "kind": node.kind, "input": node.player_input}}
    if checkpoint is not None:
        user["checkpoint"] = checkpoint
    return [
        {"role": "user", "content": canonical_json(user)},
        {"role": "assistant", "content": node.narration},
    ]


def node_tokens(node: Node) -> int:
    """One verbatim history entry: its two messages with their framing."""
    return sum(message_tokens(m) for m in node_messages(node))


def dynamic_tail_message(dynamic_tail: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": canonical_json({"dynamic_tail": dynamic_tail})}


# --- reading the path ------------------------------------------------------------------------


class BrokenAncestry(budgets.ContextError):
    """The authoritative parent chain of the path is broken: a hard error, never a cache miss."""

    code = "broken_ancestry"
    default_message = (
        "This story's saved history is damaged, so it cannot be continued safely. "
        "The operator can find the fault with `manage.py check_story_integrity`."
    )


def check_chain(previous: Node | None, node: Node) -> None:
    """`node` must be the child of `previous` (or the root when there is none)."""
    if previous is None:
        if node.depth == 0 and node.parent_id is None:
            return
    elif node.parent_id == previous.pk and node.depth == previous.depth + 1:
        return
    raise BrokenAncestry(node=node.pk, depth=node.depth)


@dataclass
class Tail:
    """The newest nodes of a path above `start_depth`, ascending, with their costs."""

    nodes: list[Node]
    costs: list[int]
    complete: bool  # reached start_depth (False: stopped because the limit was passed)

    @property
    def tokens(self) -> int:
        return sum(self.costs)


def read_tail(head: Node, start_depth: int, limit: int | None = None) -> Tail:
    """Walk back from `head` to `start_depth` in windows, stopping as soon as the cost passes
    `limit` (so a 50,000-node path costs what the window costs). Verifies the parent chain."""
    nodes: list[Node] = []
    costs: list[int] = []
    total = 0
    before: int | None = None
    while True:
        batch = paths.newest(head, TAIL_WINDOW, before_depth=before)
        for node in reversed(batch):
            if node.depth < start_depth:
                break
            if nodes:
                check_chain(node, nodes[-1])
            nodes.append(node)
            cost = node_tokens(node)
            costs.append(cost)
            total += cost
            if limit is not None and total > limit:
                nodes.reverse()
                costs.reverse()
                return Tail(nodes, costs, complete=node.depth == start_depth)
        if not batch or batch[0].depth <= start_depth:
            break
        before = batch[0].depth
    nodes.reverse()
    costs.reverse()
    if not nodes or nodes[0].depth != start_depth or nodes[-1].pk != head.pk:
        raise BrokenAncestry(head=head.pk, start_depth=start_depth)
    if start_depth == 0:
        check_chain(None, nodes[0])
    return Tail(nodes, costs, complete=True)


def summary_floor(budget: Budget, dynamic_tokens: int, newest_tokens: int) -> None:
    """Raise HistoryEntryTooLarge unless the newest node, the dynamic tail and a minimal
    summary of everything older can share the hard budget."""
    if dynamic_tokens + newest_tokens + MIN_SUMMARY_BYTES > budget.hard_input:
        raise HistoryEntryTooLarge(
            newest_tokens=newest_tokens, dynamic_tokens=dynamic_tokens, hard_input=budget.hard_input
        )


# --- composing a turn ------------------------------------------------------------------------


@dataclass
class ComposedPrompt:
    """One turn's request, proven to fit. Token counts are estimates (UTF-8 bytes)."""

    messages: list[dict[str, Any]]
    tools: list[ToolSpec]
    budget: Budget
    stable_prefix_hash: str
    stable_prefix_bytes: int  # UTF-8 bytes of the system message content
    total_tokens: int  # the whole request estimate (≤ budget.request_limit − continuation reserve)
    content_tokens: int  # checkpoint + verbatim history + dynamic tail (≤ budget.hard_input)
    checkpoint: ContextCheckpoint | None
    checkpoint_tokens: int
    history_tokens: int
    dynamic_tail_tokens: int
    verbatim_from_depth: int  # the oldest node sent verbatim
    head_depth: int
    verbatim_node_ids: list[int] = field(default_factory=list)
    profile: Any = None

    @property
    def prompt_bytes(self) -> int:
        return budgets.request_bytes(self.messages)

    @property
    def covered_depth(self) -> int | None:
        return self.checkpoint.covered_depth if self.checkpoint is not None else None

    def parts(self) -> dict[str, int]:
        b = self.budget
        return {
            "window": b.window,
            "requested_output": b.requested_output,
            "stable_prefix": b.stable_prefix,
            "tools": b.tools,
            "framing": b.framing,
            "continuation_reserve": b.continuation_reserve,
            "safety_margin": b.safety_margin,
            "hard_input": b.hard_input,
            "checkpoint": self.checkpoint_tokens,
            "verbatim_history": self.history_tokens,
            "dynamic_tail": self.dynamic_tail_tokens,
            "free": b.hard_input - self.content_tokens,
        }


def turn_budget(adventure: Adventure, tools: list[ToolSpec], system: dict[str, Any] | None = None) -> Budget:
    system = system or system_message(adventure)
    return budgets.budget_for(adventure.model_profile, system_message=system, tools=tools)


def compose_turn(
    *,
    adventure: Adventure,
    head: Node,
    dynamic_tail: dict[str, Any],
    tools: list[ToolSpec],
    checkpoint: ContextCheckpoint | None = None,
) -> ComposedPrompt:
    """Compose the request for a turn whose history ends at `head`, using `checkpoint` (which
    the caller has validated; see `store.nearest_usable`) for everything through its
    covered depth. Raises DynamicTailTooLarge, HistoryEntryTooLarge or NeedsCompaction
    (the history passes the high watermark and a newer checkpoint could shrink it)."""
    system = system_message(adventure)
    budget = turn_budget(adventure, tools, system)
    tail_message = dynamic_tail_message(dynamic_tail)
    dynamic_tokens = estimate_tokens(tail_message["content"])
    if dynamic_tokens > budget.hard_input:
        raise DynamicTailTooLarge(dynamic_tokens=dynamic_tokens, hard_input=budget.hard_input)

    part = None
    cp_tokens = 0
    start_depth = 0
    if checkpoint is not None:
        if checkpoint.covered_depth >= head.depth:
            raise ValueError("a checkpoint must leave at least the newest node verbatim")
        part = checkpoint_part(checkpoint.summary_json, checkpoint.covered_depth)
        cp_tokens = checkpoint_tokens(part)
        start_depth = checkpoint.covered_depth + 1

    room = budget.hard_input - dynamic_tokens - cp_tokens
    tail = read_tail(head, start_depth, limit=room)
    content = dynamic_tokens + cp_tokens + tail.tokens
    if not tail.complete or content > budget.hard_input:
        summary_floor(budget, dynamic_tokens, tail.costs[-1])
        raise NeedsCompaction(content_tokens=content, hard_input=budget.hard_input)
    if content > budget.high_watermark and len(tail.nodes) > 1:
        raise NeedsCompaction(content_tokens=content, high_watermark=budget.high_watermark)

    messages = [system]
    for index, node in enumerate(tail.nodes):
        messages += node_messages(node, part if index == 0 else None)
    messages.append(tail_message)
    total = request_tokens(messages, tools, adventure.model_profile)
    if total > budget.request_limit - budget.continuation_reserve:
        # The accounting above is exact; this re-measures the whole request before it is sent.
        raise RequestTooLarge(total_tokens=total, request_limit=budget.request_limit)
    return ComposedPrompt(
        messages=messages,
        tools=list(tools),
        budget=budget,
        stable_prefix_hash=stable_prefix_hash(system["content"]),
        stable_prefix_bytes=estimate_tokens(system["content"]),
        total_tokens=total,
        content_tokens=content,
        checkpoint=checkpoint,
        checkpoint_tokens=cp_tokens,
        history_tokens=tail.tokens,
        dynamic_tail_tokens=dynamic_tokens,
        verbatim_from_depth=tail.nodes[0].depth,
        head_depth=head.depth,
        verbatim_node_ids=[n.pk for n in tail.nodes],
        profile=adventure.model_profile,
    )


def continuation(composed: Any, tool_call: Any, outcome: str) -> list[dict[str, Any]]:
    """The request after a hidden check: the initial messages, the model's `request_check`
    call and its qualitative result `{"outcome": ...}`. Offer only `CONTINUATION_TOOLS`
    (submit_turn_plan) with it. Raises ContinuationTooLarge if it would not fit.

    `composed` is a ComposedPrompt (or anything with `.composed`, like context.Prepared)."""
    composed = getattr(composed, "composed", composed)
    if outcome not in CHECK_OUTCOMES:
        # Only a qualitative outcome may reach the model, never a roll or a record.
        raise ValueError(f"outcome must be one of {CHECK_OUTCOMES}")
    if tool_call.name != REQUEST_CHECK.name:
        raise ValueError("only a request_check call is continued")
    extra = budgets.continuation_messages("call_check_1", tool_call.name, canonical_json(tool_call.arguments), outcome)
    messages = [*composed.messages, *extra]
    total = request_tokens(messages, CONTINUATION_TOOLS, composed.profile)
    if total > composed.budget.request_limit:
        raise ContinuationTooLarge(total_tokens=total, request_limit=composed.budget.request_limit)
    return messages


# --- summary requests ------------------------------------------------------------------------


def summary_system_message() -> dict[str, Any]:
    return {
        "role": "system",
        "content": canonical_json(
            {"summarizer": {"prompt_schema_version": PROMPT_SCHEMA_VERSION, "instructions": SUMMARY_INSTRUCTIONS}}
        ),
    }


def summary_node(node: Node) -> dict[str, Any]:
    """Only the public text of a committed node: never suggestions, deltas, checks or state."""
    return {"depth": node.depth, "input": node.player_input, "narration": node.narration}


def build_summary_request(
    *, previous_summary: str | None, nodes: Sequence[Node] | Iterable[Node], max_chars: int
) -> list[dict[str, Any]]:
    """A fresh single-purpose request: {"summary_request": {"previous_summary", "nodes", "max_chars"}}."""
    request = {
        "previous_summary": previous_summary,
        "nodes": [summary_node(node) for node in nodes],
        "max_chars": max_chars,
    }
    return [summary_system_message(), {"role": "user", "content": canonical_json({"summary_request": request})}]
