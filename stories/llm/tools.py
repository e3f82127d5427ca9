"""The tools the model speaks through, and the strict check of their arguments.

Every tool call is required (the model never answers in plain text), every schema is closed
(`additionalProperties: false` at every level) and every argument set is validated here
before anyone uses it, whichever provider produced it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from stories.state import DELTA_SCHEMA

from .errors import ModelMalformed, shorten
from .schema import SchemaViolation, validate

MAX_SUMMARY_CHARS = 6000
MAX_NARRATION_CHARS = 8000
MAX_SUGGESTIONS = 4
MAX_SUGGESTION_CHARS = 200
MAX_KEY_POINTS = 20
MAX_KEY_POINT_CHARS = 300
DIFFICULTIES = ("easy", "moderate", "hard", "extreme")
CHECK_OUTCOMES = ("success", "partial", "failure")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    # A closed JSON schema (the subset `stories.llm.schema` understands).
    parameters: dict[str, Any] = field(hash=False)
    # The string argument surfaced progressively (`on_text`) while the call streams.
    stream_field: str | None = None


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


REQUEST_CHECK = ToolSpec(
    name="request_check",
    description=(
        "Ask the game to roll a hidden check before narrating a risky attempt. At most once per "
        "player action. You will receive only a qualitative outcome: success, partial or failure."
    ),
    parameters=_object(
        {
            "skill": {"type": "string", "minLength": 1, "maxLength": 60},
            "difficulty": {"type": "string", "enum": list(DIFFICULTIES)},
            "reason": {"type": "string", "minLength": 1, "maxLength": 300},
        }
    ),
)

SUBMIT_TURN_PLAN = ToolSpec(
    name="submit_turn_plan",
    description=(
        "Submit this turn: the narration the player reads, up to four short suggestions for what "
        "they might do next, and the changes to the story state in the fixed op vocabulary."
    ),
    parameters=_object(
        {
            "narration": {"type": "string", "minLength": 1, "maxLength": MAX_NARRATION_CHARS},
            "suggestions": {
                "type": "array",
                "maxItems": MAX_SUGGESTIONS,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_SUGGESTION_CHARS},
            },
            "state_delta": copy.deepcopy(DELTA_SCHEMA),
        }
    ),
    stream_field="narration",
)

SUBMIT_CONTEXT_SUMMARY = ToolSpec(
    name="submit_context_summary",
    description=(
        "Submit a self-contained summary of the story so far (public events, choices and revealed "
        "facts only) and its key points."
    ),
    parameters=_object(
        {
            "summary": {"type": "string", "minLength": 1, "maxLength": MAX_SUMMARY_CHARS},
            "key_points": {
                "type": "array",
                "maxItems": MAX_KEY_POINTS,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_POINT_CHARS},
            },
        }
    ),
)

ALL_TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in (REQUEST_CHECK, SUBMIT_TURN_PLAN, SUBMIT_CONTEXT_SUMMARY)}


def validate_arguments(spec: ToolSpec, args: Any) -> dict[str, Any]:
    """Return `args` if they satisfy `spec.parameters` exactly; else raise ModelMalformed
    naming the tool, the field and the fault."""
    try:
        validate(spec.parameters, args)
    except SchemaViolation as error:
        where = f"{spec.name}.{error.path}" if error.path else spec.name
        raise ModelMalformed(f"{where}: {error.reason}") from None
    return args


def find_tool(tools: list[ToolSpec], name: Any) -> ToolSpec:
    """The offered tool called `name`, or ModelMalformed."""
    for spec in tools:
        if spec.name == name:
            return spec
    raise ModelMalformed(f"called the tool {shorten(name)}, which was not offered")
