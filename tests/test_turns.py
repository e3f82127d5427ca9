"""The turn pipeline through the API, tasks run eagerly (in-process) against a real Redis lock."""

from __future__ import annotations

import pytest

from stories import paths, tree
from stories.integrity import check_adventure
from stories.models import Adventure, ApiToken, Node, TurnJob, WorldEntry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(client, user, redis_url):
    _, key = ApiToken.issue(user)

    class Api:
        headers = {"Authorization": f"Bearer {key}"}

        def get(self, url, **params):
            return client.get(url, params, headers=self.headers)

        def post(self, url, body=None):
            return client.post(url, body or {}, content_type="application/json", headers=self.headers)

    return Api()


@pytest.fixture
def adventure(user):
    adventure = tree.adventure_create(
        owner=user,
        title="The Dark Lighthouse",
        premise="Rain hammers the roofs of Saltmarsh.",
        persona="Ilsa Varn, a navigator.",
    )
    WorldEntry.objects.create(adventure=adventure, keys=["Maren"], content="Maren hides her brother in the cellar.")
    return adventure


def version(adventure) -> int:
    return Adventure.objects.get(pk=adventure.pk).version


def play(api, adventure, kind="do", text="I look around the inn.", **extra):
    body = {"kind": kind, "text": text, "expected_version": version(adventure), **extra}
    response = api.post(f"/api/v1/adventures/{adventure.pk}/turns", body)
    return response


def story(api, adventure) -> list[dict]:
    return api.get(f"/api/v1/adventures/{adventure.pk}/story", limit=200).json()["nodes"]


def assert_clean(adventure):
    assert check_adventure(Adventure.objects.get(pk=adventure.pk)) == []


def test_a_turn_is_written_and_moves_the_head(api, adventure):
    response = play(api, adventure, text="I ask Maren about the lighthouse.")
    assert response.status_code == 202, response.content
    job = api.get(f"/api/v1/jobs/{response.json()['id']}").json()
    assert job["status"] == "done", job
    assert job["node"] is not None
    nodes = story(api, adventure)
    assert [n["depth"] for n in nodes] == [0, 1]
    assert nodes[1]["input"] == "I ask Maren about the lighthouse."
    assert nodes[1]["narration"]
    assert 1 <= len(nodes[1]["suggestions"]) <= 4
    assert_clean(adventure)


def test_refusals_write_nothing(api, adventure):
    before = Node.objects.count(), TurnJob.objects.count()
    too_long = play(api, adventure, text="x" * 4001)
    assert too_long.status_code == 400
    assert "4,000" in too_long.json()["error"]["message"]
    assert play(api, adventure, kind="dance").status_code == 400
    assert play(api, adventure, text="   ").status_code == 400
    stale = api.post(f"/api/v1/adventures/{adventure.pk}/turns", {"kind": "do", "text": "hi", "expected_version": 0})
    assert stale.status_code == 409
    assert "another tab" in stale.json()["error"]["message"]
    assert (Node.objects.count(), TurnJob.objects.count()) == before


def test_the_same_idempotency_key_yields_one_job(api, adventure):
    first = play(api, adventure, idempotency_key="k-1")
    second = api.post(
        f"/api/v1/adventures/{adventure.pk}/turns",
        {"kind": "do", "text": "I look around the inn.", "expected_version": 1, "idempotency_key": "k-1"},
    )
    assert first.status_code == 202
    assert second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    assert TurnJob.objects.count() == 1
    assert Node.objects.filter(adventure=adventure).count() == 2


