from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from tests.conftest import wait_for
from tests.worker_tasks import mark_user

pytestmark = pytest.mark.worker


def test_a_task_enqueued_on_commit_runs_in_a_real_worker(celery_worker, user):
    with transaction.atomic():
        transaction.on_commit(lambda: mark_user.delay(user.pk, "seen-by-worker"))
    User = get_user_model()
    wait_for(
        lambda: User.objects.get(pk=user.pk).first_name == "seen-by-worker",
        timeout=20,
        message=f"the worker to run the task\n{celery_worker.output()}",
    )


def test_nothing_is_enqueued_when_the_transaction_rolls_back(celery_worker, user):
    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(lambda: mark_user.delay(user.pk, "should-not-run"))
        raise RuntimeError("roll back")
    # A marker task queued after proves the worker ran past where the first would have been.
    with transaction.atomic():
        transaction.on_commit(lambda: mark_user.delay(user.pk, "after"))
    User = get_user_model()
    wait_for(lambda: User.objects.get(pk=user.pk).first_name == "after", timeout=20, message="the marker task")
