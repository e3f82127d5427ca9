"""Story bundles: a whole story tree as one versioned JSON file (docs/bundle-format.md).

A bundle carries what was chosen, never what is derived. Branches (parent, fork
depth, name), nodes (coordinates, parent, live, content, state, checks), memories
with their anchors, world entries and the head are decisions somebody made, so
they are in the file. Lineages, the version counter, prompt sizes and checkpoints
are computed from those (or are caches) and are rebuilt or left out: a bundle is
a text file anybody can edit, and every derived field shipped beside its source is
a chance for the file to disagree with itself.

Export streams the file in bounded chunks, deterministically: ids in the file are
file-local, numbered densely in a canonical order (branches parents-first, nodes
by depth, then age), so export -> import -> export gives the same bytes.

Import reads the whole file and validates all of it before it writes anything
(`BundleError`: status 400 or 413, the JSON path of the fault, the reason), then
writes every row in one transaction and runs the integrity checker, rolling back
on any violation. Two things a file may get wrong are corrected rather than
refused, each with a warning: which attempt is live at a coordinate (the one the
story continues from wins: the head's path first), and an unknown model profile
name (the default profile is used).
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.text import slugify

from .integrity import check_adventure
from .llm.schema import json_type_name
from .models import Adventure, Branch, Memory, ModelProfile, Node, WorldEntry
from .tree import default_profile

FORMAT = "storytree-bundle"
VERSION = 1

# Export: yield roughly this many bytes at a time; read nodes this many rows per fetch.
EXPORT_CHUNK_BYTES = 64 * 1024
EXPORT_NODE_FETCH = 1000
# Import: rows per INSERT.
WRITE_BATCH = 1000
# JSON values stored as-is (state, delta, checks, suggestions) may nest this deep.
MAX_JSON_NESTING = 32
# Column limits (the model's max_length where it has one).
TITLE_MAX = Adventure._meta.get_field("title").max_length
BRANCH_NAME_MAX = Branch._meta.get_field("name").max_length
MODEL_NAME_MAX = Node._meta.get_field("model_name").max_length
PROFILE_NAME_MAX = ModelProfile._meta.get_field("name").max_length
WORLD_KEY_MAX = 200
SMALLINT_MAX = 32_767
INT_MIN, INT_MAX = -(2**31), 2**31 - 1

NODE_KINDS = tuple(Node.Kind.values)
TOP_FIELDS = ("format", "version", "adventure", "branches", "nodes", "memories", "world_entries", "head")
ADVENTURE_FIELDS = ("title", "premise", "persona", "style", "world_scan_depth", "model_profile")
BRANCH_FIELDS = ("id", "parent", "fork_depth", "name")
NODE_FIELDS = (
    "id",
    "branch",
    "depth",
    "parent",
    "live",
    "kind",
    "input",
    "narration",
    "suggestions",
    "delta",
    "state_after",
    "checks",
    "regenerated_from",
    "model_name",
    "created_at",
)
MEMORY_FIELDS = ("branch", "depth", "text", "pinned", "source_node")
WORLD_ENTRY_FIELDS = ("keys", "content", "enabled", "priority", "always_on")


class BundleError(Exception):
    """A bundle refused. `status` is 400 (a fault in the file) or 413 (too large);
    `path` is the JSON path of the fault (`$.nodes[12].parent`); `reason` says what is wrong."""

    def __init__(self, status: int, path: str, reason: str) -> None:
        self.status = status
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def _fault(path: str, reason: str) -> BundleError:
    return BundleError(400, path, reason)


def _too_large(path: str, reason: str) -> BundleError:
    return BundleError(413, path, reason)


@dataclass(frozen=True)
class Caps:
    """What one import may hold. Lists beyond these are 413; a string beyond its cap is 400."""

    max_bytes: int
    branches: int
    nodes: int
    memories: int
    world_entries: int
    attempts: int
    text_chars: int

    @classmethod
    def from_settings(cls) -> Caps:
        # Branch, node and attempt caps mirror what playing may create, so an imported
        # story is never one the player could not have played.
        return cls(
            max_bytes=getattr(settings, "STORYTREE_IMPORT_MAX_BYTES", 50 * 1024 * 1024),
            branches=getattr(settings, "STORYTREE_MAX_BRANCHES_PER_ADVENTURE", 2_000),
            nodes=getattr(settings, "STORYTREE_MAX_NODES_PER_ADVENTURE", 50_000),
            memories=getattr(settings, "STORYTREE_IMPORT_MAX_MEMORIES", 20_000),
            world_entries=getattr(settings, "STORYTREE_IMPORT_MAX_WORLD_ENTRIES", 5_000),
            attempts=getattr(settings, "STORYTREE_MAX_ATTEMPTS_PER_COORDINATE", 20),
            text_chars=getattr(settings, "STORYTREE_IMPORT_MAX_TEXT_CHARS", 100_000),
        )


# ===================================================================================== export


def export_filename(adventure: Adventure) -> str:
    return f"{slugify(adventure.title) or 'adventure'}.storytree.json"


def _dump(value: Any) -> str:
    # sort_keys makes stored JSON values canonical whatever order the database keeps keys in.
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _timestamp(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


class _Chunker:
    """Collects text and hands it out as UTF-8 chunks of about EXPORT_CHUNK_BYTES."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def add(self, text: str) -> bytes | None:
        self.parts.append(text)
        self.size += len(text)
        if self.size >= EXPORT_CHUNK_BYTES:
            return self.flush()
        return None

    def flush(self) -> bytes:
        out = "".join(self.parts).encode()
        self.parts, self.size = [], 0
        return out


