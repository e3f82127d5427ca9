"""A fake OpenAI-compatible chat server on a real socket, for tests.

Serves `POST /v1/chat/completions` (streamed as SSE or not) from a background thread on
127.0.0.1 and a free port. Replies are scripted per test; with nothing scripted it answers
with a valid call of the most useful offered tool (`submit_turn_plan`, else
`submit_context_summary`, else the first tool), so turn tests work without scripting.
Servers without tool support are imitated too: a request carrying `response_format` (and no
tools) is answered with `{"tool": ..., "arguments": ...}` as message content.

Usage (the `fake_openai` fixture; registered for every test through `tests/conftest.py`)::

    def test_something(fake_openai):
        profile = fake_openai.profile(timeout_seconds=5)          # saved ModelProfile (needs db)
        profile = fake_openai.profile(save=False)                 # unsaved, no database needed
        fake_openai.add_tool_call("submit_turn_plan", {...})      # streamed in 8-character pieces
        fake_openai.add_tool_call("submit_turn_plan", {...}, chunk_chars=3, chunk_delay=0.05)
        fake_openai.add_tool_calls([("request_check", {...}), ("submit_turn_plan", {...})])
        fake_openai.add_text("Once upon a time")                  # plain content, no tool call
        fake_openai.add_raw_arguments("submit_turn_plan", '{"narration": ')  # not JSON
        fake_openai.add_truncated("submit_turn_plan", {...})      # stream ends mid-arguments, no [DONE]
        fake_openai.add_error(429, retry_after="7")               # or add_error(500)
        fake_openai.add_delay(2.0)                                # sleeps before answering, then default
        fake_openai.add_slow_stream(40, 0.05)                     # default plan in 40 chunks, 50 ms apart
        ...
        fake_openai.requests[-1].body["messages"]                 # parsed JSON of each request
        fake_openai.requests[-1].headers["authorization"]         # header names lower-cased
        fake_openai.api_key                                       # the canary key the profile reads

Every `add_*` appends one reply to a FIFO queue; each request consumes one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

API_KEY_ENV = "STORYTREE_FAKE_OPENAI_KEY"
MODEL = "fake-model-1"

DEFAULT_ARGUMENTS: dict[str, dict[str, Any]] = {
    "submit_turn_plan": {
        "narration": "The lantern gutters as you step forward. Somewhere ahead, water drips on stone.",
        "suggestions": ["Light the lantern again", "Listen at the door"],
        "state_delta": [],
    },
    "submit_context_summary": {
        "summary": "You travelled to the old keep and went inside.",
        "key_points": ["You entered the keep"],
    },
    "request_check": {"skill": "athletics", "difficulty": "moderate", "reason": "A risky climb"},
}


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    raw: str  # the body as text
    body: Any  # the parsed JSON body (None if it was not JSON)


@dataclass
class Reply:
    """One scripted reply. `kind` is one of: tool_calls, text, raw_arguments, truncated,
    error, default. `delay` is slept before answering; `chunk_chars`/`chunk_delay` shape the
    streamed argument or content pieces."""

    kind: str
    calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, arguments dict or raw string)
    text: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay: float = 0.0
    chunk_chars: int = 8
    chunk_delay: float = 0.0
    chunks: int | None = None  # split the streamed text into exactly this many pieces


class FakeOpenAI:
    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[RecordedRequest] = []
        self.default_arguments = json.loads(json.dumps(DEFAULT_ARGUMENTS))
        self.api_key = "sk-canary-" + "7f3e9c2a41d8b6e05a9f"
        self.chunks_sent = 0  # streamed data chunks written, over all requests
        self.stopping = threading.Event()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai", daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()  # wakes handlers sleeping in a scripted delay
        self.server.shutdown()
        self.server.server_close()

    # -- scripting ----------------------------------------------------------------------

    def add(self, reply: Reply) -> Reply:
        self.script.append(reply)
        return reply

    def add_tool_call(self, name: str, arguments: Any, **shape: Any) -> Reply:
        return self.add(Reply("tool_calls", calls=[(name, arguments)], **shape))

    def add_tool_calls(self, calls: list[tuple[str, Any]], **shape: Any) -> Reply:
        return self.add(Reply("tool_calls", calls=list(calls), **shape))

    def add_text(self, text: str, **shape: Any) -> Reply:
        return self.add(Reply("text", text=text, **shape))

    def add_raw_arguments(self, name: str, raw: str, **shape: Any) -> Reply:
        return self.add(Reply("tool_calls", calls=[(name, raw)], **shape))

    def add_truncated(self, name: str = "submit_turn_plan", arguments: Any = None, **shape: Any) -> Reply:
        arguments = arguments if arguments is not None else self.default_arguments.get(name, {})
        return self.add(Reply("truncated", calls=[(name, arguments)], **shape))

    def add_error(self, status: int, *, retry_after: str | None = None, body: Any = None, **shape: Any) -> Reply:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        body = body if body is not None else {"error": {"message": f"fake error {status}", "type": "fake_error"}}
        return self.add(Reply("error", status=status, headers=headers, body=body, **shape))

    def add_delay(self, seconds: float, **shape: Any) -> Reply:
        return self.add(Reply("default", delay=seconds, **shape))

    def add_slow_stream(self, chunks: int, delay: float, name: str | None = None, arguments: Any = None) -> Reply:
        if name is None:
            return self.add(Reply("default", chunks=chunks, chunk_delay=delay))
        return self.add(Reply("tool_calls", calls=[(name, arguments)], chunks=chunks, chunk_delay=delay))

    # -- helpers for tests ----------------------------------------------------------------

    def profile(self, *, save: bool = True, **overrides: Any):
        """A ModelProfile pointing here; its key variable holds `self.api_key`."""
        from stories.models import ModelProfile

        fields = {
            "name": f"fake-openai-{self.port}-{next(self._ids)}",
            "provider": "openai",
            "base_url": self.base_url,
            "model_name": MODEL,
            "api_key_env": API_KEY_ENV,
            "context_window": 8192,
            "max_output_tokens": 1024,
            "temperature": 0.7,
            "timeout_seconds": 10.0,
            "supports_tools": True,
        }
        fields.update(overrides)
        if save:
            return ModelProfile.objects.create(**fields)
        return ModelProfile(**fields)

    @property
    def last_body(self) -> Any:
        return self.requests[-1].body if self.requests else None

    def _next_reply(self) -> Reply:
        with self._lock:
            return self.script.popleft() if self.script else Reply("default")

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server is stopping; False when it is."""
        return not self.stopping.wait(seconds) if seconds > 0 else True


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAI
    # HTTP/1.0: every response ends by closing the connection, which is how a truncated
    # stream is imitated (the body simply stops).
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", errors="replace")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        fake = self.fake
        fake.requests.append(
            RecordedRequest(
                method="POST",
                path=self.path,
                headers={name.lower(): value for name, value in self.headers.items()},
                raw=raw,
                body=body,
            )
        )
        if self.path.rstrip("/") != "/v1/chat/completions" or not isinstance(body, dict):
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        reply = fake._next_reply()
        if not fake._sleep(reply.delay):
            return
        # The client may hang up mid-answer (cancel, timeout): expected, not an error.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._answer(reply, body)

    # -- answers ------------------------------------------------------------------------

    def _answer(self, reply: Reply, request: dict[str, Any]) -> None:
        if reply.kind == "error":
            self._json(reply.status, reply.body, reply.headers)
            return
        json_mode = not request.get("tools") and bool(request.get("response_format"))
        if reply.kind == "default":
            reply.calls = [_default_call(request, self.fake.default_arguments)]
            reply.kind = "tool_calls"
        if json_mode and reply.kind in ("tool_calls", "truncated"):
            # No tool support: the call travels as {"tool", "arguments"} content.
            name, arguments = reply.calls[0]
            envelope = {"tool": name, "arguments": arguments}
            reply = Reply(
                "text" if reply.kind == "tool_calls" else "truncated_text",
                text=json.dumps(envelope),
                chunk_chars=reply.chunk_chars,
                chunk_delay=reply.chunk_delay,
                chunks=reply.chunks,
            )
        if request.get("stream"):
            self._stream(reply, request)
        else:
            self._complete(reply, request)

    def _stream(self, reply: Reply, request: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.flush()
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL}

        def send(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.fake.chunks_sent += 1

        send({"role": "assistant", "content": ""})
        if reply.kind in ("text", "truncated_text"):
            pieces = _pieces(reply.text, reply)
            if reply.kind == "truncated_text":
                pieces = pieces[: max(1, len(pieces) // 2)]
            for index, piece in enumerate(pieces):
                if index and not self.fake._sleep(reply.chunk_delay):
                    return
                send({"content": piece})
            if reply.kind == "truncated_text":
                return
            send({}, "stop")
        else:
            for call_index, (name, arguments) in enumerate(reply.calls):
                raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
                call_id = f"call_{call_index + 1}"
                send(
                    {
                        "tool_calls": [
                            {
                                "index": call_index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
                pieces = _pieces(raw, reply)
                if reply.kind == "truncated":
                    pieces = pieces[: max(1, len(pieces) // 2)]
                for index, piece in enumerate(pieces):
                    if index and not self.fake._sleep(reply.chunk_delay):
                        return
                    send({"tool_calls": [{"index": call_index, "function": {"arguments": piece}}]})
            if reply.kind == "truncated":
                return  # no finish_reason, no [DONE]: the connection just closes
            send({}, "tool_calls")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _complete(self, reply: Reply, request: dict[str, Any]) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "tool_calls"
        if reply.kind in ("text", "truncated_text"):
            message["content"] = reply.text
            finish = "stop" if reply.kind == "text" else "length"
        else:
            message["tool_calls"] = [
                {
                    "id": f"call_{index + 1}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                    },
                }
                for index, (name, arguments) in enumerate(reply.calls)
            ]
            if reply.kind == "truncated":
                finish = "length"
        self._json(
            200,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def _pieces(text: str, reply: Reply) -> list[str]:
    size = max(1, -(-len(text) // reply.chunks)) if reply.chunks else max(1, reply.chunk_chars)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _offered_tools(request: dict[str, Any]) -> list[str]:
    names = [t.get("function", {}).get("name") for t in request.get("tools") or [] if isinstance(t, dict)]
    if not names:
        schema = (request.get("response_format") or {}).get("json_schema", {}).get("schema", {})
        names = schema.get("properties", {}).get("tool", {}).get("enum", [])
    return [name for name in names if name]


def _default_call(request: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> tuple[str, Any]:
    offered = _offered_tools(request)
    for name in ("submit_turn_plan", "submit_context_summary"):
        if name in offered:
            return name, defaults[name]
    if offered:
        return offered[0], defaults.get(offered[0], {})
    return "submit_turn_plan", defaults["submit_turn_plan"]


@pytest.fixture
def fake_openai(monkeypatch) -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI().start()
    monkeypatch.setenv(API_KEY_ENV, fake.api_key)
    try:
        yield fake
    finally:
        fake.stop()