def test_retry_switch_fork_regenerate_undo_redo(api, adventure):
    for text in ["I enter the inn.", "I order a drink.", "I ask about the lighthouse."]:
        assert play(api, adventure, text=text).status_code == 202
    tip = Adventure.objects.get(pk=adventure.pk).head
    assert play(api, adventure, kind="retry", text="").status_code == 202
    attempts = api.get(f"/api/v1/nodes/{tip.pk}/attempts").json()["attempts"]
    assert len(attempts) == 2
    assert [a["live"] for a in attempts].count(True) == 1
    # Switch back to the first attempt.
    switched = api.post(f"/api/v1/nodes/{tip.pk}/switch", {"expected_version": version(adventure)})
    assert switched.status_code == 200
    assert switched.json()["head"] == tip.pk
    assert_clean(adventure)

    # Regenerate an older node: a sibling on a new branch, same input, same delta and checks.
    target = story(api, adventure)[2]
    response = play(api, adventure, kind="regenerate", text="", node=target["id"])
    assert response.status_code == 202, response.content
    job = api.get(f"/api/v1/jobs/{response.json()['id']}").json()
    assert job["status"] == "done", job
    new = Node.objects.get(pk=job["node"])
    old = Node.objects.get(pk=target["id"])
    assert new.branch_id != old.branch_id
    assert new.depth == old.depth and new.parent_id == old.parent_id
    assert new.player_input == old.player_input
    assert new.state_delta == old.state_delta and new.checks == old.checks
    assert new.regenerated_from_id == old.pk
    assert Adventure.objects.get(pk=adventure.pk).head_id == new.pk
    assert_clean(adventure)

    # Undo then redo.
    undone = api.post(f"/api/v1/adventures/{adventure.pk}/undo", {"expected_version": version(adventure)}).json()
    assert undone["head"] == new.parent_id
    redone = api.post(f"/api/v1/adventures/{adventure.pk}/redo", {"expected_version": version(adventure)}).json()
    assert redone["head"] == new.pk
    assert_clean(adventure)


def test_play_thirty_turns_mixing_kinds_keeps_the_tree_clean(api, adventure):
    kinds = ["do", "say", "story", "continue"]
    expected_inputs = []
    for i in range(30):
        kind = kinds[i % 4]
        text = "" if kind == "continue" else f"{kind} number {i}"
        response = play(api, adventure, kind=kind, text=text)
        assert response.status_code == 202, response.content
        assert api.get(f"/api/v1/jobs/{response.json()['id']}").json()["status"] == "done"
        expected_inputs.append(text)
        if i % 7 == 6:
            assert play(api, adventure, kind="retry", text="").status_code == 202
        assert_clean(adventure)
    nodes = story(api, adventure)
    assert [n["input"] for n in nodes[1:]] == expected_inputs
    head = Adventure.objects.get(pk=adventure.pk).head
    walked = []
    node = head
    while node is not None:
        walked.append(node.pk)
        node = node.parent
    assert [n["id"] for n in nodes] == list(reversed(walked))
    assert [n.pk for n in paths.iter_path(head)] == list(reversed(walked))


def test_cancel_a_queued_job(api, adventure, settings):
    from storyproject.celery import app

    app.conf.task_always_eager = False  # nobody consumes: the job stays queued
    response = play(api, adventure)
    job_id = response.json()["id"]
    cancelled = api.post(f"/api/v1/jobs/{job_id}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert Node.objects.filter(adventure=adventure).count() == 1
    assert version(adventure) == 1


def test_turn_requests_are_rate_limited_per_user_with_retry_after(api, adventure, settings):
    settings.STORYTREE_TURN_RATE = "2/min"
    assert play(api, adventure).status_code == 202
    assert play(api, adventure).status_code == 202
    limited = play(api, adventure)
    assert limited.status_code == 429
    assert int(limited["Retry-After"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limited"
    assert Node.objects.filter(adventure=adventure).count() == 3


def test_turn_requests_answer_503_when_the_queue_is_down(api, adventure, settings):
    from storyproject.celery import app
    from tests.conftest import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_URL = dead
    app.conf.task_always_eager = False
    original = app.conf.broker_url
    app.conf.broker_url = dead
    app._pool = None
    app.amqp._producer_pool = None
    app.conf.broker_connection_retry = False
    app.conf.broker_connection_max_retries = 0
    try:
        response = play(api, adventure)
    finally:
        app.conf.broker_url = original
        app._pool = None
        app.amqp._producer_pool = None
    assert response.status_code == 503, response.content
    assert "not answering" in response.json()["error"]["message"]
    assert Node.objects.filter(adventure=adventure).count() == 1
    assert TurnJob.objects.get(adventure=adventure).status == "failed"


def test_retry_with_the_offline_narrator_writes_a_different_attempt(api, adventure):
    assert play(api, adventure, text="I look around the inn.").status_code == 202
    tip = Adventure.objects.get(pk=adventure.pk).head
    for _ in range(2):
        assert play(api, adventure, kind="retry", text="").status_code == 202
    attempts = api.get(f"/api/v1/nodes/{tip.pk}/attempts").json()["attempts"]
    assert len(attempts) == 3
    assert len({a["narration"] for a in attempts}) > 1
