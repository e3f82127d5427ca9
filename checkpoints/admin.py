"""The operator's view of the checkpoint cache: what each row covers, whether it is still
usable (recomputed by the store's validator), and actions to invalidate or rebuild.

A checkpoint is a cache: invalidating or deleting one changes nothing a player sees;
the next turn (or "rebuild now") computes a fresh one.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.utils.html import format_html

from stories.admin import admin_link, human_bytes, report_compaction
from stories.dashboard import CHECKPOINT_RELATED, checkpoint_validity

from .models import ContextCheckpoint


@admin.register(ContextCheckpoint)
class ContextCheckpointAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "adventure",
        "host",
        "covered_range",
        "summary_size",
        "model_name",
        "invalidated",
        "validity",
        "created_at",
    ]
    list_select_related = CHECKPOINT_RELATED
    list_filter = ["invalidated", "checkpoint_schema_version", "prompt_schema_version", "created_at"]
    search_fields = ["=id", "=adventure__id", "adventure__title", "=host_node__id", "model_name", "source_hash"]
    actions = ["invalidate_selected", "rebuild_now"]
    # The validity column recomputes each row's hashes (the covered path is read): keep pages short.
    list_per_page = 20
    fields = [
        "adventure",
        "host_node",
        "branch",
        "depth",
        "covered_through",
        "covered_depth",
        "retained_from",
        "covered_range",
        "checkpoint_schema_version",
        "prompt_schema_version",
        "stable_prefix_hash",
        "source_hash",
        "model_name",
        "summary_bytes",
        "covered_bytes",
        "invalidated",
        "validity",
        "summary_json",
        "created_at",
    ]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # written only by the summarizer, committed with a node

    def has_change_permission(self, request, obj=None):
        return False  # a cache row is rebuilt, never edited; "invalidate" is an action

    @admin.display(description="Host", ordering="host_node")
    def host(self, obj: ContextCheckpoint) -> str:
        return admin_link(obj.host_node, f"node {obj.host_node_id} ({obj.branch_id}:{obj.depth})")

    @admin.display(description="Covered", ordering="covered_depth")
    def covered_range(self, obj: ContextCheckpoint) -> str:
        """Depths summarized (from the root) and where the verbatim history resumes."""
        covered = f"depths 0–{obj.covered_depth}"
        if obj.retained_from_id is None:
            return covered
        return f"{covered}; verbatim from depth {obj.retained_from.depth}"

    @admin.display(description="Summary", ordering="summary_bytes")
    def summary_size(self, obj: ContextCheckpoint) -> str:
        return f"{human_bytes(obj.summary_bytes)} (of {human_bytes(obj.covered_bytes)} covered)"

    @admin.display(description="Validity")
    def validity(self, obj: ContextCheckpoint) -> str:
        ok, reason = checkpoint_validity(obj)
        if ok:
            return format_html('<span class="storytree-ok">✔ {}</span>', "valid")
        return format_html('<span class="storytree-warning">✘ stale: {}</span>', reason)

    @admin.action(description="Invalidate selected checkpoints")
    def invalidate_selected(self, request, queryset: QuerySet[ContextCheckpoint]):
        count = queryset.filter(invalidated=False).update(invalidated=True)
        self.message_user(
            request,
            f"Invalidated {count} checkpoint(s); they are kept for inspection and never used.",
            messages.SUCCESS,
        )

    @admin.action(description="Rebuild now (compact the host's path)")
    def rebuild_now(self, request, queryset: QuerySet[ContextCheckpoint]):
        # One job per adventure: compaction of one adventure runs one at a time.
        chosen: dict[int, ContextCheckpoint] = {}
        for checkpoint in queryset.select_related("adventure", "host_node").order_by("-depth"):
            chosen.setdefault(checkpoint.adventure_id, checkpoint)
        report_compaction(
            self,
            request,
            [checkpoint.adventure for checkpoint in chosen.values()],
            target_of=lambda adventure: chosen[adventure.pk].host_node,
        )
