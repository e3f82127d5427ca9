"""The OpenAI-compatible provider, over real HTTP against the fake server in tests/fake_openai.py."""

from __future__ import annotations

import email.utils
import json
import socket
import time

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stories.llm.base import ChatResult, ToolCall, api_key_for, client_for
from stories.llm.errors import (
    ModelCancelled,
    ModelMalformed,
    ModelRateLimited,
    ModelTimeout,
    ModelUnavailable,
)
from stories.llm.jsonstream import FieldStreamer
from stories.llm.openai_provider import OpenAIClient, retry_after_seconds, wire_schema
from stories.llm.tools import REQUEST_CHECK, SUBMIT_CONTEXT_SUMMARY, SUBMIT_TURN_PLAN

MESSAGES = [
    {"role": "system", "content": '{"stable_prefix": {"premise": "A dark keep."}}'},
    {"role": "user", "content": '{"dynamic_tail": {"input": {"kind": "do", "text": "climb the wall"}}}'},
]
PLAN = {
    "narration": 'You climb. "Careful," Bram says\u2014the stones are slick. \U0001f319 Rain\\snow\nfalls.',
    "suggestions": ["Drop into the yard", "Wait"],
    "state_delta": [{"op": "add_fact", "fact": "The north wall can be climbed."}],
}


def chat(profile, tools=(REQUEST_CHECK, SUBMIT_TURN_PLAN), **kwargs):
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("max_output_tokens", 512)
    return client_for(profile).chat(tools=list(tools), **kwargs)


def test_a_tool_call_turn_round_trips(fake_openai):
    fake_openai.add_tool_call("submit_turn_plan", PLAN)
    profile = fake_openai.profile(save=False)
    result = chat(profile, seed=42)

    assert isinstance(client_for(profile), OpenAIClient)
    assert result == ChatResult(
        tool_calls=[ToolCall("submit_turn_plan", PLAN)], model="fake-model-1", prompt_bytes=result.prompt_bytes
    )
    body = fake_openai.requests[-1].body
    assert fake_openai.requests[-1].path == "/v1/chat/completions"
    assert body["model"] == "fake-model-1"
    assert body["stream"] is True
    assert body["tool_choice"] == "required"
    assert body["max_tokens"] == 512
    assert body["temperature"] == 0.7
    assert body["seed"] == 42
    assert body["messages"] == MESSAGES
    assert [t["function"]["name"] for t in body["tools"]] == ["request_check", "submit_turn_plan"]
    assert all(t["function"]["strict"] is True for t in body["tools"])
    # Strict structured output knows anyOf, not oneOf; the branches are disjoint by "op".
    plan_params = body["tools"][1]["function"]["parameters"]
    assert plan_params == wire_schema(SUBMIT_TURN_PLAN.parameters)
    assert "anyOf" in plan_params["properties"]["state_delta"]["items"]
    assert "oneOf" not in json.dumps(body["tools"])
    assert result.prompt_bytes >= len(json.dumps(MESSAGES).encode())


def test_a_check_continuation_is_sent_as_openai_tool_messages(fake_openai):
    check = {"skill": "athletics", "difficulty": "hard", "reason": "Slick stones"}
    fake_openai.add_tool_call("request_check", check)
    profile = fake_openai.profile(save=False)
    first = chat(profile)
    assert first.tool_calls == [ToolCall("request_check", check)]

    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "request_check", "arguments": json.dumps(check)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"outcome": "partial"}'},
    ]
    second = chat(profile, tools=[SUBMIT_TURN_PLAN], messages=messages)
    assert second.tool_calls[0].name == "submit_turn_plan"
    assert fake_openai.last_body["messages"] == messages
    assert [t["function"]["name"] for t in fake_openai.last_body["tools"]] == ["submit_turn_plan"]


def test_narration_streams_in_several_pieces_before_the_reply_ends(fake_openai):
    fake_openai.add_tool_call("submit_turn_plan", PLAN, chunk_chars=5, chunk_delay=0.01)
    seen: list[tuple[str, int]] = []
    result = chat(fake_openai.profile(save=False), on_text=lambda delta: seen.append((delta, fake_openai.chunks_sent)))

    assert len(seen) > 3
    assert "".join(delta for delta, _ in seen) == PLAN["narration"]  # escapes and emoji decoded
    # The first pieces arrived while the server was still sending.
    assert seen[0][1] < fake_openai.chunks_sent
    assert result.tool_calls[0].arguments == PLAN


