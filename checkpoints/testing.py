"""A minimal turn driver for tests and benchmarks: prepare → chat → (continuation → chat)
→ assert_next_turn_fits → commit_turn through the tree's own writes, without jobs,
workers or locks. The production pipeline is `stories.turns`; this mirrors its calls to
the context layer so the context rules can be exercised in-process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from stories import tree
from stories.llm.base import client_for, effective_limits
from stories.llm.tools import REQUEST_CHECK, SUBMIT_TURN_PLAN
from stories.models import Adventure, Node
from stories.state import apply_delta

from .context import (
    CONTINUATION_TOOLS,
    TURN_TOOLS,
    Prepared,
    assert_next_turn_fits,
    build_dynamic_tail,
    commit_turn,
    continuation,
    prepare,
)

DIFFICULTY_DC = {"easy": 8, "moderate": 12, "hard": 16, "extreme": 19}


@dataclass
class Turn:
    node: Node
    prepared: Prepared
    requests: list[tuple[list[dict[str, Any]], list[Any]]] = field(default_factory=list)


def roll(arguments: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """An exact check record (private) and its qualitative outcome."""
    value = rng.randint(1, 20)
    dc = DIFFICULTY_DC[arguments["difficulty"]]
    outcome = "success" if value >= dc else "partial" if value >= dc - 4 else "failure"
    return {**arguments, "roll": value, "dc": dc, "seed": rng.getrandbits(40), "outcome": outcome}


def play(
    adventure: Adventure,
    text: str = "",
    *,
    kind: str = "do",
    regenerate: Node | None = None,
    rng: random.Random | None = None,
    before_chat: Any = None,
    on_progress: Any = None,
    cancel: Any = None,
) -> Turn:
    """Play one turn at the adventure's head (or regenerate `regenerate`: a sibling on a new
    branch, history ending at its parent, its checks reused as fixed outcomes)."""
    rng = rng or random.Random(0)
    adventure = Adventure.objects.select_related("model_profile", "head__branch").get(pk=adventure.pk)
    profile = adventure.model_profile
    if regenerate is not None:
        parent = Node.objects.select_related("branch").get(pk=regenerate.parent_id)
        kind, text = regenerate.kind, regenerate.player_input
        fixed = [{"skill": c.get("skill", ""), "outcome": c.get("outcome", "")} for c in regenerate.checks]
        tools = [SUBMIT_TURN_PLAN]
    else:
        parent, fixed, tools = adventure.head, None, TURN_TOOLS
    tail = build_dynamic_tail(
        adventure, head=parent, kind=kind, text=text, state=parent.state_after, fixed_outcomes=fixed
    )
    prepared = prepare(
        adventure=adventure, head=parent, dynamic_tail=tail, tools=tools, on_progress=on_progress, cancel=cancel
    )
    if before_chat:
        before_chat(prepared)
    client = client_for(profile)
    _window, _assumed, max_output = effective_limits(profile)
    turn_requests = [(prepared.messages, tools)]
    result = client.chat(messages=prepared.messages, tools=tools, max_output_tokens=max_output, cancel=cancel)
    call = result.tool_calls[0]
    checks: list[dict[str, Any]] = []
    prompt_bytes = prepared.prompt_bytes
    if call.name == REQUEST_CHECK.name:
        record = roll(call.arguments, rng)
        checks.append(record)
        messages = continuation(prepared, call, record["outcome"])
        turn_requests.append((messages, CONTINUATION_TOOLS))
        result = client.chat(messages=messages, tools=CONTINUATION_TOOLS, max_output_tokens=max_output, cancel=cancel)
        call = result.tool_calls[0]
    plan = call.arguments
    if regenerate is not None:
        delta, checks, state_after = regenerate.state_delta, regenerate.checks, regenerate.state_after
    else:
        delta = plan.get("state_delta", [])
        state_after = apply_delta(parent.state_after or {}, delta)
    content = {
        "kind": kind,
        "player_input": text,
        "narration": plan["narration"],
        "suggestions": list(plan.get("suggestions", [])),
        "state_delta": delta,
        "state_after": state_after,
        "checks": checks,
        "model_name": result.model[:200],
        "prompt_bytes": prompt_bytes,
        "prompt_stable_bytes": prepared.stable_prefix_bytes,
    }
    assert_next_turn_fits(adventure=adventure, head=parent, candidate=content, prepared=prepared)

    def write_node() -> Node:
        if regenerate is not None:
            return tree.sibling_branch_add(
                adventure=adventure,
                target=regenerate,
                expected_version=adventure.version,
                regenerated_from=regenerate,
                **content,
            )
        return tree.node_append(adventure=adventure, expected_version=adventure.version, **content)

    node = commit_turn(
        adventure=adventure,
        expected_version=adventure.version,
        pending_checkpoint=prepared.pending_checkpoint,
        write_node=write_node,
        cancel=cancel,
    )
    return Turn(node=node, prepared=prepared, requests=turn_requests)


# --- fixtures' helpers ------------------------------------------------------------------------


def make_profile(name: str, **fields: Any):
    """A saved ModelProfile (the offline narrator unless `provider` says otherwise)."""
    from stories.models import ModelProfile

    defaults = {"provider": ModelProfile.Provider.BUILTIN, "model_name": "storytree-builtin"}
    return ModelProfile.objects.create(name=name, **{**defaults, **fields})


def use_profile(adventure: Adventure, profile) -> Adventure:
    adventure.model_profile = profile
    adventure.save(update_fields=["model_profile"])
    return adventure


def snapshot(adventure: Adventure) -> dict[str, Any]:
    """Everything a player can see or the story is made of, for byte-identical comparisons."""
    from stories import paths
    from stories.models import Branch, Memory

    fresh = Adventure.objects.get(pk=adventure.pk)
    head = Node.objects.select_related("branch").get(pk=fresh.head_id)
    fields = [f.attname for f in Node._meta.concrete_fields]
    return {
        "adventure": Adventure.objects.filter(pk=adventure.pk).values().get(),
        "branches": list(Branch.objects.filter(adventure=adventure).order_by("pk").values()),
        "nodes": list(Node.objects.filter(adventure=adventure).order_by("pk").values(*fields)),
        "memories": list(Memory.objects.filter(adventure=adventure).order_by("pk").values()),
        "story": [(n.pk, n.depth, n.player_input, n.narration) for n in paths.newest(head, head.depth + 1)],
    }


def body_tokens(body: dict[str, Any]) -> int:
    """The budget estimator applied to a request body as a server received it."""
    from .budget import estimate_tokens, request_tokens

    total = request_tokens(body["messages"], body.get("tools") or [])
    if body.get("response_format"):
        total += estimate_tokens(body["response_format"])
    return total


@dataclass
class Recorded:
    messages: list[dict[str, Any]]
    tools: list[str]
    arguments: list[dict[str, Any]]


def record_builtin(monkeypatch) -> list[Recorded]:
    """Record every request the offline narrator answers (and what it answered)."""
    import copy

    from stories.llm.builtin import BuiltinNarrator

    calls: list[Recorded] = []
    original = BuiltinNarrator.chat

    def chat(self, **kwargs):
        result = original(self, **kwargs)
        calls.append(
            Recorded(
                messages=copy.deepcopy(kwargs["messages"]),
                tools=[spec.name for spec in kwargs["tools"]],
                arguments=[copy.deepcopy(call.arguments) for call in result.tool_calls],
            )
        )
        return result

    monkeypatch.setattr(BuiltinNarrator, "chat", chat)
    return calls
