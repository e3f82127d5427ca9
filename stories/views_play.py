"""The play page and everything a player does on it.

Thin views: look the adventure up scoped to the player, parse with a form, call one
domain function (`stories.tree`, `stories.turns`), render. The htmx control flow is kept
in sight, in the same few shapes everywhere:

- A head move (undo, redo, switch an attempt or a branch, fork, a finished turn) answers
  with the whole `#play` region: story, composer, branch rail and every panel are drawn
  again for the new head. Panels therefore refresh on what moved the head (the
  adventure's version), never on the story's length, which a branch switch need not change.
- A turn answers with its job: a `#job` element that polls itself every 400 ms while the
  job runs; the poll answers with the whole `#play` once the node is committed, or with
  the reason and a Retry button when it failed.
- A refusal answers in `#notice` with the status the domain gave (400, 409, 429, 503); a
  stale version says the story moved on in another tab and offers the current head.
- Without htmx every POST redirects back to the play page (Post/Redirect/Get); a refusal
  renders the play page with the notice and the same status.
"""

from __future__ import annotations

import operator
import uuid
from collections import defaultdict
from collections.abc import Callable
from functools import reduce
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from checkpoints.context import context_report

from . import paths, throttle, tree, turns
from .forms import (
    PLAY_KINDS,
    BranchRenameForm,
    MemoryForm,
    PinForm,
    TurnForm,
    VersionForm,
    WorldEntryForm,
    WorldToggleForm,
    first_error,
)
from .llm.base import profile_label
from .models import Adventure, Branch, Memory, Node, TurnJob, WorldEntry
from .state import player_projection

TEMPLATE = "stories/play.html"
# Nodes per window: the newest page, and each earlier page loaded on scrolling up.
WINDOW = 30
STALE_MESSAGE = "This story moved on in another tab."
EDITABLE_KINDS = {Node.Kind.DO, Node.Kind.SAY, Node.Kind.STORY}


# --- Looking things up (always scoped to the player) -------------------------------------------


def _adventure(request: HttpRequest, adventure_id: int) -> Adventure:
    queryset = Adventure.objects.select_related("model_profile", "head__branch")
    return get_object_or_404(queryset, pk=adventure_id, owner=request.user)


def _fresh(adventure: Adventure) -> Adventure:
    """The adventure as it stands now (after a head move)."""
    return Adventure.objects.select_related("model_profile", "head__branch").get(pk=adventure.pk)


def _play_url(adventure: Adventure, **params: Any) -> str:
    url = reverse("play", args=[adventure.pk])
    query = urlencode({key: value for key, value in params.items() if value is not None})
    return f"{url}?{query}" if query else url


# --- What the page draws ------------------------------------------------------------------------


def _annotate_nodes(nodes: list[Node], head: Node) -> None:
    """Attach to each node what its toolbar needs: its attempts (one query for the window,
    the union of `tree.attempts_at` over its nodes), the pager and retry at the tip."""
    playable = [node for node in nodes if node.depth > 0]
    attempts: dict[tuple[int, int], list[Node]] = defaultdict(list)
    if playable:
        union = reduce(operator.or_, (tree.attempts_at(node) for node in playable))
        for attempt in union.defer("state_after", "state_delta", "checks").order_by("id"):
            attempts[(attempt.branch_id, attempt.depth)].append(attempt)
    head_is_tip = head.depth > 0 and tree.is_tip(head)
    for node in nodes:
        here = attempts.get((node.branch_id, node.depth)) or [node]
        index = next((i for i, attempt in enumerate(here) if attempt.pk == node.pk), 0)
        node.is_head = node.pk == head.pk
        node.attempt_count = len(here)
        node.attempt_number = index + 1
        node.other_attempts = [attempt for attempt in here if attempt.pk != node.pk]
        node.at_tip = node.is_head and head_is_tip
        node.prev_attempt = here[index - 1] if node.at_tip and index > 0 else None
        node.next_attempt = here[index + 1] if node.at_tip and index + 1 < len(here) else None
        node.editable = node.kind in EDITABLE_KINDS


