"""The story state vocabulary: its shape, the delta ops that change it, and what a player
(and the model) may see of it. The one owner of these rules; the tool schema in
`stories.llm.tools` is built from `DELTA_SCHEMA` below.

State (stored as `Node.state_after`)::

    {"flags": {"name": true, ...}, "relationships": {"npc": -100..100, ...},
     "inventory": ["item", ...], "facts": ["fact", ...]}

Delta ops (a list, at most `MAX_DELTA_OPS`)::

    {"op": "set_flag", "flag": ...}         {"op": "clear_flag", "flag": ...}
    {"op": "adjust_relationship", "npc": ..., "by": -10..10}
    {"op": "add_item", "item": ...}         {"op": "remove_item", "item": ...}
    {"op": "add_fact", "fact": ...}

Flags whose name starts with `hidden:` are hidden: never projected to the player or model.
Relationship numbers are never projected either; the projection says a word.
"""

from __future__ import annotations

import copy
from typing import Any

from stories.llm.schema import SchemaViolation, validate

HIDDEN_FLAG_PREFIX = "hidden:"
RELATIONSHIP_MIN = -100
RELATIONSHIP_MAX = 100
MAX_RELATIONSHIP_STEP = 10
MAX_DELTA_OPS = 20
MAX_OP_TEXT = 200

# (upper bound inclusive, word), checked in order.
RELATIONSHIP_WORDS: tuple[tuple[int, str], ...] = (
    (-50, "hostile"),
    (-15, "wary"),
    (14, "neutral"),
    (49, "friendly"),
    (RELATIONSHIP_MAX, "devoted"),
)


def _text() -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": MAX_OP_TEXT}


def _op(name: str, **fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"op": {"type": "string", "const": name}, **fields},
        "required": ["op", *fields],
        "additionalProperties": False,
    }


OP_SCHEMAS: tuple[dict[str, Any], ...] = (
    _op("set_flag", flag=_text()),
    _op("clear_flag", flag=_text()),
    _op(
        "adjust_relationship",
        npc=_text(),
        by={"type": "integer", "minimum": -MAX_RELATIONSHIP_STEP, "maximum": MAX_RELATIONSHIP_STEP},
    ),
    _op("add_item", item=_text()),
    _op("remove_item", item=_text()),
    _op("add_fact", fact=_text()),
)
OPS = tuple(schema["properties"]["op"]["const"] for schema in OP_SCHEMAS)

DELTA_SCHEMA: dict[str, Any] = {
    "type": "array",
    "maxItems": MAX_DELTA_OPS,
    "items": {"oneOf": list(OP_SCHEMAS)},
}


class InvalidDelta(ValueError):
    """A delta that is malformed or cannot apply to the given state."""


def empty_state() -> dict[str, Any]:
    return {"flags": {}, "relationships": {}, "inventory": [], "facts": []}


def validate_delta(ops: Any) -> list[dict[str, Any]]:
    """Check the shape of a delta; return a deep copy. Raises InvalidDelta."""
    try:
        validate(DELTA_SCHEMA, ops, "state_delta")
    except SchemaViolation as error:
        raise InvalidDelta(str(error)) from None
    return copy.deepcopy(ops)


def apply_delta(state: dict[str, Any] | None, ops: Any) -> dict[str, Any]:
    """A new state with `ops` applied in order; `state` is not modified. Raises InvalidDelta
    for a malformed delta or an op that cannot apply (removing an item not carried)."""
    ops = validate_delta(ops)
    result = _normalized(state)
    for index, op in enumerate(ops):
        kind = op["op"]
        if kind == "set_flag":
            result["flags"][op["flag"]] = True
        elif kind == "clear_flag":
            result["flags"].pop(op["flag"], None)
        elif kind == "adjust_relationship":
            current = result["relationships"].get(op["npc"], 0)
            result["relationships"][op["npc"]] = max(RELATIONSHIP_MIN, min(RELATIONSHIP_MAX, current + op["by"]))
        elif kind == "add_item":
            result["inventory"].append(op["item"])
        elif kind == "remove_item":
            if op["item"] not in result["inventory"]:
                raise InvalidDelta(f"state_delta[{index}]: cannot remove {op['item']!r}, it is not carried")
            result["inventory"].remove(op["item"])
        elif kind == "add_fact" and op["fact"] not in result["facts"]:
            result["facts"].append(op["fact"])
    return result


def is_hidden_flag(name: str) -> bool:
    return name.startswith(HIDDEN_FLAG_PREFIX)


def relationship_word(value: int) -> str:
    for upper, word in RELATIONSHIP_WORDS:
        if value <= upper:
            return word
    return RELATIONSHIP_WORDS[-1][1]


def player_projection(state: dict[str, Any] | None) -> dict[str, Any]:
    """What the player sees, and the only state the model is shown: visible flag names
    (sorted list), relationships as words, inventory and facts."""
    state = _normalized(state)
    return {
        "flags": sorted(name for name, on in state["flags"].items() if on and not is_hidden_flag(name)),
        "relationships": {npc: relationship_word(value) for npc, value in sorted(state["relationships"].items())},
        "inventory": list(state["inventory"]),
        "facts": list(state["facts"]),
    }


def _normalized(state: dict[str, Any] | None) -> dict[str, Any]:
    """A deep copy with every key present (a root node's `state_after` may be `{}`)."""
    result = empty_state()
    if state:
        for key, value in state.items():
            if key in result:
                result[key] = copy.deepcopy(value)
    return result