def _branch_order(rows: list[Branch]) -> list[Branch]:
    """Parents before children, otherwise oldest first (ids ascend in creation order, so an
    imported tree, whose ids follow the file, comes out in the same order)."""
    by_parent: dict[int | None, list[Branch]] = defaultdict(list)
    known = {row.pk for row in rows}
    for row in rows:
        by_parent[row.parent_branch_id if row.parent_branch_id in known else None].append(row)
    ordered: list[Branch] = []
    ready = [(row.pk, row) for row in by_parent.pop(None, [])]
    heapq.heapify(ready)
    while ready:
        _pk, branch = heapq.heappop(ready)
        ordered.append(branch)
        for child in by_parent.pop(branch.pk, []):
            heapq.heappush(ready, (child.pk, child))
    return ordered  # a branch in a parent cycle never becomes ready: it is left out


def export_stream(adventure: Adventure) -> Iterator[bytes]:
    """The adventure as a bundle, in chunks of about 64 KB. Nodes are read `EXPORT_NODE_FETCH`
    rows at a time in one query; only an id map (two ints a node) is held, never the file.

    Rows created after the export starts are left out (id watermarks), so a turn committed
    mid-export cannot produce a node whose branch is missing from the file."""
    adventure = Adventure.objects.select_related("model_profile").get(pk=adventure.pk)
    node_rows = Node.objects.filter(adventure_id=adventure.pk)
    watermark = node_rows.aggregate(top=Max("id"))["top"] or 0
    branches = _branch_order(list(Branch.objects.filter(adventure_id=adventure.pk)))
    branch_ids = {branch.pk: index for index, branch in enumerate(branches, start=1)}
    node_rows = node_rows.filter(id__lte=watermark, branch_id__in=list(branch_ids)).order_by("depth", "id")
    node_ids: dict[int, int] = {}

    def node_ref(pk: int | None) -> int | None:
        if pk is None:
            return None
        if pk not in node_ids:
            # Only a regenerated_from pointing forward in the canonical order gets here.
            target = Node.objects.filter(pk=pk).values("depth").first()
            if target is None:
                return None
            earlier = node_rows.filter(Q(depth__lt=target["depth"]) | Q(depth=target["depth"], id__lt=pk))
            return earlier.count() + 1
        return node_ids[pk]

    chunker = _Chunker()
    header = {
        "title": adventure.title,
        "premise": adventure.premise,
        "persona": adventure.persona,
        "style": adventure.style,
        "world_scan_depth": adventure.world_scan_depth,
        "model_profile": adventure.model_profile.name,
    }
    chunker.add(f'{{"format":"{FORMAT}","version":{VERSION},\n"adventure":{_dump(header)},\n"branches":[')
    for index, branch in enumerate(branches):
        record = {
            "id": branch_ids[branch.pk],
            "parent": branch_ids.get(branch.parent_branch_id) if branch.parent_branch_id else None,
            "fork_depth": branch.fork_depth,
            "name": branch.name,
        }
        chunker.add(("\n" if index == 0 else ",\n") + _dump(record))
    yield chunker.flush()

    chunker.add('\n],\n"nodes":[')
    for node in node_rows.iterator(chunk_size=EXPORT_NODE_FETCH):
        file_id = len(node_ids) + 1
        node_ids[node.pk] = file_id
        record = {
            "id": file_id,
            "branch": branch_ids[node.branch_id],
            "depth": node.depth,
            "parent": node_ids.get(node.parent_id) if node.parent_id else None,
            "live": node.live,
            "kind": node.kind,
            "input": node.player_input,
            "narration": node.narration,
            "suggestions": node.suggestions,
            "delta": node.state_delta,
            "state_after": node.state_after,
            "checks": node.checks,
            "regenerated_from": node_ref(node.regenerated_from_id),
            "model_name": node.model_name,
            "created_at": _timestamp(node.created_at),
        }
        chunk = chunker.add(("\n" if file_id == 1 else ",\n") + _dump(record))
        if chunk:
            yield chunk

    chunker.add('\n],\n"memories":[')
    memories = Memory.objects.filter(adventure_id=adventure.pk, branch_id__in=list(branch_ids)).order_by("id")
    for index, memory in enumerate(memories.iterator(chunk_size=EXPORT_NODE_FETCH)):
        record = {
            "branch": branch_ids[memory.branch_id],
            "depth": memory.depth,
            "text": memory.text,
            "pinned": memory.pinned,
            "source_node": node_ids.get(memory.source_node_id) if memory.source_node_id else None,
        }
        chunk = chunker.add(("\n" if index == 0 else ",\n") + _dump(record))
        if chunk:
            yield chunk

    chunker.add('\n],\n"world_entries":[')
    entries = WorldEntry.objects.filter(adventure_id=adventure.pk).order_by("id")
    for index, entry in enumerate(entries.iterator(chunk_size=EXPORT_NODE_FETCH)):
        record = {
            "keys": entry.keys,
            "content": entry.content,
            "enabled": entry.enabled,
            "priority": entry.priority,
            "always_on": entry.always_on,
        }
        chunk = chunker.add(("\n" if index == 0 else ",\n") + _dump(record))
        if chunk:
            yield chunk

    chunker.add(f'\n],\n"head":{_dump(node_ids.get(adventure.head_id))}}}\n')
    yield chunker.flush()


