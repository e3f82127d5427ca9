"""The offline narrator: the same tools and schemas as a real model, no network, deterministic."""

from __future__ import annotations

import json
import time

import pytest

from stories.llm.base import BUILTIN_LABEL, client_for, profile_label
from stories.llm.builtin import BuiltinNarrator, split_for_streaming
from stories.llm.errors import ModelCancelled
from stories.llm.tools import (
    MAX_SUMMARY_CHARS,
    REQUEST_CHECK,
    SUBMIT_CONTEXT_SUMMARY,
    SUBMIT_TURN_PLAN,
    validate_arguments,
)
from stories.models import ModelProfile
from stories.state import apply_delta, empty_state, player_projection

PERSONA = "Ilsa Varn, a former ship's navigator with a steady hand"
LIGHTHOUSE = "The Saltmarsh lighthouse has been dark for three nights. Its keeper vanished with the key."


def system(**prefix):
    stable = {"premise": "Rain over Saltmarsh.", "persona": PERSONA, "style": "Atmospheric.", **prefix}
    return {"role": "system", "content": json.dumps({"stable_prefix": stable})}


def turn(text, kind="do", *, entries=None, state=None, memories=None, fixed=None):
    tail = {
        "input": {"kind": kind, "text": text},
        "world_entries": entries if entries is not None else [{"keys": ["lighthouse"], "content": LIGHTHOUSE}],
        "memories": memories or [],
        "state": state or player_projection(empty_state()),
        "fixed_outcomes": fixed,
    }
    return [system(), {"role": "user", "content": json.dumps({"dynamic_tail": tail})}]


def narrate(messages, tools=(REQUEST_CHECK, SUBMIT_TURN_PLAN), **kwargs):
    return BuiltinNarrator(chunk_delay_ms=0).chat(messages=messages, tools=list(tools), max_output_tokens=512, **kwargs)


def plan_of(result):
    assert [c.name for c in result.tool_calls] == ["submit_turn_plan"]
    args = result.tool_calls[0].arguments
    assert validate_arguments(SUBMIT_TURN_PLAN, args) == args
    return args


def test_a_risky_action_asks_for_a_check_when_offered():
    result = narrate(turn("I climb the lighthouse wall"))
    assert result.model == "builtin" and result.prompt_bytes > 0
    [call] = result.tool_calls
    assert call.name == "request_check"
    assert validate_arguments(REQUEST_CHECK, call.arguments) == call.arguments
    assert call.arguments["skill"] == "athletics"
    assert "climb the lighthouse wall" in call.arguments["reason"]


@pytest.mark.parametrize(
    ("text", "skill"),
    [
        ("sneak past the guard", "stealth"),
        ("pick the lock on the cellar door", "sleight of hand"),
        ("steal the harbourmaster's ledger", "sleight of hand"),
        ("fight the smuggler", "combat"),
        ("jump across the gap", "athletics"),
    ],
)
def test_risky_keywords_map_to_skills(text, skill):
    assert narrate(turn(text)).tool_calls[0].arguments["skill"] == skill


def test_persuading_someone_is_a_check_too():
    call = narrate(turn("Maren, please, help me. I'll persuade you if I must.", kind="say")).tool_calls[0]
    assert call.name == "request_check" and call.arguments["skill"] == "persuasion"


def test_a_check_is_never_requested_unless_offered_or_for_a_calm_action():
    assert plan_of(narrate(turn("I climb the lighthouse wall"), tools=[SUBMIT_TURN_PLAN]))
    assert plan_of(narrate(turn("pick up the lantern")))  # picking up is not picking a lock
    assert plan_of(narrate(turn("look at the harbour")))
    assert plan_of(narrate(turn("I climb the stairs", kind="story")))


def test_a_play_request_narrates_with_the_players_words_persona_and_world_entries():
    seen: list[str] = []
    args = plan_of(narrate(turn("I light my lantern and study the lighthouse"), on_text=seen.append, seed=3))
    narration = args["narration"]
    assert "You light your lantern and study the lighthouse" in narration
    assert "The Saltmarsh lighthouse has been dark for three nights." in narration
    assert 2 <= len(args["suggestions"]) <= 3
    assert all(suggestion.strip() for suggestion in args["suggestions"])
    # Streamed in several pieces that add up to exactly the narration.
    assert len(seen) > 1 and "".join(seen) == narration
    # The delta is plausible and applies to the current state.
    assert {"op": "add_fact", "fact": "lighthouse: " + LIGHTHOUSE.split(". ")[0] + "."} in args["state_delta"]
    apply_delta(empty_state(), args["state_delta"])


def test_the_persona_is_used():
    narrations = [plan_of(narrate(turn("look around"), seed=seed))["narration"] for seed in range(8)]
    assert any(f"As {PERSONA}" in narration for narration in narrations)


def test_say_and_continue():
    said = plan_of(narrate(turn("Where is the keeper?", kind="say")))["narration"]
    assert 'You say, "Where is the keeper?"' in said
    continued = plan_of(narrate(turn("", kind="continue")))["narration"]
    assert continued.strip()


