"""Context checkpoints: a cache of same-model rolling summaries.

Deleting every row changes nothing a player sees; the next turn rebuilds
what it needs. Validation on read lives in `checkpoints/store.py`.
"""

from __future__ import annotations

from django.db import models


class ContextCheckpoint(models.Model):
    adventure = models.ForeignKey("stories.Adventure", on_delete=models.CASCADE, related_name="checkpoints")
    # Keyed by the node it was committed with. (branch, depth) copy the host's
    # coordinates so the nearest checkpoint is one query over the path clause.
    host_node = models.OneToOneField("stories.Node", on_delete=models.CASCADE, related_name="checkpoint")
    branch = models.ForeignKey("stories.Branch", on_delete=models.CASCADE, related_name="checkpoints")
    depth = models.PositiveIntegerField()
    covered_through = models.ForeignKey("stories.Node", on_delete=models.CASCADE, related_name="+")
    covered_depth = models.PositiveIntegerField()
    retained_from = models.ForeignKey("stories.Node", on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    checkpoint_schema_version = models.PositiveSmallIntegerField()
    prompt_schema_version = models.PositiveSmallIntegerField()
    stable_prefix_hash = models.CharField(max_length=64)
    summary_json = models.JSONField()
    source_hash = models.CharField(max_length=64)
    model_name = models.CharField(max_length=200, blank=True)
    summary_bytes = models.PositiveIntegerField(default=0)
    covered_bytes = models.PositiveIntegerField(default=0)
    # Set by the admin's "invalidate" action: the row stays for inspection but is never used.
    invalidated = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["branch", "depth"], name="checkpoint_branch_depth")]

    def __str__(self) -> str:
        return f"Checkpoint on node {self.host_node_id} (through depth {self.covered_depth})"