def export_bytes(adventure: Adventure) -> bytes:
    """The whole bundle in memory (tests and small tools; the views and command stream)."""
    return b"".join(export_stream(adventure))


# ================================================================================ reading input


def read_capped(data: bytes | IO[bytes], max_bytes: int) -> bytes:
    """The raw bytes, or 413 as soon as more than `max_bytes` are seen (a file is never read
    past the cap)."""
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
    else:
        size = getattr(data, "size", None)
        if isinstance(size, int) and size > max_bytes:
            raise _too_large("$", _size_reason(size, max_bytes))
        parts, seen = [], 0
        while True:
            part = data.read(min(1024 * 1024, max_bytes + 1 - seen))
            if not part:
                break
            if isinstance(part, str):
                part = part.encode()
            parts.append(part)
            seen += len(part)
            if seen > max_bytes:
                break
        raw = b"".join(parts)
    if len(raw) > max_bytes:
        raise _too_large("$", _size_reason(len(raw), max_bytes))
    return raw


def _size_reason(size: int, max_bytes: int) -> str:
    return f"the file is {'over ' if size == max_bytes + 1 else ''}{size:,} bytes; at most {max_bytes:,} are accepted"


def decode_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _fault("$", f"the file is not UTF-8 text (byte {exc.start})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in one object")
        result[key] = value
    return result


