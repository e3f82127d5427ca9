"""The operator's admin for the story tree.

Rules followed here:

- Committed nodes are immutable and the tree changes only through `stories.tree`:
  nodes are view-only, branches and memories cannot be added or deleted here
  (forking and branch deletion have rules the tree module owns), adventures are
  created by players (creation writes the root branch and node).
- Changelists never run a query per row: related rows are joined
  (`list_select_related`) and counts and sizes are correlated subqueries
  annotated onto the page's one query.
- Work that belongs to another module is called, never re-implemented:
  `turns.job_retry`, `integrity.check_adventure`, `bundles.export_stream`,
  `checkpoints.tasks.compact_adventure_task`. Those imports are inside the
  functions that need them, so this admin loads even before they exist.

The operator dashboard (`stories/views_admin.py`) is added to the default
admin site's URLs below, at /admin/dashboard/ (name `admin:storytree_dashboard`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import (
    CharField,
    Count,
    IntegerField,
    JSONField,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    TextField,
    Value,
)
from django.db.models.functions import Coalesce
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from kombu.exceptions import OperationalError as KombuOperationalError

from .models import Adventure, ApiToken, Branch, Memory, ModelProfile, Node, TurnJob, WorldEntry

log = logging.getLogger(__name__)

INTEGRITY_VIOLATIONS_SHOWN = 10
RECENT_COMPACT_JOBS_SHOWN = 10


# --- shared helpers ---------------------------------------------------------------------------


def admin_link(obj, text: str | None = None) -> str:
    """A link to `obj`'s admin change page ("-" for None)."""
    if obj is None:
        return "-"
    opts = obj._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, text if text is not None else str(obj))


def changelist_link(model, text: str, **filters) -> str:
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    query = "&".join(f"{key}={value}" for key, value in filters.items())
    return format_html('<a href="{}?{}">{}</a>', url, query, text)


def excerpt(text: str, length: int = 80) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= length else text[: length - 1] + "…"


def count_of(model, field: str = "adventure") -> Subquery:
    """Correlated COUNT(*) of `model` rows whose `field` is the outer row (0 when none)."""
    rows = model.objects.filter(**{field: OuterRef("pk")}).order_by().values(field).annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(rows, output_field=IntegerField()), Value(0))


def stored_bytes_of(model, field: str = "adventure") -> Coalesce:
    """Correlated sum of the stored size of `model`'s text and JSON columns for the outer row."""
    from .tree import Octets  # the one measure of stored bytes (deletion reports use it too)

    columns = [f.name for f in model._meta.concrete_fields if isinstance(f, CharField | TextField | JSONField)]
    size = sum((Coalesce(Octets(name), Value(0)) for name in columns[1:]), Coalesce(Octets(columns[0]), Value(0)))
    rows = model.objects.filter(**{field: OuterRef("pk")}).order_by().values(field).annotate(b=Sum(size)).values("b")
    return Coalesce(Subquery(rows, output_field=IntegerField()), Value(0))


def human_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{size} B"


def duration_of(job: TurnJob) -> str:
    if job.started_at is None:
        return "-"
    end = job.finished_at or timezone.now()
    seconds = max((end - job.started_at).total_seconds(), 0.0)
    text = f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    return text if job.finished_at else f"{text} (running)"


def progress_of(job: TurnJob) -> str:
    return f"{job.progress_done}/{job.progress_total}" if job.progress_total else "-"


# --- compaction on request --------------------------------------------------------------------


def request_compaction(adventure: Adventure, *, target: Node | None = None) -> tuple[TurnJob | None, str]:
    """Create a compact job for `target` (default: the head) and enqueue it after commit.

    Returns (job, "") or (None, why nothing was queued). One compaction per adventure at a time.
    """
    from checkpoints.tasks import compact_adventure_task

    with transaction.atomic():
        locked = Adventure.objects.select_for_update().get(pk=adventure.pk)
        target_id = target.pk if target is not None else locked.head_id
        if target_id is None:
            return None, "it has no head node"
        busy = TurnJob.objects.filter(
            adventure=locked, kind=TurnJob.Kind.COMPACT, status__in=[TurnJob.Status.QUEUED, TurnJob.Status.RUNNING]
        ).first()
        if busy is not None:
            return None, f"compact job {busy.pk} is already {busy.status}"
        job = TurnJob.objects.create(
            adventure=locked,
            kind=TurnJob.Kind.COMPACT,
            target_node_id=target_id,
            expected_head_id=locked.head_id,
            expected_version=locked.version,
        )

        def send() -> None:
            try:
                compact_adventure_task.delay(job.pk)
            except (KombuOperationalError, redis.RedisError, OSError) as exc:
                # The broker is down: fail the job with a reason instead of leaving it queued forever.
                log.warning("could not enqueue compact job %s: %s", job.pk, exc)
                TurnJob.objects.filter(pk=job.pk, status=TurnJob.Status.QUEUED).update(
                    status=TurnJob.Status.FAILED,
                    stage=TurnJob.Stage.FINISHED,
                    error_code="queue_unavailable",
                    error_message="The task queue is not answering, so nothing was started. Try again in a minute.",
                    finished_at=timezone.now(),
                )

        transaction.on_commit(send)
    job.refresh_from_db()
    return job, ""


