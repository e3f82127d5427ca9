"""Compact the head's path (or a branch tip's) now, synchronously, and print the result."""

from __future__ import annotations

from contextlib import nullcontext

import redis
from django.core.management.base import BaseCommand, CommandError

from checkpoints.budget import ContextError
from checkpoints.context import compact_now
from stories.llm.errors import ModelError
from stories.locks import LockBusy, adventure_lock
from stories.models import Adventure, Node


class Command(BaseCommand):
    help = (
        "Summarize the older part of an adventure's path with its own model so the next turn fits the "
        "context window. Prints progress (chunks) and the checkpoint written."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("adventure_id", type=int)
        parser.add_argument("--branch-tip", type=int, dest="tip", help="Compact the path ending at this node.")
        parser.add_argument(
            "--no-lock", action="store_true", help="Do not take the adventure's Redis lock (only when no worker runs)."
        )

    def handle(self, *args, adventure_id: int, tip: int | None = None, no_lock: bool = False, **options) -> None:
        adventure = Adventure.objects.filter(pk=adventure_id).first()
        if adventure is None:
            raise CommandError(f"No adventure {adventure_id}.")
        node = None
        if tip is not None:
            node = Node.objects.filter(pk=tip, adventure=adventure).first()
            if node is None:
                raise CommandError(f"Node {tip} is not part of adventure {adventure_id}.")

        def progress(done: int, total: int) -> None:
            self.stdout.write(f"chunk {done}/{total}")

        try:
            with nullcontext() if no_lock else adventure_lock(adventure.pk, owner=f"manage.py compact {adventure.pk}"):
                result = compact_now(adventure, node, on_progress=progress)
        except LockBusy as exc:
            raise CommandError("A turn of this adventure is being written; try again in a moment.") from exc
        except redis.RedisError as exc:
            raise CommandError(f"Redis is not answering ({exc}); use --no-lock if no worker is running.") from exc
        except (ContextError, ModelError) as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        cp = result.checkpoint
        for miss in result.misses:
            self.stdout.write(f"skipped checkpoint {miss.checkpoint_id}: {miss.reason}")
        if result.created:
            self.stdout.write(
                f"checkpoint {cp.pk} on node {cp.host_node_id}: covers depths 0-{cp.covered_depth}, "
                f"{cp.summary_bytes} bytes of summary for {cp.covered_bytes} bytes of story; "
                f"{result.calls} model call(s)"
            )
        elif cp is not None:
            self.stdout.write(
                f"nothing to compact: checkpoint {cp.pk} (depths 0-{cp.covered_depth}) already leaves the path "
                "under the low watermark"
            )
        else:
            self.stdout.write("nothing to compact: the whole path fits under the low watermark")