def parse_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no out-of-range numbers, no duplicate keys in an object."""
    try:
        return json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except json.JSONDecodeError as exc:
        raise _fault("$", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise _fault("$", "the JSON is nested too deeply") from None
    except ValueError as exc:
        raise _fault("$", f"not valid JSON: {exc}") from None


# ============================================================================ validation (pure)

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENTIFIER.match(key) else f"{path}[{json.dumps(key)}]"


def _check_text(value: str, path: str, max_chars: int) -> str:
    if len(value) > max_chars:
        raise _fault(path, f"is {len(value):,} characters long; at most {max_chars:,} are allowed")
    if "\x00" in value:
        raise _fault(path, "contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _fault(path, "contains an unpaired surrogate (not valid Unicode)") from None
    return value


def _check_json_value(value: Any, path: str, max_chars: int, depth: int = 0) -> None:
    """Any JSON, bounded: nesting, string lengths, storable text."""
    if depth > MAX_JSON_NESTING:
        raise _fault(path, f"nests more than {MAX_JSON_NESTING} levels deep")
    if isinstance(value, str):
        _check_text(value, path, max_chars)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}[{index}]", max_chars, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            item_path = _key_path(path, key)
            _check_text(key, item_path, max_chars)
            _check_json_value(item, item_path, max_chars, depth + 1)


class _Record:
    """One JSON object of the bundle, read field by field with exact types. Every field
    listed is required and no other field is allowed: a typo is a fault, not a silent loss."""

    def __init__(self, value: Any, path: str, fields: tuple[str, ...], caps: Caps) -> None:
        if not isinstance(value, dict):
            raise _fault(path, f"must be an object, got {json_type_name(value)}")
        for key in value:
            if key not in fields:
                raise _fault(_key_path(path, key), f"unknown field (allowed: {', '.join(fields)})")
        for key in fields:
            if key not in value:
                raise _fault(_key_path(path, key), "is missing (a required field)")
        self.value, self.path, self.caps = value, path, caps

    def at(self, key: str) -> str:
        return _key_path(self.path, key)

    def _typed(self, key: str, kind: type | tuple[type, ...], expected: str, nullable: bool) -> Any:
        value = self.value[key]
        if value is None and nullable:
            return None
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is int)
        if not ok:
            raise _fault(
                self.at(key), f"must be {expected}{' or null' if nullable else ''}, got {json_type_name(value)}"
            )
        return value

    def text(self, key: str, max_chars: int | None = None, *, blank: bool = True, nullable: bool = False) -> Any:
        value = self._typed(key, str, "a string", nullable)
        if value is None:
            return None
        if not blank and not value.strip():
            raise _fault(self.at(key), "must not be blank")
        return _check_text(value, self.at(key), max_chars or self.caps.text_chars)

    def integer(self, key: str, low: int, high: int, *, nullable: bool = False) -> Any:
        value = self._typed(key, int, "a whole number", nullable)
        if value is not None and not low <= value <= high:
            raise _fault(self.at(key), f"{value} is outside {low}..{high}")
        return value

    def flag(self, key: str) -> bool:
        return self._typed(key, bool, "true or false", False)

    def json(self, key: str, kind: type) -> Any:
        value = self._typed(key, kind, "a list" if kind is list else "an object", False)
        _check_json_value(value, self.at(key), self.caps.text_chars)
        return value

    def list_of(self, key: str, item_kind: type, item_name: str) -> list:
        value = self.json(key, list)
        for index, item in enumerate(value):
            if not isinstance(item, item_kind):
                raise _fault(f"{self.at(key)}[{index}]", f"must be {item_name}, got {json_type_name(item)}")
        return value


@dataclass
class _BranchPlan:
    parent: int | None  # index into Plan.branches
    fork_depth: int
    name: str


@dataclass
class _NodePlan:
    branch: int  # index into Plan.branches
    depth: int
    parent: int | None  # index into Plan.nodes, always earlier
    live: bool
    kind: str
    player_input: str
    narration: str
    suggestions: list
    state_delta: list
    state_after: dict
    checks: list
    regenerated_from: int | None  # index into Plan.nodes
    model_name: str
    created_at: datetime | None


@dataclass
class _MemoryPlan:
    branch: int
    depth: int
    text: str
    pinned: bool
    source_node: int | None


@dataclass
class Plan:
    """A validated bundle, references resolved to list indexes. Building it touches no row."""

    title: str
    premise: str
    persona: str
    style: str
    world_scan_depth: int
    profile: ModelProfile | None  # None: the default profile
    branches: list[_BranchPlan]
    nodes: list[_NodePlan]
    memories: list[_MemoryPlan]
    world_entries: list[dict[str, Any]]
    head: int
    warnings: list[str] = field(default_factory=list)


def _list(doc: dict, key: str, cap: int, *, at_least: int = 0) -> list:
    value = doc[key]
    path = f"$.{key}"
    if not isinstance(value, list):
        raise _fault(path, f"must be a list, got {json_type_name(value)}")
    if len(value) > cap:
        raise _too_large(path, f"has {len(value):,} items; at most {cap:,} are accepted")
    if len(value) < at_least:
        raise _fault(path, f"must hold at least {at_least} item{'s' if at_least > 1 else ''}")
    return value


def _ids(items: list, path: str) -> dict[int, int]:
    """{file id: index} for a list of records, refusing a missing, mistyped or repeated id."""
    found: dict[int, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict) or "id" not in item:
            continue  # reported with the record's other faults, in list order
        value = item["id"]
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if value in found:
            raise _fault(f"{path}[{index}].id", f"repeats id {value} (already used by {path}[{found[value]}])")
        found[value] = index
    return found


def plan_bundle(doc: Any, caps: Caps | None = None) -> Plan:
    """Validate a parsed bundle completely. Raises BundleError naming the first fault."""
    caps = caps or Caps.from_settings()
    if not isinstance(doc, dict):
        raise _fault("$", f"a bundle is a JSON object, got {json_type_name(doc)}")
    if doc.get("format") != FORMAT:
        raise _fault("$.format", f'must be "{FORMAT}" (this is not a Storytree bundle)')
    version = doc.get("version")
    if type(version) is not int or version != VERSION:  # True == 1 in Python; not in a bundle
        raise _fault(
            "$.version", f"version {doc.get('version')!r} is not supported; this server reads version {VERSION}"
        )
    top = _Record(doc, "$", TOP_FIELDS, caps)
    adventure = _Record(doc["adventure"], "$.adventure", ADVENTURE_FIELDS, caps)
    title = adventure.text("title", TITLE_MAX, blank=False)
    premise, persona, style = adventure.text("premise"), adventure.text("persona"), adventure.text("style")
    world_scan_depth = adventure.integer("world_scan_depth", 0, SMALLINT_MAX)
    profile_name = adventure.text("model_profile", PROFILE_NAME_MAX, nullable=True)
    raw_branches = _list(doc, "branches", caps.branches, at_least=1)
    raw_nodes = _list(doc, "nodes", caps.nodes, at_least=1)
    raw_memories = _list(doc, "memories", caps.memories)
    raw_entries = _list(doc, "world_entries", caps.world_entries)

    warnings: list[str] = []
    profile = ModelProfile.objects.filter(name=profile_name).first() if profile_name else None
    if profile_name and profile is None:
        warnings.append(
            f"$.adventure.model_profile: no model profile is named {profile_name!r} here; the default profile is used"
        )
    branch_ids = _ids(raw_branches, "$.branches")
    branches = _plan_branches(raw_branches, branch_ids, caps)
    node_ids = _ids(raw_nodes, "$.nodes")
    nodes = _plan_nodes(raw_nodes, node_ids, branch_ids, branches, caps)
    memories = _plan_memories(raw_memories, node_ids, branch_ids, branches, caps)
    world_entries = _plan_world_entries(raw_entries, caps)
    head_id = top.integer("head", INT_MIN, 2**63 - 1)
    head = node_ids.get(head_id)
    if head is None:
        raise _fault("$.head", f"names node {head_id}, which is not listed in $.nodes")
    _resolve_live(nodes, node_ids, head, branches, caps, warnings)
    return Plan(
        title=title,
        premise=premise,
        persona=persona,
        style=style,
        world_scan_depth=world_scan_depth,
        profile=profile,
        branches=branches,
        nodes=nodes,
        memories=memories,
        world_entries=world_entries,
        head=head,
        warnings=warnings,
    )


def _plan_branches(raw: list, ids: dict[int, int], caps: Caps) -> list[_BranchPlan]:
    out: list[_BranchPlan] = []
    for index, item in enumerate(raw):
        path = f"$.branches[{index}]"
        record = _Record(item, path, BRANCH_FIELDS, caps)
        record.integer("id", INT_MIN, 2**63 - 1)
        parent_id = record.integer("parent", INT_MIN, 2**63 - 1, nullable=True)
        fork_depth = record.integer("fork_depth", 0, INT_MAX)
        name = record.text("name", BRANCH_NAME_MAX)
        if index == 0:
            if parent_id is not None:
                raise _fault(record.at("parent"), "the first branch is the main story and has no parent")
            if fork_depth != 0:
                raise _fault(record.at("fork_depth"), "the main story starts at depth 0")
            out.append(_BranchPlan(parent=None, fork_depth=0, name=name))
            continue
        if parent_id is None:
            raise _fault(record.at("parent"), "only the first branch (the main story) has no parent")
        parent = ids.get(parent_id)
        if parent is None:
            raise _fault(record.at("parent"), f"names branch {parent_id}, which is not listed in $.branches")
        if parent >= index:
            raise _fault(
                record.at("parent"),
                f"names branch {parent_id}, listed at $.branches[{parent}]: a parent must be listed before its "
                "children (which also rules out cycles)",
            )
        floor = out[parent].fork_depth + 1
        if fork_depth < floor:
            raise _fault(
                record.at("fork_depth"),
                f"is {fork_depth}, but its parent branch starts at depth {floor - 1}; a fork starts deeper than "
                "the branch it forks from",
            )
        out.append(_BranchPlan(parent=parent, fork_depth=fork_depth, name=name))
    return out


def _created_at(record: _Record) -> datetime | None:
    value = record.text("created_at", 64, nullable=True)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _fault(record.at("created_at"), f"{value!r} is not an ISO 8601 date and time") from None
    if parsed.tzinfo is None:
        raise _fault(record.at("created_at"), f"{value!r} has no time zone (write it in UTC, ending +00:00)")
    return parsed


def _plan_nodes(
    raw: list, ids: dict[int, int], branch_ids: dict[int, int], branches: list[_BranchPlan], caps: Caps
) -> list[_NodePlan]:
    out: list[_NodePlan] = []
    for index, item in enumerate(raw):
        path = f"$.nodes[{index}]"
        record = _Record(item, path, NODE_FIELDS, caps)
        record.integer("id", INT_MIN, 2**63 - 1)
        branch_id = record.integer("branch", INT_MIN, 2**63 - 1)
        branch = branch_ids.get(branch_id)
        if branch is None:
            raise _fault(record.at("branch"), f"names branch {branch_id}, which is not listed in $.branches")
        depth = record.integer("depth", 0, INT_MAX)
        fork_depth = branches[branch].fork_depth
        if depth < fork_depth:
            raise _fault(
                record.at("depth"), f"is {depth}, before its branch's fork at depth {fork_depth}: no path reads it"
            )
        kind = record.text("kind", 20)
        if kind not in NODE_KINDS:
            raise _fault(record.at("kind"), f"{kind!r} is not one of {', '.join(NODE_KINDS)}")
        if (kind == Node.Kind.OPENING) != (depth == 0):
            raise _fault(record.at("kind"), "the opening, and only the opening, is at depth 0")
        parent = _node_parent(record, index, ids, out, branch, depth, branches)
        regenerated_id = record.integer("regenerated_from", INT_MIN, 2**63 - 1, nullable=True)
        regenerated = None
        if regenerated_id is not None:
            regenerated = ids.get(regenerated_id)
            if regenerated is None:
                raise _fault(
                    record.at("regenerated_from"), f"names node {regenerated_id}, which is not listed in $.nodes"
                )
            if regenerated == index:
                raise _fault(record.at("regenerated_from"), "a node cannot be regenerated from itself")
        out.append(
            _NodePlan(
                branch=branch,
                depth=depth,
                parent=parent,
                live=record.flag("live"),
                kind=kind,
                player_input=record.text("input"),
                narration=record.text("narration"),
                suggestions=record.list_of("suggestions", str, "a string"),
                state_delta=record.list_of("delta", dict, "an object"),
                state_after=record.json("state_after", dict),
                checks=record.list_of("checks", dict, "an object"),
                regenerated_from=regenerated,
                model_name=record.text("model_name", MODEL_NAME_MAX),
                created_at=_created_at(record),
            )
        )
    return out


def _node_parent(
    record: _Record,
    index: int,
    ids: dict[int, int],
    earlier: list[_NodePlan],
    branch: int,
    depth: int,
    branches: list[_BranchPlan],
) -> int | None:
    """The parent's index, checked: listed before, one depth up, on this branch's lineage."""
    parent_id = record.integer("parent", INT_MIN, 2**63 - 1, nullable=True)
    at = record.at("parent")
    if depth == 0:
        if parent_id is not None:
            raise _fault(at, "the opening (depth 0) has no parent")
        return None
    if parent_id is None:
        raise _fault(at, f"is null, but only the opening has no parent (this node is at depth {depth})")
    parent = ids.get(parent_id)
    if parent is None:
        raise _fault(at, f"names node {parent_id}, which is not listed in $.nodes")
    if parent >= index:
        raise _fault(
            at,
            f"names node {parent_id}, listed at $.nodes[{parent}]: a parent must be listed before its children "
            "(which also rules out cycles)",
        )
    above = earlier[parent]
    if above.depth != depth - 1:
        raise _fault(
            record.at("depth"),
            f"is {depth}, but its parent (node {parent_id}) is at depth {above.depth}: a child is one deeper",
        )
    # A branch's lineage reads its own nodes down to its fork and its parent branch just above
    # it (a fork always starts deeper than its parent branch, so that is where depth - 1 is).
    own = branches[branch]
    expected = branch if depth > own.fork_depth else own.parent
    if above.branch != expected:
        raise _fault(
            at,
            f"node {parent_id} is on another line of the story: at depth {depth - 1} this node's branch reads the "
            f"branch listed at $.branches[{expected}], not $.branches[{above.branch}]",
        )
    return parent


def _resolve_live(
    nodes: list[_NodePlan], ids: dict[int, int], head: int, branches: list[_BranchPlan], caps: Caps, warnings: list
) -> None:
    """Exactly one live attempt per (branch, depth), correcting the file where it is wrong.

    An attempt something continues from must be the live one (each node's parent is the live
    node one depth up on its path), and so must the head. Two different attempts at one
    coordinate that both must be live cannot be corrected and are refused."""
    file_id = {index: node_id for node_id, index in ids.items()}
    required: dict[tuple[int, int], tuple[int, int | None]] = {}  # coordinate -> (node, the child needing it)
    for index, node in enumerate(nodes):
        if node.parent is None:
            continue
        parent = nodes[node.parent]
        coordinate = (parent.branch, parent.depth)
        have = required.get(coordinate)
        if have is not None and have[0] != node.parent:
            raise _fault(
                f"$.nodes[{index}].parent",
                f"continues from node {file_id[node.parent]}, but $.nodes[{have[1]}] continues from node "
                f"{file_id[have[0]]}, another attempt at the same turn: only the live attempt can be continued",
            )
        required.setdefault(coordinate, (node.parent, index))
    head_node = nodes[head]
    coordinate = (head_node.branch, head_node.depth)
    if coordinate in required and required[coordinate][0] != head:
        raise _fault(
            "$.head",
            f"node {file_id[head]} is an attempt the story does not continue from "
            f"($.nodes[{required[coordinate][1]}] continues from node {file_id[required[coordinate][0]]})",
        )
    required[coordinate] = (head, None)
    on_head_path = set()
    cursor: int | None = head
    while cursor is not None:
        on_head_path.add(cursor)
        cursor = nodes[cursor].parent

    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, node in enumerate(nodes):
        groups[(node.branch, node.depth)].append(index)
    for coordinate, members in groups.items():
        if len(members) > caps.attempts:
            raise _too_large(
                f"$.nodes[{members[caps.attempts]}]",
                f"is attempt {caps.attempts + 1} at one turn; at most {caps.attempts} attempts per turn are accepted",
            )
        flagged = [index for index in members if nodes[index].live]
        if coordinate in required:
            chosen = required[coordinate][0]
            why = "the head's path goes through it" if chosen in on_head_path else "the story continues from it"
        elif flagged:
            chosen, why = flagged[0], "it is the first attempt the file marks live"
        else:
            chosen, why = members[0], "it is the first attempt listed"
        if flagged == [chosen]:
            continue
        for index in members:
            nodes[index].live = index == chosen
        marked = ", ".join(str(file_id[index]) for index in flagged) or "none"
        warnings.append(
            f"$.nodes[{chosen}].live: at branch {_branch_label(coordinate[0], branches)} depth {coordinate[1]} "
            f"the file marked {marked} live; node {file_id[chosen]} is made the live attempt because {why}"
        )


def _branch_label(index: int, branches: list[_BranchPlan]) -> str:
    return f"$.branches[{index}]" + (f" ({branches[index].name})" if branches[index].name else "")


def _plan_memories(
    raw: list, node_ids: dict[int, int], branch_ids: dict[int, int], branches: list[_BranchPlan], caps: Caps
) -> list[_MemoryPlan]:
    out = []
    for index, item in enumerate(raw):
        record = _Record(item, f"$.memories[{index}]", MEMORY_FIELDS, caps)
        branch_id = record.integer("branch", INT_MIN, 2**63 - 1)
        branch = branch_ids.get(branch_id)
        if branch is None:
            raise _fault(record.at("branch"), f"names branch {branch_id}, which is not listed in $.branches")
        depth = record.integer("depth", 0, INT_MAX)
        if depth < branches[branch].fork_depth:
            raise _fault(
                record.at("depth"),
                f"is {depth}, before its branch's fork at depth {branches[branch].fork_depth}: no path reads it",
            )
        source_id = record.integer("source_node", INT_MIN, 2**63 - 1, nullable=True)
        source = None
        if source_id is not None:
            source = node_ids.get(source_id)
            if source is None:
                raise _fault(record.at("source_node"), f"names node {source_id}, which is not listed in $.nodes")
        out.append(
            _MemoryPlan(
                branch=branch,
                depth=depth,
                text=record.text("text", blank=False),
                pinned=record.flag("pinned"),
                source_node=source,
            )
        )
    return out


def _plan_world_entries(raw: list, caps: Caps) -> list[dict[str, Any]]:
    out = []
    for index, item in enumerate(raw):
        record = _Record(item, f"$.world_entries[{index}]", WORLD_ENTRY_FIELDS, caps)
        keys = record.list_of("keys", str, "a string")
        for position, key in enumerate(keys):
            _check_text(key, f"{record.at('keys')}[{position}]", WORLD_KEY_MAX)
        out.append(
            {
                "keys": keys,
                "content": record.text("content"),
                "enabled": record.flag("enabled"),
                "priority": record.integer("priority", INT_MIN, INT_MAX),
                "always_on": record.flag("always_on"),
            }
        )
    return out


# ================================================================================== writing


def _lineage(branch_id: int, parent_lineage: list | None, fork_depth: int) -> list:
    """The same lineage `stories.tree` computes at a fork: this branch unbounded, the parent
    capped one below the fork, then the parent's ancestors as they were."""
    if parent_lineage is None:
        return [[branch_id, None]]
    return [[branch_id, None], [parent_lineage[0][0], fork_depth - 1], *parent_lineage[1:]]


