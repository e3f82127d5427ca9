"""Schemathesis against `/api/v1/openapi.json`, in process (the WSGI app): for every operation a
few generated requests, half of them aimed at real objects of a player with one adventure, all
sent with that player's bearer token. No response may be a 5xx, and every response must match
the schema (documented status, content type, body)."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance

from stories import tree, turns
from stories.models import ApiToken, Memory, TurnJob, WorldEntry

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES_PER_OPERATION = 5
# "Schema-valid data must be accepted" does not hold for this API by design: the domain refuses
# with a 400 and a message what a schema cannot say (a model profile id that does not exist,
# a turn longer than STORYTREE_MAX_INPUT_CHARS, a blank title after trimming).
EXCLUDED_CHECKS = [positive_data_acceptance]


def a_world(user) -> dict[str, int]:
    """One adventure with a played turn, a retried attempt, a fork, a memory, a world entry
    and a finished job: real ids for every kind of path parameter."""
    adventure = tree.adventure_create(owner=user, title="Schema", premise="A foggy quay.", persona="A smuggler.")
    job, _ = turns.turn_request(adventure=adventure, kind="do", text="I wait.", expected_version=1)
    turns.turn_request(adventure=adventure, kind="retry", expected_version=2)
    adventure.refresh_from_db()
    memory = Memory.objects.create(
        adventure=adventure, branch=adventure.head.branch, depth=adventure.head.depth, text="The quay is watched."
    )
    entry = WorldEntry.objects.create(adventure=adventure, keys=["quay"], content="Smugglers meet at the quay.")
    job = TurnJob.objects.get(pk=job.pk)
    return {
        "adventure_id": adventure.pk,
        "node_id": adventure.head_id,
        "branch_id": adventure.head.branch_id,
        "job_id": job.pk,
        "memory_id": memory.pk,
        "entry_id": entry.pk,
    }


@pytest.fixture
def schema(redis_url):
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())


def test_every_operation_answers_as_its_schema_says(schema, user):
    _, key = ApiToken.issue(user)
    headers = {"Authorization": f"Bearer {key}"}
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 25, "the schema lost its operations"
    for operation in operations:
        names = [p.name for p in operation.path_parameters]
        ids = a_world(user)  # a fresh story per operation: DELETE may remove it
        unknown = [name for name in names if name not in ids]
        assert not unknown, f"{operation.label}: no real object for path parameter(s) {unknown}; add them to a_world"
        real = operation.as_strategy(path_parameters={name: ids[name] for name in names})
        strategy = st.one_of(real, operation.as_strategy()) if names else real

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: report, keep the suite fast
            suppress_health_check=list(HealthCheck),
        )
        def check(case):
            case.call_and_validate(headers=headers, excluded_checks=EXCLUDED_CHECKS)

        try:
            check()
        except (Exception, BaseExceptionGroup) as exc:  # collected: one run reports every failing operation
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
