"""Bundles (stories/bundles.py): lossless round trips, validation before writing, corrections."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from stories import bundles, paths, tree
from stories.bundles import BundleError, export_bytes, export_stream, import_any, import_bundle
from stories.integrity import Violation, check_adventure
from stories.models import Adventure, Branch, Memory, ModelProfile, Node, WorldEntry

pytestmark = pytest.mark.django_db


# These tests never log in: skip the deliberately slow password hashing of conftest's users.
@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create(username="alice")


def content(text: str, **extra) -> dict:
    return {
        "narration": f"Narration for {text} — «ünïcödé»",
        "suggestions": [f"after {text}", "look around"],
        "state_delta": [{"op": "add_fact", "fact": text}],
        "state_after": {"facts": [text], "relationships": {"Maren": len(text)}, "flags": {"hidden:x": True}},
        "checks": [{"kind": "d20", "roll": len(text) % 20 + 1, "seed": 42, "difficulty": 12}],
        "model_name": "llama-3-8b",
        **extra,
    }


def play(adventure: Adventure, text: str) -> Node:
    return tree.node_append(
        adventure=adventure, kind="do", player_input=text, expected_version=adventure.version, **content(text)
    )


def build_rich(owner) -> Adventure:
    """Every shape the tree can take: retries, a fork from an old attempt, a regeneration,
    a play after undo (a new branch), an empty branch, a named branch, memories on several
    branches and world entries. Built only through the tree functions."""
    profile = ModelProfile.objects.create(
        name="Local llama", provider="openai", base_url="http://127.0.0.1:9/v1", api_key_env="SECRET_KEY_VARIABLE"
    )
    adventure = tree.adventure_create(
        owner=owner,
        title="The Lighthouse: a test!",
        premise="Fog over the harbour.",
        persona="A tired keeper",
        style="Terse, second person.",
        model_profile=profile,
    )
    root_branch = adventure.head.branch
    climb = play(adventure, "climb the stairs")
    lamp = play(adventure, "light the lamp")
    tree.attempt_add(adventure=adventure, tip=lamp, expected_version=adventure.version, **content("lamp again"))
    tree.attempt_add(adventure=adventure, tip=lamp, expected_version=adventure.version, **content("lamp thrice"))
    # Fork from the first (now abandoned) attempt, and continue there.
    seaward = tree.fork_from(adventure=adventure, node=lamp, expected_version=adventure.version)
    tree.branch_rename(branch=seaward, name="Seaward")
    watch = play(adventure, "watch the sea")
    tree.memory_add(adventure=adventure, text="A ship without lights.", source_node=watch)
    # Back to the main line; regenerate the climb (a sibling on a new branch).
    tree.branch_switch(adventure=adventure, branch=root_branch, expected_version=adventure.version)
    regen = tree.sibling_branch_add(
        adventure=adventure,
        target=climb,
        expected_version=adventure.version,
        regenerated_from=climb,
        **content("climb, told again"),
    )
    play(adventure, "after the regeneration")
    play(adventure, "and further")
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.undo(adventure=adventure, expected_version=adventure.version)
    tree.redo(adventure=adventure, expected_version=adventure.version)
    # Played after an undo where the line already continues: this goes on a new branch.
    play(adventure, "a different step")
    tree.branch_for_sibling(adventure=adventure, parent=regen)  # an empty branch (a turn that failed)
    tree.memory_add(adventure=adventure, text="The keeper hates heights.", pinned=True, source_node=climb)
    tree.memory_add(adventure=adventure, text="Hand-written at the head.")
    WorldEntry.objects.create(adventure=adventure, keys=["lamp", "Fresnel"], content="An old lens.", priority=3)
    WorldEntry.objects.create(adventure=adventure, keys=[], content="Always foggy.", always_on=True, enabled=False)
    adventure.refresh_from_db()
    assert check_adventure(adventure) == []
    return adventure


def story_of(node: Node) -> list[tuple]:
    return [
        (
            n.depth,
            n.kind,
            n.player_input,
            n.narration,
            n.suggestions,
            n.state_delta,
            n.state_after,
            n.checks,
            n.model_name,
            n.created_at,
        )
        for n in paths.newest(node, 10_000)
    ]


def tips(adventure: Adventure) -> list[Node | None]:
    """Each branch's tip (live node of greatest depth), branches in creation order."""
    out = []
    for branch in Branch.objects.filter(adventure=adventure).order_by("id"):
        out.append(Node.objects.filter(branch=branch, live=True).order_by("-depth").first())
    return out


