"""The hard input budget, the one token estimator, and the context errors.

    hard input budget = context window − requested output − system prompt and tool schema
                        − message framing − hidden-check continuation reserve − safety margin

The window and requested output come from `stories.llm.base.effective_limits` (the one home
of the 16,384-token assumed window and the min(max_output_tokens or 4096, 4096) rule).

Token estimate: UTF-8 bytes of the serialized content (`estimate_tokens`). Every
tokenizer needs at most one token per byte, so a prompt estimated to fit does fit. Nothing
else in the app may know how tokens are estimated: count through this module.

What the hard input budget holds is the *budgeted content*: the checkpoint, the verbatim
history (each node with its own message framing) and the dynamic tail. The composer
compacts when that content passes the high watermark (70%) and compacts back under the
low watermark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from stories.llm.base import effective_limits
from stories.llm.tools import REQUEST_CHECK, SUBMIT_TURN_PLAN, ToolSpec

from .hashing import canonical_json

if TYPE_CHECKING:
    from stories.models import ModelProfile

# Chat-template tokens a server adds around each message (role markers, separators) and
# the JSON envelope; generous for every template we know (ChatML uses about five tokens).
FRAMING_PER_MESSAGE = 16
# Per tool call inside an assistant message (id, type, function wrapper).
FRAMING_PER_TOOL_CALL = 16
# The request envelope: generation prompt, tool-list wrapper, BOS/EOS.
REQUEST_FRAMING = 64
# Per offered tool, beyond its schema bytes ({"type":"function", "strict": ...}).
TOOL_FRAMING = 32

HIGH_WATERMARK = 0.70
LOW_WATERMARK = 0.45
# A checkpoint summary may use at most this share of the hard input budget ...
SUMMARY_SHARE = 0.20
# ... and never more than this many bytes, whatever the window.
MAX_SUMMARY_BYTES = 16_000
# Below this a summary cannot say anything useful: the history entry is too large instead.
MIN_SUMMARY_BYTES = 256
# Safety margin: 2% of the window, at least 128 tokens.
SAFETY_MARGIN_SHARE = 0.02
MIN_SAFETY_MARGIN = 128
# UTF-8 needs at most four bytes per character (what `maxLength` counts).
MAX_BYTES_PER_CHAR = 4

# After a hidden check, only `submit_turn_plan` is offered (V1: one check per player action).
CONTINUATION_TOOLS: list[ToolSpec] = [SUBMIT_TURN_PLAN]


class ContextError(Exception):
    """A prompt that cannot be composed within the model's window. `.code` is stable
    (stored on jobs, sent in API errors); `.message` is plain words a player can read."""

    code = "context_error"
    default_message = "The story's context could not be prepared."

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or self.default_message
        self.details = details
        super().__init__(self.message)


class DynamicTailTooLarge(ContextError):
    code = "dynamic_tail_too_large"
    default_message = (
        "This turn's input, triggered world entries and story state do not fit the model's context window. "
        "Shorten the input, or choose a model with a larger window."
    )


class HistoryEntryTooLarge(ContextError):
    code = "history_entry_too_large"
    default_message = (
        "The latest passage is too long to keep in the model's context window with this turn. "
        "Choose a model with a larger window."
    )


class NeedsCompaction(ContextError):
    code = "needs_compaction"
    default_message = "Earlier chapters must be summarized before the story can continue."


class ContinuationTooLarge(ContextError):
    code = "continuation_too_large"
    default_message = "The model's hidden check request does not fit its context window."


class RequestTooLarge(ContextError):
    """A composed request over the limit: the accounting is exact, so this means a bug."""

    code = "request_too_large"
    default_message = "The request for the model came out larger than its context window allows."


class WindowTooSmall(ContextError):
    code = "window_too_small"
    default_message = (
        "The model's context window is too small for this story's setup (premise, persona, style and tools). "
        "Choose a model with a larger window."
    )


def estimate_tokens(value: Any) -> int:
    """The one token estimator: UTF-8 bytes of the text, or of the compact JSON
    serialization of anything else (the same bytes `hashing.canonical_json` produces)."""
    if isinstance(value, bytes):
        return len(value)
    if not isinstance(value, str):
        value = estimate_json(value)
    return len(value.encode("utf-8"))


def estimate_json(value: Any) -> str:
    """The serialization the estimator measures: canonical JSON (see `hashing.canonical_json`)."""
    return canonical_json(value)


def tool_schema(spec: ToolSpec | dict[str, Any]) -> dict[str, Any]:
    """A tool as OpenAI-compatible servers receive it (dicts pass through unchanged). Same
    bytes as the provider's wire form (`oneOf` and `anyOf` have the same length)."""
    if isinstance(spec, dict):
        return spec
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
            "strict": True,
        },
    }


