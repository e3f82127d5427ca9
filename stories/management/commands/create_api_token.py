"""Print a new API token for a user (shown once; only its hash is stored)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from stories.models import ApiToken


class Command(BaseCommand):
    help = "Create a bearer token for USER and print it."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="A label to recognise the token by.")

    def handle(self, *args, username: str, name: str, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        _, key = ApiToken.issue(user, name=name[:100])
        self.stdout.write(key)
