"""Write an adventure as a bundle to stdout (streamed): `manage.py export_adventure ID > story.storytree.json`."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from stories.bundles import export_stream
from stories.models import Adventure


class Command(BaseCommand):
    help = "Export an adventure (every branch, attempt, memory and world entry) as a Storytree bundle on stdout."

    def add_arguments(self, parser) -> None:
        parser.add_argument("adventure_id", type=int)

    def handle(self, *args, adventure_id: int, **options) -> None:
        adventure = Adventure.objects.filter(pk=adventure_id).first()
        if adventure is None:
            raise CommandError(f"No adventure {adventure_id}.")
        # Bytes straight to the binary stream when there is one: the bundle is UTF-8 whatever
        # the terminal's locale, and no newline translation may touch it.
        stream = self.stdout._out
        binary = getattr(stream, "buffer", None)
        for chunk in export_stream(adventure):
            if binary is not None:
                binary.write(chunk)
            else:
                stream.write(chunk.decode())
        (binary or stream).flush()