def node_rows(adventure: Adventure) -> list[tuple]:
    nodes = list(Node.objects.filter(adventure=adventure).order_by("depth", "id"))
    index = {node.pk: i for i, node in enumerate(nodes)}
    branches = {
        pk: i
        for i, pk in enumerate(Branch.objects.filter(adventure=adventure).order_by("id").values_list("pk", flat=True))
    }
    return [
        (
            branches[n.branch_id],
            n.depth,
            index.get(n.parent_id),
            n.live,
            n.kind,
            n.player_input,
            n.narration,
            n.suggestions,
            n.state_delta,
            n.state_after,
            n.checks,
            index.get(n.regenerated_from_id),
            n.model_name,
            n.created_at,
        )
        for n in nodes
    ]


def test_a_branched_adventure_round_trips_losslessly(user):
    original = build_rich(user)
    first = export_bytes(original)

    imported = import_bundle(first, owner=user)

    assert imported.pk != original.pk and imported.owner == user
    assert imported.import_warnings == []
    assert check_adventure(imported) == []
    assert export_bytes(imported) == first  # byte-identical: ids are file-local and canonical
    for field in ("title", "premise", "persona", "style", "world_scan_depth", "model_profile_id"):
        assert getattr(imported, field) == getattr(original, field)

    # Every branch reads the same story from its tip; the head is at the same place.
    original_tips, imported_tips = tips(original), tips(imported)
    assert len(imported_tips) == len(original_tips) == 5
    assert None in original_tips  # the empty branch came along
    for before, after in zip(original_tips, imported_tips, strict=True):
        assert (before is None) == (after is None)
        if before is not None:
            assert story_of(after) == story_of(before)
    assert story_of(imported.head) == story_of(original.head)
    assert node_rows(imported) == node_rows(original)

    # Branch structure and names; lineage recomputed with the new ids.
    def shape(adventure):
        rows = list(Branch.objects.filter(adventure=adventure).order_by("id"))
        position = {b.pk: i for i, b in enumerate(rows)}
        return [
            (position.get(b.parent_branch_id), b.fork_depth, b.name, [[position[i], cap] for i, cap in b.lineage])
            for b in rows
        ]

    assert shape(imported) == shape(original)

    def memories(adventure):
        rows = node_rows(adventure)
        nodes = list(Node.objects.filter(adventure=adventure).order_by("depth", "id").values_list("pk", flat=True))
        branches = list(Branch.objects.filter(adventure=adventure).order_by("id").values_list("pk", flat=True))
        assert rows
        return [
            (
                branches.index(m.branch_id),
                m.depth,
                m.text,
                m.pinned,
                nodes.index(m.source_node_id) if m.source_node_id else None,
            )
            for m in Memory.objects.filter(adventure=adventure).order_by("id")
        ]

    assert memories(imported) == memories(original) and len(memories(original)) == 3
    entries = lambda a: list(  # noqa: E731
        WorldEntry.objects.filter(adventure=a)
        .order_by("id")
        .values_list("keys", "content", "enabled", "priority", "always_on")
    )
    assert entries(imported) == entries(original) and len(entries(original)) == 2


def test_export_carries_choices_not_derived_data_or_secrets(user):
    adventure = build_rich(user)
    doc = json.loads(export_bytes(adventure))

    assert doc["format"] == "storytree-bundle" and doc["version"] == 1
    assert doc["adventure"]["model_profile"] == "Local llama"
    text = json.dumps(doc)
    for absent in ("SECRET_KEY_VARIABLE", "127.0.0.1:9", "lineage", "prompt_bytes", 'version": 2', "checkpoint"):
        assert absent not in text
    # File-local ids, dense, parents before children.
    assert [b["id"] for b in doc["branches"]] == list(range(1, len(doc["branches"]) + 1))
    assert [n["id"] for n in doc["nodes"]] == list(range(1, len(doc["nodes"]) + 1))
    seen: set[int] = set()
    for node in doc["nodes"]:
        assert node["parent"] is None or node["parent"] in seen
        seen.add(node["id"])
    assert doc["head"] == [n["id"] for n in doc["nodes"] if n["input"] == "a different step"][0]


def test_export_streams_bounded_chunks(user):
    from stories.synthetic import build_story

    adventure = build_story(nodes=400, forks=5, bytes_per_node=2_000, owner=user)
    chunks = list(export_stream(adventure))
    assert len(chunks) > 5
    assert max(len(c) for c in chunks) < bundles.EXPORT_CHUNK_BYTES + 10_000
    doc = json.loads(b"".join(chunks))
    assert len(doc["nodes"]) == 400 and len(doc["branches"]) == 6


def test_a_synthetic_story_round_trips(user):
    from stories.synthetic import build_story

    adventure = build_story(nodes=300, forks=20, bytes_per_node=200, owner=user)
    first = export_bytes(adventure)
    imported = import_bundle(io.BytesIO(first), owner=user)
    assert export_bytes(imported) == first
    assert check_adventure(imported) == []
    assert story_of(imported.head) == story_of(adventure.head)


