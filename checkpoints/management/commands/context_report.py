"""Print the context budget of an adventure's next turn, its parts and what stays verbatim."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from checkpoints.context import context_report
from stories.models import Adventure


class Command(BaseCommand):
    help = "Print the next turn's input budget (tokens estimated as bytes), its parts, the checkpoint and the verbatim range."

    def add_arguments(self, parser) -> None:
        parser.add_argument("adventure_id", type=int)
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print the report as JSON.")

    def handle(self, *args, adventure_id: int, as_json: bool = False, **options) -> None:
        adventure = Adventure.objects.filter(pk=adventure_id).first()
        if adventure is None:
            raise CommandError(f"No adventure {adventure_id}.")
        report = context_report(adventure)
        if as_json:
            self.stdout.write(json.dumps(report, indent=2))
            return
        write = self.stdout.write
        assumed = " (ASSUMED: the profile sets no window)" if report["window_assumed"] else ""
        write(f"model: {report['model']['label']} [{report['model']['profile']}]")
        write(f"window: {report['window']:,} tokens{assumed}; requested output {report['requested_output']:,}")
        if "budget" not in report:
            write(f"error: {report['error']['code']}: {report['error']['message']}")
            return
        budget = report["budget"]
        write(
            f"hard input budget: {budget['hard_input']:,} (compacts above {budget['high_watermark']:,}, "
            f"down to {budget['low_watermark']:,})"
        )
        if "parts" not in report:
            write(f"error: {report['error']['code']}: {report['error']['message']}")
            return
        write("parts:")
        for name, value in report["parts"].items():
            write(f"  {name:22} {'-' if value is None else format(value, ',')}")
        cp = report["checkpoint"]
        if cp:
            write(
                f"checkpoint: {cp['id']} on node {cp['host_node']}, covers depths 0-{cp['covered_depth']} ({cp['model_name']})"
            )
        else:
            write("checkpoint: none")
        for miss in report["misses"]:
            write(f"  skipped checkpoint {miss['checkpoint']}: {miss['reason']}")
        verbatim = report["verbatim"]
        if verbatim["from_depth"] is not None:
            write(f"verbatim: depths {verbatim['from_depth']}-{verbatim['through_depth']} ({verbatim['nodes']} nodes)")
        if report["needs_compaction"]:
            after = report["after_compaction"]
            where = (
                f": will cover 0-{after['covered_through_depth']}, verbatim from {after['verbatim_from_depth']}"
                if after
                else ""
            )
            write(f"the next turn compacts first{where}")
        if "error" in report:
            write(f"error: {report['error']['code']}: {report['error']['message']}")