def test_the_summary_tool_streams_no_text(fake_openai):
    summary = {"summary": "You went into the keep.", "key_points": ["keep"]}
    fake_openai.add_tool_call("submit_context_summary", summary)
    seen: list[str] = []
    result = chat(fake_openai.profile(save=False), tools=[SUBMIT_CONTEXT_SUMMARY], on_text=seen.append)
    assert result.tool_calls == [ToolCall("submit_context_summary", summary)]
    assert seen == []


def test_the_unscripted_default_reply_fits_the_offered_tools(fake_openai):
    profile = fake_openai.profile(save=False)
    assert chat(profile).tool_calls[0].name == "submit_turn_plan"
    assert chat(profile, tools=[SUBMIT_CONTEXT_SUMMARY]).tool_calls[0].name == "submit_context_summary"


def test_two_tool_calls_are_allowed_only_when_asked_for(fake_openai):
    check = {"skill": "stealth", "difficulty": "easy", "reason": "Dark night"}
    calls = [("request_check", check), ("submit_turn_plan", PLAN)]
    fake_openai.add_tool_calls(calls)
    result = chat(fake_openai.profile(save=False), max_tool_calls=2)
    assert [c.name for c in result.tool_calls] == ["request_check", "submit_turn_plan"]
    assert fake_openai.last_body["parallel_tool_calls"] is True

    fake_openai.add_tool_calls(calls)
    with pytest.raises(ModelMalformed, match="more than 1 tool call"):
        chat(fake_openai.profile(save=False))
    assert fake_openai.last_body["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (lambda f: f.add_text("Once upon a time, you climbed the wall."), "plain text where a tool call was required"),
        (lambda f: f.add_raw_arguments("submit_turn_plan", '{"narration": "You climb'), "not valid JSON"),
        (lambda f: f.add_raw_arguments("submit_turn_plan", '["narration"]'), "not a JSON object"),
        (lambda f: f.add_truncated("submit_turn_plan", PLAN), "cut off before it finished"),
        (lambda f: f.add_tool_call("delete_everything", {}), "'delete_everything', which was not offered"),
        (lambda f: f.add_tool_call("submit_turn_plan", {**PLAN, "checks": [{"roll": 20}]}), "unknown field 'checks'"),
        (
            lambda f: f.add_tool_call(
                "submit_turn_plan", {**PLAN, "state_delta": [{"op": "record_check", "roll": 20}]}
            ),
            "unknown op 'record_check'",
        ),
        (lambda f: f.add_tool_call("submit_turn_plan", {**PLAN, "narration": ""}), "narration: must be at least 1"),
    ],
    ids=["text", "bad-json", "not-object", "truncated", "unknown-tool", "unknown-field", "forged-check", "empty"],
)
def test_unusable_replies_are_malformed(fake_openai, script, reason):
    script(fake_openai)
    with pytest.raises(ModelMalformed, match=reason) as caught:
        chat(fake_openai.profile(save=False))
    assert caught.value.code == "model_malformed"


def test_a_rate_limit_carries_retry_after(fake_openai):
    fake_openai.add_error(429, retry_after="7")
    with pytest.raises(ModelRateLimited) as caught:
        chat(fake_openai.profile(save=False))
    assert caught.value.code == "model_rate_limited"
    assert caught.value.retry_after == 7.0
    assert "7 seconds" in caught.value.message

    fake_openai.add_error(429)
    with pytest.raises(ModelRateLimited) as caught:
        chat(fake_openai.profile(save=False))
    assert caught.value.retry_after is None


def test_retry_after_parsing():
    assert retry_after_seconds({"retry-after": "2.5"}) == 2.5
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_seconds({"retry-after": later}) <= 31
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_unavailable(fake_openai, status):
    fake_openai.add_error(status)
    with pytest.raises(ModelUnavailable, match=f"HTTP {status}") as caught:
        chat(fake_openai.profile(save=False))
    assert caught.value.code == "model_unavailable"


