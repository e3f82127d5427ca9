"""Export and import in the browser (stories/views_bundles.py)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import StreamingHttpResponse
from django.urls import reverse

from stories import tree
from stories.bundles import export_bytes
from stories.models import Adventure

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create(username="alice")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create(username="mallory")


@pytest.fixture
def alice(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def adventure(user) -> Adventure:
    adventure = tree.adventure_create(owner=user, title="Fog & Light", premise="Fog over the harbour.")
    tree.node_append(
        adventure=adventure,
        kind="do",
        player_input="I climb.",
        narration="The stairs creak.",
        suggestions=[],
        state_delta=[],
        state_after={},
        checks=[],
        expected_version=adventure.version,
    )
    return adventure


def upload(name: str, data: bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="application/octet-stream")


def test_export_streams_an_attachment(alice, adventure):
    response = alice.get(reverse("adventure_export", args=[adventure.pk]))
    assert response.status_code == 200
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Disposition"] == 'attachment; filename="fog-light.storytree.json"'
    body = b"".join(response.streaming_content)
    assert body == export_bytes(adventure)
    assert json.loads(body)["adventure"]["title"] == "Fog & Light"


def test_export_streams_asynchronously_under_asgi(async_client, adventure, user):
    async def fetch():
        await async_client.aforce_login(user)
        response = await async_client.get(reverse("adventure_export", args=[adventure.pk]))
        return response, b"".join([chunk async for chunk in response.streaming_content])

    response, body = async_to_sync(fetch)()
    assert response.status_code == 200
    assert response.is_async  # an ASGI server streams it instead of collecting it in memory first
    assert body == export_bytes(adventure)


def test_export_is_404_for_another_player_and_needs_login(client, adventure, other_user):
    url = reverse("adventure_export", args=[adventure.pk])
    assert client.get(url).status_code == 302  # to the login page
    client.force_login(other_user)
    assert client.get(url).status_code == 404
    assert client.post(url).status_code in (404, 405)


def test_the_import_form(alice):
    response = alice.get(reverse("adventure_import"))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'type="file"' in page and 'enctype="multipart/form-data"' in page


def test_a_good_import_redirects_to_the_list_with_a_message(alice, adventure, user):
    data = export_bytes(adventure)
    response = alice.post(reverse("adventure_import"), {"file": upload("fog.storytree.json", data)}, follow=True)
    assert response.redirect_chain == [(reverse("adventure_list"), 302)]
    imported = Adventure.objects.filter(owner=user).exclude(pk=adventure.pk).get()
    assert export_bytes(imported) == data
    assert "Imported “Fog &amp; Light”." in response.content.decode()


def test_a_corrected_import_shows_what_was_corrected(alice, adventure):
    doc = json.loads(export_bytes(adventure))
    doc["adventure"]["model_profile"] = "Nobody's model"
    response = alice.post(
        reverse("adventure_import"), {"file": upload("x.json", json.dumps(doc).encode())}, follow=True
    )
    assert "Corrected while importing" in response.content.decode()


def test_a_faulty_file_is_400_naming_the_json_path(alice, adventure, user):
    doc = json.loads(export_bytes(adventure))
    doc["nodes"][1]["parent"] = 99
    before = Adventure.objects.count()
    response = alice.post(reverse("adventure_import"), {"file": upload("x.json", json.dumps(doc).encode())})
    assert response.status_code == 400
    page = response.content.decode()
    assert "$.nodes[1].parent" in page
    assert "names node 99, which is not listed in $.nodes" in page
    assert 'type="file"' in page  # the form again
    assert Adventure.objects.count() == before


def test_a_missing_file_is_400(alice):
    response = alice.post(reverse("adventure_import"), {})
    assert response.status_code == 400


def test_too_large_is_413_with_a_clear_message(alice, adventure, settings):
    data = export_bytes(adventure)
    settings.STORYTREE_IMPORT_MAX_BYTES = len(data) - 10
    before = Adventure.objects.count()
    response = alice.post(reverse("adventure_import"), {"file": upload("x.json", data)})
    assert response.status_code == 413
    assert "too large" in response.content.decode()
    # A body declared far beyond the cap is refused before it is read.
    settings.STORYTREE_IMPORT_MAX_BYTES = 1024
    response = alice.post(reverse("adventure_import"), {"file": upload("x.json", b" " * 200_000)})
    assert response.status_code == 413
    assert Adventure.objects.count() == before


def test_import_needs_login_and_a_csrf_token(client, user, adventure):
    url = reverse("adventure_import")
    assert client.get(url).status_code == 302
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post(url, {"file": upload("x.json", export_bytes(adventure))})
    assert response.status_code == 403
