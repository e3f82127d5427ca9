"""Property: any damaged bundle is refused with a 400 naming where, and writes nothing.

Starts from a valid export of a branched adventure and applies one mutation a
hand-edited file could carry: a dropped field, a dangling reference, a cycle, a
wrong type, an over-long string, a repeated id.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stories.bundles import BundleError, export_bytes, import_bundle
from stories.models import Adventure, Branch, Memory, ModelProfile, Node, WorldEntry
from tests.test_bundles import build_rich

pytestmark = pytest.mark.django_db

TEXT_CAP = 2_000
MISSING = 10**6

INT, TEXT, BOOL, LIST, OBJECT = "int", "text", "bool", "list", "object"
# Field -> (type, nullable, cap for an over-long string).
FIELDS: dict[str, dict[str, tuple[str, bool, int | None]]] = {
    "top": {
        "format": (TEXT, False, None),
        "version": (INT, False, None),
        "adventure": (OBJECT, False, None),
        "branches": (LIST, False, None),
        "nodes": (LIST, False, None),
        "memories": (LIST, False, None),
        "world_entries": (LIST, False, None),
        "head": (INT, False, None),
    },
    "adventure": {
        "title": (TEXT, False, 200),
        "premise": (TEXT, False, TEXT_CAP),
        "persona": (TEXT, False, TEXT_CAP),
        "style": (TEXT, False, TEXT_CAP),
        "world_scan_depth": (INT, False, None),
        "model_profile": (TEXT, True, 100),
    },
    "branches": {
        "id": (INT, False, None),
        "parent": (INT, True, None),
        "fork_depth": (INT, False, None),
        "name": (TEXT, False, 100),
    },
    "nodes": {
        "id": (INT, False, None),
        "branch": (INT, False, None),
        "depth": (INT, False, None),
        "parent": (INT, True, None),
        "live": (BOOL, False, None),
        "kind": (TEXT, False, None),
        "input": (TEXT, False, TEXT_CAP),
        "narration": (TEXT, False, TEXT_CAP),
        "suggestions": (LIST, False, None),
        "delta": (LIST, False, None),
        "state_after": (OBJECT, False, None),
        "checks": (LIST, False, None),
        "regenerated_from": (INT, True, None),
        "model_name": (TEXT, False, 200),
        "created_at": (TEXT, True, None),
    },
    "memories": {
        "branch": (INT, False, None),
        "depth": (INT, False, None),
        "text": (TEXT, False, TEXT_CAP),
        "pinned": (BOOL, False, None),
        "source_node": (INT, True, None),
    },
    "world_entries": {
        "keys": (LIST, False, None),
        "content": (TEXT, False, TEXT_CAP),
        "enabled": (BOOL, False, None),
        "priority": (INT, False, None),
        "always_on": (BOOL, False, None),
    },
}
SAMPLES: dict[str, Any] = {INT: 7, TEXT: "seven", BOOL: True, LIST: [7], OBJECT: {"seven": 7}}


def fits(kind: str, value: Any) -> bool:
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {TEXT: str, BOOL: bool, LIST: list, OBJECT: dict}[kind])


def record(doc: dict, section: str, data) -> tuple[dict, str]:
    """A record of `section` and its JSON path."""
    if section == "top":
        return doc, "$"
    if section == "adventure":
        return doc["adventure"], "$.adventure"
    index = data.draw(st.integers(0, len(doc[section]) - 1), label=f"{section} index")
    return doc[section][index], f"$.{section}[{index}]"


def drop_field(doc: dict, data) -> str:
    section = data.draw(st.sampled_from(sorted(FIELDS)))
    target, path = record(doc, section, data)
    key = data.draw(st.sampled_from(sorted(FIELDS[section])))
    del target[key]
    return f"dropped {path}.{key}"


def wrong_type(doc: dict, data) -> str:
    section = data.draw(st.sampled_from(sorted(FIELDS)))
    target, path = record(doc, section, data)
    key = data.draw(st.sampled_from(sorted(FIELDS[section])))
    kind, nullable, _cap = FIELDS[section][key]
    pool = [v for v in (None, 7, "seven", True, 1.5, [7], {"seven": 7}) if not fits(kind, v)]
    if nullable:
        pool = [v for v in pool if v is not None]
    target[key] = data.draw(st.sampled_from(pool))
    return f"{path}.{key} = {target[key]!r}"


def wrong_item_type(doc: dict, data) -> str:
    node = doc["nodes"][data.draw(st.integers(0, len(doc["nodes"]) - 1))]
    choice = data.draw(st.sampled_from(["suggestions", "delta", "checks", "keys"]))
    if choice == "keys":
        doc["world_entries"][0]["keys"] = ["lamp", 7]
    else:
        node[choice] = [*node[choice], 7 if choice == "suggestions" else "seven"]
    return f"wrong item type in {choice}"


def dangle(doc: dict, data) -> str:
    refs = [("$.head", doc, "head")]
    refs += [(f"$.nodes[{i}]", n, key) for i, n in enumerate(doc["nodes"]) for key in ("branch", "regenerated_from")]
    refs += [(f"$.nodes[{i}]", n, "parent") for i, n in enumerate(doc["nodes"]) if n["depth"] > 0]
    refs += [(f"$.branches[{i}]", b, "parent") for i, b in enumerate(doc["branches"]) if i > 0]
    refs += [(f"$.memories[{i}]", m, key) for i, m in enumerate(doc["memories"]) for key in ("branch", "source_node")]
    path, target, key = data.draw(st.sampled_from(refs))
    target[key] = MISSING
    return f"{path}.{key} dangles"


def cycle(doc: dict, data) -> str:
    if data.draw(st.booleans(), label="branch cycle"):
        index = data.draw(st.integers(1, len(doc["branches"]) - 1))
        later = [b["id"] for b in doc["branches"][index:]]
        doc["branches"][index]["parent"] = data.draw(st.sampled_from(later))
        return f"$.branches[{index}].parent points at itself or a later branch"
    candidates = [i for i, n in enumerate(doc["nodes"]) if n["depth"] > 0]
    index = data.draw(st.sampled_from(candidates))
    later = [n["id"] for n in doc["nodes"][index:]]
    key = data.draw(st.sampled_from(["parent", "regenerated_from"]))
    if key == "regenerated_from":
        doc["nodes"][index][key] = doc["nodes"][index]["id"]
    else:
        doc["nodes"][index][key] = data.draw(st.sampled_from(later))
    return f"$.nodes[{index}].{key} loops"


def huge_string(doc: dict, data) -> str:
    capped = [(section, key, cap) for section, fields in FIELDS.items() for key, (_k, _n, cap) in fields.items() if cap]
    section, key, cap = data.draw(st.sampled_from(capped + [("nodes", "state_after", TEXT_CAP)]))
    target, path = record(doc, section, data)
    huge = "x" * (cap + data.draw(st.integers(1, 50)))
    if key == "state_after":
        target[key] = {**target[key], "facts": [huge]}
    else:
        target[key] = huge
    return f"{path}.{key} is {len(huge)} characters"


def duplicate_id(doc: dict, data) -> str:
    section = data.draw(st.sampled_from(["branches", "nodes"]))
    items = doc[section]
    first = data.draw(st.integers(0, len(items) - 2))
    second = data.draw(st.integers(first + 1, len(items) - 1))
    items[second]["id"] = items[first]["id"]
    return f"$.{section}[{second}].id repeats $.{section}[{first}].id"


MUTATIONS = [drop_field, wrong_type, wrong_item_type, dangle, cycle, huge_string, duplicate_id]


def row_counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Adventure, Branch, Node, Memory, WorldEntry, ModelProfile))


@pytest.fixture
def valid_bundle(django_user_model, settings) -> tuple[Any, dict]:
    settings.STORYTREE_IMPORT_MAX_TEXT_CHARS = TEXT_CAP
    user = django_user_model.objects.create(username="alice")
    return user, json.loads(export_bytes(build_rich(user)))


def test_the_unmutated_bundle_imports(valid_bundle):
    user, doc = valid_bundle
    assert import_bundle(json.dumps(doc).encode(), owner=user).import_warnings == []


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_damaged_bundle_is_refused_and_writes_nothing(valid_bundle, data):
    user, original = valid_bundle
    doc = copy.deepcopy(original)
    mutation = data.draw(st.sampled_from(MUTATIONS), label="mutation")
    described = mutation(doc, data)
    before = row_counts()

    with pytest.raises(BundleError) as caught:
        import_bundle(json.dumps(doc).encode(), owner=user)

    assert caught.value.status == 400, described
    assert caught.value.path.startswith("$"), described
    assert caught.value.reason, described
    assert row_counts() == before, described
