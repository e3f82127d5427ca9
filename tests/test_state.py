"""The state vocabulary: validating and applying deltas, and what a player (and the model) sees."""

from __future__ import annotations

import copy
import json

import pytest

from stories.state import (
    MAX_DELTA_OPS,
    InvalidDelta,
    apply_delta,
    empty_state,
    player_projection,
    relationship_word,
    validate_delta,
)


def test_empty_state_has_every_key():
    assert empty_state() == {"flags": {}, "relationships": {}, "inventory": [], "facts": []}
    # A fresh dict each time: mutating one must not leak into the next.
    first = empty_state()
    first["inventory"].append("x")
    assert empty_state()["inventory"] == []


def test_it_applies_every_op_in_order():
    ops = [
        {"op": "set_flag", "flag": "gate_open"},
        {"op": "set_flag", "flag": "lantern_lit"},
        {"op": "clear_flag", "flag": "lantern_lit"},
        {"op": "adjust_relationship", "npc": "Maren", "by": 7},
        {"op": "adjust_relationship", "npc": "Maren", "by": -2},
        {"op": "add_item", "item": "brass key"},
        {"op": "add_item", "item": "rope"},
        {"op": "remove_item", "item": "rope"},
        {"op": "add_fact", "fact": "The lighthouse has been dark for three nights."},
    ]
    state = apply_delta(empty_state(), ops)
    assert state == {
        "flags": {"gate_open": True},
        "relationships": {"Maren": 5},
        "inventory": ["brass key"],
        "facts": ["The lighthouse has been dark for three nights."],
    }


def test_apply_is_pure():
    state = apply_delta(empty_state(), [{"op": "add_item", "item": "rope"}, {"op": "set_flag", "flag": "a"}])
    before = copy.deepcopy(state)
    ops = [{"op": "remove_item", "item": "rope"}, {"op": "clear_flag", "flag": "a"}]
    ops_before = copy.deepcopy(ops)
    after = apply_delta(state, ops)
    assert state == before
    assert ops == ops_before
    assert after["inventory"] == [] and after["flags"] == {}


def test_it_accepts_a_root_nodes_empty_state():
    # Node.state_after defaults to {}: it must behave as the empty state.
    assert apply_delta({}, []) == empty_state()
    assert apply_delta(None, [{"op": "add_fact", "fact": "x"}])["facts"] == ["x"]
    assert player_projection({}) == {"flags": [], "relationships": {}, "inventory": [], "facts": []}


def test_relationships_are_clamped_to_plus_minus_100():
    state = empty_state()
    for _ in range(15):
        state = apply_delta(state, [{"op": "adjust_relationship", "npc": "Bram", "by": 10}])
    assert state["relationships"]["Bram"] == 100
    for _ in range(25):
        state = apply_delta(state, [{"op": "adjust_relationship", "npc": "Bram", "by": -10}])
    assert state["relationships"]["Bram"] == -100


def test_removing_an_item_not_carried_is_invalid():
    with pytest.raises(InvalidDelta, match="not carried"):
        apply_delta(empty_state(), [{"op": "remove_item", "item": "sword"}])
    # Duplicates are separate items: removing one leaves the other.
    state = apply_delta(empty_state(), [{"op": "add_item", "item": "torch"}] * 2)
    state = apply_delta(state, [{"op": "remove_item", "item": "torch"}])
    assert state["inventory"] == ["torch"]


def test_clearing_an_unset_flag_is_harmless_and_facts_are_not_repeated():
    state = apply_delta(empty_state(), [{"op": "clear_flag", "flag": "never_set"}])
    assert state["flags"] == {}
    state = apply_delta(state, [{"op": "add_fact", "fact": "x"}, {"op": "add_fact", "fact": "x"}])
    assert state["facts"] == ["x"]


@pytest.mark.parametrize(
    ("ops", "reason"),
    [
        ("not a list", "must be a list"),
        ([{"op": "record_check", "roll": 20}], "unknown op 'record_check'"),
        ([{"flag": "x"}], "missing required field 'op'"),
        ([{"op": "set_flag"}], "missing required field 'flag'"),
        ([{"op": "set_flag", "flag": "x", "roll": 3}], "unknown field 'roll'"),
        ([{"op": "adjust_relationship", "npc": "Bram", "by": 11}], "above the maximum 10"),
        ([{"op": "adjust_relationship", "npc": "Bram", "by": -11}], "below the minimum -10"),
        ([{"op": "adjust_relationship", "npc": "Bram", "by": 2.5}], "must be a whole number"),
        ([{"op": "adjust_relationship", "npc": "Bram", "by": True}], "must be a whole number"),
        ([{"op": "add_item", "item": ""}], "at least 1"),
        ([{"op": "add_item", "item": "   "}], "blank"),
        ([{"op": "add_fact", "fact": "x" * 201}], "at most 200"),
        ([{"op": "add_item", "item": 7}], "must be a string"),
        (["set_flag"], "must be an object"),
        ([{"op": "add_fact", "fact": "x"}] * (MAX_DELTA_OPS + 1), "at most 20"),
    ],
)
def test_validate_delta_rejects_malformed_ops(ops, reason):
    with pytest.raises(InvalidDelta, match=reason.replace("(", r"\(")):
        validate_delta(ops)
    with pytest.raises(InvalidDelta):
        apply_delta(empty_state(), ops)


def test_validate_delta_returns_a_copy():
    ops = [{"op": "add_item", "item": "rope"}]
    checked = validate_delta(ops)
    assert checked == ops and checked is not ops and checked[0] is not ops[0]
    assert validate_delta([]) == []


def test_projection_hides_hidden_flags_and_relationship_numbers():
    state = apply_delta(
        empty_state(),
        [
            {"op": "set_flag", "flag": "met_maren"},
            {"op": "set_flag", "flag": "hidden:maren_is_the_smuggler"},
            {"op": "adjust_relationship", "npc": "Maren", "by": 10},
            {"op": "adjust_relationship", "npc": "Bram", "by": -10},
            {"op": "add_item", "item": "brass key"},
            {"op": "add_fact", "fact": "The cellar door is locked."},
        ],
    )
    for _ in range(5):
        state = apply_delta(state, [{"op": "adjust_relationship", "npc": "Maren", "by": 10}])
    projection = player_projection(state)
    assert projection == {
        "flags": ["met_maren"],
        "relationships": {"Bram": "neutral", "Maren": "devoted"},
        "inventory": ["brass key"],
        "facts": ["The cellar door is locked."],
    }
    text = json.dumps(projection)
    assert "hidden:" not in text and "smuggler" not in text
    assert "60" not in text and "-10" not in text
    # The state itself still holds the hidden flag and the numbers.
    assert state["flags"]["hidden:maren_is_the_smuggler"] is True
    assert state["relationships"] == {"Maren": 60, "Bram": -10}


@pytest.mark.parametrize(
    ("value", "word"),
    [
        (-100, "hostile"),
        (-50, "hostile"),
        (-49, "wary"),
        (-15, "wary"),
        (-14, "neutral"),
        (0, "neutral"),
        (14, "neutral"),
        (15, "friendly"),
        (49, "friendly"),
        (50, "devoted"),
        (100, "devoted"),
    ],
)
def test_relationship_words(value, word):
    assert relationship_word(value) == word