def tools_tokens(tools: Iterable[ToolSpec | dict[str, Any]]) -> int:
    return sum(estimate_tokens(tool_schema(spec)) + TOOL_FRAMING for spec in tools)


def uses_json_mode(profile: ModelProfile | None) -> bool:
    return profile is not None and profile.provider == "openai" and not profile.supports_tools


def offered_tokens(tools: list[ToolSpec], profile: ModelProfile | None = None) -> int:
    """What offering `tools` costs: the tool schemas, or, for a server without tool calling,
    the instruction message and response format the provider sends instead."""
    if uses_json_mode(profile):
        # Imported here: only this case needs the SDK-backed provider module.
        from stories.llm.openai_provider import json_mode_format, json_mode_instruction

        instruction = {"role": "system", "content": json_mode_instruction(tools)}
        return message_tokens(instruction) + estimate_tokens(json_mode_format(tools))
    return tools_tokens(tools)


def message_tokens(message: dict[str, Any]) -> int:
    """A chat message: its content, any tool calls and ids, plus the per-message framing."""
    total = FRAMING_PER_MESSAGE + estimate_tokens(message.get("content") or "")
    if message.get("tool_call_id"):
        total += estimate_tokens(message["tool_call_id"])
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments", "")
        total += FRAMING_PER_TOOL_CALL + estimate_tokens(call.get("id", "")) + estimate_tokens(function.get("name", ""))
        total += estimate_tokens(arguments)
    return total


def request_tokens(
    messages: Iterable[dict[str, Any]], tools: list[ToolSpec], profile: ModelProfile | None = None
) -> int:
    """Estimated input tokens of one whole request (what must fit beside the output)."""
    return REQUEST_FRAMING + sum(message_tokens(m) for m in messages) + offered_tokens(tools, profile)


def request_bytes(messages: Iterable[dict[str, Any]]) -> int:
    """UTF-8 bytes of the messages' serialized content (texts, tool-call names, arguments and
    ids), without framing or tool schemas: what `Node.prompt_bytes` records."""
    return sum(
        message_tokens(m) - FRAMING_PER_MESSAGE - FRAMING_PER_TOOL_CALL * len(m.get("tool_calls") or [])
        for m in messages
    )


def max_json_bytes(schema: dict[str, Any]) -> int:
    """An upper bound on the compact JSON bytes of any value `schema` accepts (closed
    objects of bounded strings, enums, numbers and bounded arrays)."""
    if "enum" in schema:
        return max(estimate_tokens(choice) for choice in schema["enum"])
    if "const" in schema:
        return estimate_tokens(schema["const"])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        fields = [estimate_tokens(key) + 1 + max_json_bytes(sub) for key, sub in properties.items()]
        return 2 + sum(fields) + max(0, len(fields) - 1)
    if kind == "string":
        # Quotes, plus the worst case per character (JSON escapes of control characters
        # are longer, and are caught by the check every request gets before it is sent).
        return 2 + schema.get("maxLength", 1000) * MAX_BYTES_PER_CHAR
    if kind == "array":
        items = schema.get("maxItems", 100)
        return 2 + items * (max_json_bytes(schema.get("items", {})) + 1)
    if kind in ("integer", "number"):
        return 24
    if kind == "boolean":
        return 5
    return 1000