def _rail(adventure: Adventure) -> list[tuple[str, dict | None]]:
    """The branch tree from lineage as a flat run of tokens the template turns into nested
    lists (iterative, so a chain of a thousand forks cannot exhaust the recursion limit)."""
    rows = tree.branch_tree(adventure)
    ids = {row["id"] for row in rows}
    children: dict[int | None, list[dict]] = defaultdict(list)
    for row in rows:
        # tree.branch_delete refuses the head's branch and every branch it borrows from:
        # exactly the branches on the head's path, so those offer no delete.
        row["deletable"] = not row["on_head_path"]
        row["switchable"] = not row["current"] and row["tip_depth"] is not None
        children[row["parent"] if row["parent"] in ids else None].append(row)
    tokens: list[tuple[str, dict | None]] = [("open", None)]
    stack = [iter(children[None])]
    while stack:
        row = next(stack[-1], None)
        if row is None:
            stack.pop()
            tokens.append(("close", None))
            if stack:
                tokens.append(("end", None))
            continue
        tokens.append(("item", row))
        if children.get(row["id"]):
            tokens.append(("open", None))
            stack.append(iter(children[row["id"]]))
        else:
            tokens.append(("end", None))
    return tokens


CONTEXT_SEGMENTS = (
    ("stable", "Stable prefix (premise, persona, tools)"),
    ("checkpoint", "Checkpoint (summary of earlier turns)"),
    ("verbatim", "Verbatim history"),
    ("dynamic", "Dynamic tail (input, world entries, memories, state)"),
    ("free", "Free"),
    ("reserved", "Reply and safety reserve"),
)


def _context_panel(adventure: Adventure) -> dict[str, Any]:
    """checkpoints.context.context_report drawn as a bar of the model's whole window."""
    report = context_report(adventure)
    panel: dict[str, Any] = {
        "report": report,
        "error": report.get("error"),
        "model_label": report.get("model", {}).get("label", ""),
        "window": report.get("window"),
        "window_text": f"{report['window']:,}" if report.get("window") else "",
        "window_assumed": report.get("window_assumed"),
    }
    parts = report.get("parts")
    if not parts:
        return panel
    budget = report["budget"]
    over = parts["verbatim_history"] is None
    sizes = {
        "stable": parts["stable_prefix"] + parts["tools"] + parts["framing"],
        "checkpoint": parts["checkpoint"],
        "dynamic": parts["dynamic_tail_reserve"],
        "reserved": report["requested_output"] + parts["continuation_reserve"] + parts["safety_margin"],
    }
    if over:
        # The history does not fit: it will be summarized before the next turn is narrated.
        sizes["verbatim"] = max(0, budget["hard_input"] - sizes["checkpoint"] - sizes["dynamic"])
        sizes["free"] = 0
    else:
        sizes["verbatim"] = parts["verbatim_history"]
        sizes["free"] = max(0, parts["free"])
    total = max(1, report["window"], sum(sizes.values()))
    segments, x = [], 0.0
    for key, label in CONTEXT_SEGMENTS:
        width = sizes[key] * 1000 / total
        segments.append(
            {"key": key, "label": label, "tokens": sizes[key], "tokens_text": f"{sizes[key]:,}", "x": x, "w": width}
        )
        x += width
    panel.update(
        segments=segments,
        over=over,
        needs_compaction=report.get("needs_compaction"),
        checkpoint=report.get("checkpoint"),
        covered=report.get("covered"),
        verbatim=report.get("verbatim"),
        verbatim_tokens_text=f"{report['verbatim']['tokens'] or 0:,}",
        after=report.get("after_compaction"),
        hard_input=budget["hard_input"],
    )
    return panel


def _composer(adventure: Adventure, head: Node, *, text: str = "", kind: str = "do", pending: bool = False) -> dict:
    return {
        "text": text,
        "kind": kind if kind in dict(PLAY_KINDS) else "do",
        "kinds": PLAY_KINDS,
        # A fresh key per drawn composer: a double submit is one turn, a new turn a new key.
        "key": uuid.uuid4().hex,
        "suggestions": head.suggestions if isinstance(head.suggestions, list) else [],
        "pending": pending,
        "max_input": settings.STORYTREE_MAX_INPUT_CHARS,
    }


def _active_job(adventure: Adventure, job_id: str | None = None) -> TurnJob | None:
    jobs = TurnJob.objects.filter(adventure=adventure).exclude(kind=TurnJob.Kind.COMPACT)
    job = None
    if job_id and job_id.isdigit():
        job = jobs.filter(pk=int(job_id)).first()
    if job is None:
        job = jobs.filter(status__in=turns.UNFINISHED).order_by("-created_at").first()
    return turns.job_refresh(job) if job is not None else None


