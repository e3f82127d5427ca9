"""Failure semantics: whatever goes wrong before the commit leaves no node, no checkpoint and
an unmoved head; the player sees a clear message and can retry."""

from __future__ import annotations

import json

import pytest

from checkpoints.models import ContextCheckpoint
from stories import tree
from stories.models import Adventure, ApiToken, Node, TurnJob, WorldEntry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(client, user, redis_url):
    _, key = ApiToken.issue(user)

    class Api:
        headers = {"Authorization": f"Bearer {key}"}

        def get(self, url):
            return client.get(url, headers=self.headers)

        def post(self, url, body=None):
            return client.post(url, body or {}, content_type="application/json", headers=self.headers)

    return Api()


@pytest.fixture
def adventure(user, fake_openai):
    adventure = tree.adventure_create(owner=user, title="Fakes", premise="A quiet harbour.", persona="A sailor.")
    adventure.model_profile = fake_openai.profile(timeout_seconds=1.0)
    adventure.save(update_fields=["model_profile"])
    return adventure


def request_turn(api, adventure, text="I climb the wall."):
    version = Adventure.objects.get(pk=adventure.pk).version
    response = api.post(
        f"/api/v1/adventures/{adventure.pk}/turns", {"kind": "do", "text": text, "expected_version": version}
    )
    assert response.status_code == 202, response.content
    return api.get(f"/api/v1/jobs/{response.json()['id']}").json()


def snapshot(adventure):
    fresh = Adventure.objects.get(pk=adventure.pk)
    return (
        fresh.head_id,
        fresh.version,
        Node.objects.filter(adventure=adventure).count(),
        ContextCheckpoint.objects.count(),
    )


@pytest.mark.parametrize(
    ("script", "code"),
    [
        (lambda f: f.add_error(429, retry_after="7"), "model_rate_limited"),
        (lambda f: f.add_error(500), "model_unavailable"),
        (lambda f: f.add_delay(3.0), "model_timeout"),
        (lambda f: f.add_text("Once upon a time"), "model_malformed"),
        (lambda f: f.add_raw_arguments("submit_turn_plan", '{"narration": '), "model_malformed"),
        (lambda f: f.add_truncated("submit_turn_plan"), "model_malformed"),
        (
            lambda f: f.add_tool_call(
                "submit_turn_plan", {"narration": "x", "suggestions": [], "state_delta": [], "checks": [{"roll": 20}]}
            ),
            "model_malformed",
        ),
        (
            lambda f: f.add_tool_call(
                "submit_turn_plan",
                {"narration": "x", "suggestions": [], "state_delta": [{"op": "grant_godhood", "who": "me"}]},
            ),
            "model_malformed",
        ),
    ],
)
def test_model_errors_write_nothing_and_can_be_retried(api, adventure, fake_openai, script, code):
    before = snapshot(adventure)
    script(fake_openai)
    job = request_turn(api, adventure)
    assert job["status"] == "failed"
    assert job["error"]["code"] == code
    assert job["error"]["message"]
    assert fake_openai.api_key not in job["error"]["message"]
    assert snapshot(adventure) == before
    # Once the model behaves again, retrying the same job writes the turn.
    retried = api.post(f"/api/v1/jobs/{job['id']}/retry")
    assert retried.status_code == 202
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "done"
    assert Node.objects.filter(adventure=adventure).count() == before[2] + 1


def test_a_hidden_check_is_rolled_by_the_runtime_and_kept_private(api, adventure, fake_openai):
    fake_openai.add_tool_call("request_check", {"skill": "athletics", "difficulty": "hard", "reason": "slick stones"})
    fake_openai.add_tool_call(
        "submit_turn_plan",
        {
            "narration": "You haul yourself up.",
            "suggestions": ["Look around"],
            "state_delta": [{"op": "add_item", "item": "rope"}],
        },
    )
    job = request_turn(api, adventure)
    assert job["status"] == "done", job
    node = Node.objects.get(pk=job["node"])
    [record] = node.checks
    assert (
        record["skill"] == "athletics"
        and 1 <= record["roll"] <= 20
        and record["outcome"] in {"success", "partial", "failure"}
    )
    assert node.state_after["inventory"] == ["rope"]
    continuation = fake_openai.requests[-1].body
    # After the check only submit_turn_plan is offered, and the model sees only the outcome.
    assert [t["function"]["name"] for t in continuation["tools"]] == ["submit_turn_plan"]
    tool_message = continuation["messages"][-1]
    assert tool_message["role"] == "tool"
    assert json.loads(tool_message["content"]) == {"outcome": record["outcome"]}
    assert str(record["seed"]) not in json.dumps(continuation)