def continuation_messages(tool_call_id: str, name: str, arguments: str, outcome: str) -> list[dict[str, Any]]:
    """The two messages a hidden check appends: the model's call and its qualitative result."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": tool_call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": tool_call_id, "content": estimate_json({"outcome": outcome})},
    ]


def continuation_reserve(tools: list[ToolSpec], profile: ModelProfile | None = None) -> int:
    """Room a hidden-check continuation needs beyond the initial request: the largest
    `request_check` call the schema allows plus its result, less the tool schemas that
    are no longer offered afterwards. Zero when no check can be requested."""
    if not any(spec.name == REQUEST_CHECK.name for spec in tools):
        return 0
    worst_args = "x" * max_json_bytes(REQUEST_CHECK.parameters)
    extra = sum(
        message_tokens(m) for m in continuation_messages("call_check", REQUEST_CHECK.name, worst_args, "partial")
    )
    freed = offered_tokens(tools, profile) - offered_tokens(CONTINUATION_TOOLS, profile)
    return max(0, extra - freed)


@dataclass(frozen=True)
class Budget:
    """Every number in tokens (estimated as bytes)."""

    window: int
    window_assumed: bool
    requested_output: int
    system_and_tools: int
    stable_prefix: int
    tools: int
    framing: int
    continuation_reserve: int
    safety_margin: int

    @property
    def hard_input(self) -> int:
        """Room for the budgeted content: checkpoint, verbatim history, dynamic tail."""
        return (
            self.window
            - self.requested_output
            - self.system_and_tools
            - self.framing
            - self.continuation_reserve
            - self.safety_margin
        )

    @property
    def request_limit(self) -> int:
        """No request (initial or continuation) may estimate above this."""
        return self.window - self.requested_output - self.safety_margin

    @property
    def high_watermark(self) -> int:
        return int(self.hard_input * HIGH_WATERMARK)

    @property
    def low_watermark(self) -> int:
        return int(self.hard_input * LOW_WATERMARK)

    @property
    def summary_cap(self) -> int:
        """The largest checkpoint (as it sits in the prompt) this budget accepts: its share of
        the budget, never below the minimal summary (a smaller one could say nothing)."""
        return min(MAX_SUMMARY_BYTES, max(MIN_SUMMARY_BYTES, int(self.hard_input * SUMMARY_SHARE)))

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            hard_input=self.hard_input,
            request_limit=self.request_limit,
            high_watermark=self.high_watermark,
            low_watermark=self.low_watermark,
            summary_cap=self.summary_cap,
        )
        return data


def safety_margin(window: int) -> int:
    return max(MIN_SAFETY_MARGIN, int(window * SAFETY_MARGIN_SHARE))


def budget_for(profile: ModelProfile, *, system_message: dict[str, Any], tools: list[ToolSpec]) -> Budget:
    """The budget of a request that starts with `system_message`, offers `tools` and has
    one final user message (the dynamic tail or the summary request). History messages
    carry their own framing inside the budgeted content. Raises WindowTooSmall when not
    even the fixed parts fit."""
    window, assumed, requested_output = effective_limits(profile)
    stable = estimate_tokens(system_message.get("content") or "")
    tool_bytes = offered_tokens(tools, profile)
    budget = Budget(
        window=window,
        window_assumed=assumed,
        requested_output=requested_output,
        system_and_tools=stable + tool_bytes,
        stable_prefix=stable,
        tools=tool_bytes,
        # The envelope, plus the framing of the two fixed messages (system, final user).
        framing=REQUEST_FRAMING + 2 * FRAMING_PER_MESSAGE,
        continuation_reserve=continuation_reserve(tools, profile),
        safety_margin=safety_margin(window),
    )
    if budget.hard_input <= 0:
        raise WindowTooSmall(window=window, requested_output=requested_output, fixed=budget.system_and_tools)
    return budget