def report_compaction(modeladmin: admin.ModelAdmin, request: HttpRequest, adventures: Iterable[Adventure], target_of):
    for adventure in adventures:
        job, why = request_compaction(adventure, target=target_of(adventure))
        if job is None:
            modeladmin.message_user(request, f"“{adventure}”: not compacted, {why}.", messages.WARNING)
        elif job.status == TurnJob.Status.FAILED:
            modeladmin.message_user(
                request, f"“{adventure}”: compact job {job.pk} failed: {job.error_message}", messages.ERROR
            )
        else:
            modeladmin.message_user(
                request, f"“{adventure}”: compact job {job.pk} is {job.get_status_display().lower()}.", messages.SUCCESS
            )


# --- model profiles ---------------------------------------------------------------------------


@admin.register(ModelProfile)
class ModelProfileAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "provider",
        "model_name",
        "base_url",
        "effective_window",
        "requested_output",
        "api_key",
        "is_default",
        "adventure_count",
    ]
    list_filter = ["provider", "is_default", "supports_tools"]
    search_fields = ["name", "model_name", "base_url", "api_key_env"]
    readonly_fields = ["effective_window", "requested_output", "api_key", "created_at"]
    fieldsets = [
        (None, {"fields": ["name", "provider", "is_default", "base_url", "model_name"]}),
        ("Credentials", {"fields": ["api_key_env", "api_key"]}),
        (
            "Limits",
            {
                "fields": [
                    "context_window",
                    "max_output_tokens",
                    "effective_window",
                    "requested_output",
                    "temperature",
                    "timeout_seconds",
                    "supports_tools",
                ]
            },
        ),
        (None, {"fields": ["created_at"]}),
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(n_adventures=count_of(Adventure, "model_profile"))

    @admin.display(description="Effective window")
    def effective_window(self, obj: ModelProfile) -> str:
        from .llm.base import effective_limits

        window, assumed, _ = effective_limits(obj)
        if assumed:
            return format_html(
                '<span class="storytree-warning" title="{}">⚠ {} tokens (assumed)</span>',
                "No context window is set: 16,384 tokens are assumed. Set the model's real window.",
                f"{window:,}",
            )
        return f"{window:,} tokens"

    @admin.display(description="Requested output")
    def requested_output(self, obj: ModelProfile) -> str:
        from .llm.base import effective_limits

        return f"{effective_limits(obj)[2]:,} tokens"

    @admin.display(description="API key")
    def api_key(self, obj: ModelProfile) -> str:
        """Only whether the named variable is set in this process's environment; never the key."""
        if not obj.api_key_env:
            return "none" if obj.is_builtin else "no variable named"
        from .llm.base import api_key_for

        state = "set" if api_key_for(obj) else "missing"
        return format_html("<code>{}</code> {}", obj.api_key_env, state)

    @admin.display(description="Adventures", ordering="n_adventures")
    def adventure_count(self, obj: ModelProfile) -> int:
        return obj.n_adventures


# --- adventures -------------------------------------------------------------------------------


@admin.register(Adventure)
class AdventureAdmin(admin.ModelAdmin):
    list_display = [
        "title",
        "owner",
        "length",
        "branch_count",
        "head_link",
        "model_profile",
        "last_played_at",
        "storage",
    ]
    list_select_related = ["owner", "head", "model_profile"]
    list_filter = ["model_profile", "last_played_at", "created_at"]
    search_fields = ["title", "owner__username", "=id"]
    date_hierarchy = "created_at"
    actions = ["compact_head_branch", "check_integrity", "export_bundle"]
    fieldsets = [
        (None, {"fields": ["title", "owner", "model_profile", "premise", "persona", "style", "world_scan_depth"]}),
        ("Tree", {"fields": ["head", "redo_tip", "version", "created_at", "last_played_at", "size", "related"]}),
        ("Compaction", {"fields": ["compact_jobs"]}),
    ]
    readonly_fields = [
        "owner",
        "head",
        "redo_tip",
        "version",
        "created_at",
        "last_played_at",
        "size",
        "related",
        "compact_jobs",
    ]

    def get_queryset(self, request):
        from checkpoints.models import ContextCheckpoint

        return (
            super()
            .get_queryset(request)
            .annotate(
                n_branches=count_of(Branch),
                n_nodes=count_of(Node),
                storage_bytes=stored_bytes_of(Node)
                + stored_bytes_of(Memory)
                + stored_bytes_of(WorldEntry)
                + stored_bytes_of(ContextCheckpoint)
                + stored_bytes_of(TurnJob),
            )
        )

    def has_add_permission(self, request):
        # Creating an adventure writes its root branch and node (tree.adventure_create): players do that.
        return False

    def delete_model(self, request, obj):
        from .tree import adventure_delete

        adventure_delete(adventure=obj)

    def delete_queryset(self, request, queryset):
        from .tree import adventure_delete

        for adventure in queryset:
            adventure_delete(adventure=adventure)

    # columns

    @admin.display(description="Length", ordering="head__depth")
    def length(self, obj: Adventure) -> int | None:
        """Turns on the head's path: the head's depth."""
        return obj.head.depth if obj.head_id else None

    @admin.display(description="Branches", ordering="n_branches")
    def branch_count(self, obj: Adventure) -> int:
        return obj.n_branches

    @admin.display(description="Head", ordering="head")
    def head_link(self, obj: Adventure) -> str:
        return admin_link(obj.head)

    @admin.display(description="Stored bytes", ordering="storage_bytes")
    def storage(self, obj: Adventure) -> str:
        return human_bytes(obj.storage_bytes)

    # change page

    @admin.display(description="Size")
    def size(self, obj: Adventure) -> str:
        return (
            f"{obj.n_nodes:,} nodes on {obj.n_branches:,} branches; {human_bytes(obj.storage_bytes)} stored "
            "(node text and state, memories, world entries, checkpoint summaries, job logs)"
        )

    @admin.display(description="Rows")
    def related(self, obj: Adventure) -> str:
        from checkpoints.models import ContextCheckpoint

        links = [
            changelist_link(Branch, "branches", adventure__id__exact=obj.pk),
            changelist_link(Node, "nodes", adventure__id__exact=obj.pk),
            changelist_link(Memory, "memories", adventure__id__exact=obj.pk),
            changelist_link(WorldEntry, "world entries", adventure__id__exact=obj.pk),
            changelist_link(TurnJob, "jobs", adventure__id__exact=obj.pk),
            changelist_link(ContextCheckpoint, "checkpoints", adventure__id__exact=obj.pk),
        ]
        return format_html_join(" · ", "{}", ((link,) for link in links))

    @admin.display(description="Recent compact jobs")
    def compact_jobs(self, obj: Adventure) -> str:
        jobs = TurnJob.objects.filter(adventure=obj, kind=TurnJob.Kind.COMPACT).order_by("-created_at")[
            :RECENT_COMPACT_JOBS_SHOWN
        ]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    admin_link(job, f"#{job.pk}"),
                    job.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    job.get_status_display(),
                    job.get_stage_display(),
                    progress_of(job),
                    duration_of(job),
                    excerpt(" ".join(filter(None, [job.error_code, job.error_message])), 120),
                )
                for job in jobs
            ),
        )
        if not rows:
            return "None yet. Use the “Compact head branch now” action on the adventure list."
        return format_html(
            '<table class="storytree-jobs"><thead><tr><th>Job</th><th>Created</th><th>Status</th><th>Stage</th>'
            "<th>Progress (chunks)</th><th>Duration</th><th>Error</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # actions

    @admin.action(description="Compact head branch now")
    def compact_head_branch(self, request, queryset: QuerySet[Adventure]):
        report_compaction(self, request, queryset, target_of=lambda adventure: None)

    @admin.action(description="Check integrity")
    def check_integrity(self, request, queryset: QuerySet[Adventure]):
        from .integrity import check_adventure

        for adventure in queryset:
            violations = check_adventure(adventure)
            if not violations:
                self.message_user(request, f"“{adventure}”: integrity OK.", messages.SUCCESS)
                continue
            shown = "; ".join(str(v) for v in violations[:INTEGRITY_VIOLATIONS_SHOWN])
            more = len(violations) - INTEGRITY_VIOLATIONS_SHOWN
            suffix = f" (and {more} more; run manage.py check_story_integrity {adventure.pk})" if more > 0 else ""
            self.message_user(
                request, f"“{adventure}”: {len(violations)} violation(s): {shown}{suffix}", messages.ERROR
            )

    @admin.action(description="Export bundle (one adventure)")
    def export_bundle(self, request, queryset: QuerySet[Adventure]):
        adventures = list(queryset[:2])
        if len(adventures) != 1:
            self.message_user(request, "Select exactly one adventure to export.", messages.WARNING)
            return None
        from .bundles import export_stream

        adventure = adventures[0]
        response = StreamingHttpResponse(export_stream(adventure), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="adventure-{adventure.pk}.json"'
        return response


# --- branches ---------------------------------------------------------------------------------


@admin.register(Branch)
class BranchAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "label",
        "adventure",
        "parent_branch",
        "fork_depth",
        "node_count",
        "lineage_size",
        "created_at",
    ]
    list_display_links = ["id", "label"]
    list_select_related = ["adventure", "parent_branch"]
    list_filter = [("parent_branch", admin.EmptyFieldListFilter), "created_at"]
    search_fields = ["name", "adventure__title", "=id", "=adventure__id"]
    fields = ["adventure", "name", "parent_branch", "fork_depth", "lineage_view", "node_count", "created_at"]
    readonly_fields = ["adventure", "parent_branch", "fork_depth", "lineage_view", "node_count", "created_at"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(n_nodes=count_of(Node, "branch"))

    def has_add_permission(self, request):
        return False  # branches are made by forking (stories.tree)

    def has_delete_permission(self, request, obj=None):
        return False  # deletion has rules (never the head's branch or its ancestors): the player does it

    def save_model(self, request, obj, form, change):
        from .tree import branch_rename

        branch_rename(branch=obj, name=form.cleaned_data.get("name") or None)

    @admin.display(description="Label")
    def label(self, obj: Branch) -> str:
        from .tree import branch_label

        return branch_label(obj)

    @admin.display(description="Nodes", ordering="n_nodes")
    def node_count(self, obj: Branch) -> int:
        return obj.n_nodes

    @admin.display(description="Lineage entries")
    def lineage_size(self, obj: Branch) -> int:
        return len(obj.lineage or [])

    @admin.display(description="Lineage (newest first: branch, deepest depth borrowed)")
    def lineage_view(self, obj: Branch) -> str:
        return format_html_join(
            ", ",
            "[{}, {}]",
            ((branch_id, "∞" if cap is None else cap) for branch_id, cap in (obj.lineage or [])),
        )


# --- nodes ------------------------------------------------------------------------------------


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    """View-only: committed nodes are immutable, and `live` moves only through the tree module."""

    list_display = [
        "id",
        "adventure",
        "branch",
        "depth",
        "kind",
        "live",
        "input_excerpt",
        "narration_excerpt",
        "created_at",
    ]
    list_select_related = ["adventure", "branch"]
    list_filter = ["kind", "live", "created_at"]
    search_fields = ["=id", "=adventure__id", "adventure__title", "player_input"]
    show_full_result_count = False  # a COUNT(*) over every node of every story buys nothing here
    ordering = ["-id"]  # newest first, along the primary key (the model's depth order has no index alone)
    fields = [
        "adventure",
        "branch",
        "depth",
        "parent",
        "live",
        "kind",
        "player_input",
        "narration",
        "suggestions",
        "state_delta",
        "state_after",
        "checks",
        "regenerated_from",
        "model_name",
        "prompt_bytes",
        "prompt_stable_bytes",
        "created_at",
    ]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Input")
    def input_excerpt(self, obj: Node) -> str:
        return excerpt(obj.player_input, 60)

    @admin.display(description="Narration")
    def narration_excerpt(self, obj: Node) -> str:
        return excerpt(obj.narration, 80)


# --- memories and world entries ---------------------------------------------------------------


@admin.register(Memory)
class MemoryAdmin(admin.ModelAdmin):
    """Players write and edit memories (anchored at their head); operators can read and delete."""

    list_display = ["text_excerpt", "adventure", "branch", "depth", "pinned", "source_node", "created_at"]
    list_select_related = ["adventure", "branch", "source_node"]
    list_filter = ["pinned", "created_at"]
    search_fields = ["text", "adventure__title", "=adventure__id"]
    fields = ["adventure", "branch", "depth", "source_node", "text", "pinned", "created_at"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="Text")
    def text_excerpt(self, obj: Memory) -> str:
        return excerpt(obj.text, 80)


@admin.register(WorldEntry)
class WorldEntryAdmin(admin.ModelAdmin):
    list_display = ["keys_text", "adventure", "enabled", "always_on", "priority", "content_excerpt", "updated_at"]
    list_select_related = ["adventure"]
    list_filter = ["enabled", "always_on", "updated_at"]
    search_fields = ["content", "adventure__title", "=adventure__id"]
    raw_id_fields = ["adventure"]
    fields = ["adventure", "keys", "content", "enabled", "always_on", "priority", "created_at", "updated_at"]
    readonly_fields = ["created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        # An entry belongs to one adventure for life.
        return [*self.readonly_fields, "adventure"] if obj is not None else self.readonly_fields

    @admin.display(description="Keys")
    def keys_text(self, obj: WorldEntry) -> str:
        keys = ", ".join(str(key) for key in obj.keys or [])
        return keys or ("(always on)" if obj.always_on else "-")

    @admin.display(description="Content")
    def content_excerpt(self, obj: WorldEntry) -> str:
        return excerpt(obj.content, 80)


# --- turn jobs --------------------------------------------------------------------------------


@admin.register(TurnJob)
class TurnJobAdmin(admin.ModelAdmin):
    """Jobs are a log written by the pipeline: view, delete, and retry a failed one."""

    list_display = [
        "id",
        "adventure",
        "kind",
        "status",
        "stage",
        "progress",
        "error_code",
        "error_excerpt",
        "attempts",
        "duration",
        "created_at",
    ]
    list_select_related = ["adventure"]
    list_filter = ["status", "kind", "stage", "error_code", "created_at"]
    search_fields = ["=id", "=adventure__id", "adventure__title", "error_code", "error_message", "idempotency_key"]
    date_hierarchy = "created_at"
    actions = ["retry_failed"]
    readonly_fields = [
        "adventure",
        "kind",
        "status",
        "stage",
        "progress",
        "duration",
        "attempts",
        "worker",
        "error_code",
        "error_message",
        "player_input",
        "target_node",
        "expected_head",
        "expected_version",
        "idempotency_key",
        "cancel_requested",
        "partial_text",
        "result_node",
        "created_at",
        "started_at",
        "finished_at",
    ]
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="Progress")
    def progress(self, obj: TurnJob) -> str:
        return progress_of(obj)

    @admin.display(description="Error")
    def error_excerpt(self, obj: TurnJob) -> str:
        return excerpt(obj.error_message, 80)

    @admin.display(description="Duration")
    def duration(self, obj: TurnJob) -> str:
        return duration_of(obj)

    @admin.action(description="Retry selected failed jobs")
    def retry_failed(self, request, queryset: QuerySet[TurnJob]):
        from .turns import TurnRefused, job_retry

        for job in queryset:
            if job.kind == TurnJob.Kind.COMPACT:
                # job_retry requeues onto the turn task; a compaction is requested afresh instead.
                report_compaction(self, request, [job.adventure], target_of=lambda _adventure, job=job: job.target_node)
                continue
            try:
                job = job_retry(job)
            except TurnRefused as exc:
                self.message_user(request, f"Job {job.pk}: not retried. {exc.message}", messages.WARNING)
                continue
            self.message_user(
                request, f"Job {job.pk}: requeued ({job.get_status_display().lower()}).", messages.SUCCESS
            )


# --- API tokens -------------------------------------------------------------------------------


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued on the account page or by `manage.py create_api_token`; only their hash
    is stored, so here they can be renamed or revoked (deleted), never created or read back."""

    list_display = ["prefix_text", "name", "user", "created_at", "last_used_at"]
    list_select_related = ["user"]
    list_filter = ["created_at", "last_used_at"]
    search_fields = ["prefix", "name", "user__username"]
    fields = ["user", "name", "prefix", "created_at", "last_used_at"]  # never key_hash
    readonly_fields = ["user", "prefix", "created_at", "last_used_at"]

    def has_add_permission(self, request):
        return False

    @admin.display(description="Prefix", ordering="prefix")
    def prefix_text(self, obj: ApiToken) -> str:
        return f"{obj.prefix}…"


# --- the dashboard ----------------------------------------------------------------------------


def _with_dashboard(get_urls):
    """Put /admin/dashboard/ in front of the site's own URLs, behind `admin_view` (staff only).

    The project keeps the stock `admin.site` (no custom AdminSite class to wire into settings),
    so its `get_urls` is wrapped on the instance; autodiscovery imports this module before the
    root URLconf reads `admin.site.urls`.
    """

    def urls():
        from .views_admin import dashboard

        return [path("dashboard/", admin.site.admin_view(dashboard), name="storytree_dashboard"), *get_urls()]

    urls.storytree_dashboard = True
    return urls


if not getattr(admin.site.get_urls, "storytree_dashboard", False):
    admin.site.get_urls = _with_dashboard(admin.site.get_urls)
