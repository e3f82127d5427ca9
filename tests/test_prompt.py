"""Prompt schema v3: layout, the byte-identical stable prefix, one cache break per checkpoint
rotation, verbatim history (never cut), and the refusals that stop a prompt from overflowing."""

from __future__ import annotations

import json

import pytest

from checkpoints.budget import MIN_SUMMARY_BYTES, HistoryEntryTooLarge, NeedsCompaction, estimate_tokens
from checkpoints.context import TURN_TOOLS, assert_next_turn_fits, build_dynamic_tail, prepare
from checkpoints.models import ContextCheckpoint
from checkpoints.prompt import (
    PROMPT_SCHEMA_VERSION,
    SUMMARY_CLASSIFICATION,
    build_summary_request,
    compose_turn,
    continuation,
    dynamic_tail_message,
    node_tokens,
    turn_budget,
)
from checkpoints.testing import make_profile, play, use_profile
from stories import paths, tree
from stories.llm.base import ToolCall
from stories.models import Adventure, Node, WorldEntry
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model):
    # No password: hashing one costs ~0.4 s per test, and nobody signs in here.
    return django_user_model.objects.create(username="owner")


def content(message: dict) -> dict:
    return json.loads(message["content"])


def raw_tail_depths(messages: list[dict]) -> list[int]:
    return [content(m)["raw_tail"]["depth"] for m in messages[1:-1] if m["role"] == "user"]


@pytest.fixture
def small(owner):
    """A window small enough that a few dozen turns rotate checkpoints."""
    return make_profile("small-window", context_window=9_000, max_output_tokens=1_024)


