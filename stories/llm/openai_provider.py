"""Any OpenAI-compatible chat server (llama.cpp server, Ollama, vLLM, LM Studio, hosted
APIs) through the official `openai` SDK.

Always streams. With `profile.supports_tools` the tools are offered as strict function
tools with `tool_choice="required"`; without it the server is asked, through a strict
`response_format` JSON schema, for `{"tool": <name>, "arguments": {...}}`, which is then held
to exactly the same checks.

`profile.timeout_seconds` bounds connecting and every wait for the next bytes (an idle
timeout), not the whole reply: a slow local model that keeps streaming is not cut off.
The SDK never retries (`max_retries=0`): retrying is the job's decision.
"""

from __future__ import annotations

import email.utils
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx2
import openai

from .base import ChatResult, ToolCall, api_key_for
from .errors import (
    ModelCancelled,
    ModelError,
    ModelMalformed,
    ModelRateLimited,
    ModelTimeout,
    ModelUnavailable,
)
from .jsonstream import FieldStreamer
from .tools import ToolSpec, find_tool, validate_arguments

if TYPE_CHECKING:
    from stories.models import ModelProfile

# Sent when the profile names no key variable: local servers ignore it, and passing
# something stops the SDK from falling back to OPENAI_API_KEY behind the operator's back.
NO_KEY_PLACEHOLDER = "no-key"
JSON_MODE_SCHEMA_NAME = "tool_call"


