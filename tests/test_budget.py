"""The hard input budget: the formula, the one estimator, the exact window boundary, the
unknown-window fallback, a switch to a smaller model, and — across randomized stories,
node sizes and windows — every request a server receives staying inside it."""

from __future__ import annotations

import random
import string

import pytest
from django.core.management import call_command
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from checkpoints import budget as budgets
from checkpoints import store
from checkpoints.budget import (
    ContextError,
    ContinuationTooLarge,
    DynamicTailTooLarge,
    HistoryEntryTooLarge,
    WindowTooSmall,
    estimate_tokens,
)
from checkpoints.context import TURN_TOOLS, context_report, prepare
from checkpoints.prompt import (
    compose_turn,
    continuation,
    current_stable_prefix_hash,
    dynamic_tail_message,
    node_tokens,
    turn_budget,
)
from checkpoints.testing import body_tokens, make_profile, play, use_profile
from stories import tree
from stories.llm.base import ToolCall
from stories.llm.tools import REQUEST_CHECK, SUBMIT_TURN_PLAN
from stories.state import player_projection
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model):
    # No password: hashing one costs ~0.4 s per test, and nobody signs in here.
    return django_user_model.objects.create(username="owner")


def tail(text: str = "") -> dict:
    return {
        "input": {"kind": "do", "text": text},
        "world_entries": [],
        "memories": [],
        "state": player_projection({}),
        "fixed_outcomes": None,
    }


def test_the_estimator_counts_utf8_bytes_of_the_serialization():
    assert estimate_tokens("abc") == 3
    assert estimate_tokens("é") == 2
    assert estimate_tokens("日本") == 6
    assert estimate_tokens("🙂") == 4
    # Objects: their compact canonical JSON, characters kept as UTF-8 (not \u escapes).
    assert estimate_tokens({"b": 1, "a": "é"}) == len('{"a":"é","b":1}'.encode())


def test_the_hard_budget_is_the_window_minus_every_fixed_part(owner):
    profile = make_profile("w12k", context_window=12_000, max_output_tokens=1_500)
    adventure = tree.adventure_create(owner=owner, title="Budget", premise="A harbour.", model_profile=profile)
    budget = turn_budget(adventure, TURN_TOOLS)
    assert budget.window == 12_000 and not budget.window_assumed
    assert budget.requested_output == 1_500
    assert budget.hard_input == (
        12_000 - 1_500 - budget.system_and_tools - budget.framing - budget.continuation_reserve - budget.safety_margin
    )
    assert budget.system_and_tools == budget.stable_prefix + budget.tools
    assert budget.high_watermark == int(budget.hard_input * 0.70)
    assert budget.low_watermark < budget.high_watermark
    # The reserve covers the largest check call the schema allows, less the schema dropped after it.
    assert budget.continuation_reserve > 0
    assert turn_budget(adventure, [SUBMIT_TURN_PLAN]).continuation_reserve == 0


@pytest.mark.parametrize(("max_output", "requested"), [(None, 4096), (8000, 4096), (1000, 1000)])
def test_requested_output_is_min_of_the_profile_limit_and_4096(owner, max_output, requested):
    profile = make_profile(f"out{max_output}", context_window=32_768, max_output_tokens=max_output)
    adventure = tree.adventure_create(owner=owner, title="Out", model_profile=profile)
    assert turn_budget(adventure, TURN_TOOLS).requested_output == requested