def _play_context(
    adventure: Adventure,
    *,
    before: Node | None = None,
    job: TurnJob | None = None,
    notice: str = "",
    stale: bool = False,
    composer_text: str = "",
    composer_kind: str = "do",
) -> dict[str, Any]:
    adventure = _fresh(adventure)
    head = adventure.head
    if job is None:
        # A redraw after any head move keeps showing (and polling) a turn still being written.
        job = _active_job(adventure)
    window = paths.page(head, WINDOW, before.depth if before is not None else None)
    nodes = window.nodes
    _annotate_nodes(nodes, head)
    pending = job is not None and not job.is_finished
    if job is not None and job.is_finished and not composer_text and job.kind in turns.PLAY_KINDS:
        composer_text, composer_kind = job.player_input, job.kind
    return {
        "adventure": adventure,
        "head": head,
        "model_label": profile_label(adventure.model_profile),
        "nodes": nodes,
        "has_more": window.has_more,
        "older_url": _play_url(adventure, before=nodes[0].pk, v=adventure.version) if window.has_more else "",
        "windowed": before is not None,
        "job": job if job is not None and job.status != TurnJob.Status.DONE else None,
        "composer": _composer(adventure, head, text=composer_text, kind=composer_kind, pending=pending),
        "notice": notice,
        "stale": stale,
        "can_undo": head.depth > 0,
        "can_redo": adventure.redo_tip_id is not None,
        "rail": _rail(adventure),
        "state": player_projection(tree.current_state(adventure)),
        "memories": paths.memories_on_path(head).order_by("-pinned", "-depth", "-id"),
        "world_entries": adventure.world_entries.all(),
        "ctx": _context_panel(adventure),
    }


def _render_play(request: HttpRequest, adventure: Adventure, *, status: int = 200, **kwargs: Any) -> HttpResponse:
    """The whole play region for htmx (replacing `#play`), else the whole page."""
    context = _play_context(adventure, **kwargs)
    if request.htmx:
        response = render(request, f"{TEMPLATE}#play", context, status=status)
        return reswap(retarget(response, "#play"), "outerHTML")
    return render(request, TEMPLATE, context, status=status)


def _moved(request: HttpRequest, adventure: Adventure, anchor: str = "") -> HttpResponse:
    """After a head move: the new state of everything (htmx) or a redirect back (PRG)."""
    if request.htmx:
        return _render_play(request, adventure)
    return redirect(_play_url(adventure) + anchor)


def _refuse(
    request: HttpRequest,
    adventure: Adventure,
    message: str,
    status: int,
    *,
    stale: bool = False,
    composer_text: str = "",
    composer_kind: str = "do",
) -> HttpResponse:
    """A refusal in plain words with its status. Nothing was written."""
    if stale:
        message = STALE_MESSAGE
    if request.htmx:
        context = {"adventure": adventure, "notice": message, "stale": stale}
        response = render(request, f"{TEMPLATE}#notice-body", context, status=status)
        return reswap(retarget(response, "#notice"), "innerHTML")
    return _render_play(
        request,
        adventure,
        status=status,
        notice=message,
        stale=stale,
        composer_text=composer_text,
        composer_kind=composer_kind,
    )


def _tree_call(request: HttpRequest, adventure: Adventure, call: Callable[[], Any]) -> HttpResponse | None:
    """Run one tree operation; a refusal becomes the response, success returns None."""
    try:
        call()
    except tree.StaleVersion:
        return _refuse(request, adventure, STALE_MESSAGE, 409, stale=True)
    except tree.TreeError as exc:
        return _refuse(request, adventure, exc.message, exc.http_status)
    return None


def _version(request: HttpRequest, adventure: Adventure) -> tuple[int | None, HttpResponse | None]:
    form = VersionForm(request.POST)
    if not form.is_valid():
        return None, _refuse(request, adventure, first_error(form), 400)
    return form.cleaned_data["expected_version"], None


# --- The page -----------------------------------------------------------------------------------


