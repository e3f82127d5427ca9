"""Same-model summaries through the one strict tool `submit_context_summary`.

Every call is a fresh single-purpose request (`prompt.build_summary_request`), never the
story prompt, sent with the adventure's own profile. What a request may carry: the previous
self-contained summary and the public text of committed nodes on the path (depth, player
input, narration). Never suggestions, deltas, checks, state, world entries or anything from
another branch: `prompt.summary_node` is the only way a node enters a request.

A long branch with no checkpoint is summarized in bounded rolling chunks (each request
fits the model's window and `MAX_CHUNK_TOKENS`); each chunk folds the running summary with
the next nodes, and only the final summary is kept. A later compaction folds the previous
checkpoint's summary with the new nodes: one call when they fit one chunk.

The model layer validates the tool's schema; this module adds the rules the schema cannot
say: exactly one call of this tool, no blank summary, the summary must fit the room the
story prompt has for it, and it must not repeat a credential or our own request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stories.llm.base import api_key_for, client_for, effective_limits
from stories.llm.errors import ModelCancelled, ModelMalformed
from stories.llm.tools import MAX_SUMMARY_CHARS, SUBMIT_CONTEXT_SUMMARY

from .budget import HistoryEntryTooLarge, budget_for, estimate_tokens, request_tokens
from .prompt import (
    build_summary_request,
    checkpoint_part,
    checkpoint_tokens,
    summary_node,
    summary_system_message,
)

if TYPE_CHECKING:
    from stories.models import ModelProfile, Node

SUMMARY_TOOLS = [SUBMIT_CONTEXT_SUMMARY]
# However large the window, one summary request carries at most this much history.
MAX_CHUNK_TOKENS = 48_000
# Share of the summary room promised to the summary text; key points use the rest.
SUMMARY_TEXT_SHARE = 0.8
# Markers of our own request format: a summary echoing them is not a summary.
REQUEST_MARKERS = ('"summary_request"', '"dynamic_tail"', '"stable_prefix"', '"raw_tail"')

ProgressCallback = Callable[[int, int], None]
CancelCallback = Callable[[], bool]


@dataclass
class Summary:
    summary: str
    key_points: list[str]
    calls: int = 0
    model: str = ""
    chunks: list[int] = field(default_factory=list)  # nodes per chunk, for reports


def render_previous(summary: str, key_points: Sequence[str]) -> str:
    """A previous summary as the next request sees it: the text, then its key points."""
    if not key_points:
        return summary
    return summary + "\nKey points:\n" + "\n".join(f"- {point}" for point in key_points)


def _max_chars(cap_tokens: int, covered_depth: int, nodes: Sequence[Node], previous: str | None) -> int:
    """Characters to ask for, so that the summary text fits its share of `cap_tokens` bytes
    whatever the script: scaled by the source's bytes per character (+10% for escapes)."""
    empty = checkpoint_tokens(checkpoint_part({"summary": "", "key_points": []}, covered_depth))
    room = max(0, cap_tokens - empty) * SUMMARY_TEXT_SHARE
    sample = "".join(f"{n.player_input}{n.narration}" for n in nodes[-50:]) + (previous or "")
    ratio = max(1.0, len(sample.encode()) / max(1, len(sample))) * 1.1
    return max(1, min(MAX_SUMMARY_CHARS, int(room / ratio)))


def plan_chunks(
    nodes: Sequence[Node], *, capacity: int, first_has_previous: bool, previous_allowance: int
) -> list[list[Node]]:
    """Greedy chunks of consecutive nodes, each within `capacity` bytes of request content
    (chunks after the first also carry the running summary). Raises HistoryEntryTooLarge
    for a node that does not fit a chunk on its own."""
    chunks: list[list[Node]] = []
    current: list[Node] = []
    used = 0
    room = capacity - (previous_allowance if first_has_previous else 0)
    for node in nodes:
        cost = estimate_tokens(summary_node(node)) + 1
        if current and used + cost > room:
            chunks.append(current)
            current, used = [], 0
            room = capacity - previous_allowance
        if cost > room:
            raise HistoryEntryTooLarge(
                "A single passage is too long for the model to summarize within its context window.",
                node=node.pk,
                tokens=cost,
            )
        current.append(node)
        used += cost
    if current or not chunks:
        chunks.append(current)
    return chunks