def test_exact_window_boundary_and_one_byte_overflow(owner, fake_openai):
    profile = fake_openai.profile(context_window=6_000, max_output_tokens=512)
    adventure = tree.adventure_create(owner=owner, title="Edge", premise="A quiet room.", model_profile=profile)
    head = adventure.head
    budget = turn_budget(adventure, TURN_TOOLS)
    base = estimate_tokens(dynamic_tail_message(tail())["content"])
    fill = budget.hard_input - node_tokens(head) - base

    composed = compose_turn(adventure=adventure, head=head, dynamic_tail=tail("x" * fill), tools=TURN_TOOLS)
    assert composed.content_tokens == budget.hard_input
    assert composed.total_tokens == budget.request_limit - budget.continuation_reserve
    # What the server receives measures the same, to the byte.
    from stories.llm.base import client_for

    client_for(profile).chat(messages=composed.messages, tools=TURN_TOOLS, max_output_tokens=512)
    assert body_tokens(fake_openai.last_body) == composed.total_tokens

    # One byte more and the only node no longer fits beside the tail: refused, nothing sent.
    sent = len(fake_openai.requests)
    with pytest.raises(HistoryEntryTooLarge):
        prepare(adventure=adventure, head=head, dynamic_tail=tail("x" * (fill + 1)), tools=TURN_TOOLS)
    # The dynamic tail is budgeted first: exactly the budget is not "too large" by itself ...
    with pytest.raises(HistoryEntryTooLarge):
        prepare(adventure=adventure, head=head, dynamic_tail=tail("x" * (budget.hard_input - base)), tools=TURN_TOOLS)
    # ... one byte over is.
    with pytest.raises(DynamicTailTooLarge) as raised:
        prepare(
            adventure=adventure, head=head, dynamic_tail=tail("x" * (budget.hard_input - base + 1)), tools=TURN_TOOLS
        )
    assert raised.value.code == "dynamic_tail_too_large" and "window" in raised.value.message
    assert len(fake_openai.requests) == sent


def test_the_continuation_after_a_check_is_checked_to_the_byte(owner):
    profile = make_profile("w6k", context_window=6_000, max_output_tokens=512)
    adventure = tree.adventure_create(owner=owner, title="Check", premise="A cliff.", model_profile=profile)
    composed = compose_turn(adventure=adventure, head=adventure.head, dynamic_tail=tail("I climb."), tools=TURN_TOOLS)
    budget = composed.budget

    def call(reason: str) -> ToolCall:
        return ToolCall(REQUEST_CHECK.name, {"skill": "climb", "difficulty": "hard", "reason": reason})

    base = budgets.request_tokens(continuation(composed, call(""), "partial"), [SUBMIT_TURN_PLAN])
    room = budget.request_limit - base
    messages = continuation(composed, call("r" * room), "partial")
    assert budgets.request_tokens(messages, [SUBMIT_TURN_PLAN]) == budget.request_limit
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_check_1", "content": '{"outcome":"partial"}'}
    with pytest.raises(ContinuationTooLarge):
        continuation(composed, call("r" * (room + 1)), "partial")
    # The largest call the schema allows always fits: that is what the reserve is for.
    worst = "日" * 300
    continuation(
        composed,
        ToolCall(REQUEST_CHECK.name, {"skill": "日" * 60, "difficulty": "moderate", "reason": worst}),
        "success",
    )


def test_an_unknown_window_falls_back_to_16384_and_says_so(owner, capsys):
    profile = make_profile("unknown", context_window=None, max_output_tokens=1024)
    adventure = tree.adventure_create(owner=owner, title="Unknown", premise="Fog.", model_profile=profile)
    budget = turn_budget(adventure, TURN_TOOLS)
    assert (budget.window, budget.window_assumed) == (16_384, True)
    report = context_report(adventure)
    assert report["window"] == 16_384 and report["window_assumed"] is True
    assert report["budget"]["window_assumed"] is True
    call_command("context_report", str(adventure.pk))
    assert "ASSUMED" in capsys.readouterr().out
    known = make_profile("known", context_window=16_384, max_output_tokens=1024)
    use_profile(adventure, known)
    assert context_report(adventure)["window_assumed"] is False


def test_a_window_too_small_for_the_setup_is_refused(owner):
    profile = make_profile("tiny", context_window=4_000, max_output_tokens=None)
    adventure = tree.adventure_create(owner=owner, title="Tiny", premise="Dust.", model_profile=profile)
    with pytest.raises(WindowTooSmall):
        prepare(adventure=adventure, head=adventure.head, dynamic_tail=tail("hi"), tools=TURN_TOOLS)
    assert context_report(adventure)["error"]["code"] == "window_too_small"


