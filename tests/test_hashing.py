"""Canonical JSON and the two checkpoint hashes: exactly the seed's fields, nothing else."""

from __future__ import annotations

import hashlib

import pytest

from checkpoints.context import compact_now
from checkpoints.hashing import canonical_json, source_hash, stable_prefix_hash, summary_digest
from checkpoints.prompt import CHECKPOINT_SCHEMA_VERSION, PROMPT_SCHEMA_VERSION, current_stable_prefix_hash
from checkpoints.store import source_hash_for
from checkpoints.testing import make_profile, use_profile
from stories import paths, tree
from stories.models import Adventure, Node, WorldEntry
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model):
    # No password: hashing one costs ~0.4 s per test, and nobody signs in here.
    return django_user_model.objects.create(username="owner")


def test_canonical_json_is_order_independent_compact_and_utf8():
    assert canonical_json({"b": [1, {"d": 1, "c": 2}], "a": "é"}) == '{"a":"é","b":[1,{"c":2,"d":1}]}'
    assert canonical_json({"x": 1, "y": 2}) == canonical_json({"y": 2, "x": 1})
    with pytest.raises(ValueError):
        canonical_json(float("nan"))


def test_the_stable_prefix_hash_is_sha256_of_the_exact_encoding(owner):
    adventure = tree.adventure_create(owner=owner, title="H", premise="P", persona="Q", style="S")
    from checkpoints.prompt import system_message

    encoding = system_message(adventure)["content"]
    assert stable_prefix_hash(encoding) == hashlib.sha256(encoding.encode()).hexdigest()
    assert current_stable_prefix_hash(adventure) == stable_prefix_hash(encoding)


def test_the_stable_prefix_hash_follows_exactly_its_sources(owner):
    adventure = tree.adventure_create(owner=owner, title="H", premise="P", persona="Q", style="S")
    base = current_stable_prefix_hash(adventure)

    def now() -> str:
        return current_stable_prefix_hash(Adventure.objects.get(pk=adventure.pk))

    # Unrelated to the prefix: the title, a turn, a memory, the world book's disabled entries.
    Adventure.objects.filter(pk=adventure.pk).update(title="Other")
    from checkpoints.testing import play

    play(adventure, "I wait.")
    tree.memory_add(adventure=Adventure.objects.get(pk=adventure.pk), text="A memory.")
    WorldEntry.objects.create(adventure=adventure, keys=["x"], content="Disabled.", enabled=False)
    assert now() == base
    for field, value in [("premise", "P2"), ("persona", "Q2"), ("style", "S2")]:
        Adventure.objects.filter(pk=adventure.pk).update(**{field: value})
        assert now() != base
        Adventure.objects.filter(pk=adventure.pk).update(
            **{field: {"premise": "P", "persona": "Q", "style": "S"}[field]}
        )
        assert now() == base
    entry = WorldEntry.objects.create(adventure=adventure, keys=["tide"], content="Bound.")
    bound = now()
    assert bound != base
    entry.priority = 5
    entry.save()
    assert now() not in (base, bound)


class FakeNode:
    def __init__(self, pk, parent_id, player_input, narration):
        self.pk, self.parent_id, self.player_input, self.narration = pk, parent_id, player_input, narration


def test_the_source_hash_covers_versions_prefix_adventure_and_each_node_field():
    nodes = [FakeNode(1, None, "", "Opening."), FakeNode(2, 1, "I go.", "You go."), FakeNode(3, 2, "Hi.", "Hello.")]
    args = {
        "checkpoint_schema_version": 1,
        "prompt_schema_version": 3,
        "stable_prefix_hash": "a" * 64,
        "adventure_id": 7,
    }
    base = source_hash(nodes=nodes, **args)
    assert source_hash(nodes=list(nodes), **args) == base
    for change in [
        {"checkpoint_schema_version": 2},
        {"prompt_schema_version": 2},
        {"stable_prefix_hash": "b" * 64},
        {"adventure_id": 8},
    ]:
        assert source_hash(nodes=nodes, **{**args, **change}) != base
    for index, field, value in [
        (1, "pk", 9),
        (1, "parent_id", 3),
        (2, "player_input", "Hi!"),
        (0, "narration", "Opening"),
    ]:
        changed = [FakeNode(n.pk, n.parent_id, n.player_input, n.narration) for n in nodes]
        setattr(changed[index], field, value)
        assert source_hash(nodes=changed, **args) != base
    # A prefix of the sequence never hashes like the whole, and fields cannot slide between nodes.
    assert source_hash(nodes=nodes[:2], **args) != base
    slid = [FakeNode(1, None, "", "Opening.You go."), FakeNode(2, 1, "I go.", ""), nodes[2]]
    assert source_hash(nodes=slid, **args) != base


def test_the_source_hash_ignores_everything_the_seed_excludes(owner):
    profile = make_profile("hash-window", context_window=9_000, max_output_tokens=1_024)
    adventure = use_profile(build_story(nodes=40, bytes_per_node=300, owner=owner), profile)
    result = compact_now(adventure)
    checkpoint = result.checkpoint
    assert result.created and checkpoint.source_hash
    assert checkpoint.checkpoint_schema_version == CHECKPOINT_SCHEMA_VERSION
    assert checkpoint.prompt_schema_version == PROMPT_SCHEMA_VERSION

    def recompute() -> str:
        covered = Node.objects.select_related("branch").get(pk=checkpoint.covered_through_id)
        return source_hash_for(
            adventure_id=adventure.pk, covered=covered, stable_prefix_hash=checkpoint.stable_prefix_hash
        )[0]

    assert recompute() == checkpoint.source_hash
    covered = paths.newest(checkpoint.covered_through, 5)
    # Suggestions, deltas, checks, private state, the model's name and prompt sizes: not covered.
    Node.objects.filter(pk__in=[n.pk for n in covered]).update(
        suggestions=["unselected"],
        state_delta=[{"op": "set_flag", "flag": "hidden:x"}],
        checks=[{"roll": 19, "dc": 12}],
        state_after={"flags": {"hidden:x": True}, "relationships": {"Maren": 77}, "inventory": ["knife"], "facts": []},
        model_name="another",
        prompt_bytes=123,
    )
    WorldEntry.objects.create(adventure=adventure, keys=["never"], content="Untriggered.", enabled=False)
    assert recompute() == checkpoint.source_hash
    # The public text is.
    Node.objects.filter(pk=covered[-1].pk).update(narration=covered[-1].narration + " Changed.")
    assert recompute() != checkpoint.source_hash


def test_the_summary_digest_binds_the_summary_to_its_source():
    args = {"summary": "They met.", "key_points": ["met"], "classification": "non_authoritative_narrative"}
    digest = summary_digest(source_hash="a" * 64, **args)
    assert summary_digest(source_hash="b" * 64, **args) != digest
    assert summary_digest(source_hash="a" * 64, **{**args, "summary": "They fought."}) != digest
    assert summary_digest(source_hash="a" * 64, **{**args, "key_points": []}) != digest
