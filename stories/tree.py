"""Every operation that writes the story tree. Each runs in one transaction."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from .models import Adventure, Branch, ModelProfile, Node


def default_profile() -> ModelProfile:
    profile = ModelProfile.objects.filter(is_default=True).first() or ModelProfile.objects.order_by("id").first()
    if profile is None:
        profile = ModelProfile.objects.create(
            name="Offline narrator",
            provider=ModelProfile.Provider.BUILTIN,
            model_name="storytree-builtin",
            is_default=True,
        )
    return profile


@transaction.atomic
def adventure_create(
    *,
    owner,
    title: str,
    premise: str = "",
    persona: str = "",
    style: str = "",
    model_profile: ModelProfile | None = None,
) -> Adventure:
    """Create an adventure with its root branch and root node (depth 0, the premise as narration)."""
    adventure = Adventure.objects.create(
        owner=owner,
        title=title,
        premise=premise,
        persona=persona,
        style=style,
        model_profile=model_profile or default_profile(),
        last_played_at=timezone.now(),
    )
    branch = Branch.objects.create(adventure=adventure, fork_depth=0)
    branch.lineage = [[branch.pk, None]]
    branch.save(update_fields=["lineage"])
    root = Node.objects.create(
        adventure=adventure,
        branch=branch,
        depth=0,
        kind=Node.Kind.OPENING,
        narration=premise,
        state_after={"flags": {}, "relationships": {}, "inventory": [], "facts": []},
    )
    adventure.head = root
    adventure.version = 1
    adventure.save(update_fields=["head", "version"])
    return adventure
