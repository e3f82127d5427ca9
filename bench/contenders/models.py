"""Contender trees for bench/paths.py. Tables are created at run time with
`schema_editor.create_model` (no migrations): this app exists only under bench/settings.py.

Every node model carries exactly the content columns of `stories.Node` (same field types), so
sizes and row reads compare structure, not payload. Each has a `story` column (ours has
`adventure`): every app has to find "all the nodes of this adventure".
"""

from __future__ import annotations

from django.db import models
from mptt.models import MPTTModel, TreeForeignKey
from treebeard.mp_tree import MP_Node


class Content(models.Model):
    story = models.PositiveIntegerField(db_index=True)
    kind = models.CharField(max_length=10)
    player_input = models.TextField(blank=True)
    narration = models.TextField(blank=True)
    suggestions = models.JSONField(default=list, blank=True)
    state_delta = models.JSONField(default=list, blank=True)
    state_after = models.JSONField(default=dict, blank=True)
    checks = models.JSONField(default=list, blank=True)
    model_name = models.CharField(max_length=200, blank=True)
    prompt_bytes = models.PositiveIntegerField(default=0)
    prompt_stable_bytes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True


class AdjNode(Content):
    """Plain adjacency list: a parent pointer and the depth. Used by two contenders (walked
    one query per node, and read with a recursive CTE), each in its own database file."""

    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, related_name="children")
    depth = models.PositiveIntegerField()

    class Meta:
        app_label = "contenders"


class AdjCheckpoint(models.Model):
    story = models.PositiveIntegerField(db_index=True)
    host = models.OneToOneField(AdjNode, on_delete=models.CASCADE, related_name="checkpoint")
    summary = models.TextField()

    class Meta:
        app_label = "contenders"


class TbNode(MP_Node, Content):
    """django-treebeard materialized path. steplen=1 (36 children a node, more than the 20
    attempts a coordinate may hold) is the most favourable setting for a deep chain: the
    default steplen=4 makes every path four times longer."""

    steplen = 1
    path = models.CharField(max_length=100_000, unique=True)

    class Meta:
        app_label = "contenders"


class TbCheckpoint(models.Model):
    story = models.PositiveIntegerField(db_index=True)
    host = models.OneToOneField(TbNode, on_delete=models.CASCADE, related_name="checkpoint")
    summary = models.TextField()

    class Meta:
        app_label = "contenders"


class MpNode(MPTTModel, Content):
    """django-mptt nested sets (tree_id, lft, rght, level) plus its parent pointer."""

    parent = TreeForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")

    class Meta:
        app_label = "contenders"


class MpCheckpoint(models.Model):
    story = models.PositiveIntegerField(db_index=True)
    host = models.OneToOneField(MpNode, on_delete=models.CASCADE, related_name="checkpoint")
    summary = models.TextField()

    class Meta:
        app_label = "contenders"


NODE_MODELS = {"adjacency": AdjNode, "cte": AdjNode, "treebeard": TbNode, "mptt": MpNode}
CHECKPOINT_MODELS = {"adjacency": AdjCheckpoint, "cte": AdjCheckpoint, "treebeard": TbCheckpoint, "mptt": MpCheckpoint}
