"""Deciding what to compact and building the (unsaved) checkpoint.

Compaction keeps the newest nodes verbatim while the dynamic tail, the summary's room and
those nodes stay under the low watermark (always at least the newest node), and summarizes
everything older: from the root on a first compaction, or by folding the previous
checkpoint's summary with the nodes after it. The result is a `ContextCheckpoint` that is
NOT saved: a turn commits it with its node (`context.commit_turn`), `compact_now` saves it
on its own. Interrupted or failed compaction therefore leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from stories import paths
from stories.models import Adventure, Node

from .budget import Budget
from .hashing import summary_digest
from .models import ContextCheckpoint
from .prompt import (
    CHECKPOINT_SCHEMA_VERSION,
    PROMPT_SCHEMA_VERSION,
    SUMMARY_CLASSIFICATION,
    check_chain,
    checkpoint_part,
    checkpoint_tokens,
    node_tokens,
    read_tail,
    summary_floor,
)
from .store import model_identity, source_hash_for
from .summarizer import CancelCallback, ProgressCallback, summarize


@dataclass
class Plan:
    covered: Node  # the newest node the new summary covers
    retained_from: Node  # the oldest node kept verbatim (covered's child)
    new_nodes: list[Node] | None  # nodes to fold into the previous summary; None: root..covered
    cap_tokens: int  # room the checkpoint may take in the prompt


def load_path(tip: Node) -> list[Node]:
    """Root to `tip`, verifying the parent chain (BrokenAncestry)."""
    nodes: list[Node] = []
    for node in paths.iter_path(tip):
        check_chain(nodes[-1] if nodes else None, node)
        nodes.append(node)
    if not nodes or nodes[-1].pk != tip.pk:
        from .prompt import BrokenAncestry

        raise BrokenAncestry(tip=tip.pk)
    return nodes


def path_slice(tip: Node, low: int) -> list[Node]:
    """Nodes of tip's path from depth `low` through tip, ascending, in bounded windows."""
    nodes: list[Node] = []
    before = tip.depth + 1
    while before > low:
        batch = [n for n in paths.newest(tip, min(500, before - low), before_depth=before) if n.depth >= low]
        if not batch:
            break
        nodes[:0] = batch
        before = batch[0].depth
    for previous, node in zip(nodes, nodes[1:], strict=False):
        check_chain(previous, node)
    return nodes


def plan(
    *,
    head: Node,
    budget: Budget,
    dynamic_tokens: int,
    checkpoint: ContextCheckpoint | None,
    force: bool,
) -> Plan | None:
    """What to summarize so the prompt drops under the low watermark. None when there is
    nothing worth doing (everything already fits under it and `force` is off)."""
    start = checkpoint.covered_depth + 1 if checkpoint is not None else 0
    newest_tokens = node_tokens(head)
    summary_floor(budget, dynamic_tokens, newest_tokens)
    cap = min(budget.summary_cap, budget.hard_input - dynamic_tokens - newest_tokens)
    keep_limit = max(budget.low_watermark - dynamic_tokens - cap, newest_tokens)
    tail = read_tail(head, start, limit=keep_limit)
    over = not tail.complete or tail.tokens > keep_limit
    if over:
        # tail.nodes[0] is the node that passed the limit: the newest one to summarize.
        covered, retained = tail.nodes[0], tail.nodes[1]
    elif not force:
        return None
    elif len(tail.nodes) > 1:
        covered, retained = tail.nodes[0], tail.nodes[1]
    elif checkpoint is not None and checkpoint.summary_bytes > cap:
        # Only the newest node is verbatim and the summary itself is too large for this
        # budget (a smaller model): summarize the summary again.
        return Plan(covered=checkpoint.covered_through, retained_from=head, new_nodes=[], cap_tokens=cap)
    else:
        return None
    # Folding: the nodes after the previous checkpoint through `covered` (tail nodes are >= start).
    new_nodes = None if checkpoint is None else path_slice(covered, start)
    return Plan(covered=covered, retained_from=retained, new_nodes=new_nodes, cap_tokens=cap)


@dataclass
class Compaction:
    checkpoint: ContextCheckpoint  # unsaved
    calls: int
    chunks: list[int]


def compact(
    *,
    adventure: Adventure,
    head: Node,
    budget: Budget,
    dynamic_tokens: int,
    checkpoint: ContextCheckpoint | None,
    stable_prefix_hash: str,
    force: bool = True,
    on_progress: ProgressCallback | None = None,
    cancel: CancelCallback | None = None,
) -> Compaction | None:
    """Summarize with the adventure's own model and return an unsaved checkpoint hosted on
    `head`, or None when nothing needs compacting. `checkpoint`: the usable one in effect
    (its summary is folded), or None for a first compaction from the root."""
    chosen = plan(head=head, budget=budget, dynamic_tokens=dynamic_tokens, checkpoint=checkpoint, force=force)
    if chosen is None:
        return None
    covered = chosen.covered
    if chosen.new_nodes is None:
        root_path = load_path(covered)
        nodes, previous = root_path, None
    else:
        root_path = None
        nodes = chosen.new_nodes
        previous = (checkpoint.summary_json["summary"], list(checkpoint.summary_json["key_points"]))
    profile = adventure.model_profile
    result = summarize(
        profile=profile,
        nodes=nodes,
        previous=previous,
        cap_tokens=chosen.cap_tokens,
        covered_depth=covered.depth,
        on_progress=on_progress,
        cancel=cancel,
    )
    source, covered_bytes = source_hash_for(
        adventure_id=adventure.pk, covered=covered, stable_prefix_hash=stable_prefix_hash, nodes=root_path
    )
    summary_json = {
        "classification": SUMMARY_CLASSIFICATION,
        "summary": result.summary,
        "key_points": result.key_points,
        "digest": summary_digest(
            summary=result.summary,
            key_points=result.key_points,
            classification=SUMMARY_CLASSIFICATION,
            source_hash=source,
        ),
    }
    pending = ContextCheckpoint(
        adventure=adventure,
        host_node=head,
        branch_id=head.branch_id,
        depth=head.depth,
        covered_through=covered,
        covered_depth=covered.depth,
        retained_from=chosen.retained_from,
        checkpoint_schema_version=CHECKPOINT_SCHEMA_VERSION,
        prompt_schema_version=PROMPT_SCHEMA_VERSION,
        stable_prefix_hash=stable_prefix_hash,
        summary_json=summary_json,
        source_hash=source,
        model_name=model_identity(profile),
        summary_bytes=checkpoint_tokens(checkpoint_part(summary_json, covered.depth)),
        covered_bytes=covered_bytes,
    )
    return Compaction(checkpoint=pending, calls=result.calls, chunks=result.chunks)
