"""Hidden canaries: exact check records, relationship numbers, hidden flags, the inventory,
untriggered world entries, unselected suggestions, the API key and a provider's response
body never reach a summary request or a summary, and never reach a story prompt where
they are hidden from the model."""

from __future__ import annotations

import json

import pytest

from checkpoints.models import ContextCheckpoint
from checkpoints.testing import make_profile, play, record_builtin, use_profile
from stories import tree
from stories.llm.errors import ModelError
from stories.models import Adventure, WorldEntry
from stories.state import RELATIONSHIP_WORDS
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db

NEVER = ["CHECKCANARY", "987654321", "SUGGESTCANARY", "FLAGCANARY", "WORLDCANARY"]
NOT_IN_SUMMARIES = [*NEVER, "ITEMCANARY", "relationships", "inventory"]


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


def hidden_turn(adventure: Adventure, index: int) -> None:
    """A committed turn carrying private material, as the turn pipeline writes it."""
    adventure = Adventure.objects.get(pk=adventure.pk)
    state = dict(adventure.head.state_after)
    tree.node_append(
        adventure=adventure,
        kind="do",
        player_input=f"I wait by the lantern, hour {index}.",
        narration=f"Hour {index} passes by the lantern; Maren nods to you.",
        suggestions=["SUGGESTCANARY: open the sealed crate"],
        state_delta=[{"op": "set_flag", "flag": "hidden:FLAGCANARY"}],
        state_after={
            **state,
            "flags": {**state.get("flags", {}), "hidden:FLAGCANARY": True, "harbour_open": True},
            "relationships": {"Maren": 87},
            "inventory": ["ITEMCANARY brass key"],
        },
        checks=[
            {
                "skill": "stealth",
                "difficulty": "hard",
                "reason": "CHECKCANARY",
                "roll": 17,
                "dc": 16,
                "seed": 987654321,
                "outcome": "success",
            }
        ],
        expected_version=adventure.version,
    )


def test_private_material_never_reaches_a_summary_request_or_a_summary(owner, monkeypatch):
    profile = make_profile("canary-window", context_window=9_000, max_output_tokens=1_024)
    adventure = tree.adventure_create(owner=owner, title="Port", premise="A smugglers' port.", model_profile=profile)
    WorldEntry.objects.create(adventure=adventure, keys=["lantern"], content="The lantern never goes out.")
    WorldEntry.objects.create(
        adventure=adventure, keys=["zzq-never-said"], content="WORLDCANARY: the mayor is a ghost."
    )
    calls = record_builtin(monkeypatch)
    for index in range(36):
        if index % 3 == 0:
            hidden_turn(adventure, index)
        else:
            play(adventure, f"I walk past the lantern again, turn {index}.")
    summaries = [c for c in calls if c.tools == ["submit_context_summary"]]
    turns = [c for c in calls if c.tools != ["submit_context_summary"]]
    assert len(summaries) >= 3 and turns

    for call in summaries:
        request = json.loads(call.messages[-1]["content"])["summary_request"]
        assert {key for node in request["nodes"] for key in node} <= {"depth", "input", "narration"}
        text = json.dumps(call.messages, ensure_ascii=False) + json.dumps(call.arguments)
        for marker in NOT_IN_SUMMARIES:
            assert marker not in text, marker
    for checkpoint in ContextCheckpoint.objects.all():
        for marker in NOT_IN_SUMMARIES:
            assert marker not in json.dumps(checkpoint.summary_json), marker

    words = {word for _bound, word in RELATIONSHIP_WORDS}
    for call in turns:
        text = json.dumps(call.messages, ensure_ascii=False)
        for marker in NEVER:
            assert marker not in text, marker
        state = json.loads(call.messages[-1]["content"])["dynamic_tail"]["state"]
        # The model sees a word for a relationship, never the number; hidden flags never.
        assert set(state["relationships"].values()) <= words
        assert all(not flag.startswith("hidden:") for flag in state["flags"])
    assert any("ITEMCANARY" in json.dumps(call.messages) for call in turns)  # the visible inventory is there
    assert any("The lantern never goes out." in json.dumps(call.messages) for call in turns)  # triggered entries are


def test_the_api_key_and_provider_bodies_never_travel(owner, fake_openai):
    profile = fake_openai.profile()
    adventure = use_profile(build_story(nodes=80, bytes_per_node=250, owner=owner), profile)
    body = {"error": {"message": "BODYCANARY stack trace: secret=hunter2", "type": "server_error"}}

    # A provider error while compacting: nothing saved, and its body is not repeated.
    fake_openai.add_error(500, body=body)
    with pytest.raises(ModelError) as raised:
        play(adventure, "I wait.")
    assert "BODYCANARY" not in raised.value.message and not ContextCheckpoint.objects.exists()

    # A provider error while narrating, after a successful compaction: the pending
    # checkpoint is dropped with the turn.
    def fail_narration(prepared):
        assert prepared.pending_checkpoint is not None
        fake_openai.add_error(500, body=body)

    with pytest.raises(ModelError):
        play(adventure, "I wait.", before_chat=fail_narration)
    assert not ContextCheckpoint.objects.exists()

    for index in range(12):
        play(adventure, f"I wait, hour {index}.")
    assert ContextCheckpoint.objects.exists()
    for request in fake_openai.requests:
        assert fake_openai.api_key not in request.raw
        assert "BODYCANARY" not in request.raw
        assert request.headers["authorization"] == f"Bearer {fake_openai.api_key}"  # only ever here
    for checkpoint in ContextCheckpoint.objects.all():
        assert "BODYCANARY" not in json.dumps(checkpoint.summary_json)
        assert fake_openai.api_key not in json.dumps(checkpoint.summary_json)
