"""Run the story-tree invariant checker over one adventure or all of them."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from stories.integrity import check_adventure
from stories.models import Adventure


class Command(BaseCommand):
    help = (
        "Check the story tree invariants (DESIGN.md) of one adventure, or of every adventure. Exits 1 on a violation."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("adventure_id", nargs="?", type=int, help="Only this adventure.")

    def handle(self, *args, adventure_id: int | None = None, **options) -> None:
        adventures = Adventure.objects.order_by("id")
        if adventure_id is not None:
            adventures = adventures.filter(pk=adventure_id)
            if not adventures.exists():
                raise CommandError(f"No adventure {adventure_id}.")
        checked = failed = 0
        for adventure in adventures.iterator():
            checked += 1
            violations = check_adventure(adventure)
            if violations:
                failed += 1
                self.stdout.write(f"adventure {adventure.pk}: {len(violations)} violation(s)")
                for violation in violations:
                    self.stdout.write(f"  {violation}")
            elif options["verbosity"] >= 2:
                self.stdout.write(f"adventure {adventure.pk}: ok")
        if failed:
            raise CommandError(f"{failed} of {checked} adventure(s) violate the story tree invariants.")
        self.stdout.write(f"{checked} adventure(s) checked, no violations.")