def test_after_a_check_it_narrates_the_outcome_and_does_not_ask_again():
    messages = turn("I climb the lighthouse wall")
    check = narrate(messages, seed=1).tool_calls[0]
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": check.name, "arguments": json.dumps(check.arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"outcome": "failure"})},
    ]
    args = plan_of(narrate(messages, seed=1))  # request_check still offered: not asked twice
    assert any(
        line in args["narration"]
        for line in (
            "It goes wrong almost at once.",
            "Your luck runs out, and the attempt falls apart.",
            "It fails, and the failure makes a noise of its own.",
        )
    )


def test_fixed_outcomes_from_regenerate_are_used_without_a_new_check():
    fixed = [{"skill": "athletics", "outcome": "success"}]
    args = plan_of(narrate(turn("I climb the lighthouse wall", fixed=fixed)))
    assert "hidden:athletics success" in [op.get("flag") for op in args["state_delta"]]


def test_items_are_taken_and_only_carried_items_dropped():
    args = plan_of(narrate(turn("take the brass key", entries=[])))
    assert {"op": "add_item", "item": "brass key"} in args["state_delta"]
    state = apply_delta(empty_state(), args["state_delta"])
    dropped = plan_of(narrate(turn("drop the brass key", entries=[], state=player_projection(state))))
    assert {"op": "remove_item", "item": "brass key"} in dropped["state_delta"]
    apply_delta(state, dropped["state_delta"])
    nothing = plan_of(narrate(turn("drop the sword", entries=[])))
    assert not [op for op in nothing["state_delta"] if op["op"] == "remove_item"]


def test_plain_text_content_is_the_players_words():
    args = plan_of(narrate([{"role": "user", "content": "open the cellar door"}], tools=[SUBMIT_TURN_PLAN]))
    assert "You open the cellar door." in args["narration"]


def test_it_is_deterministic_for_a_seed_and_for_the_same_request():
    messages = turn("look at the harbour")
    assert narrate(messages, seed=7) == narrate(messages, seed=7)
    assert narrate(messages) == narrate(messages)  # seed derived from the request
    variants = {json.dumps(narrate(messages, seed=seed).tool_calls[0].arguments) for seed in range(10)}
    assert len(variants) > 1


def test_a_summary_request_gets_an_extractive_summary_within_limits():
    nodes = [
        {"depth": d, "input": f"step {d}", "narration": f"Scene {d} happens. More detail {d} follows."}
        for d in range(1, 30)
    ]
    request = {"summary_request": {"previous_summary": "You reached Saltmarsh.", "nodes": nodes, "max_chars": 400}}
    result = narrate([{"role": "user", "content": json.dumps(request)}], tools=[SUBMIT_CONTEXT_SUMMARY])
    [call] = result.tool_calls
    assert call.name == "submit_context_summary"
    args = validate_arguments(SUBMIT_CONTEXT_SUMMARY, call.arguments)
    assert 0 < len(args["summary"]) <= 400
    assert "Scene 29 happens." in args["summary"]  # the newest events are kept
    assert "More detail" not in args["summary"]  # first sentences only: extractive
    assert len(args["key_points"]) <= 20 and args["key_points"][-1] == "step 29"


def test_a_summary_fits_the_tool_limit_whatever_max_chars_says():
    nodes = [{"depth": d, "input": "", "narration": "A long sentence about the sea. " * 5} for d in range(1, 400)]
    request = {"summary_request": {"previous_summary": None, "nodes": nodes, "max_chars": 100_000}}
    args = narrate([{"role": "user", "content": json.dumps(request)}], tools=[SUBMIT_CONTEXT_SUMMARY]).tool_calls[0]
    assert len(args.arguments["summary"]) <= MAX_SUMMARY_CHARS


def test_a_summary_of_nothing_is_still_a_valid_summary():
    request = {"summary_request": {"previous_summary": None, "nodes": [], "max_chars": 200}}
    args = narrate([{"role": "user", "content": json.dumps(request)}], tools=[SUBMIT_CONTEXT_SUMMARY]).tool_calls[0]
    assert args.arguments["summary"].strip()


def test_cancel_between_chunks():
    seen: list[str] = []
    with pytest.raises(ModelCancelled):
        narrate(turn("look around"), tools=[SUBMIT_TURN_PLAN], on_text=seen.append, cancel=lambda: len(seen) >= 2)
    assert len(seen) == 2
    with pytest.raises(ModelCancelled):
        narrate(turn("look around"), cancel=lambda: True)


def test_the_chunk_delay_setting_paces_the_stream(settings):
    settings.STORYTREE_BUILTIN_CHUNK_DELAY_MS = 15
    seen: list[str] = []
    started = time.monotonic()
    BuiltinNarrator().chat(
        messages=turn("look around"), tools=[SUBMIT_TURN_PLAN], max_output_tokens=64, on_text=seen.append
    )
    assert time.monotonic() - started >= 0.015 * (len(seen) - 1)


def test_split_for_streaming_keeps_every_character():
    import random

    text = "One two  three\nfour five six seven eight nine ten eleven."
    for seed in range(20):
        pieces = split_for_streaming(text, random.Random(seed))
        assert "".join(pieces) == text and len(pieces) > 1


def test_client_for_a_builtin_profile_and_its_label():
    profile = ModelProfile(name="Offline", provider="builtin")
    assert isinstance(client_for(profile), BuiltinNarrator)
    assert profile_label(profile) == BUILTIN_LABEL == "offline narrator, no AI model"
