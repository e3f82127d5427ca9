"""The story tree's rows. Workflows live in domain modules, not here.

- `stories/paths.py` owns path selection (which nodes are "the story").
- `stories/tree.py` owns every operation that writes the tree.
- `stories/integrity.py` owns the invariant checker.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q


class ModelProfile(models.Model):
    """How to reach one model. The API key itself is never stored: only the
    name of the environment variable that holds it."""

    class Provider(models.TextChoices):
        BUILTIN = "builtin", "Built-in offline narrator (no AI model)"
        OPENAI = "openai", "OpenAI-compatible server"

    name = models.CharField(max_length=100, unique=True)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.BUILTIN)
    base_url = models.URLField(max_length=500, blank=True)
    model_name = models.CharField(max_length=200, blank=True)
    api_key_env = models.CharField(
        "API key environment variable",
        max_length=100,
        blank=True,
        help_text="The NAME of the environment variable holding the key, e.g. OPENAI_API_KEY. Never the key.",
    )
    context_window = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tokens. Empty = unknown (16,384 assumed)."
    )
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens. Empty = unknown.")
    temperature = models.FloatField(default=0.8)
    timeout_seconds = models.FloatField(default=60.0)
    supports_tools = models.BooleanField(default=True, help_text="Whether the server accepts tool calls.")
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_profile"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_builtin(self) -> bool:
        return self.provider == self.Provider.BUILTIN


class Adventure(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="adventures")
    title = models.CharField(max_length=200)
    premise = models.TextField(blank=True)
    persona = models.TextField("player persona", blank=True)
    style = models.TextField("style notes", blank=True)
    model_profile = models.ForeignKey(ModelProfile, on_delete=models.PROTECT, related_name="adventures")
    # The node the player stands on. Null only inside the transaction that creates the adventure.
    head = models.ForeignKey("Node", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Where undo came from: redo walks forward along this node's path. Cleared by any other
    # head move (a new turn, a switch, a fork), which is what makes redo mean "go back".
    redo_tip = models.ForeignKey("Node", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Bumped on every head move: optimistic concurrency for two tabs on one story.
    version = models.PositiveBigIntegerField(default=0)
    world_scan_depth = models.PositiveSmallIntegerField(
        default=4, help_text="How many of the newest nodes are scanned for world-entry keys."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_played_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_played_at", "-created_at"]
        indexes = [models.Index(fields=["owner", "-last_played_at"])]

    def __str__(self) -> str:
        return self.title


class Branch(models.Model):
    adventure = models.ForeignKey(Adventure, on_delete=models.CASCADE, related_name="branches")
    parent_branch = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")
    # Depth of this branch's first node.
    fork_depth = models.PositiveIntegerField(default=0)
    # [[branch_id, max_depth], ...] newest first; the first entry is this branch with max_depth null
    # (unbounded); each ancestor is capped below the fork of the branch beneath it. Computed once.
    lineage = models.JSONField(default=list)
    # A name is stored only when the player gives one; otherwise a label is derived.
    name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "branches"

    def __str__(self) -> str:
        return self.name or f"Branch {self.pk}"


class Node(models.Model):
    """One committed story turn. Immutable once written (only `live` moves)."""

    class Kind(models.TextChoices):
        OPENING = "opening", "Opening"
        DO = "do", "Do"
        SAY = "say", "Say"
        STORY = "story", "Story"
        CONTINUE = "continue", "Continue"

    adventure = models.ForeignKey(Adventure, on_delete=models.CASCADE, related_name="nodes")
    branch = models.ForeignKey(Branch, on_delete=models.CASCADE, related_name="nodes")
    depth = models.PositiveIntegerField()
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")
    live = models.BooleanField(default=True)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    player_input = models.TextField(blank=True)
    narration = models.TextField(blank=True)
    suggestions = models.JSONField(default=list, blank=True)
    state_delta = models.JSONField(default=list, blank=True)
    state_after = models.JSONField(default=dict, blank=True)
    # Exact hidden-check records (roll, seed, difficulty). Private: never shown to the model or player.
    checks = models.JSONField(default=list, blank=True)
    regenerated_from = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    model_name = models.CharField(max_length=200, blank=True)
    prompt_bytes = models.PositiveIntegerField(default=0)
    prompt_stable_bytes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["depth", "id"]
        indexes = [models.Index(fields=["branch", "depth"], name="node_branch_depth")]
        constraints = [
            models.UniqueConstraint(
                fields=["branch", "depth"], condition=Q(live=True), name="one_live_node_per_coordinate"
            ),
        ]

    def __str__(self) -> str:
        return f"Node {self.pk} ({self.branch_id}:{self.depth})"


class Memory(models.Model):
    """A fact worth remembering, visible exactly from paths through its anchor."""

    adventure = models.ForeignKey(Adventure, on_delete=models.CASCADE, related_name="memories")
    branch = models.ForeignKey(Branch, on_delete=models.CASCADE, related_name="memories")
    depth = models.PositiveIntegerField()
    text = models.TextField()
    pinned = models.BooleanField(default=False)
    source_node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["depth", "id"]
        indexes = [models.Index(fields=["branch", "depth"], name="memory_branch_depth")]
        verbose_name_plural = "memories"

    def __str__(self) -> str:
        return self.text[:60]


class WorldEntry(models.Model):
    """A world-book (lorebook) entry: adventure-wide, reaches the prompt only when triggered."""

    adventure = models.ForeignKey(Adventure, on_delete=models.CASCADE, related_name="world_entries")
    keys = models.JSONField(default=list, blank=True)
    content = models.TextField()
    enabled = models.BooleanField(default=True)
    priority = models.IntegerField(default=0)
    always_on = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-always_on", "-priority", "id"]
        verbose_name_plural = "world entries"

    def __str__(self) -> str:
        return ", ".join(self.keys) or self.content[:60]


class TurnJob(models.Model):
    """One requested generation (or compaction), claimed by exactly one worker."""

    class Kind(models.TextChoices):
        DO = "do", "Do"
        SAY = "say", "Say"
        STORY = "story", "Story"
        CONTINUE = "continue", "Continue"
        RETRY = "retry", "Retry"
        REGENERATE = "regenerate", "Regenerate"
        COMPACT = "compact", "Compact"

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Stage(models.TextChoices):
        WAITING = "waiting", "Waiting for a worker"
        COMPACTING = "compacting", "Summarizing earlier chapters"
        NARRATING = "narrating", "Narrating"
        COMMITTING = "committing", "Saving"
        FINISHED = "finished", "Finished"

    adventure = models.ForeignKey(Adventure, on_delete=models.CASCADE, related_name="jobs")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    player_input = models.TextField(blank=True)
    # retry: the tip attempt being retried; regenerate: the node regenerated; compact: the tip compacted.
    target_node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    expected_head = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    expected_version = models.PositiveBigIntegerField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=100, null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    stage = models.CharField(max_length=12, choices=Stage.choices, default=Stage.WAITING)
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    partial_text = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    error_code = models.CharField(max_length=50, blank=True)
    error_message = models.TextField(blank=True)
    result_node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    attempts = models.PositiveSmallIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "created_at"], name="job_status_created"),
            models.Index(fields=["adventure", "status"], name="job_adventure_status"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["adventure", "idempotency_key"], name="one_job_per_idempotency_key"),
        ]

    def __str__(self) -> str:
        return f"Job {self.pk} ({self.kind}, {self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in {self.Status.DONE, self.Status.FAILED, self.Status.CANCELLED}


class ApiToken(models.Model):
    """A per-user bearer token. Only its SHA-256 is stored; the key is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @staticmethod
    def hash_key(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    @classmethod
    def issue(cls, user, name: str = "") -> tuple[ApiToken, str]:
        key = "st_" + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=key[:10], key_hash=cls.hash_key(key))
        return token, key