def test_a_second_check_request_is_malformed(api, adventure, fake_openai):
    before = snapshot(adventure)
    check = {"skill": "athletics", "difficulty": "hard", "reason": "again"}
    fake_openai.add_tool_call("request_check", check)
    fake_openai.add_tool_call("request_check", check)
    job = request_turn(api, adventure)
    assert job["status"] == "failed"
    assert job["error"]["code"] == "model_malformed"
    assert snapshot(adventure) == before


def test_canaries_never_reach_the_model(api, adventure, fake_openai):
    WorldEntry.objects.create(adventure=adventure, keys=["zeppelin"], content="CANARY-UNTRIGGERED-ENTRY")
    fake_openai.add_tool_call("request_check", {"skill": "stealth", "difficulty": "easy", "reason": "sneak"})
    fake_openai.add_tool_call(
        "submit_turn_plan", {"narration": "You slip past.", "suggestions": ["Go on"], "state_delta": []}
    )
    first = request_turn(api, adventure, text="I sneak past the guard.")
    assert first["status"] == "done"
    node = Node.objects.get(pk=first["node"])
    # Put a canary into the private check record, as an exact roll would be.
    node.checks[0]["reason"] = "CANARY-CHECK-RECORD"
    Node.objects.filter(pk=node.pk).update(checks=node.checks)
    request_turn(api, adventure, text="I keep walking.")
    request_turn(api, adventure, text="I regenerate nothing.")
    sent = json.dumps([r.body for r in fake_openai.requests])
    headers = json.dumps([{k: v for k, v in r.headers.items() if k != "authorization"} for r in fake_openai.requests])
    for canary in ["CANARY-UNTRIGGERED-ENTRY", "CANARY-CHECK-RECORD", fake_openai.api_key]:
        assert canary not in sent
    assert fake_openai.api_key not in headers
    assert all(r.headers["authorization"] == f"Bearer {fake_openai.api_key}" for r in fake_openai.requests)


def test_regenerate_does_not_send_the_replaced_narration(api, adventure, fake_openai):
    fake_openai.add_tool_call(
        "submit_turn_plan",
        {
            "narration": "CANARY-REPLACED-NARRATION",
            "suggestions": [],
            "state_delta": [{"op": "set_flag", "flag": "met_maren"}],
        },
    )
    job = request_turn(api, adventure, text="I greet Maren.")
    target = Node.objects.get(pk=job["node"])
    version = Adventure.objects.get(pk=adventure.pk).version
    response = api.post(
        f"/api/v1/adventures/{adventure.pk}/turns",
        {"kind": "regenerate", "node": target.pk, "expected_version": version},
    )
    job = api.get(f"/api/v1/jobs/{response.json()['id']}").json()
    assert job["status"] == "done", job
    request = fake_openai.requests[-1].body
    assert "CANARY-REPLACED-NARRATION" not in json.dumps(request)
    assert [t["function"]["name"] for t in request["tools"]] == ["submit_turn_plan"]
    new = Node.objects.get(pk=job["node"])
    assert new.state_delta == target.state_delta == [{"op": "set_flag", "flag": "met_maren"}]
    assert new.state_after == target.state_after


def test_cancel_while_narrating_commits_nothing(api, adventure, fake_openai, client):
    from storyproject.celery import app

    app.conf.task_always_eager = False
    before = snapshot(adventure)
    fake_openai.add_slow_stream(60, 0.05)
    version = Adventure.objects.get(pk=adventure.pk).version
    response = api.post(
        f"/api/v1/adventures/{adventure.pk}/turns", {"kind": "do", "text": "I wait.", "expected_version": version}
    )
    job = TurnJob.objects.get(pk=response.json()["id"])
    # Run it here, in a thread, as a worker would; cancel once narration has started streaming.
    import threading

    from stories.turns import turn_run
    from tests.conftest import wait_for

    runner = threading.Thread(target=turn_run, args=(job.pk,))
    runner.start()
    wait_for(lambda: TurnJob.objects.get(pk=job.pk).partial_text, timeout=10, message="streamed narration")
    assert api.post(f"/api/v1/jobs/{job.pk}/cancel").status_code == 200
    runner.join(15)
    job.refresh_from_db()
    assert job.status == "cancelled"
    assert snapshot(adventure) == before