def test_switching_to_a_smaller_model_rebuilds_an_oversized_checkpoint(owner):
    big = make_profile("big", context_window=32_768, max_output_tokens=1_024)
    adventure = use_profile(build_story(nodes=120, bytes_per_node=300, owner=owner), big)
    first = play(adventure, "I read the harbour notices.")
    old = first.prepared.pending_checkpoint
    assert old is not None and old.pk is not None

    small = make_profile("small", context_window=10_240, max_output_tokens=1_024)
    use_profile(adventure, small)
    adventure.refresh_from_db()
    budget = turn_budget(adventure, TURN_TOOLS)
    assert old.summary_bytes > budget.summary_cap  # the big model's summary is too large here
    found, misses = store.nearest_usable(
        adventure,
        adventure.head,
        stable_prefix_hash=current_stable_prefix_hash(adventure),
        model_name=store.model_identity(small),
        max_summary_tokens=budget.summary_cap,
    )
    assert found is None and [m.reason for m in misses] == ["oversize"]

    turn = play(adventure, "I walk to the pier.")
    assert [m.reason for m in turn.prepared.misses] == ["oversize"]
    new = turn.prepared.pending_checkpoint
    assert new is not None and new.pk is not None and new.summary_bytes <= budget.summary_cap
    assert turn.prepared.total_tokens <= budget.request_limit - budget.continuation_reserve
    assert context_report(adventure)["window"] == 10_240


# --- every request a server receives fits ---------------------------------------------------


def test_a_server_without_tool_calling_is_budgeted_for_what_it_is_sent(owner, fake_openai):
    # The provider sends an instruction message and a response format instead of tools.
    profile = fake_openai.profile(supports_tools=False, context_window=9_000)
    adventure = use_profile(build_story(nodes=60, bytes_per_node=250, owner=owner), profile)
    for index in range(6):
        play(adventure, f"I haul the net, {index}.")
    limit = 9_000 - 1_024 - budgets.safety_margin(9_000)
    assert any(r.body.get("response_format") for r in fake_openai.requests)
    assert all(body_tokens(r.body) <= limit for r in fake_openai.requests)


TEXT = st.text(alphabet=string.ascii_letters + ' .,"\\\n' + "éßжन日🙂", max_size=250)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    window=st.integers(7_000, 24_000),
    max_output=st.sampled_from([256, 512, 1024, 2048]),
    nodes=st.integers(1, 50),
    node_bytes=st.integers(10, 350),
    turns=st.lists(st.tuples(TEXT, st.integers(1, 1_400), st.booleans(), st.integers(1, 300)), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_every_request_and_continuation_stays_within_the_budget(
    fake_openai, owner, window, max_output, nodes, node_bytes, turns, seed
):
    rng = random.Random(seed)
    profile = fake_openai.profile(context_window=window, max_output_tokens=max_output)
    adventure = use_profile(build_story(nodes=nodes, bytes_per_node=node_bytes, owner=owner), profile)
    limit = window - max_output - budgets.safety_margin(window)
    start = len(fake_openai.requests)
    played = refused = 0
    for text, narration_chars, check, reason_chars in turns:
        narration = "".join(rng.choice('abc déf 日本 "q" ') for _ in range(narration_chars)).strip() or "x"
        fake_openai.default_arguments["submit_turn_plan"]["narration"] = narration

        def script_check(prepared, check=check, reason_chars=reason_chars):
            if check:
                fake_openai.add_tool_call(
                    "request_check", {"skill": "climb", "difficulty": "hard", "reason": "ж" * reason_chars}
                )

        try:
            turn = play(adventure, text.strip() or "I wait.", before_chat=script_check, rng=rng)
            played += 1
            event(f"compaction calls: {min(turn.prepared.compaction_calls, 2)}+")
        except ContextError as exc:
            refused += 1  # a refusal is fine: it happens before anything is sent
            event(f"refused: {exc.code}")
    assert played + refused == len(turns)
    turn_requests = continuations = 0
    for request in fake_openai.requests[start:]:
        body = request.body
        offered = [t["function"]["name"] for t in body.get("tools", [])]
        assert body_tokens(body) <= limit, (offered, body_tokens(body), limit)
        if offered == ["request_check", "submit_turn_plan"]:
            turn_requests += 1
            reserve = budgets.continuation_reserve(TURN_TOOLS)
            assert body_tokens(body) <= limit - reserve
        elif body["messages"][-1]["role"] == "tool":
            continuations += 1
    assert turn_requests >= played
    event(f"continuations: {bool(continuations)}")
