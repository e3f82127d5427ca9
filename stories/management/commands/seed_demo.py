"""Create the demo player and one demo adventure (idempotent)."""

from __future__ import annotations

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from stories.models import Adventure, WorldEntry
from stories.tree import adventure_create

DEMO_PREMISE = (
    "Rain hammers the slate roofs of Saltmarsh as you step into the Drowned Lantern, the only inn still lit. "
    "The harbourmaster has gone missing, the lighthouse has been dark for three nights, and the innkeeper "
    "Maren keeps glancing at the cellar door."
)


class Command(BaseCommand):
    help = "Create the demo player (printing the credentials) and a demo adventure."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        username = os.environ.get("DEMO_USERNAME", "demo")
        password = os.environ.get("DEMO_PASSWORD", "storytree-demo")
        user, created = User.objects.get_or_create(username=username)
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
        if not Adventure.objects.filter(owner=user).exists():
            adventure = adventure_create(
                owner=user,
                title="The Dark Lighthouse",
                premise=DEMO_PREMISE,
                persona="Ilsa Varn, a former ship's navigator with a steady hand and a debt to the harbourmaster.",
                style="Atmospheric, grounded, second person, present tense.",
            )
            WorldEntry.objects.create(
                adventure=adventure,
                keys=["Maren", "innkeeper"],
                content="Maren, the innkeeper, is hiding her smuggler brother in the cellar.",
                priority=5,
            )
            WorldEntry.objects.create(
                adventure=adventure,
                keys=["lighthouse"],
                content="The lighthouse keeper's logbook records ships that never arrived.",
                priority=3,
            )
        state = "created" if created else "exists"
        self.stdout.write(f"Demo player ({state}): username '{username}', password '{password}'")
