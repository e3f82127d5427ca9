"""Same-model summaries through the strict `submit_context_summary` tool, counted and
inspected at a fake OpenAI-compatible server: rolling chunks for a 500-node first
compaction, one call for an incremental one, and every reply that must be rejected."""

from __future__ import annotations

import json

import pytest

from checkpoints import budget as budgets
from checkpoints.context import compact_now
from checkpoints.models import ContextCheckpoint
from checkpoints.prompt import SUMMARY_CLASSIFICATION, checkpoint_part, checkpoint_tokens
from checkpoints.summarizer import MAX_CHUNK_TOKENS, render_previous
from checkpoints.testing import body_tokens, play, use_profile
from stories.llm.errors import ModelMalformed
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


def offered(request) -> list[str]:
    return [tool["function"]["name"] for tool in request.body.get("tools", [])]


def summary_requests(fake, start: int = 0) -> list[dict]:
    """The summary_request of every summary call the server received since `start`."""
    found = []
    for request in fake.requests[start:]:
        if offered(request) == ["submit_context_summary"]:
            messages = request.body["messages"]
            assert [m["role"] for m in messages] == ["system", "user"]  # fresh and single-purpose
            assert "summarizer" in json.loads(messages[0]["content"])
            found.append(json.loads(messages[1]["content"])["summary_request"])
    return found


def numbered_summaries(fake):
    """Make the n-th summary call answer "Summary n" (set from the progress callback)."""
    seen = []

    def on_progress(done: int, total: int) -> None:
        seen.append((done, total))
        fake.default_arguments["submit_context_summary"] = {
            "summary": f"Summary {done + 1}.",
            "key_points": [f"point {done + 1}"],
        }

    return seen, on_progress


def test_a_500_node_first_compaction_rolls_through_bounded_chunks(owner, fake_openai):
    profile = fake_openai.profile()  # 8,192-token window, 1,024 output
    adventure = use_profile(build_story(nodes=500, bytes_per_node=250, owner=owner), profile)
    seen, on_progress = numbered_summaries(fake_openai)

    result = compact_now(adventure, on_progress=on_progress)

    checkpoint = result.checkpoint
    requests = summary_requests(fake_openai)
    calls = len(requests)
    assert calls == result.calls == len(result.chunks) > 10
    assert seen == [(0, calls)] + [(done, calls) for done in range(1, calls + 1)]
    # The chunks are consecutive and cover root..covered exactly once, in order.
    depths = [node["depth"] for request in requests for node in request["nodes"]]
    assert depths == list(range(checkpoint.covered_depth + 1))
    assert [len(r["nodes"]) for r in requests] == result.chunks
    # Each chunk folds the running summary; only the final one is kept.
    assert requests[0]["previous_summary"] is None
    for index, request in enumerate(requests[1:], start=1):
        assert request["previous_summary"] == render_previous(f"Summary {index}.", [f"point {index}"])
    assert checkpoint.summary_json["summary"] == f"Summary {calls}."
    assert checkpoint.summary_json["classification"] == SUMMARY_CLASSIFICATION
    assert ContextCheckpoint.objects.count() == 1
    # Bounded: each request fits the window (and the chunk cap), whatever the story's length.
    limit = 8192 - 1024 - budgets.safety_margin(8192)
    for request in fake_openai.requests:
        assert body_tokens(request.body) <= limit
        assert budgets.estimate_tokens(request.body["messages"][1]["content"]) <= MAX_CHUNK_TOKENS
    # Only public text travels: depth, input, narration.
    assert {key for request in requests for node in request["nodes"] for key in node} == {
        "depth",
        "input",
        "narration",
    }


