"""The JSON API contract: auth, scoping, errors, and the non-turn routes."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from stories import tree
from stories.models import Adventure, ApiToken, Memory, WorldEntry

pytestmark = pytest.mark.django_db


@pytest.fixture
def token(user):
    _, key = ApiToken.issue(user, name="test")
    return key


@pytest.fixture
def api(client, token):
    """A client speaking with a bearer token, as scripts would."""

    class Api:
        def __init__(self, key):
            self.headers = {"Authorization": f"Bearer {key}"}

        def get(self, url, **params):
            return client.get(url, params, headers=self.headers)

        def post(self, url, body=None):
            return client.post(url, body or {}, content_type="application/json", headers=self.headers)

        def patch(self, url, body):
            return client.patch(url, body, content_type="application/json", headers=self.headers)

        def delete(self, url):
            return client.delete(url, headers=self.headers)

        def client_post_raw(self, url, data: bytes):
            return client.generic("POST", url, data, content_type="application/json", headers=self.headers)

    return Api(token)


@pytest.fixture
def adventure(user):
    return tree.adventure_create(owner=user, title="The Dark Lighthouse", premise="Rain on slate roofs.")


def test_anonymous_callers_get_401_with_the_error_shape(client):
    response = client.get("/api/v1/adventures")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_a_wrong_token_is_401(client):
    response = client.get("/api/v1/adventures", headers={"Authorization": "Bearer st_nope"})
    assert response.status_code == 401


def test_create_then_list_and_read(api):
    response = api.post("/api/v1/adventures", {"title": "Salt and Iron", "premise": "A harbour at dusk."})
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["title"] == "Salt and Iron"
    assert created["version"] == 1
    assert created["length"] == 0
    assert created["model_profile"]["label"] == "offline narrator, no AI model"
    listing = api.get("/api/v1/adventures").json()["adventures"]
    assert [a["id"] for a in listing] == [created["id"]]
    detail = api.get(f"/api/v1/adventures/{created['id']}").json()
    assert detail["premise"] == "A harbour at dusk."
    assert (
        detail["state"] == {"flags": [], "relationships": {}, "inventory": [], "facts": []}
        or "flags" in detail["state"]
    )


def test_create_rejects_bad_input_with_400(api):
    assert api.post("/api/v1/adventures", {"title": ""}).status_code == 400
    response = api.post("/api/v1/adventures", {"title": "x" * 201})
    assert response.status_code == 400
    assert "title" in response.json()["error"]["message"]
    response = api.post("/api/v1/adventures", {"title": "ok", "model_profile_id": 999999})
    assert response.status_code == 400
    assert Adventure.objects.count() == 0


def test_story_endpoint_pages_up(api, adventure):
    for i in range(5):
        adventure.refresh_from_db()
        tree.node_append(
            adventure=adventure, kind="do", player_input=f"step {i}", narration=f"narration {i}", suggestions=[],
            state_delta=[], state_after={}, checks=[], expected_version=adventure.version,
        )  # fmt: skip
    first = api.get(f"/api/v1/adventures/{adventure.pk}/story", limit=3).json()
    assert [n["input"] for n in first["nodes"]] == ["step 2", "step 3", "step 4"]
    assert first["has_more"] is True
    second = api.get(f"/api/v1/adventures/{adventure.pk}/story", limit=3, before=first["nodes"][0]["id"]).json()
    assert [n["depth"] for n in second["nodes"]] == [0, 1, 2]
    assert second["has_more"] is False


def test_another_players_objects_answer_404(client, other_user, adventure):
    _, key = ApiToken.issue(other_user)
    headers = {"Authorization": f"Bearer {key}"}
    head = adventure.head
    branch = head.branch
    memory = tree.memory_add(adventure=adventure, text="A secret")
    entry = WorldEntry.objects.create(adventure=adventure, keys=["x"], content="y")
    for method, url in [
        ("get", f"/api/v1/adventures/{adventure.pk}"),
        ("get", f"/api/v1/adventures/{adventure.pk}/story"),
        ("get", f"/api/v1/adventures/{adventure.pk}/branches"),
        ("get", f"/api/v1/adventures/{adventure.pk}/memories"),
        ("get", f"/api/v1/adventures/{adventure.pk}/world-entries"),
        ("get", f"/api/v1/nodes/{head.pk}/attempts"),
        ("delete", f"/api/v1/adventures/{adventure.pk}"),
        ("delete", f"/api/v1/branches/{branch.pk}"),
        ("delete", f"/api/v1/memories/{memory.pk}"),
        ("delete", f"/api/v1/world-entries/{entry.pk}"),
    ]:
        response = getattr(client, method)(url, headers=headers)
        assert response.status_code == 404, (method, url, response.content)
        assert response.json()["error"]["code"] == "not_found"
    assert Adventure.objects.filter(pk=adventure.pk).exists()
    assert Memory.objects.filter(pk=memory.pk).exists()


def test_session_auth_requires_csrf_for_writes(user):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get("/api/v1/adventures").status_code == 200
    response = browser.post("/api/v1/adventures", {"title": "x"}, content_type="application/json")
    assert response.status_code in (401, 403)
    assert Adventure.objects.count() == 0


def test_memories_and_world_entries_round_trip(api, adventure):
    url = f"/api/v1/adventures/{adventure.pk}/memories"
    created = api.post(url, {"text": "Maren owes you a favour", "pinned": True})
    assert created.status_code == 201
    memory_id = created.json()["id"]
    assert api.patch(f"/api/v1/memories/{memory_id}", {"pinned": False}).json()["pinned"] is False
    assert [m["text"] for m in api.get(url).json()["memories"]] == ["Maren owes you a favour"]
    assert api.post(url, {"text": ""}).status_code == 400
    assert api.delete(f"/api/v1/memories/{memory_id}").status_code == 204

    url = f"/api/v1/adventures/{adventure.pk}/world-entries"
    created = api.post(url, {"keys": ["Maren", " "], "content": "The innkeeper.", "priority": 3})
    assert created.status_code == 201
    assert created.json()["keys"] == ["Maren"]
    entry_id = created.json()["id"]
    assert api.patch(f"/api/v1/world-entries/{entry_id}", {"enabled": False}).json()["enabled"] is False
    assert api.post(url, {"keys": ["a"], "content": "x", "priority": 10_000}).status_code == 400
    # The world book's own rule: an entry needs a trigger word unless it is always on.
    refused = api.post(url, {"keys": [" "], "content": "Never triggers."})
    assert refused.status_code == 400
    assert "always on" in refused.json()["error"]["message"]
    assert api.post(url, {"keys": [], "content": "Always there.", "always_on": True}).status_code == 201
    assert api.delete(f"/api/v1/world-entries/{entry_id}").status_code == 204


def test_undo_redo_and_stale_version(api, adventure):
    tree.node_append(
        adventure=adventure, kind="do", player_input="look", narration="You look.", suggestions=[],
        state_delta=[], state_after={}, checks=[], expected_version=adventure.version,
    )  # fmt: skip
    adventure.refresh_from_db()
    version = adventure.version
    stale = api.post(f"/api/v1/adventures/{adventure.pk}/undo", {"expected_version": version - 1})
    assert stale.status_code == 409
    assert "another tab" in stale.json()["error"]["message"]
    undone = api.post(f"/api/v1/adventures/{adventure.pk}/undo", {"expected_version": version}).json()
    assert undone["length"] == 0
    nothing = api.post(f"/api/v1/adventures/{adventure.pk}/undo", {"expected_version": undone["version"]})
    assert nothing.status_code in (400, 409)
    redone = api.post(f"/api/v1/adventures/{adventure.pk}/redo", {"expected_version": undone["version"]}).json()
    assert redone["length"] == 1


def test_branches_listing_and_rename(api, adventure):
    data = api.get(f"/api/v1/adventures/{adventure.pk}/branches").json()
    assert len(data["branches"]) == 1
    branch_id = data["branches"][0]["id"]
    renamed = api.patch(f"/api/v1/branches/{branch_id}", {"name": "Main line"})
    assert renamed.status_code == 200
    assert renamed.json()["name"] == "Main line"
    refused = api.delete(f"/api/v1/branches/{branch_id}")
    assert refused.status_code == 409


def test_openapi_schema_is_served(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert "/api/v1/adventures/{adventure_id}/turns" in response.json()["paths"]


def test_create_api_token_command_prints_a_working_token(client, user, capsys):
    call_command("create_api_token", "alice")
    key = capsys.readouterr().out.strip()
    response = client.get("/api/v1/adventures", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200


def test_export_then_import_through_the_api(api, adventure, settings):
    tree.memory_add(adventure=adventure, text="The bell tolls at midnight")
    response = api.get(f"/api/v1/adventures/{adventure.pk}/export")
    assert response.status_code == 200
    assert response.streaming
    body = b"".join(response.streaming_content)
    imported = api.client_post_raw("/api/v1/adventures/import", body)
    assert imported.status_code == 201, imported.content
    new_id = imported.json()["id"]
    assert new_id != adventure.pk
    assert imported.json()["title"] == "The Dark Lighthouse"
    again = b"".join(api.get(f"/api/v1/adventures/{new_id}/export").streaming_content)
    assert again == body


def test_import_refuses_bad_files_with_the_json_path(api, settings):
    response = api.client_post_raw("/api/v1/adventures/import", b'{"format": "storytree-bundle", "version": 99}')
    assert response.status_code == 400
    assert "$" in response.json()["error"]["message"]
    settings.STORYTREE_IMPORT_MAX_BYTES = 2048
    response = api.client_post_raw("/api/v1/adventures/import", b" " * 4096)
    assert response.status_code == 413
    assert Adventure.objects.count() == 0


def test_another_players_export_is_404(client, other_user, adventure):
    _, key = ApiToken.issue(other_user)
    response = client.get(f"/api/v1/adventures/{adventure.pk}/export", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 404
