"""`manage.py prune [--dry-run] [--adventure ID]`, the nightly task and its settings."""

from __future__ import annotations

import runpy
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.utils import timezone

from checkpoints import retention
from checkpoints.models import ContextCheckpoint
from checkpoints.tasks_retention import prune_all_task
from stories import tree
from stories.models import Adventure, TurnJob
from tests.test_retention import assert_no_orphans, grow, small_profile, turn

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


@pytest.fixture
def small():
    return small_profile()


SETTINGS = Path(__file__).resolve().parent.parent / "storyproject" / "settings.py"


def prune(*args: str) -> dict[tuple[str, str], list[int]]:
    """Run the command; {(adventure id or "total", kind): [rows before, reclaimable, after,
    bytes before, reclaimable, after]}, plus the raw output under ("output", "")."""
    out = StringIO()
    call_command("prune", *args, stdout=out)
    table: dict = {("output", ""): out.getvalue()}
    for line in out.getvalue().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 8 and parts[1] in {"checkpoints", "jobs"}:
            table[(parts[0], parts[1])] = [int(p.replace(",", "")) for p in parts[2:]]
    return table


def measured(adventure: Adventure) -> tuple[int, int]:
    return (
        ContextCheckpoint.objects.filter(adventure=adventure).count(),
        TurnJob.objects.filter(adventure=adventure).count(),
    )


@pytest.fixture
def two_adventures(owner, small, redis_url):
    """One grown tree with checkpoints on several branches, one plain story with old jobs."""
    grown = grow(owner, small)
    plain = tree.adventure_create(owner=owner, title="Plain", premise="A quiet harbour.")
    for index in range(3):
        turn(plain, text=f"I mend the nets, knot {index}.")
    old = timezone.now() - timedelta(days=31)
    aged = list(TurnJob.objects.filter(adventure=plain).order_by("pk").values_list("pk", flat=True)[:2])
    aged += list(TurnJob.objects.filter(adventure=grown).order_by("pk").values_list("pk", flat=True)[:5])
    TurnJob.objects.filter(pk__in=aged).update(finished_at=old)
    return grown, plain, len(aged)


def test_a_dry_run_prints_the_numbers_and_deletes_nothing(two_adventures):
    grown, plain, aged = two_adventures
    before = measured(grown), measured(plain)
    plan = retention.plan(grown)

    table = prune("--dry-run")

    assert (measured(grown), measured(plain)) == before
    cps = table[(str(grown.pk), "checkpoints")]
    assert cps[0] == before[0][0] and cps[1] == len(plan.reclaimable_checkpoints) > 0
    assert cps[2] == cps[0] - cps[1] and cps[5] == cps[3] - cps[4] and 0 < cps[4] < cps[3]
    assert table[(str(plain.pk), "checkpoints")] == [0, 0, 0, 0, 0, 0]
    jobs = [table[(str(a.pk), "jobs")] for a in (grown, plain)]
    assert [j[0] for j in jobs] == [before[0][1], before[1][1]]
    assert sum(j[1] for j in jobs) == aged and all(j[4] > 0 for j in jobs)
    for kind in ("checkpoints", "jobs"):
        total = table[("total", kind)]
        assert total == [sum(table[(str(a.pk), kind)][i] for a in (grown, plain)) for i in range(6)]
    output = table[("output", "")]
    assert "dry run: nothing was deleted" in output and "unreferenced" in output


def test_a_real_run_deletes_what_the_dry_run_reported_and_a_second_run_nothing(two_adventures):
    grown, plain, _aged = two_adventures
    dry = prune("--dry-run")

    real = prune()

    for adventure in (grown, plain):
        for index, kind in enumerate(("checkpoints", "jobs")):
            key = (str(adventure.pk), kind)
            assert real[key] == dry[key]  # before, reclaimable and (measured) after agree
            assert real[key][2] == measured(adventure)[index]
    assert "deleted" in real[("output", "")] and "dry run" not in real[("output", "")]
    assert_no_orphans(grown)
    again = prune()
    assert again[("total", "checkpoints")][1] == again[("total", "jobs")][1] == 0
    assert again[("total", "checkpoints")][0] == real[("total", "checkpoints")][2]
    turn(grown, text="I play on after the prune.")


def test_it_prunes_only_the_adventure_named(two_adventures):
    grown, plain, _aged = two_adventures
    plain_before = measured(plain)
    table = prune("--adventure", str(grown.pk))
    assert (str(plain.pk), "jobs") not in table
    assert measured(plain) == plain_before
    assert table[(str(grown.pk), "checkpoints")][1] > 0
    with pytest.raises(CommandError, match="No adventure 999999"):
        prune("--dry-run", "--adventure", "999999")


def test_the_nightly_task_runs_the_pass(two_adventures):
    grown, plain, _aged = two_adventures
    expected = retention.plan(grown).protected_checkpoints
    prune_all_task.delay()  # eager in tests
    assert set(ContextCheckpoint.objects.filter(adventure=grown).values_list("pk", flat=True)) == expected
    assert retention.prune_adventure(adventure=plain, dry_run=True).jobs.reclaimable.rows == 0


def settings_with(monkeypatch, **env: str) -> dict:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS))


def test_the_beat_schedule_is_off_by_default_and_nightly_when_enabled(monkeypatch):
    monkeypatch.delenv("STORYTREE_PRUNE_NIGHTLY", raising=False)
    monkeypatch.delenv("STORYTREE_JOB_RETENTION_DAYS", raising=False)
    default = runpy.run_path(str(SETTINGS))
    assert default["STORYTREE_PRUNE_NIGHTLY"] is False and "prune-nightly" not in default["CELERY_BEAT_SCHEDULE"]
    assert default["STORYTREE_JOB_RETENTION_DAYS"] == 30

    enabled = settings_with(monkeypatch, STORYTREE_PRUNE_NIGHTLY="1", STORYTREE_JOB_RETENTION_DAYS="90")
    entry = enabled["CELERY_BEAT_SCHEDULE"]["prune-nightly"]
    assert entry["task"] == prune_all_task.name == "checkpoints.tasks_retention.prune_all_task"
    assert entry["schedule"] == crontab(hour=3, minute=30)
    assert enabled["STORYTREE_JOB_RETENTION_DAYS"] == 90

    for name, bad in (("STORYTREE_PRUNE_NIGHTLY", "sometimes"), ("STORYTREE_JOB_RETENTION_DAYS", "0")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ImproperlyConfigured, match=name):
            runpy.run_path(str(SETTINGS))
        monkeypatch.delenv(name)
