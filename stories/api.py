"""The JSON API (`/api/v1/`). Thin: parse, look up scoped to the caller, call one domain function.

Errors are always `{"error": {"code": "...", "message": "..."}}` with the right status;
another player's objects answer 404 exactly like missing ones.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404
from django.utils import timezone
from ninja import NinjaAPI, Router, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer, SessionAuth
from pydantic import Field

from . import bundles, paths, throttle, tree, turns, worldbook
from .llm.base import effective_limits, profile_label
from .models import Adventure, ApiToken, Branch, Memory, ModelProfile, Node, TurnJob, WorldEntry
from .state import player_projection
from .streaming import download


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        found = ApiToken.objects.select_related("user").filter(key_hash=ApiToken.hash_key(token)).first()
        if found is None or not found.user.is_active:
            return None
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
        request.user = found.user
        return found.user


class BrowserSession(SessionAuth):
    """The browser's session. CSRF is checked only for a signed-in session, so a call with
    neither a session nor a token is a 401 (not a CSRF 403)."""

    def __call__(self, request: HttpRequest):
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)


api = NinjaAPI(
    title="Storytree API",
    version="1",
    urls_namespace="api",
    auth=[BearerToken(), BrowserSession()],
    docs_url="/docs",
    openapi_url="/openapi.json",
)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def error_response(request: HttpRequest, status: int, code: str, message: str, headers: dict | None = None):
    response = api.create_response(request, {"error": {"code": code, "message": message}}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


@api.exception_handler(ApiError)
def _api_error(request, exc: ApiError):
    return error_response(request, exc.status, exc.code, exc.message, exc.headers)


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    faults = []
    for err in exc.errors[:5]:
        where = ".".join(str(part) for part in err.get("loc", []) if part not in ("body", "payload"))
        faults.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    return error_response(request, 400, "invalid", "; ".join(faults) or "The request is not valid.")


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error_response(request, 413, "too_large", f"The request body is over the {limit:,}-byte limit.")


@api.exception_handler(AuthenticationError)
def _auth_error(request, exc):
    return error_response(request, 401, "unauthorized", "Sign in or send Authorization: Bearer <token>.")


@api.exception_handler(ObjectDoesNotExist)
def _gone(request, exc):
    # A row another request deleted between our lookup and our write (e.g. a branch deleted in another tab).
    return error_response(request, 404, "gone", "That no longer exists: it was deleted, perhaps in another tab.")


@api.exception_handler(Http404)
def _not_found(request, exc):
    return error_response(request, 404, "not_found", "Not found.")


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    return error_response(request, exc.status_code, "error", str(exc))


@api.exception_handler(turns.TurnRefused)
def _turn_refused(request, exc: turns.TurnRefused):
    return error_response(request, exc.status, exc.code, exc.message)


@api.exception_handler(throttle.RateLimited)
def _rate_limited(request, exc: throttle.RateLimited):
    return error_response(request, 429, exc.code, exc.message, {"Retry-After": str(exc.retry_after)})


@api.exception_handler(tree.StaleVersion)
def _stale(request, exc):
    return error_response(request, 409, "stale_version", turns.STALE_MESSAGE)


@api.exception_handler(tree.TreeError)
def _tree_error(request, exc: tree.TreeError):
    return error_response(request, exc.http_status, exc.code, str(exc))


# --- Lookups scoped to the caller (another player's object is a 404) ------------------------


def my_adventure(request: HttpRequest, adventure_id: int) -> Adventure:
    return get_object_or_404(
        Adventure.objects.select_related("head", "model_profile"), pk=adventure_id, owner=request.user
    )


def my_node(request: HttpRequest, node_id: int) -> Node:
    return get_object_or_404(
        Node.objects.select_related("adventure", "branch"), pk=node_id, adventure__owner=request.user
    )


def my_branch(request: HttpRequest, branch_id: int) -> Branch:
    return get_object_or_404(Branch.objects.select_related("adventure"), pk=branch_id, adventure__owner=request.user)


def my_job(request: HttpRequest, job_id: int) -> TurnJob:
    return get_object_or_404(TurnJob.objects.select_related("adventure"), pk=job_id, adventure__owner=request.user)


# --- Schemas ----------------------------------------------------------------------------------


class ErrorBody(Schema):
    code: str
    message: str


class ErrorOut(Schema):
    error: ErrorBody


def responses(ok: dict[int, Any], *errors: int) -> dict[int, Any]:
    """An operation's documented responses: its successes, then the error statuses it can
    answer with (every one as ErrorOut). 400 (bad input), 401 (no session or token) and 403
    (a signed-in browser session without its CSRF token) apply to every operation."""
    return {**ok, **dict.fromkeys(sorted({400, 401, 403, *errors}), ErrorOut)}


class ProfileRef(Schema):
    id: int
    name: str
    label: str


class StateOut(Schema):
    """The player's projection of the story state (hidden flags and numbers never appear)."""

    flags: list[str]
    relationships: dict[str, str]
    inventory: list[str]
    facts: list[str]