def test_a_slow_server_times_out(fake_openai):
    fake_openai.add_delay(5.0)
    started = time.monotonic()
    with pytest.raises(ModelTimeout) as caught:
        chat(fake_openai.profile(save=False, timeout_seconds=0.3))
    assert caught.value.code == "model_timeout"
    assert time.monotonic() - started < 3


def test_a_refused_connection_is_unavailable():
    from stories.models import ModelProfile

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    profile = ModelProfile(provider="openai", base_url=f"http://127.0.0.1:{port}/v1", model_name="m", timeout_seconds=2)
    with pytest.raises(ModelUnavailable, match="could not be reached"):
        chat(profile)


def test_cancel_stops_a_streaming_reply(fake_openai):
    fake_openai.add_slow_stream(60, 0.03, "submit_turn_plan", PLAN)
    seen: list[str] = []
    started = time.monotonic()
    with pytest.raises(ModelCancelled) as caught:
        chat(fake_openai.profile(save=False), on_text=seen.append, cancel=lambda: len(seen) >= 2)
    elapsed = time.monotonic() - started
    assert caught.value.code == "cancelled"
    assert 2 <= len(seen) < 10
    assert "".join(seen) != PLAN["narration"]
    assert elapsed < 60 * 0.03 / 2  # well before the server would have finished


def test_cancel_before_the_request_sends_nothing(fake_openai):
    with pytest.raises(ModelCancelled):
        chat(fake_openai.profile(save=False), cancel=lambda: True)
    assert fake_openai.requests == []


def test_the_api_key_travels_only_in_the_authorization_header(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-key-must-not-be-used")
    profile = fake_openai.profile(save=False)
    assert api_key_for(profile) == fake_openai.api_key
    chat(profile)
    fake_openai.add_error(500, body={"error": {"message": f"echo {fake_openai.api_key} BODY-CANARY"}})
    with pytest.raises(ModelUnavailable) as caught:
        chat(profile)
    # Neither the key nor the provider's body reach the player-facing message.
    assert fake_openai.api_key not in caught.value.message and "BODY-CANARY" not in caught.value.message
    assert "BODY-CANARY" not in str(caught.value)

    assert len(fake_openai.requests) == 2
    for request in fake_openai.requests:
        assert request.headers["authorization"] == f"Bearer {fake_openai.api_key}"
        assert fake_openai.api_key not in request.raw
        for name, value in request.headers.items():
            if name != "authorization":
                assert fake_openai.api_key not in value, name
            assert "sk-ambient" not in value


def test_a_profile_without_a_key_variable_never_falls_back_to_openai_api_key(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-key-must-not-be-used")
    chat(fake_openai.profile(save=False, api_key_env=""))
    assert fake_openai.requests[-1].headers["authorization"] == "Bearer no-key"


def test_a_missing_key_variable_is_named(fake_openai, monkeypatch):
    monkeypatch.delenv("STORYTREE_FAKE_OPENAI_KEY")
    with pytest.raises(ModelUnavailable, match="STORYTREE_FAKE_OPENAI_KEY"):
        chat(fake_openai.profile(save=False))
    assert fake_openai.requests == []


def test_without_tool_support_it_asks_for_a_json_envelope(fake_openai):
    profile = fake_openai.profile(save=False, supports_tools=False)
    fake_openai.add_tool_call("submit_turn_plan", PLAN, chunk_chars=6)  # sent as message content
    seen: list[str] = []
    check_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "request_check", "arguments": '{"skill": "x"}'}}
        ],
    }
    messages = [*MESSAGES, check_call, {"role": "tool", "tool_call_id": "c1", "content": '{"outcome": "success"}'}]
    result = chat(profile, tools=[SUBMIT_TURN_PLAN], messages=messages, on_text=seen.append)

    assert result.tool_calls == [ToolCall("submit_turn_plan", PLAN)]
    assert len(seen) > 1 and "".join(seen) == PLAN["narration"]
    body = fake_openai.last_body
    assert "tools" not in body and "tool_choice" not in body
    schema = body["response_format"]["json_schema"]["schema"]
    assert body["response_format"]["type"] == "json_schema"
    assert schema["properties"]["tool"]["enum"] == ["submit_turn_plan"]
    assert schema["additionalProperties"] is False
    # The prefix is unchanged; tool traffic becomes plain messages the server understands.
    assert body["messages"][:2] == MESSAGES
    assert json.loads(body["messages"][2]["content"]) == {"tool": "request_check", "arguments": {"skill": "x"}}
    assert body["messages"][3]["role"] == "user" and '"outcome": "success"' in body["messages"][3]["content"]
    assert "submit_turn_plan" in body["messages"][-1]["content"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("Once upon a time", "plain text where a tool call was required"),
        (json.dumps({"tool": "submit_turn_plan", "arguments": PLAN, "extra": 1}), 'exactly {"tool", "arguments"}'),
        (json.dumps({"tool": "nope", "arguments": {}}), "'nope', which was not offered"),
        (json.dumps({"tool": "submit_turn_plan", "arguments": {**PLAN, "roll": 3}}), "unknown field 'roll'"),
    ],
)
def test_json_mode_replies_get_the_same_validation(fake_openai, content, reason):
    fake_openai.add_text(content)
    with pytest.raises(ModelMalformed, match=reason):
        chat(fake_openai.profile(save=False, supports_tools=False))