def _validate(result: Any, *, cap_tokens: int, covered_depth: int, forbidden: Sequence[str]) -> tuple[str, list[str]]:
    """The summary and the key points that fit, or ModelMalformed."""
    calls = result.tool_calls
    if len(calls) != 1:
        raise ModelMalformed(f"made {len(calls)} tool calls where exactly one submit_context_summary was required")
    call = calls[0]
    if call.name != SUBMIT_CONTEXT_SUMMARY.name:
        raise ModelMalformed(f"called {call.name} where submit_context_summary was required")
    arguments = call.arguments
    if not isinstance(arguments, dict) or set(arguments) != {"summary", "key_points"}:
        raise ModelMalformed("submit_context_summary must carry exactly summary and key_points")
    summary, points = arguments["summary"], arguments["key_points"]
    if not isinstance(summary, str) or not summary.strip():
        raise ModelMalformed("the summary is blank")
    if not isinstance(points, list) or not all(isinstance(p, str) for p in points):
        raise ModelMalformed("key_points must be a list of texts")
    summary = summary.strip()
    if any(marker in summary for marker in REQUEST_MARKERS):
        raise ModelMalformed("the summary repeats the request instead of summarizing it")
    if any(secret and secret in text for secret in forbidden for text in [summary, *points]):
        raise ModelMalformed("the summary contains a credential")
    if checkpoint_tokens(checkpoint_part({"summary": summary, "key_points": []}, covered_depth)) > cap_tokens:
        raise ModelMalformed(f"the summary is longer than the {cap_tokens} bytes it may take in the prompt")
    # Key points are an aid, the summary is self-contained: keep those that fit, in order.
    kept: list[str] = []
    for point in dict.fromkeys(p.strip() for p in points if p.strip()):
        trial = checkpoint_part({"summary": summary, "key_points": [*kept, point]}, covered_depth)
        if checkpoint_tokens(trial) <= cap_tokens:
            kept.append(point)
    return summary, kept


def summarize(
    *,
    profile: ModelProfile,
    nodes: Sequence[Node],
    previous: tuple[str, list[str]] | None,
    cap_tokens: int,
    covered_depth: int,
    on_progress: ProgressCallback | None = None,
    cancel: CancelCallback | None = None,
) -> Summary:
    """Fold `previous` (summary, key points) and `nodes` (consecutive, oldest first) into one
    self-contained summary whose checkpoint fits `cap_tokens`. Raises ModelError subclasses
    (ModelCancelled when `cancel()` turns true between chunks) and HistoryEntryTooLarge;
    nothing is written either way."""
    system = summary_system_message()
    budget = budget_for(profile, system_message=system, tools=SUMMARY_TOOLS)
    _window, _assumed, max_output = effective_limits(profile)
    max_chars = _max_chars(cap_tokens, covered_depth, nodes, previous[0] if previous else None)
    skeleton = estimate_tokens(
        build_summary_request(previous_summary=None, nodes=[], max_chars=max_chars)[1]["content"]
    )
    # The running summary as a JSON string: its bytes plus room for escapes.
    allowance = cap_tokens + cap_tokens // 4 + 16
    capacity = min(budget.hard_input, MAX_CHUNK_TOKENS) - skeleton
    chunks = plan_chunks(
        nodes, capacity=capacity, first_has_previous=previous is not None, previous_allowance=allowance
    )
    forbidden = [key for key in [api_key_for(profile)] if key]
    client = client_for(profile)

    running = render_previous(*previous) if previous else None
    summary = Summary(summary="", key_points=[])
    total = len(chunks)
    if on_progress:
        on_progress(0, total)
    index = 0
    while index < len(chunks):
        if cancel and cancel():
            raise ModelCancelled()
        chunk = chunks[index]
        messages = build_summary_request(previous_summary=running, nodes=chunk, max_chars=max_chars)
        while request_tokens(messages, SUMMARY_TOOLS, profile) > budget.request_limit:
            # The running summary escaped to more bytes than allowed for: move the newest
            # node of this chunk to the next one (one more chunk, never a cut node).
            if len(chunk) <= 1:
                raise HistoryEntryTooLarge(
                    "A passage and the running summary do not fit the model's context window together."
                )
            moved = chunk.pop()
            if index + 1 < len(chunks):
                chunks[index + 1].insert(0, moved)
            else:
                chunks.append([moved])
            messages = build_summary_request(previous_summary=running, nodes=chunk, max_chars=max_chars)
        total = len(chunks)
        result = client.chat(
            messages=messages, tools=SUMMARY_TOOLS, max_output_tokens=max_output, max_tool_calls=1, cancel=cancel
        )
        text, points = _validate(result, cap_tokens=cap_tokens, covered_depth=covered_depth, forbidden=forbidden)
        summary = Summary(
            summary=text,
            key_points=points,
            calls=summary.calls + 1,
            model=result.model,
            chunks=[*summary.chunks, len(chunk)],
        )
        running = render_previous(text, points)
        index += 1
        if on_progress:
            on_progress(index, total)
    return summary