class AdventureOut(Schema):
    id: int
    title: str
    head: int | None
    version: int
    length: int
    model_profile: ProfileRef
    created_at: datetime
    last_played_at: datetime | None


class AdventureDetail(AdventureOut):
    premise: str
    persona: str
    style: str
    state: StateOut


class AdventureImported(AdventureDetail):
    warnings: list[str]


class AdventureList(Schema):
    adventures: list[AdventureOut]


class NodeOut(Schema):
    id: int
    depth: int
    kind: str
    input: str
    narration: str
    suggestions: list[str]
    branch: int
    live: bool
    created_at: datetime


class StoryOut(Schema):
    nodes: list[NodeOut]
    has_more: bool
    version: int
    head: int | None


class JobProgress(Schema):
    done: int
    total: int


class JobOut(Schema):
    id: int
    adventure: int
    kind: str
    status: str
    stage: str
    progress: JobProgress
    partial_text: str
    error: ErrorBody | None
    node: int | None
    created_at: datetime


class BranchOut(Schema):
    id: int
    name: str
    label: str
    parent: int | None
    fork_depth: int
    nodes: int
    tip_depth: int | None
    current: bool
    on_head_path: bool


class BranchTree(Schema):
    branches: list[BranchOut]
    head: int | None
    version: int


class BranchRenamed(Schema):
    id: int
    name: str
    label: str


class DeletionOut(Schema):
    branch_ids: list[int]
    labels: list[str]
    rows: dict[str, int]
    bytes: dict[str, int]
    dry_run: bool
    total_rows: int
    total_bytes: int


class BranchDeleted(Schema):
    deleted: DeletionOut


class AttemptsOut(Schema):
    attempts: list[NodeOut]
    tip: bool


class ForkOut(Schema):
    branch: int
    adventure: AdventureDetail


class MemoryOut(Schema):
    id: int
    text: str
    pinned: bool
    branch: int
    depth: int


class MemoryList(Schema):
    memories: list[MemoryOut]


class EntryOut(Schema):
    id: int
    keys: list[str]
    content: str
    priority: int
    always_on: bool
    enabled: bool


class EntryList(Schema):
    world_entries: list[EntryOut]


class ProfileOut(Schema):
    id: int
    name: str
    label: str
    provider: str
    context_window: int
    window_assumed: bool
    max_output_tokens: int
    default: bool


class ProfileList(Schema):
    profiles: list[ProfileOut]


class AdventureIn(Schema):
    title: str = Field(min_length=1, max_length=200)
    premise: str = Field("", max_length=20_000)
    persona: str = Field("", max_length=4_000)
    style: str = Field("", max_length=4_000)
    model_profile_id: int | None = None


class VersionIn(Schema):
    expected_version: int


class TurnIn(Schema):
    kind: str = Field(max_length=20)
    text: str = Field("", max_length=200_000)  # the real cap is checked by turns, with a clear message
    node: int | None = None
    expected_version: int
    idempotency_key: str | None = Field(None, max_length=100)


class BranchPatch(Schema):
    name: str = Field(max_length=200)


class MemoryIn(Schema):
    text: str = Field(min_length=1, max_length=2_000)
    pinned: bool = False


class MemoryPatch(Schema):
    text: str | None = Field(None, min_length=1, max_length=2_000)
    pinned: bool | None = None