def wire_schema(schema: Any) -> Any:
    """The schema as sent to servers: `oneOf` becomes `anyOf` (strict structured output
    accepts only `anyOf`; our branches are disjoint by their "op" constant, so the two mean
    the same). Our own validation keeps using `oneOf`."""
    if isinstance(schema, dict):
        return {("anyOf" if key == "oneOf" else key): wire_schema(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [wire_schema(item) for item in schema]
    return schema


def tool_param(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": wire_schema(spec.parameters),
            "strict": True,
        },
    }


def json_mode_format(tools: list[ToolSpec]) -> dict[str, Any]:
    """`response_format` for servers without tool calling: one object naming the tool and
    carrying its arguments."""
    arguments = (
        wire_schema(tools[0].parameters) if len(tools) == 1 else {"anyOf": [wire_schema(t.parameters) for t in tools]}
    )
    schema = {
        "type": "object",
        "properties": {
            "tool": {"type": "string", "enum": [spec.name for spec in tools]},
            "arguments": arguments,
        },
        "required": ["tool", "arguments"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": JSON_MODE_SCHEMA_NAME, "schema": schema, "strict": True}}


def json_mode_instruction(tools: list[ToolSpec]) -> str:
    """Short on purpose: the full schemas already travel in `response_format`."""
    lines = ['Answer with exactly one JSON object {"tool": <tool name>, "arguments": {...}} and nothing else. Tools:']
    for spec in tools:
        fields = ", ".join(spec.parameters.get("properties", {}))
        lines.append(f"- {spec.name}({fields}): {spec.description}")
    return "\n".join(lines)


def json_mode_messages(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The conversation for a server without tool calling: earlier tool calls become the
    JSON envelope they would have been, tool results become user messages, and the
    instruction goes last (after the unchanged prefix, so prefix caches still hit; many chat
    templates refuse a system message anywhere but first)."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            envelopes = []
            for call in message["tool_calls"]:
                function = call.get("function", {})
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except json.JSONDecodeError:
                    arguments = {}
                envelopes.append(json.dumps({"tool": function.get("name"), "arguments": arguments}))
            converted.append({"role": "assistant", "content": "\n".join(envelopes)})
        elif message.get("role") == "tool":
            converted.append({"role": "user", "content": f"Tool result: {message.get('content', '')}"})
        else:
            converted.append(dict(message))
    instruction = json_mode_instruction(tools)
    if converted and converted[-1].get("role") == "user" and isinstance(converted[-1].get("content"), str):
        converted[-1]["content"] += "\n\n" + instruction
    else:
        converted.append({"role": "user", "content": instruction})
    return converted


class OpenAIClient:
    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile

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
    ) -> ChatResult:
        if not tools:
            raise ValueError("chat() needs at least one tool: a tool call is always required")
        if cancel and cancel():
            raise ModelCancelled()
        profile = self.profile
        request: dict[str, Any] = {
            "model": profile.model_name,
            "messages": list(messages),
            "max_tokens": max_output_tokens,
            "temperature": profile.temperature,
            "stream": True,
        }
        if profile.supports_tools:
            request["tools"] = [tool_param(spec) for spec in tools]
            request["tool_choice"] = "required"
            request["parallel_tool_calls"] = max_tool_calls > 1
        else:
            request["messages"] = json_mode_messages(messages, tools)
            request["response_format"] = json_mode_format(tools)
        if seed is not None:
            request["seed"] = seed
        prompt_bytes = len(
            json.dumps(
                {k: request[k] for k in ("messages", "tools", "response_format") if k in request},
                ensure_ascii=False,
            ).encode()
        )

        reader = (
            _ToolCallReader(tools, max_tool_calls, on_text)
            if profile.supports_tools
            else _JsonModeReader(tools, on_text)
        )
        with openai.OpenAI(
            base_url=profile.base_url,
            api_key=self._api_key(),
            timeout=profile.timeout_seconds,
            max_retries=0,
        ) as client:
            model = self._stream(client, request, reader, cancel)
        calls = reader.finish()
        return ChatResult(tool_calls=calls, model=model or profile.model_name, prompt_bytes=prompt_bytes)

    def _api_key(self) -> str:
        key = api_key_for(self.profile)
        if key is None and self.profile.api_key_env:
            raise ModelUnavailable(
                f"The environment variable {self.profile.api_key_env} that should hold the API key is not set."
            )
        return key or NO_KEY_PLACEHOLDER

    def _stream(self, client: openai.OpenAI, request: dict[str, Any], reader: _Reader, cancel) -> str:
        model = ""
        started = False
        try:
            stream = client.chat.completions.create(**request)
            started = True
            try:
                for chunk in stream:
                    if cancel and cancel():
                        raise ModelCancelled()
                    model = chunk.model or model
                    reader.chunk(chunk)
            finally:
                stream.close()
        except ModelError:
            raise
        except openai.APITimeoutError:
            raise ModelTimeout() from None
        except openai.RateLimitError as error:
            raise ModelRateLimited(retry_after=retry_after_seconds(error.response.headers)) from None
        except openai.APIStatusError as error:
            raise _status_error(error.status_code) from None
        except openai.APIConnectionError:
            if started:
                raise ModelMalformed("the reply was cut off before it finished") from None
            raise ModelUnavailable() from None
        except httpx2.TimeoutException:
            raise ModelTimeout() from None
        except openai.APIError:
            # An error event inside the stream; its body is the provider's, so it is not repeated.
            raise ModelUnavailable("The model server reported an error while answering.") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelMalformed("the server sent a stream that is not valid JSON") from None
        return model


def _status_error(status: int) -> ModelError:
    if status >= 500:
        return ModelUnavailable(f"The model server had an internal error (HTTP {status}).")
    if status in (401, 403):
        return ModelUnavailable(f"The model server refused the API key (HTTP {status}).")
    if status == 404:
        return ModelUnavailable("The model server does not know this model or address (HTTP 404).")
    if status == 408:
        return ModelTimeout()
    return ModelUnavailable(f"The model server refused the request (HTTP {status}).")


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds to wait from `retry-after-ms`, `Retry-After` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _parse_arguments(spec: ToolSpec, raw: str) -> dict[str, Any]:
    try:
        arguments = json.loads(raw) if raw.strip() else None
    except json.JSONDecodeError:
        raise ModelMalformed(f"the arguments of {spec.name} are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise ModelMalformed(f"the arguments of {spec.name} are not a JSON object")
    return validate_arguments(spec, arguments)


class _Reader(ABC):
    """Turns a stream of completion chunks into tool calls (tool calling or JSON mode)."""

    @abstractmethod
    def chunk(self, chunk: Any) -> None: ...

    @abstractmethod
    def finish(self) -> list[ToolCall]: ...


class _ToolCallReader(_Reader):
    """Collects streamed tool calls by index, surfacing each call's stream field."""

    def __init__(self, tools: list[ToolSpec], max_tool_calls: int, on_text: Callable[[str], None] | None) -> None:
        self.tools = tools
        self.max_tool_calls = max_tool_calls
        self.on_text = on_text
        self.calls: dict[int, dict[str, Any]] = {}
        self.text: list[str] = []
        self.finish_reason: str | None = None

    def chunk(self, chunk: Any) -> None:
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self.text.append(delta.content)
                for part in delta.tool_calls or []:
                    self._tool_call_part(part)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def _tool_call_part(self, part: Any) -> None:
        call = self.calls.get(part.index)
        if call is None:
            if len(self.calls) >= self.max_tool_calls:
                raise ModelMalformed(f"made more than {self.max_tool_calls} tool call(s)")
            call = self.calls[part.index] = {"name": "", "arguments": "", "streamer": None}
        function = part.function
        if function is None:
            return
        if function.name:
            call["name"] += function.name
        if function.arguments:
            call["arguments"] += function.arguments
            self._surface(call, function.arguments)

    def _surface(self, call: dict[str, Any], fragment: str) -> None:
        if self.on_text is None:
            return
        if call["streamer"] is None:
            spec = next((t for t in self.tools if t.name == call["name"]), None)
            if spec is None or spec.stream_field is None:
                call["streamer"] = False
                return
            call["streamer"] = FieldStreamer((spec.stream_field,))
            fragment = call["arguments"]  # catch up on anything that came before the name
        if call["streamer"]:
            delta = call["streamer"].feed(fragment)
            if delta:
                self.on_text(delta)

    def finish(self) -> list[ToolCall]:
        if self.finish_reason is None:
            raise ModelMalformed("the reply was cut off before it finished")
        if self.finish_reason == "length":
            raise ModelMalformed("the reply ran past the output limit")
        if not self.calls:
            if "".join(self.text).strip():
                raise ModelMalformed("answered in plain text where a tool call was required")
            raise ModelMalformed("made no tool call")
        result = []
        for index in sorted(self.calls):
            call = self.calls[index]
            spec = find_tool(self.tools, call["name"])
            result.append(ToolCall(name=spec.name, arguments=_parse_arguments(spec, call["arguments"])))
        return result


class _JsonModeReader(_Reader):
    """Reads `{"tool": ..., "arguments": {...}}` from the message content."""

    def __init__(self, tools: list[ToolSpec], on_text: Callable[[str], None] | None) -> None:
        self.tools = tools
        self.on_text = on_text
        # The envelope's tool name may arrive after the arguments, so surface the stream field
        # of the first offered tool that has one (every current tool set has at most one).
        field = next((spec.stream_field for spec in tools if spec.stream_field), None)
        self.streamer = FieldStreamer(("arguments", field)) if field and on_text else None
        self.content: list[str] = []
        self.finish_reason: str | None = None

    def chunk(self, chunk: Any) -> None:
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is not None:
                if delta.tool_calls:
                    raise ModelMalformed("made a tool call although none was offered")
                if delta.content:
                    self.content.append(delta.content)
                    if self.streamer is not None:
                        text = self.streamer.feed(delta.content)
                        if text:
                            self.on_text(text)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def finish(self) -> list[ToolCall]:
        if self.finish_reason is None:
            raise ModelMalformed("the reply was cut off before it finished")
        if self.finish_reason == "length":
            raise ModelMalformed("the reply ran past the output limit")
        content = _strip_fence("".join(self.content))
        if not content:
            raise ModelMalformed("gave an empty answer where a tool call was required")
        try:
            envelope = json.loads(content)
        except json.JSONDecodeError:
            raise ModelMalformed("answered in plain text where a tool call was required") from None
        if not isinstance(envelope, dict) or set(envelope) != {"tool", "arguments"}:
            raise ModelMalformed('did not answer with exactly {"tool", "arguments"}')
        spec = find_tool(self.tools, envelope["tool"])
        if not isinstance(envelope["arguments"], dict):
            raise ModelMalformed(f"the arguments of {spec.name} are not a JSON object")
        return [ToolCall(name=spec.name, arguments=validate_arguments(spec, envelope["arguments"]))]


def _strip_fence(text: str) -> str:
    """Some servers wrap JSON in a Markdown code fence even under a schema."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```"):
        text = text[3:-3]
        if text.startswith("json"):
            text = text[4:]
    return text.strip()
