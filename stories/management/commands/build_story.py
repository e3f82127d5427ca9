"""Build a synthetic adventure (for tests and benchmarks) and print its id."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from stories.synthetic import build_story


class Command(BaseCommand):
    help = (
        "Build a synthetic adventure of N nodes whose head path crosses F forks (forks of forks), each node "
        "holding about B bytes of narration. Prints the adventure id."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--nodes", type=int, required=True, help="Nodes in the whole tree (N).")
        parser.add_argument("--forks", type=int, default=0, help="Forks on the head's path (F); needs N >= 2F + 1.")
        parser.add_argument("--bytes", type=int, default=1000, help="Approximate narration bytes per node (B).")
        parser.add_argument("--owner", help="Username of the owner (default: a 'synthetic' user, created if needed).")

    def handle(self, *args, nodes: int, forks: int, bytes: int, owner: str | None = None, **options) -> None:
        user = None
        if owner is not None:
            user = get_user_model().objects.filter(username=owner).first()
            if user is None:
                raise CommandError(f"No user named {owner!r}.")
        try:
            adventure = build_story(nodes=nodes, forks=forks, bytes_per_node=bytes, owner=user)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(str(adventure.pk))