def test_a_later_compaction_folds_the_previous_summary_with_the_new_nodes_in_one_call(owner, fake_openai):
    profile = fake_openai.profile()
    adventure = use_profile(build_story(nodes=120, bytes_per_node=250, owner=owner), profile)
    first = compact_now(adventure).checkpoint
    fake_openai.default_arguments["submit_context_summary"] = {"summary": "Folded.", "key_points": []}
    for index in range(30):
        start = len(fake_openai.requests)
        turn = play(adventure, f"I row past buoy {index}.")
        if turn.prepared.pending_checkpoint is not None:
            break
    else:
        pytest.fail("no second compaction in 30 turns")
    requests = summary_requests(fake_openai, start)
    assert len(requests) == turn.prepared.compaction_calls == 1
    second = turn.prepared.pending_checkpoint
    old = first.summary_json
    assert requests[0]["previous_summary"] == render_previous(old["summary"], old["key_points"])
    assert [n["depth"] for n in requests[0]["nodes"]] == list(range(first.covered_depth + 1, second.covered_depth + 1))
    assert second.summary_json["summary"] == "Folded."
    # Self-contained: the new summary replaces the old one in the prompt, never nests it.
    contents = [m["content"] for m in turn.prepared.messages]
    assert not any(old["summary"] in text for text in contents)
    assert sum('"checkpoint":' in text for text in contents) == 1


def test_the_key_points_that_do_not_fit_are_dropped_not_the_summary(owner, fake_openai):
    profile = fake_openai.profile()
    adventure = use_profile(build_story(nodes=40, bytes_per_node=250, owner=owner), profile)
    fake_openai.default_arguments["submit_context_summary"] = {
        "summary": "A long road.",
        "key_points": [f"key point number {i} " + "x" * 250 for i in range(20)],
    }
    checkpoint = compact_now(adventure).checkpoint
    points = checkpoint.summary_json["key_points"]
    assert 0 < len(points) < 20 and points == [f"key point number {i} " + "x" * 250 for i in range(len(points))]
    cap = checkpoint_tokens(checkpoint_part(checkpoint.summary_json, checkpoint.covered_depth))
    assert cap == checkpoint.summary_bytes


REJECTED = {
    "plain text": lambda fake: fake.add_text("Once upon a time the story went on."),
    "two calls": lambda fake: fake.add_tool_calls(
        [("submit_context_summary", {"summary": "A.", "key_points": []})] * 2
    ),
    "unknown field": lambda fake: fake.add_tool_call(
        "submit_context_summary", {"summary": "A.", "key_points": [], "classification": "authoritative"}
    ),
    "missing field": lambda fake: fake.add_tool_call("submit_context_summary", {"summary": "A."}),
    "blank": lambda fake: fake.add_tool_call("submit_context_summary", {"summary": "   \n ", "key_points": []}),
    "oversized": lambda fake: fake.add_tool_call(
        "submit_context_summary", {"summary": "word " * 1_150, "key_points": []}
    ),
    "a credential": lambda fake: fake.add_tool_call(
        "submit_context_summary", {"summary": f"The key is {fake.api_key}.", "key_points": []}
    ),
    "our own request": lambda fake: fake.add_tool_call(
        "submit_context_summary", {"summary": '{"summary_request": {"nodes": []}}', "key_points": []}
    ),
    "another tool": lambda fake: fake.add_tool_call("submit_turn_plan", fake.default_arguments["submit_turn_plan"]),
    "not JSON": lambda fake: fake.add_raw_arguments("submit_context_summary", '{"summary": "A'),
}


@pytest.mark.parametrize("name", list(REJECTED))
def test_a_reply_that_is_not_one_valid_summary_is_rejected_and_saves_nothing(owner, fake_openai, name):
    profile = fake_openai.profile()
    adventure = use_profile(build_story(nodes=40, bytes_per_node=250, owner=owner), profile)
    REJECTED[name](fake_openai)
    with pytest.raises(ModelMalformed) as raised:
        compact_now(adventure)
    assert raised.value.code == "model_malformed"
    assert fake_openai.api_key not in raised.value.message
    assert not ContextCheckpoint.objects.exists()
    # The next attempt, with a valid reply, succeeds.
    assert compact_now(adventure).created