def _created_pks(rows: list) -> list[int]:
    pks = [row.pk for row in rows]
    if any(pk is None for pk in pks):
        raise RuntimeError("bulk_create did not return ids on this database")
    return pks


def _set_node_links(plan: Plan, pks: list[int]) -> None:
    """Parents, regeneration sources and creation times, which the INSERT could not carry
    (a parent's id exists only once its batch is written; created_at is stamped on insert)."""
    table = connection.ops.quote_name(Node._meta.db_table)
    created = Node._meta.get_field("created_at")
    columns = ", ".join(f"{connection.ops.quote_name(name)} = %s" for name in ("parent_id", "regenerated_from_id"))
    now = timezone.now()
    rows = [
        (
            pks[node.parent] if node.parent is not None else None,
            pks[node.regenerated_from] if node.regenerated_from is not None else None,
            created.get_db_prep_value(node.created_at or now, connection),
            pks[index],
        )
        for index, node in enumerate(plan.nodes)
    ]
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET {columns}, {connection.ops.quote_name('created_at')} = %s "
            f"WHERE {connection.ops.quote_name('id')} = %s",
            rows,
        )


def write_plan(plan: Plan, *, owner) -> Adventure:
    """Write a validated plan in one transaction; roll back (400) if the result violates an
    invariant of the tree. Sets `adventure.import_warnings`."""
    with transaction.atomic():
        adventure = Adventure.objects.create(
            owner=owner,
            title=plan.title,
            premise=plan.premise,
            persona=plan.persona,
            style=plan.style,
            world_scan_depth=plan.world_scan_depth,
            model_profile=plan.profile or default_profile(),
            version=1,
            last_played_at=timezone.now(),
        )
        branch_rows = Branch.objects.bulk_create(
            [Branch(adventure=adventure, fork_depth=b.fork_depth, name=b.name, lineage=[]) for b in plan.branches],
            batch_size=WRITE_BATCH,
        )
        branch_pks = _created_pks(branch_rows)
        for row, branch in zip(branch_rows, plan.branches, strict=True):
            parent = branch_rows[branch.parent] if branch.parent is not None else None
            row.parent_branch_id = parent.pk if parent is not None else None
            row.lineage = _lineage(row.pk, parent.lineage if parent is not None else None, row.fork_depth)
        Branch.objects.bulk_update(branch_rows, ["parent_branch", "lineage"], batch_size=WRITE_BATCH)

        node_rows = Node.objects.bulk_create(
            (
                Node(
                    adventure=adventure,
                    branch_id=branch_pks[node.branch],
                    depth=node.depth,
                    live=node.live,
                    kind=node.kind,
                    player_input=node.player_input,
                    narration=node.narration,
                    suggestions=node.suggestions,
                    state_delta=node.state_delta,
                    state_after=node.state_after,
                    checks=node.checks,
                    model_name=node.model_name,
                )
                for node in plan.nodes
            ),
            batch_size=WRITE_BATCH,
        )
        node_pks = _created_pks(node_rows)
        _set_node_links(plan, node_pks)
        Memory.objects.bulk_create(
            (
                Memory(
                    adventure=adventure,
                    branch_id=branch_pks[memory.branch],
                    depth=memory.depth,
                    text=memory.text,
                    pinned=memory.pinned,
                    source_node_id=node_pks[memory.source_node] if memory.source_node is not None else None,
                )
                for memory in plan.memories
            ),
            batch_size=WRITE_BATCH,
        )
        WorldEntry.objects.bulk_create(
            (WorldEntry(adventure=adventure, **entry) for entry in plan.world_entries), batch_size=WRITE_BATCH
        )
        adventure.head_id = node_pks[plan.head]
        adventure.save(update_fields=["head"])

        violations = check_adventure(adventure)
        if violations:
            # Validation should make this unreachable; the checker is the last word all the same.
            raise _fault("$", "the story would break an invariant of the tree: " + "; ".join(map(str, violations)))
    adventure.import_warnings = list(plan.warnings)  # type: ignore[attr-defined]
    return adventure