class WorldEntryIn(Schema):
    keys: list[str] = Field(default_factory=list, max_length=20)
    content: str = Field(min_length=1, max_length=8_000)
    priority: int = Field(0, ge=-1000, le=1000)
    always_on: bool = False
    enabled: bool = True


class WorldEntryPatch(Schema):
    keys: list[str] | None = Field(None, max_length=20)
    content: str | None = Field(None, min_length=1, max_length=8_000)
    priority: int | None = Field(None, ge=-1000, le=1000)
    always_on: bool | None = None
    enabled: bool | None = None


def node_out(node: Node) -> dict[str, Any]:
    return {
        "id": node.pk,
        "depth": node.depth,
        "kind": node.kind,
        "input": node.player_input,
        "narration": node.narration,
        "suggestions": node.suggestions,
        "branch": node.branch_id,
        "live": node.live,
        "created_at": node.created_at,
    }


def adventure_out(adventure: Adventure, *, full: bool = False) -> dict[str, Any]:
    profile = adventure.model_profile
    data: dict[str, Any] = {
        "id": adventure.pk,
        "title": adventure.title,
        "head": adventure.head_id,
        "version": adventure.version,
        "length": adventure.head.depth if adventure.head else 0,
        "model_profile": {"id": profile.pk, "name": profile.name, "label": profile_label(profile)},
        "created_at": adventure.created_at,
        "last_played_at": adventure.last_played_at,
    }
    if full:
        data.update(
            premise=adventure.premise,
            persona=adventure.persona,
            style=adventure.style,
            state=player_projection(adventure.head.state_after if adventure.head else {}),
        )
    return data


def job_out(job: TurnJob) -> dict[str, Any]:
    return {
        "id": job.pk,
        "adventure": job.adventure_id,
        "kind": job.kind,
        "status": job.status,
        "stage": job.stage,
        "progress": {"done": job.progress_done, "total": job.progress_total},
        "partial_text": job.partial_text,
        "error": {"code": job.error_code, "message": job.error_message} if job.error_code else None,
        "node": job.result_node_id,
        "created_at": job.created_at,
    }


def branch_out(branch: Branch, *, head: Node | None, counts: dict[int, int], tips: dict[int, int]) -> dict[str, Any]:
    return {
        "id": branch.pk,
        "name": branch.name,
        "label": tree.branch_label(branch),
        "parent": branch.parent_branch_id,
        "fork_depth": branch.fork_depth,
        "nodes": counts.get(branch.pk, 0),
        "tip_depth": tips.get(branch.pk),
        "current": head is not None and head.branch_id == branch.pk,
        "on_head_path": head is not None and paths.Path.for_node(head).covers(branch.pk, branch.fork_depth),
    }


def memory_out(memory: Memory) -> dict[str, Any]:
    return {
        "id": memory.pk,
        "text": memory.text,
        "pinned": memory.pinned,
        "branch": memory.branch_id,
        "depth": memory.depth,
    }


def entry_out(entry: WorldEntry) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "keys": entry.keys,
        "content": entry.content,
        "priority": entry.priority,
        "always_on": entry.always_on,
        "enabled": entry.enabled,
    }


# --- Adventures ---------------------------------------------------------------------------------

adventures = Router(tags=["adventures"])


@adventures.get("", response=responses({200: AdventureList}))
def adventure_list(request):
    qs = Adventure.objects.filter(owner=request.user).select_related("head", "model_profile")
    return {"adventures": [adventure_out(a) for a in qs]}


@adventures.post("", response=responses({201: AdventureDetail}))
def adventure_create(request, payload: AdventureIn):
    profile = None
    if payload.model_profile_id is not None:
        profile = ModelProfile.objects.filter(pk=payload.model_profile_id).first()
        if profile is None:
            raise ApiError(400, "invalid", f"model_profile_id: no profile {payload.model_profile_id}.")
    if not payload.title.strip():
        raise ApiError(400, "invalid", "title: a title is required.")
    adventure = tree.adventure_create(
        owner=request.user,
        title=payload.title.strip(),
        premise=payload.premise,
        persona=payload.persona,
        style=payload.style,
        model_profile=profile,
    )
    adventure = my_adventure(request, adventure.pk)
    return Status(201, adventure_out(adventure, full=True))


