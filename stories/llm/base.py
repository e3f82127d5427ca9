"""The one interface every model provider implements, and the facts about a profile that
the rest of the app shows or budgets with.

Contract of `ModelClient.chat`:

- `messages` are OpenAI chat-format dicts: `system`, `user`, `assistant` (possibly with
  `tool_calls`) and `tool` results (`{"role": "tool", "tool_call_id", "content"}`).
- `tools` are the offered `ToolSpec`s. A tool call is ALWAYS required: plain text, an
  unknown tool, arguments that fail the tool's schema, or more than `max_tool_calls` calls
  raise `ModelMalformed`. Returned arguments have passed `validate_arguments`.
- `max_output_tokens` is what to ask the server for (see `effective_limits`).
- `cancel` is polled before the request and between streamed chunks; when it returns true
  the stream is closed and `ModelCancelled` raised.
- `on_text(delta)` receives INCREMENTAL pieces of the decoded `stream_field` (e.g. the
  narration of `submit_turn_plan`) as they stream: concatenating every piece gives that
  field's value. Tools without a `stream_field` produce no calls. The final, validated value
  is in the result; if `chat` raises, text already surfaced must be discarded.
- `seed` asks for reproducible sampling where the provider supports it (the offline
  narrator is fully deterministic for a fixed seed).
- Failures are `stories.llm.errors.ModelError` subclasses, never provider exceptions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from .tools import ToolSpec

if TYPE_CHECKING:
    from stories.models import ModelProfile

ASSUMED_CONTEXT_WINDOW = 16_384
MAX_REQUESTED_OUTPUT = 4_096
BUILTIN_LABEL = "offline narrator, no AI model"


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ChatResult:
    tool_calls: list[ToolCall]
    # The model that answered, as the server names it ("builtin" for the offline narrator).
    model: str
    # UTF-8 bytes of the serialized request (messages and tool schemas) actually sent.
    prompt_bytes: int


class ModelClient(Protocol):
    def chat(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[ToolSpec],
        max_output_tokens: int,
        max_tool_calls: int = 1,
        cancel: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
        seed: int | None = None,
    ) -> ChatResult: ...


def client_for(profile: ModelProfile) -> ModelClient:
    if profile.provider == "builtin":
        from .builtin import BuiltinNarrator

        return BuiltinNarrator(profile)
    if profile.provider == "openai":
        from .openai_provider import OpenAIClient

        return OpenAIClient(profile)
    raise ValueError(f"unknown model provider {profile.provider!r}")


def api_key_for(profile: ModelProfile) -> str | None:
    """The key from the environment variable the profile names; None when it names none or
    the variable is unset or empty."""
    if not profile.api_key_env:
        return None
    return os.environ.get(profile.api_key_env) or None


def effective_limits(profile: ModelProfile) -> tuple[int, bool, int]:
    """(context window, whether that window is assumed, requested output tokens).

    The one home of these two rules: an unknown window is assumed to be 16,384 tokens (and
    must be shown as assumed), and the output asked for is min(max_output_tokens or 4096, 4096).
    """
    window = profile.context_window or ASSUMED_CONTEXT_WINDOW
    assumed = not profile.context_window
    requested_output = min(profile.max_output_tokens or MAX_REQUESTED_OUTPUT, MAX_REQUESTED_OUTPUT)
    return window, assumed, requested_output


def profile_label(profile: ModelProfile) -> str:
    """How a profile's model is described to players."""
    if profile.provider == "builtin":
        return BUILTIN_LABEL
    host = urlsplit(profile.base_url).netloc or profile.base_url
    model = profile.model_name or "model"
    return f"{model} at {host}" if host else model