@login_required
@require_GET
def play(request: HttpRequest, adventure_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    before_param = request.GET.get("before")
    before = None
    if before_param is not None:
        if not before_param.isdigit():
            return _refuse(request, adventure, "before: give the id of a turn of this story.", 400)
        before = Node.objects.filter(pk=int(before_param), adventure=adventure).first()
        version = request.GET.get("v")
        moved = version is not None and version != str(adventure.version)
        if before is None or moved or not paths.on_path(adventure.head, before):
            if request.htmx:
                return _refuse(request, adventure, STALE_MESSAGE, 409, stale=True)
            before = None  # an old link: show where the story stands now
    if request.htmx and before is not None:
        return _older_page(request, adventure, before)
    job = _active_job(adventure, request.GET.get("job"))
    if request.htmx:
        return _render_play(request, adventure, job=job)
    return render(request, TEMPLATE, _play_context(adventure, before=before, job=job))


def _older_page(request: HttpRequest, adventure: Adventure, before: Node) -> HttpResponse:
    """Earlier turns for scrolling up: they replace the sentinel that asked for them."""
    window = paths.page(adventure.head, WINDOW, before.depth)
    _annotate_nodes(window.nodes, adventure.head)
    context = {
        "adventure": adventure,
        "head": adventure.head,
        "nodes": window.nodes,
        "has_more": window.has_more,
        "older_url": _play_url(adventure, before=window.nodes[0].pk, v=adventure.version) if window.has_more else "",
    }
    return render(request, f"{TEMPLATE}#story-page", context)


# --- Turns and their jobs -----------------------------------------------------------------------


def _job_response(request: HttpRequest, adventure: Adventure, job: TurnJob) -> HttpResponse:
    job.refresh_from_db()  # an eager worker may have finished it inside this request
    job = turns.job_refresh(job)
    if not request.htmx:
        if job.status == TurnJob.Status.DONE:
            return redirect(_play_url(adventure))
        return redirect(_play_url(adventure, job=job.pk) + "#job")
    if job.status == TurnJob.Status.DONE:
        # The committed node replaces the pending one, and every panel follows the new head.
        return _render_play(request, adventure)
    head = _fresh(adventure).head
    context: dict[str, Any] = {"adventure": _fresh(adventure), "job": job}
    if job.is_finished:
        text, kind = (job.player_input, job.kind) if job.kind in turns.PLAY_KINDS else ("", "do")
        context["composer"] = _composer(adventure, head, text=text, kind=kind)
    else:
        context["composer"] = _composer(adventure, head, pending=True)
    response = render(request, f"{TEMPLATE}#job-update", context)
    return reswap(retarget(response, "#job"), "outerHTML")


@login_required
@require_POST
def play_turn(request: HttpRequest, adventure_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    form = TurnForm(request.POST)
    text, kind = request.POST.get("text", ""), request.POST.get("kind", "do")
    if not form.is_valid():
        return _refuse(request, adventure, first_error(form), 400, composer_text=text, composer_kind=kind)
    data = form.cleaned_data
    node = None
    if data["node"]:
        node = Node.objects.filter(pk=data["node"], adventure=adventure).first()
        if node is None:
            raise Http404("No such turn in this story.")
    try:
        job, _created = turns.turn_request(
            adventure=adventure,
            kind=data["kind"],
            text=data["text"],
            node=node,
            expected_version=data["expected_version"],
            idempotency_key=data["idempotency_key"] or None,
        )
    except turns.TurnRefused as exc:
        stale = exc.code == "stale_version"
        return _refuse(request, adventure, exc.message, exc.status, stale=stale, composer_text=text, composer_kind=kind)
    except throttle.RateLimited as exc:
        response = _refuse(request, adventure, exc.message, exc.status, composer_text=text, composer_kind=kind)
        response["Retry-After"] = str(exc.retry_after)
        return response
    return _job_response(request, adventure, job)


@login_required
@require_GET
def play_job(request: HttpRequest, adventure_id: int, job_id: int) -> HttpResponse:
    """The pending turn, polled every 400 ms: its stage, progress and streamed narration."""
    adventure = _adventure(request, adventure_id)
    job = turns.job_refresh(get_object_or_404(TurnJob, pk=job_id, adventure=adventure))
    if request.htmx and not job.is_finished:
        return render(request, f"{TEMPLATE}#job-progress", {"adventure": adventure, "job": job})
    return _job_response(request, adventure, job)


@login_required
@require_POST
def play_job_cancel(request: HttpRequest, adventure_id: int, job_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    job = turns.job_cancel(get_object_or_404(TurnJob, pk=job_id, adventure=adventure))
    return _job_response(request, adventure, job)


@login_required
@require_POST
def play_job_retry(request: HttpRequest, adventure_id: int, job_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    job = get_object_or_404(TurnJob, pk=job_id, adventure=adventure)
    try:
        job = turns.job_retry(job)
    except turns.TurnRefused as exc:
        return _refuse(request, adventure, exc.message, exc.status, stale=exc.code == "stale_version")
    return _job_response(request, adventure, job)


@login_required
@require_http_methods(["GET"])
def node_edit(request: HttpRequest, adventure_id: int, node_id: int) -> HttpResponse:
    """The form to edit a past input; sending it asks for an "edit" turn (a new branch)."""
    adventure = _adventure(request, adventure_id)
    node = get_object_or_404(Node, pk=node_id, adventure=adventure)
    if node.kind not in EDITABLE_KINDS:
        return _refuse(request, adventure, "Only a turn with your own words can be edited.", 400)
    context = {"adventure": adventure, "node": node, "key": uuid.uuid4().hex}
    template = "stories/node_edit.html#edit-form" if request.htmx else "stories/node_edit.html"
    return render(request, template, context)


# --- Moving the head ----------------------------------------------------------------------------


def _head_move(request: HttpRequest, adventure: Adventure, move: Callable[[int], Any]) -> HttpResponse:
    """Parse the version, move the head with it, answer with the new state or the refusal.
    Callers look their objects up first: someone else's object is a 404 whatever the form says."""
    expected, refused = _version(request, adventure)
    if refused is not None:
        return refused
    refused = _tree_call(request, adventure, lambda: move(expected))
    return refused or _moved(request, adventure)


@login_required
@require_POST
def play_undo(request: HttpRequest, adventure_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    return _head_move(request, adventure, lambda v: tree.undo(adventure=adventure, expected_version=v))


@login_required
@require_POST
def play_redo(request: HttpRequest, adventure_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    return _head_move(request, adventure, lambda v: tree.redo(adventure=adventure, expected_version=v))


@login_required
@require_POST
def node_switch(request: HttpRequest, adventure_id: int, node_id: int) -> HttpResponse:
    """Choose another attempt at the tip (the attempt pager)."""
    adventure = _adventure(request, adventure_id)
    node = get_object_or_404(Node, pk=node_id, adventure=adventure)
    return _head_move(
        request, adventure, lambda v: tree.attempt_switch(adventure=adventure, node=node, expected_version=v)
    )


@login_required
@require_POST
def node_fork(request: HttpRequest, adventure_id: int, node_id: int) -> HttpResponse:
    """Give an attempt the story does not tell a branch of its own, and stand on it."""
    adventure = _adventure(request, adventure_id)
    node = get_object_or_404(Node, pk=node_id, adventure=adventure)
    return _head_move(request, adventure, lambda v: tree.fork_from(adventure=adventure, node=node, expected_version=v))


@login_required
@require_POST
def node_rewind(request: HttpRequest, adventure_id: int, node_id: int) -> HttpResponse:
    """Continue from an earlier turn: the head goes back there; the next turn starts a new line."""
    adventure = _adventure(request, adventure_id)
    node = get_object_or_404(Node, pk=node_id, adventure=adventure)
    return _head_move(request, adventure, lambda v: tree.rewind_to(adventure=adventure, node=node, expected_version=v))


@login_required
@require_POST
def branch_switch(request: HttpRequest, adventure_id: int, branch_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    branch = get_object_or_404(Branch, pk=branch_id, adventure=adventure)
    return _head_move(
        request, adventure, lambda v: tree.branch_switch(adventure=adventure, branch=branch, expected_version=v)
    )


# --- Branches: rename, delete -------------------------------------------------------------------


def _rail_response(request: HttpRequest, adventure: Adventure) -> HttpResponse:
    if not request.htmx:
        return redirect(_play_url(adventure) + "#rail")
    adventure = _fresh(adventure)
    context = {"adventure": adventure, "rail": _rail(adventure)}
    response = render(request, f"{TEMPLATE}#rail", context)
    return reswap(retarget(response, "#rail"), "outerHTML")


@login_required
@require_POST
def branch_rename(request: HttpRequest, adventure_id: int, branch_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    branch = get_object_or_404(Branch, pk=branch_id, adventure=adventure)
    form = BranchRenameForm(request.POST)
    if not form.is_valid():
        return _refuse(request, adventure, first_error(form), 400)
    name = None if form.cleaned_data["clear"] else form.cleaned_data["name"]
    refused = _tree_call(request, adventure, lambda: tree.branch_rename(branch=branch, name=name))
    return refused or _rail_response(request, adventure)


@login_required
@require_http_methods(["GET", "POST"])
def branch_delete(request: HttpRequest, adventure_id: int, branch_id: int) -> HttpResponse:
    """A confirmation page listing what goes (the branch and every branch forked from it);
    the head's branch and the branches it borrows from are refused by tree.branch_delete."""
    adventure = _adventure(request, adventure_id)
    branch = get_object_or_404(Branch, pk=branch_id, adventure=adventure)
    label = tree.branch_label(branch)
    try:
        report = tree.branch_delete(adventure=adventure, branch=branch, dry_run=request.method != "POST")
    except tree.TreeError as exc:
        context = {"adventure": adventure, "branch": branch, "label": label, "refusal": exc.message}
        return render(request, "stories/branch_delete.html", context, status=exc.http_status)
    turns_lost = report.rows.get("stories.Node", 0)
    if request.method == "POST":
        others = len(report.branch_ids) - 1
        also = f" and {others} branch{'es' if others != 1 else ''} forked from it" if others else ""
        messages.success(request, f"Deleted “{label}”{also}: {turns_lost} turn{'s' if turns_lost != 1 else ''}.")
        url = _play_url(adventure)
        return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    context = {
        "adventure": adventure,
        "branch": branch,
        "label": label,
        "descendants": report.labels[1:],
        "turns": turns_lost,
        "memories": report.rows.get("stories.Memory", 0),
        "total_bytes": report.total_bytes,
    }
    return render(request, "stories/branch_delete.html", context)


# --- Memories and the world book (no head move: only their panel and the context panel) ---------


def _panel_response(request: HttpRequest, adventure: Adventure, panel: str) -> HttpResponse:
    if not request.htmx:
        return redirect(_play_url(adventure) + f"#{panel}")
    adventure = _fresh(adventure)
    context = {
        "adventure": adventure,
        "memories": paths.memories_on_path(adventure.head).order_by("-pinned", "-depth", "-id"),
        "world_entries": adventure.world_entries.all(),
        # What reaches the prompt changed, so the budget did too.
        "ctx": _context_panel(adventure),
    }
    response = render(request, f"{TEMPLATE}#{panel}-changed", context)
    return reswap(retarget(response, f"#{panel}"), "outerHTML")


@login_required
@require_POST
def memory_add(request: HttpRequest, adventure_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    form = MemoryForm(request.POST)
    if not form.is_valid():
        return _refuse(request, adventure, first_error(form), 400)
    data = form.cleaned_data
    refused = _tree_call(
        request, adventure, lambda: tree.memory_add(adventure=adventure, text=data["text"], pinned=data["pinned"])
    )
    return refused or _panel_response(request, adventure, "memories")


def _memory(adventure: Adventure, memory_id: int) -> Memory:
    return get_object_or_404(Memory, pk=memory_id, adventure=adventure)


@login_required
@require_POST
def memory_pin(request: HttpRequest, adventure_id: int, memory_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    memory = _memory(adventure, memory_id)
    form = PinForm(request.POST)
    form.is_valid()  # a lone optional checkbox: absent means unpin
    tree.memory_update(memory=memory, pinned=form.cleaned_data.get("pinned", False))
    return _panel_response(request, adventure, "memories")


@login_required
@require_POST
def memory_delete(request: HttpRequest, adventure_id: int, memory_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    tree.memory_delete(memory=_memory(adventure, memory_id))
    return _panel_response(request, adventure, "memories")


@login_required
@require_POST
def world_add(request: HttpRequest, adventure_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    form = WorldEntryForm(request.POST, instance=WorldEntry(adventure=adventure))
    if not form.is_valid():
        return _refuse(request, adventure, first_error(form), 400)
    form.save()
    return _panel_response(request, adventure, "world")


@login_required
@require_POST
def world_edit(request: HttpRequest, adventure_id: int, entry_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    entry = get_object_or_404(WorldEntry, pk=entry_id, adventure=adventure)
    form = WorldEntryForm(request.POST, instance=entry)
    if not form.is_valid():
        return _refuse(request, adventure, first_error(form), 400)
    form.save()
    return _panel_response(request, adventure, "world")


@login_required
@require_POST
def world_toggle(request: HttpRequest, adventure_id: int, entry_id: int) -> HttpResponse:
    adventure = _adventure(request, adventure_id)
    entry = get_object_or_404(WorldEntry, pk=entry_id, adventure=adventure)
    form = WorldToggleForm(request.POST)
    form.is_valid()  # a lone optional checkbox: absent means disable
    entry.enabled = form.cleaned_data.get("enabled", False)
    entry.save(update_fields=["enabled", "updated_at"])
    return _panel_response(request, adventure, "world")
