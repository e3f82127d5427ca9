"""Import a bundle or a SillyTavern chat: `manage.py import_adventure FILE --owner USER` prints the new id."""

from __future__ import annotations

import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from stories.bundles import BundleError, import_any


class Command(BaseCommand):
    help = (
        "Import a Storytree bundle (.storytree.json) or a SillyTavern chat (.jsonl) as a new adventure of USER. "
        "Prints the new adventure's id; nothing is written if the file has a fault."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="The file to import ('-' reads stdin).")
        parser.add_argument("--owner", required=True, help="Username of the new adventure's owner.")

    def handle(self, *args, file: str, owner: str, **options) -> None:
        user = get_user_model().objects.filter(username=owner).first()
        if user is None:
            raise CommandError(f"No user named {owner!r}.")
        try:
            if file == "-":
                adventure = import_any(sys.stdin.buffer, owner=user)
            else:
                path = Path(file)
                if not path.is_file():
                    raise CommandError(f"No such file: {file}")
                with path.open("rb") as handle:
                    adventure = import_any(handle, owner=user, filename=path.name)
        except BundleError as error:
            raise CommandError(f"{file}: refused ({error.status}) at {error.path}: {error.reason}") from None
        for warning in adventure.import_warnings:
            self.stderr.write(f"corrected: {warning}")
        self.stdout.write(str(adventure.pk))