# --- corrections -------------------------------------------------------------------------------


def exported(user) -> tuple[Adventure, dict]:
    adventure = build_rich(user)
    return adventure, json.loads(export_bytes(adventure))


def encode(doc: dict) -> bytes:
    return json.dumps(doc).encode()


def test_a_wrong_live_flag_on_the_heads_path_is_corrected_with_a_warning(user):
    _adventure, doc = exported(user)
    nodes = {n["id"]: n for n in doc["nodes"]}
    head = nodes[doc["head"]]
    sibling_parent = nodes[head["parent"]]
    # Claim the head's parent is not live, and a made-up sibling attempt is.
    sibling_parent["live"] = False
    impostor = dict(sibling_parent, id=9_999, live=True, narration="An impostor attempt.")
    doc["nodes"].insert(doc["nodes"].index(sibling_parent) + 1, impostor)

    imported = import_bundle(encode(doc), owner=user)

    assert check_adventure(imported) == []
    assert imported.head.live
    warning = " ".join(imported.import_warnings)
    assert "live" in warning and "head's path" in warning
    assert Node.objects.get(adventure=imported, narration="An impostor attempt.").live is False


def test_a_coordinate_with_no_live_attempt_gets_its_first_one(user):
    _adventure, doc = exported(user)
    head_path = set()
    nodes = {n["id"]: n for n in doc["nodes"]}
    cursor = doc["head"]
    while cursor is not None:
        head_path.add(cursor)
        cursor = nodes[cursor]["parent"]
    # An attempt nothing continues from and off the head's path: a leaf.
    parents = {n["parent"] for n in doc["nodes"]}
    leaf = next(n for n in doc["nodes"] if n["live"] and n["id"] not in parents and n["id"] not in head_path)
    leaf["live"] = False

    imported = import_bundle(encode(doc), owner=user)

    assert check_adventure(imported) == []
    assert any("first attempt listed" in w or "first attempt" in w for w in imported.import_warnings)


def test_an_unknown_model_profile_falls_back_to_the_default(user):
    _adventure, doc = exported(user)
    doc["adventure"]["model_profile"] = "A model this server has never heard of"
    imported = import_bundle(encode(doc), owner=user)
    assert imported.model_profile == tree.default_profile()
    assert any("model_profile" in w for w in imported.import_warnings)


# --- refusals ----------------------------------------------------------------------------------


def counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Adventure, Branch, Node, Memory, WorldEntry, ModelProfile))


def refused(data: bytes, user, status: int = 400) -> BundleError:
    before = counts()
    with pytest.raises(BundleError) as caught:
        import_bundle(data, owner=user)
    assert caught.value.status == status, caught.value
    assert counts() == before
    return caught.value


def test_a_missing_branch_is_refused(user):
    _adventure, doc = exported(user)
    doc["nodes"][3]["branch"] = 77
    error = refused(encode(doc), user)
    assert error.path == "$.nodes[3].branch"
    assert "77" in error.reason and "not listed" in error.reason


def test_a_child_listed_before_its_parent_is_refused(user):
    _adventure, doc = exported(user)
    nodes = doc["nodes"]
    position = {n["id"]: i for i, n in enumerate(nodes)}
    child = next(i for i, n in enumerate(nodes) if n["depth"] == 2)
    parent = position[nodes[child]["parent"]]
    nodes[parent], nodes[child] = nodes[child], nodes[parent]
    error = refused(encode(doc), user)
    assert error.path == f"$.nodes[{parent}].parent"
    assert "listed before its children" in error.reason


def test_a_depth_that_is_not_one_below_the_parent_is_refused(user):
    _adventure, doc = exported(user)
    doc["nodes"][-1]["depth"] += 1
    error = refused(encode(doc), user)
    assert error.path == f"$.nodes[{len(doc['nodes']) - 1}].depth"


def test_a_parent_off_the_branchs_lineage_is_refused(user):
    _adventure, doc = exported(user)
    # A node on a fork whose parent is on a sibling line, at the right depth.
    fork = next(b for b in doc["branches"] if b["parent"] is not None and b["name"] == "Seaward")
    child = next(n for n in doc["nodes"] if n["branch"] == fork["id"] and n["depth"] > fork["fork_depth"])
    stranger = next(
        n for n in doc["nodes"] if n["depth"] == child["depth"] - 1 and n["branch"] != fork["id"] and n["live"]
    )
    child["parent"] = stranger["id"]
    error = refused(encode(doc), user)
    assert error.path == f"$.nodes[{doc['nodes'].index(child)}].parent"
    assert "another line" in error.reason


def test_a_lineage_in_the_file_is_not_trusted_it_is_refused_as_unknown(user):
    _adventure, doc = exported(user)
    doc["branches"][1]["lineage"] = [[2, None], [1, 0]]
    error = refused(encode(doc), user)
    assert error.path == "$.branches[1].lineage"