def test_layout_is_stable_prefix_then_branch_context_then_dynamic_tail(owner):
    adventure = tree.adventure_create(
        owner=owner, title="Layout", premise="A lighthouse, dark for three nights.", persona="Ilsa, a navigator."
    )
    for text in ["I knock.", "I say hello.", "I climb the stairs."]:
        play(adventure, text)
    adventure.refresh_from_db()
    tail = build_dynamic_tail(
        adventure, head=adventure.head, kind="do", text="I look out.", state=adventure.head.state_after
    )
    prepared = prepare(adventure=adventure, head=adventure.head, dynamic_tail=tail, tools=TURN_TOOLS)
    messages = prepared.messages

    assert messages[0]["role"] == "system"
    prefix = content(messages[0])["stable_prefix"]
    assert prefix["prompt_schema_version"] == PROMPT_SCHEMA_VERSION == 3
    assert prefix["premise"] == adventure.premise and prefix["persona"] == adventure.persona
    assert content(messages[-1]) == {"dynamic_tail": tail}
    # Roles alternate (every chat template accepts it): system, (user, assistant)*, user.
    roles = [m["role"] for m in messages]
    assert roles == ["system"] + ["user", "assistant"] * ((len(roles) - 2) // 2) + ["user"]
    # The branch context: every node of the path, oldest first, each text whole.
    path = paths.newest(adventure.head, 100)
    assert raw_tail_depths(messages) == [n.depth for n in path] == list(range(adventure.head.depth + 1))
    for node, (user_message, narration) in zip(path, zip(messages[1:-1:2], messages[2:-1:2], strict=True), strict=True):
        assert content(user_message)["raw_tail"] == {"depth": node.depth, "kind": node.kind, "input": node.player_input}
        assert narration == {"role": "assistant", "content": node.narration}
    assert prepared.verbatim_from_depth == 0 and prepared.checkpoint is None


def test_stable_prefix_is_byte_identical_across_20_turns_and_changes_with_its_sources(owner):
    adventure = tree.adventure_create(owner=owner, title="Stable", premise="Salt and rain.", persona="A smuggler.")
    WorldEntry.objects.create(adventure=adventure, keys=["Maren"], content="Maren keeps the inn.")
    prefixes = set()
    for index in range(20):
        turn = play(adventure, f"I walk the quay, step {index}.")
        prefixes.add(turn.prepared.messages[0]["content"])
        assert turn.node.prompt_stable_bytes == len(turn.prepared.messages[0]["content"].encode())
    assert len(prefixes) == 1
    first = prefixes.pop()

    def prefix_now() -> str:
        fresh = Adventure.objects.get(pk=adventure.pk)
        return compose_turn(
            adventure=fresh,
            head=fresh.head,
            dynamic_tail=build_dynamic_tail(fresh, head=fresh.head, kind="continue", text="", state={}),
            tools=TURN_TOOLS,
        ).messages[0]["content"]

    # Not part of the stable prefix: the title, memories, the head.
    Adventure.objects.filter(pk=adventure.pk).update(title="Renamed")
    tree.memory_add(adventure=Adventure.objects.get(pk=adventure.pk), text="The key is under the mat.", pinned=True)
    assert prefix_now() == first
    # Part of it: persona, premise, style and the bound world book's provenance.
    entry = WorldEntry.objects.create(adventure=adventure, keys=["tide"], content="The tide turns at midnight.")
    with_entry = prefix_now()
    assert with_entry != first and "midnight" not in with_entry  # provenance only, never content
    entry.content = "The tide turns at dawn."
    entry.save()
    assert prefix_now() not in (first, with_entry)
    Adventure.objects.filter(pk=adventure.pk).update(persona="A harbour pilot.")
    assert "harbour pilot" in prefix_now()


def test_appending_keeps_every_earlier_message_and_a_rotation_is_one_cache_break(owner, small):
    adventure = use_profile(build_story(nodes=30, bytes_per_node=350, owner=owner), small)
    previous = None
    rotations = appends = 0
    for index in range(24):
        turn = play(adventure, f"I follow the coast road, mile {index}.")
        messages = turn.prepared.messages
        if previous is not None:
            same = 0
            while same < min(len(previous), len(messages)) and previous[same] == messages[same]:
                same += 1
            assert same >= 1  # the stable prefix never breaks
            if turn.prepared.pending_checkpoint is not None:
                # A rotation: everything after the stable prefix is new, exactly one break.
                assert same == 1
                rotations += 1
            else:
                # An append: all of the previous history is reused byte for byte; only the
                # previous dynamic tail was replaced (by the new node and the new tail).
                assert same == len(previous) - 1
                appends += 1
        previous = messages
    assert rotations >= 2 and appends >= rotations


def test_a_checkpoint_replaces_only_a_continuous_oldest_prefix(owner, small):
    adventure = use_profile(build_story(nodes=80, bytes_per_node=300, owner=owner), small)
    turn = play(adventure, "I open the ledger.")
    checkpoint = turn.prepared.checkpoint
    assert checkpoint is not None
    messages = turn.prepared.messages
    first = content(messages[1])
    assert first["checkpoint"]["covered_through_depth"] == checkpoint.covered_depth
    assert first["checkpoint"]["classification"] == SUMMARY_CLASSIFICATION
    depths = raw_tail_depths(messages)
    assert depths == list(range(checkpoint.covered_depth + 1, turn.node.depth))  # through the head before the turn
    assert depths[-1] == turn.node.parent.depth  # the newest committed node is verbatim
    assert "checkpoint" not in content(messages[3])  # only the first raw-tail message carries it


def test_nothing_is_truncated_and_a_too_large_node_is_refused(owner, small):
    adventure = use_profile(build_story(nodes=10, bytes_per_node=300, owner=owner), small)
    budget = turn_budget(adventure, TURN_TOOLS)
    turn = play(adventure, "I read the letter.")
    verbatim = paths.newest(turn.node.parent, turn.node.depth - turn.prepared.verbatim_from_depth)
    assert [n.depth for n in verbatim] == raw_tail_depths(turn.prepared.messages)
    for node in verbatim:
        assert {"role": "assistant", "content": node.narration} in turn.prepared.messages
    # A committed node larger than the whole budget: the story cannot continue on this
    # model, and nothing is cut to make it fit.
    huge = "word " * budget.hard_input
    Node.objects.filter(pk=turn.node.pk).update(narration=huge)
    before = (Node.objects.count(), ContextCheckpoint.objects.count(), turn.node.pk, turn.node.adventure.version)
    with pytest.raises(HistoryEntryTooLarge) as raised:
        play(adventure, "I go on.")
    assert raised.value.code == "history_entry_too_large"
    fresh = Adventure.objects.get(pk=adventure.pk)
    assert (Node.objects.count(), ContextCheckpoint.objects.count(), fresh.head_id, fresh.version) == before


def test_compose_without_a_checkpoint_over_the_watermark_needs_compaction(owner, small):
    adventure = use_profile(build_story(nodes=60, bytes_per_node=300, owner=owner), small)
    tail = build_dynamic_tail(adventure, head=adventure.head, kind="continue", text="", state={})
    with pytest.raises(NeedsCompaction):
        compose_turn(adventure=adventure, head=adventure.head, dynamic_tail=tail, tools=TURN_TOOLS)


def test_the_continuation_carries_only_the_call_and_a_qualitative_outcome(owner):
    adventure = tree.adventure_create(owner=owner, title="Cont", premise="A wall.")
    tail = build_dynamic_tail(adventure, head=adventure.head, kind="do", text="I climb.", state={})
    composed = compose_turn(adventure=adventure, head=adventure.head, dynamic_tail=tail, tools=TURN_TOOLS)
    call = ToolCall("request_check", {"skill": "athletics", "difficulty": "hard", "reason": "A slick wall"})
    messages = continuation(composed, call, "failure")
    assert messages[: len(composed.messages)] == composed.messages
    assistant, result = messages[-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "request_check"
    assert json.loads(result["content"]) == {"outcome": "failure"}
    for leak in ({"roll": 17, "outcome": "success"}, "17", "critical"):
        with pytest.raises(ValueError):
            continuation(composed, call, leak)


def test_the_next_turn_must_fit_before_a_reply_is_committed(owner, small):
    adventure = use_profile(tree.adventure_create(owner=owner, title="Next", premise="A pier."), small)
    head = adventure.head
    budget = turn_budget(adventure, TURN_TOOLS)
    minimal = build_dynamic_tail(adventure, head=head, kind="continue", text="", state={})
    dynamic = estimate_tokens(dynamic_tail_message(minimal)["content"])
    probe = Node(depth=1, kind="do", player_input="I wait.", narration="")
    room = budget.hard_input - dynamic - MIN_SUMMARY_BYTES - node_tokens(probe)
    fits = {"kind": "do", "player_input": "I wait.", "narration": "n" * room, "state_after": {}}
    assert_next_turn_fits(adventure=adventure, head=head, candidate=fits)
    too_long = {**fits, "narration": "n" * (room + 1)}
    with pytest.raises(HistoryEntryTooLarge) as raised:
        assert_next_turn_fits(adventure=adventure, head=head, candidate=too_long)
    assert "Nothing was saved" in raised.value.message


def test_a_summary_request_is_its_own_single_purpose_conversation(owner):
    adventure = tree.adventure_create(owner=owner, title="Sum", premise="Fog.")
    messages = build_summary_request(previous_summary=None, nodes=[adventure.head], max_chars=400)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "stable_prefix" not in messages[0]["content"]
    request = content(messages[1])["summary_request"]
    assert request == {
        "previous_summary": None,
        "nodes": [{"depth": 0, "input": "", "narration": "Fog."}],
        "max_chars": 400,
    }