@adventures.post("/import", response=responses({201: AdventureImported}, 413, 429))
def adventure_import(request):
    """The body is the file itself: a Storytree bundle (JSON) or a SillyTavern chat (JSONL)."""
    throttle.hit(request.user.pk, "imports")
    limit = bundles.Caps.from_settings().max_bytes
    declared = int(request.META.get("CONTENT_LENGTH") or 0)
    if declared > limit:
        raise ApiError(413, "too_large", f"The file is {declared:,} bytes; at most {limit:,} can be imported.")
    try:
        adventure = bundles.import_any(request.body, owner=request.user, filename=request.GET.get("filename"))
    except bundles.BundleError as exc:
        raise ApiError(exc.status, "invalid_bundle" if exc.status == 400 else "too_large", str(exc)) from exc
    body = adventure_out(my_adventure(request, adventure.pk), full=True)
    body["warnings"] = list(getattr(adventure, "import_warnings", []))
    return Status(201, body)


@adventures.get("/{adventure_id}/export", response=responses({200: dict[str, Any]}, 404))
def adventure_export(request, adventure_id: int):
    adventure = my_adventure(request, adventure_id)
    return download(
        request,
        bundles.export_stream(adventure),
        filename=bundles.export_filename(adventure),
        content_type="application/json; charset=utf-8",
    )


@adventures.get("/{adventure_id}", response=responses({200: AdventureDetail}, 404))
def adventure_detail(request, adventure_id: int):
    return adventure_out(my_adventure(request, adventure_id), full=True)


@adventures.delete("/{adventure_id}", response=responses({204: None}, 404))
def adventure_delete(request, adventure_id: int):
    tree.adventure_delete(adventure=my_adventure(request, adventure_id))
    return Status(204, None)


@adventures.get("/{adventure_id}/story", response=responses({200: StoryOut}, 404))
def adventure_story(request, adventure_id: int, before: int | None = None, limit: int = 30):
    adventure = my_adventure(request, adventure_id)
    if not 1 <= limit <= 200:
        raise ApiError(400, "invalid", "limit must be between 1 and 200.")
    before_depth = None
    if before is not None:
        anchor = Node.objects.filter(pk=before, adventure=adventure).first()
        if anchor is None or not paths.on_path(adventure.head, anchor):
            raise ApiError(400, "invalid", "before: that node is not on the current path.")
        before_depth = anchor.depth
    nodes = paths.newest(adventure.head, limit, before_depth=before_depth)
    return {
        "nodes": [node_out(n) for n in nodes],
        "has_more": bool(nodes) and nodes[0].depth > 0,
        "version": adventure.version,
        "head": adventure.head_id,
    }


@adventures.post("/{adventure_id}/turns", response=responses({202: JobOut, 200: JobOut}, 404, 409, 429, 503))
def turn_create(request, adventure_id: int, payload: TurnIn):
    adventure = my_adventure(request, adventure_id)
    node = None
    if payload.node is not None:
        node = Node.objects.filter(pk=payload.node, adventure=adventure).first()
        if node is None:
            raise ApiError(404, "not_found", "node: no such turn in this story.")
    job, created = turns.turn_request(
        adventure=adventure,
        kind=payload.kind,
        text=payload.text,
        node=node,
        expected_version=payload.expected_version,
        idempotency_key=payload.idempotency_key,
    )
    job.refresh_from_db()
    return Status((202 if created else 200), job_out(job))


@adventures.post("/{adventure_id}/undo", response=responses({200: AdventureDetail}, 404, 409))
def adventure_undo(request, adventure_id: int, payload: VersionIn):
    adventure = tree.undo(adventure=my_adventure(request, adventure_id), expected_version=payload.expected_version)
    return adventure_out(my_adventure(request, adventure.pk), full=True)


@adventures.post("/{adventure_id}/redo", response=responses({200: AdventureDetail}, 404, 409))
def adventure_redo(request, adventure_id: int, payload: VersionIn):
    adventure = tree.redo(adventure=my_adventure(request, adventure_id), expected_version=payload.expected_version)
    return adventure_out(my_adventure(request, adventure.pk), full=True)