def test_an_unsupported_version_and_bad_json_are_refused(user):
    _adventure, doc = exported(user)
    doc["version"] = 2
    assert refused(encode(doc), user).path == "$.version"
    error = refused(b'{"format": "storytree-bundle", ', user)
    assert error.path == "$" and "not valid JSON" in error.reason
    assert "duplicate key" in refused(b'{"format": 1, "format": 2}', user).reason
    assert refused(b"\xff\xfe", user).reason.startswith("the file is not UTF-8")
    assert "NaN" in refused(b'{"a": NaN}', user).reason


def test_over_the_size_cap_is_413_without_reading_past_it(user, settings):
    _adventure, doc = exported(user)
    data = encode(doc)
    settings.STORYTREE_IMPORT_MAX_BYTES = len(data) - 1
    assert refused(data, user, status=413).path == "$"

    class Endless(io.RawIOBase):
        read_bytes = 0

        def readinto(self, buffer):
            self.read_bytes += len(buffer)
            buffer[:] = b" " * len(buffer)
            return len(buffer)

    endless = Endless()
    with pytest.raises(BundleError) as caught:
        import_bundle(endless, owner=user)
    assert caught.value.status == 413
    assert endless.read_bytes <= len(data) + 1


def test_list_caps_are_413(user, settings):
    _adventure, doc = exported(user)
    settings.STORYTREE_MAX_NODES_PER_ADVENTURE = len(doc["nodes"]) - 1
    error = refused(encode(doc), user, status=413)
    assert error.path == "$.nodes"
    settings.STORYTREE_MAX_NODES_PER_ADVENTURE = 50_000
    settings.STORYTREE_IMPORT_MAX_MEMORIES = 1
    assert refused(encode(doc), user, status=413).path == "$.memories"


def test_an_invariant_violation_after_writing_rolls_everything_back(user, monkeypatch):
    _adventure, doc = exported(user)
    monkeypatch.setattr(bundles, "check_adventure", lambda adventure: [Violation("test", "forced")])
    error = refused(encode(doc), user)
    assert "forced" in error.reason


def test_import_any_tells_a_bundle_from_a_chat(user):
    _adventure, doc = exported(user)
    assert import_any(encode(doc), owner=user).title == doc["adventure"]["title"]
    chat = b'{"user_name": "You", "character_name": "Maren"}\n{"name": "Maren", "is_user": false, "mes": "Hello."}\n'
    adventure = import_any(chat, owner=user)
    assert adventure.premise == "Hello."


# --- the commands ------------------------------------------------------------------------------


def test_the_commands_export_to_stdout_and_import_a_file(user, tmp_path):
    adventure = build_rich(user)
    out = io.StringIO()
    call_command("export_adventure", adventure.pk, stdout=out)
    assert out.getvalue().encode() == export_bytes(adventure)

    path = tmp_path / "story.storytree.json"
    path.write_text(out.getvalue(), encoding="utf-8")
    printed = io.StringIO()
    call_command("import_adventure", str(path), "--owner", "alice", stdout=printed)
    new = Adventure.objects.get(pk=int(printed.getvalue()))
    assert export_bytes(new) == export_bytes(adventure)


def test_the_import_command_names_the_fault(user, tmp_path):
    _adventure, doc = exported(user)
    doc["nodes"][2]["parent"] = 12345
    path = tmp_path / "broken.json"
    path.write_bytes(encode(doc))
    with pytest.raises(CommandError, match=r"\$\.nodes\[2\]\.parent"):
        call_command("import_adventure", str(path), "--owner", "alice")
    with pytest.raises(CommandError, match="No adventure"):
        call_command("export_adventure", 987654)


def test_the_documented_schema_names_exactly_the_fields_the_code_reads_and_writes(user):
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parent.parent / "docs" / "bundle-format.schema.json").read_text())
    props = schema["properties"]
    assert schema["required"] == list(bundles.TOP_FIELDS)
    assert props["adventure"]["required"] == list(bundles.ADVENTURE_FIELDS)
    assert props["branches"]["items"]["required"] == list(bundles.BRANCH_FIELDS)
    assert props["nodes"]["items"]["required"] == list(bundles.NODE_FIELDS)
    assert props["memories"]["items"]["required"] == list(bundles.MEMORY_FIELDS)
    assert props["world_entries"]["items"]["required"] == list(bundles.WORLD_ENTRY_FIELDS)
    assert props["nodes"]["items"]["properties"]["kind"]["enum"] == list(bundles.NODE_KINDS)
    doc = json.loads(export_bytes(build_rich(user)))
    assert set(doc) == set(bundles.TOP_FIELDS)
    assert all(set(n) == set(bundles.NODE_FIELDS) for n in doc["nodes"])
