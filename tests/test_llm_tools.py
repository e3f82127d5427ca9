"""The tool schemas and the strict argument check every provider's reply goes through."""

from __future__ import annotations

import copy

import pytest

from stories.llm.errors import ModelMalformed
from stories.llm.tools import (
    ALL_TOOLS,
    MAX_SUMMARY_CHARS,
    REQUEST_CHECK,
    SUBMIT_CONTEXT_SUMMARY,
    SUBMIT_TURN_PLAN,
    find_tool,
    validate_arguments,
)

PLAN = {
    "narration": "You climb the wall. The stones are slick with rain.",
    "suggestions": ["Drop down into the yard", "Wait for the guard to pass"],
    "state_delta": [
        {"op": "set_flag", "flag": "on_the_wall"},
        {"op": "clear_flag", "flag": "in_the_yard"},
        {"op": "adjust_relationship", "npc": "Bram", "by": -3},
        {"op": "add_item", "item": "loose stone"},
        {"op": "remove_item", "item": "rope"},
        {"op": "add_fact", "fact": "The north wall can be climbed."},
    ],
}


def plan(**changes):
    value = copy.deepcopy(PLAN)
    value.update(changes)
    return value


def walk(schema):
    yield schema
    for value in schema.values():
        if isinstance(value, dict):
            yield from walk(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    yield from walk(item)


@pytest.mark.parametrize("spec", list(ALL_TOOLS.values()), ids=list(ALL_TOOLS))
def test_every_schema_is_closed_and_requires_every_field(spec):
    objects = [s for s in walk(spec.parameters) if s.get("type") == "object"]
    assert objects
    for schema in objects:
        assert schema["additionalProperties"] is False
        assert sorted(schema["required"]) == sorted(schema["properties"])


def test_the_three_tools_and_their_stream_fields():
    assert set(ALL_TOOLS) == {"request_check", "submit_turn_plan", "submit_context_summary"}
    assert SUBMIT_TURN_PLAN.stream_field == "narration"
    assert REQUEST_CHECK.stream_field is None
    assert SUBMIT_CONTEXT_SUMMARY.stream_field is None
    assert MAX_SUMMARY_CHARS == 6000


def test_a_valid_plan_passes_unchanged():
    args = plan()
    assert validate_arguments(SUBMIT_TURN_PLAN, args) == PLAN
    assert validate_arguments(SUBMIT_TURN_PLAN, plan(suggestions=[], state_delta=[]))


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (plan(checks=[{"roll": 20}]), "submit_turn_plan: unknown field 'checks'"),
        (plan(roll=17), "submit_turn_plan: unknown field 'roll'"),
        ({k: v for k, v in PLAN.items() if k != "narration"}, "missing required field 'narration'"),
        ({k: v for k, v in PLAN.items() if k != "state_delta"}, "missing required field 'state_delta'"),
        (plan(narration=""), "submit_turn_plan.narration: must be at least 1"),
        (plan(narration=" \n "), "submit_turn_plan.narration: must not be blank"),
        (plan(narration="x" * 8001), "narration: is 8001 characters long, at most 8000"),
        (plan(narration=None), "narration: must be a string, got null"),
        (plan(suggestions=["a", "b", "c", "d", "e"]), "suggestions: has 5 items, at most 4"),
        (plan(suggestions=["x" * 201]), r"suggestions\[0\]: is 201 characters long"),
        (plan(suggestions=[""]), r"suggestions\[0\]: must be at least 1"),
        (plan(state_delta=[{"op": "record_check", "roll": 20}]), r"state_delta\[0\].op: unknown op 'record_check'"),
        (plan(state_delta=[{"op": "set_flag", "flag": "x", "roll": 1}]), r"state_delta\[0\]: unknown field 'roll'"),
        (plan(state_delta=[{"op": "adjust_relationship", "npc": "B", "by": 12}]), r"state_delta\[0\].by: 12 is above"),
        (plan(state_delta=[{"op": "add_item", "item": "x"}] * 21), "state_delta: has 21 items, at most 20"),
        (plan(state_delta={"op": "add_item"}), "state_delta: must be a list"),
    ],
)
def test_a_malformed_plan_is_rejected_with_a_precise_reason(args, reason):
    with pytest.raises(ModelMalformed, match=reason) as caught:
        validate_arguments(SUBMIT_TURN_PLAN, args)
    assert caught.value.code == "model_malformed"


def test_request_check_arguments():
    ok = {"skill": "athletics", "difficulty": "hard", "reason": "The wall is slick with rain."}
    assert validate_arguments(REQUEST_CHECK, ok) == ok
    with pytest.raises(ModelMalformed, match="difficulty: 'impossible' is not one of easy, moderate, hard, extreme"):
        validate_arguments(REQUEST_CHECK, {**ok, "difficulty": "impossible"})
    with pytest.raises(ModelMalformed, match="skill: is 61 characters long, at most 60"):
        validate_arguments(REQUEST_CHECK, {**ok, "skill": "s" * 61})
    with pytest.raises(ModelMalformed, match="reason: is 301 characters long"):
        validate_arguments(REQUEST_CHECK, {**ok, "reason": "r" * 301})
    with pytest.raises(ModelMalformed, match="unknown field 'dc'"):
        validate_arguments(REQUEST_CHECK, {**ok, "dc": 15})


def test_summary_arguments():
    ok = {"summary": "You reached the keep.", "key_points": ["keep"]}
    assert validate_arguments(SUBMIT_CONTEXT_SUMMARY, ok) == ok
    assert validate_arguments(SUBMIT_CONTEXT_SUMMARY, {"summary": "x" * MAX_SUMMARY_CHARS, "key_points": []})
    for bad, reason in [
        ({"summary": "x" * (MAX_SUMMARY_CHARS + 1), "key_points": []}, "at most 6000"),
        ({"summary": "   ", "key_points": []}, "must not be blank"),
        ({"summary": "ok", "key_points": ["k"] * 21}, "at most 20"),
        ({"summary": "ok", "key_points": ["k" * 301]}, "at most 300"),
        ({"summary": "ok"}, "missing required field 'key_points'"),
        ({"summary": "ok", "key_points": [], "hash": "abc"}, "unknown field 'hash'"),
        (["summary"], "must be an object"),
    ]:
        with pytest.raises(ModelMalformed, match=reason):
            validate_arguments(SUBMIT_CONTEXT_SUMMARY, bad)


def test_model_supplied_names_are_shortened_in_messages():
    with pytest.raises(ModelMalformed) as caught:
        validate_arguments(SUBMIT_TURN_PLAN, plan(**{"k" * 500: 1}))
    assert len(caught.value.message) < 200


def test_find_tool_only_knows_offered_tools():
    assert find_tool([REQUEST_CHECK, SUBMIT_TURN_PLAN], "submit_turn_plan") is SUBMIT_TURN_PLAN
    with pytest.raises(ModelMalformed, match="'request_check', which was not offered"):
        find_tool([SUBMIT_TURN_PLAN], "request_check")