@adventures.get("/{adventure_id}/branches", response=responses({200: BranchTree}, 404))
def adventure_branches(request, adventure_id: int):
    adventure = my_adventure(request, adventure_id)
    return {"branches": tree.branch_tree(adventure), "head": adventure.head_id, "version": adventure.version}


@adventures.get("/{adventure_id}/context", response=responses({200: dict[str, Any]}, 404))
def adventure_context(request, adventure_id: int):
    from checkpoints.context import context_report

    return context_report(my_adventure(request, adventure_id))


@adventures.get("/{adventure_id}/memories", response=responses({200: MemoryList}, 404))
def memory_list(request, adventure_id: int):
    adventure = my_adventure(request, adventure_id)
    return {"memories": [memory_out(m) for m in paths.memories_on_path(adventure.head)]}


@adventures.post("/{adventure_id}/memories", response=responses({201: MemoryOut}, 404))
def memory_create(request, adventure_id: int, payload: MemoryIn):
    memory = tree.memory_add(
        adventure=my_adventure(request, adventure_id), text=payload.text.strip(), pinned=payload.pinned
    )
    return Status(201, memory_out(memory))


@adventures.get("/{adventure_id}/world-entries", response=responses({200: EntryList}, 404))
def world_entry_list(request, adventure_id: int):
    adventure = my_adventure(request, adventure_id)
    return {"world_entries": [entry_out(e) for e in adventure.world_entries.all()]}


@adventures.post("/{adventure_id}/world-entries", response=responses({201: EntryOut}, 404))
def world_entry_create(request, adventure_id: int, payload: WorldEntryIn):
    adventure = my_adventure(request, adventure_id)
    changes = _clean_entry(payload.dict(), current=WorldEntry(adventure=adventure))
    entry = WorldEntry.objects.create(adventure=adventure, **changes)
    return Status(201, entry_out(entry))


def _clean_entry(data: dict[str, Any], *, current: WorldEntry) -> dict[str, Any]:
    """The fields given, checked by the world book's rules against the entry they change."""
    changes = {k: v for k, v in data.items() if v is not None}
    try:
        if "keys" in changes:
            changes["keys"] = worldbook.clean_keys(changes["keys"])
        worldbook.check_entry(
            keys=changes.get("keys", current.keys or []), always_on=changes.get("always_on", current.always_on)
        )
    except worldbook.InvalidEntry as exc:
        raise ApiError(400, "invalid", f"keys: {exc}") from exc
    return changes


# --- Jobs, branches, nodes, memories, world entries -------------------------------------------

jobs = Router(tags=["jobs"])


@jobs.get("/{job_id}", response=responses({200: JobOut}, 404))
def job_detail(request, job_id: int):
    return job_out(turns.job_refresh(my_job(request, job_id)))


@jobs.post("/{job_id}/cancel", response=responses({200: JobOut}, 404))
def job_cancel(request, job_id: int):
    return job_out(turns.job_cancel(my_job(request, job_id)))


@jobs.post("/{job_id}/retry", response=responses({202: JobOut}, 404, 409, 503))
def job_retry(request, job_id: int):
    return Status(202, job_out(turns.job_retry(my_job(request, job_id))))


branches = Router(tags=["branches"])


@branches.post("/{branch_id}/switch", response=responses({200: AdventureDetail}, 404, 409))
def branch_switch(request, branch_id: int, payload: VersionIn):
    branch = my_branch(request, branch_id)
    adventure = tree.branch_switch(adventure=branch.adventure, branch=branch, expected_version=payload.expected_version)
    return adventure_out(my_adventure(request, adventure.pk), full=True)


@branches.patch("/{branch_id}", response=responses({200: BranchRenamed}, 404))
def branch_rename(request, branch_id: int, payload: BranchPatch):
    branch = tree.branch_rename(branch=my_branch(request, branch_id), name=payload.name)
    return {"id": branch.pk, "name": branch.name, "label": tree.branch_label(branch)}


