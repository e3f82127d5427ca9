"""`manage.py prune [--dry-run] [--adventure ID]`: the retention pass (docs/retention.md)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints.retention import KindReport, PruneReport, prune_all, total
from stories.models import Adventure

HEADER = (
    f"{'adventure':>10}  {'kind':<11}  {'rows before':>11}  {'reclaimable':>11}  {'after':>9}"
    f"  {'bytes before':>14}  {'reclaimable':>14}  {'after':>14}"
)


def row(label: str, kind: str, report: KindReport) -> str:
    b, r, a = report.before, report.reclaimable, report.after
    return (
        f"{label:>10}  {kind:<11}  {b.rows:>11,}  {r.rows:>11,}  {a.rows:>9,}"
        f"  {b.bytes:>14,}  {r.bytes:>14,}  {a.bytes:>14,}"
    )


class Command(BaseCommand):
    help = (
        "Delete context checkpoints nobody's turn can use and finished jobs older than "
        "STORYTREE_JOB_RETENTION_DAYS; print rows and bytes before, reclaimable and after."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Report what would be deleted; delete nothing.")
        parser.add_argument("--adventure", type=int, action="append", dest="adventures", metavar="ID",
                            help="Only this adventure (repeatable).")  # fmt: skip

    def handle(self, *args, dry_run: bool = False, adventures: list[int] | None = None, **options) -> None:
        if adventures:
            missing = sorted(
                set(adventures) - set(Adventure.objects.filter(pk__in=adventures).values_list("pk", flat=True))
            )
            if missing:
                raise CommandError(f"No adventure {', '.join(map(str, missing))}.")
        reports = prune_all(dry_run=dry_run, adventure_ids=adventures)
        write = self.stdout.write
        write(HEADER)
        for report in reports:
            self._write(str(report.adventure_id), report)
        summary = total(reports, dry_run=dry_run)
        self._write("total", summary)
        reasons = ", ".join(f"{name} {count:,}" for name, count in summary.reasons.items()) or "none"
        write(f"reclaimable checkpoints by reason: {reasons}")
        write(
            f"protected: {summary.protected_checkpoints:,} checkpoints, {summary.protected_jobs:,} jobs "
            f"over {summary.adventures:,} adventures"
        )
        for report in reports:
            if report.skipped:
                write(f"adventure {report.adventure_id}: no checkpoint reclaimed ({report.skipped})")
        if dry_run:
            write("dry run: nothing was deleted")
        else:
            deleted = summary.checkpoints.reclaimable.rows + summary.jobs.reclaimable.rows
            write(self.style.SUCCESS(f"deleted {deleted:,} rows"))

    def _write(self, label: str, report: PruneReport) -> None:
        self.stdout.write(row(label, "checkpoints", report.checkpoints))
        self.stdout.write(row(label, "jobs", report.jobs))