def test_json_mode_truncation_is_malformed(fake_openai):
    fake_openai.add_truncated("submit_turn_plan", PLAN)
    with pytest.raises(ModelMalformed, match="cut off"):
        chat(fake_openai.profile(save=False, supports_tools=False))


def test_the_fake_server_also_answers_without_streaming(fake_openai):
    fake_openai.add_tool_call("submit_turn_plan", PLAN)
    response = httpx2.post(
        f"{fake_openai.base_url}/chat/completions",
        json={"model": "m", "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "x"}}]},
    )
    message = response.json()["choices"][0]["message"]
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == PLAN


# -- the incremental JSON reader -------------------------------------------------------------


def feed_in_pieces(document: str, path: tuple[str, ...], size: int) -> str:
    streamer = FieldStreamer(path)
    pieces = [streamer.feed(document[i : i + size]) for i in range(0, len(document), size)]
    assert "".join(pieces) == streamer.text
    return streamer.text


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_the_reader_surfaces_one_field_split_anywhere(ensure_ascii):
    value = {
        "narration_note": "not this",
        "nested": {"narration": "nor this"},
        "list": [{"narration": "nor this"}, "x", 1.5e3, True, None, []],
        "narration": 'Quote " backslash \\ slash / tab \t newline \n \u00e9 \u2014 \U0001f319 end',
        "after": {"narration": "nor this"},
    }
    document = json.dumps(value, ensure_ascii=ensure_ascii)
    for size in range(1, 12):
        assert feed_in_pieces(document, ("narration",), size) == value["narration"]


def test_the_reader_follows_a_nested_path_and_skips_a_code_fence():
    document = (
        '```json\n{"tool": "submit_turn_plan", "arguments": {"narration": "Hello\\u0021", "suggestions": []}}\n```'
    )
    assert feed_in_pieces(document, ("arguments", "narration"), 3) == "Hello!"


def test_the_reader_is_tolerant_of_broken_input():
    assert feed_in_pieces('{"narration": "partial text', ("narration",), 4) == "partial text"
    assert feed_in_pieces('{"narration": "lone \\ud83d surrogate"}', ("narration",), 2) == "lone \ufffd surrogate"
    assert feed_in_pieces('{"a" 1, "narration": "x"}', ("narration",), 1) == ""  # gives up, never raises


@settings(max_examples=150, deadline=None)
@given(text=st.text(), data=st.data())
def test_the_reader_matches_json_loads_for_any_text_and_split(text, data):
    document = json.dumps(
        {"a": [text], "narration": text, "z": {"narration": "no"}}, ensure_ascii=data.draw(st.booleans())
    )
    cuts = sorted(data.draw(st.sets(st.integers(0, len(document)), max_size=12)))
    streamer = FieldStreamer(("narration",))
    start = 0
    for cut in [*cuts, len(document)]:
        streamer.feed(document[start:cut])
        start = cut
    assert streamer.text == text