@branches.delete("/{branch_id}", response=responses({200: BranchDeleted}, 404, 409))
def branch_delete(request, branch_id: int):
    branch = my_branch(request, branch_id)
    report = tree.branch_delete(adventure=branch.adventure, branch=branch)
    return {"deleted": report.as_dict() if hasattr(report, "as_dict") else report}


nodes = Router(tags=["nodes"])


@nodes.get("/{node_id}/attempts", response=responses({200: AttemptsOut}, 404))
def node_attempts(request, node_id: int):
    node = my_node(request, node_id)
    attempts = tree.attempts_at(node)
    return {"attempts": [node_out(a) for a in attempts], "tip": tree.is_tip(node)}


@nodes.post("/{node_id}/switch", response=responses({200: AdventureDetail}, 404, 409))
def node_switch(request, node_id: int, payload: VersionIn):
    node = my_node(request, node_id)
    adventure = tree.attempt_switch(adventure=node.adventure, node=node, expected_version=payload.expected_version)
    return adventure_out(my_adventure(request, adventure.pk), full=True)


@nodes.post("/{node_id}/rewind", response=responses({200: AdventureDetail}, 400, 404, 409))
def node_rewind(request, node_id: int, payload: VersionIn):
    """Continue from here: stand on an earlier turn of the story; the next turn starts a new line."""
    node = my_node(request, node_id)
    adventure = tree.rewind_to(adventure=node.adventure, node=node, expected_version=payload.expected_version)
    return adventure_out(my_adventure(request, adventure.pk), full=True)


@nodes.post("/{node_id}/fork", response=responses({200: ForkOut}, 404, 409))
def node_fork(request, node_id: int, payload: VersionIn):
    node = my_node(request, node_id)
    branch = tree.fork_from(adventure=node.adventure, node=node, expected_version=payload.expected_version)
    adventure = my_adventure(request, node.adventure_id)
    return {"branch": branch.pk, "adventure": adventure_out(adventure, full=True)}


memories = Router(tags=["memories"])


def my_memory(request, memory_id: int) -> Memory:
    return get_object_or_404(Memory, pk=memory_id, adventure__owner=request.user)


@memories.patch("/{memory_id}", response=responses({200: MemoryOut}, 404))
def memory_update(request, memory_id: int, payload: MemoryPatch):
    memory = tree.memory_update(memory=my_memory(request, memory_id), text=payload.text, pinned=payload.pinned)
    return memory_out(memory)


@memories.delete("/{memory_id}", response=responses({204: None}, 404))
def memory_delete(request, memory_id: int):
    tree.memory_delete(memory=my_memory(request, memory_id))
    return Status(204, None)


world_entries = Router(tags=["world entries"])


def my_entry(request, entry_id: int) -> WorldEntry:
    return get_object_or_404(WorldEntry, pk=entry_id, adventure__owner=request.user)


@world_entries.patch("/{entry_id}", response=responses({200: EntryOut}, 404))
def world_entry_update(request, entry_id: int, payload: WorldEntryPatch):
    entry = my_entry(request, entry_id)
    changes = _clean_entry(payload.dict(), current=entry)
    for field, value in changes.items():
        setattr(entry, field, value)
    entry.save(update_fields=[*changes.keys(), "updated_at"])
    return entry_out(entry)


@world_entries.delete("/{entry_id}", response=responses({204: None}, 404))
def world_entry_delete(request, entry_id: int):
    my_entry(request, entry_id).delete()
    return Status(204, None)


api.add_router("/adventures", adventures)
api.add_router("/jobs", jobs)
api.add_router("/branches", branches)
api.add_router("/nodes", nodes)
api.add_router("/memories", memories)
api.add_router("/world-entries", world_entries)


@api.get("/profiles", tags=["profiles"], response=responses({200: ProfileList}))
def profile_list(request):
    out = []
    for profile in ModelProfile.objects.all():
        window, assumed, output = effective_limits(profile)
        out.append(
            {
                "id": profile.pk,
                "name": profile.name,
                "label": profile_label(profile),
                "provider": profile.provider,
                "context_window": window,
                "window_assumed": assumed,
                "max_output_tokens": output,
                "default": profile.is_default,
            }
        )
    return {"profiles": out}