# ================================================================================ entry points


def import_document(doc: Any, *, owner, warnings: Iterable[str] = ()) -> Adventure:
    """Validate a parsed bundle completely, then write it. `warnings` from an earlier stage
    (a converter) are put before the bundle's own in `adventure.import_warnings`."""
    plan = plan_bundle(doc)
    plan.warnings[:0] = list(warnings)
    return write_plan(plan, owner=owner)


def import_bundle(data: bytes | IO[bytes], *, owner) -> Adventure:
    """Import a bundle file (bytes or a binary file object) as a new adventure of `owner`.

    Raises BundleError (413 over STORYTREE_IMPORT_MAX_BYTES or a list cap, 400 for any fault)
    before writing anything. Corrections made are in `adventure.import_warnings` (a list)."""
    doc = parse_json(decode_text(read_capped(data, Caps.from_settings().max_bytes)))
    return import_document(doc, owner=owner)


def import_any(data: bytes | IO[bytes], *, owner, filename: str | None = None) -> Adventure:
    """Import a Storytree bundle or a SillyTavern chat (.jsonl), whichever `data` is: a name
    ending .jsonl is a chat; otherwise a file that is not one JSON document but whose first
    line is a chat header or message is a chat; everything else is read as a bundle."""
    from . import sillytavern

    text = decode_text(read_capped(data, Caps.from_settings().max_bytes))
    if (filename or "").lower().endswith(".jsonl"):
        return sillytavern.import_chat(text, owner=owner, filename=filename)
    try:
        doc = parse_json(text)
    except BundleError:
        if sillytavern.looks_like_chat(text):
            return sillytavern.import_chat(text, owner=owner, filename=filename)
        raise
    if isinstance(doc, dict) and "format" not in doc and sillytavern.looks_like_chat(text):
        return sillytavern.import_chat(text, owner=owner, filename=filename)
    return import_document(doc, owner=owner)
