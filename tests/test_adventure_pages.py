"""The adventures page: my adventures (title, length, last played), creating one with a
model profile, deleting one after a confirmation that names what goes, import and export."""

from __future__ import annotations

from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from stories import tree
from stories.llm.base import profile_label
from stories.models import Adventure, Branch, Memory, ModelProfile, Node, WorldEntry

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def add_turns(adventure: Adventure, count: int) -> None:
    for i in range(count):
        head = Node.objects.get(pk=Adventure.objects.get(pk=adventure.pk).head_id)
        tree.node_append(
            adventure=adventure, expected_version=None, kind="do", player_input=f"Step {i}", narration="You step.",
            suggestions=[], state_delta=[], state_after=head.state_after, checks=[],
        )  # fmt: skip


def test_it_lists_only_my_adventures_with_length_and_last_played(client_alice, user, other_user):
    mine = tree.adventure_create(owner=user, title="The Lighthouse", premise="Dark.")
    add_turns(mine, 3)
    tree.adventure_create(owner=other_user, title="Someone else's")
    body = client_alice.get(reverse("adventure_list")).content.decode()
    assert "The Lighthouse" in body
    assert "Someone else" not in body
    assert "3 turns" in body
    assert " ago" in body  # last played
    assert reverse("play", args=[mine.pk]) in body
    assert reverse("adventure_export", args=[mine.pk]) in body
    assert reverse("adventure_delete", args=[mine.pk]) in body
    assert reverse("adventure_import") in body


def test_the_create_form_offers_every_profile_by_its_label(client_alice):
    tree.default_profile()
    remote = ModelProfile.objects.create(
        name="Local llama", provider="openai", base_url="http://127.0.0.1:8080/v1", model_name="llama-3"
    )
    body = unescape(client_alice.get(reverse("adventure_list")).content.decode())
    assert profile_label(remote) in body
    for profile in ModelProfile.objects.all():
        assert f'value="{profile.pk}"' in body


def test_creating_an_adventure_opens_its_play_page(client_alice, user):
    tree.default_profile()
    remote = ModelProfile.objects.create(name="Remote", provider="openai", base_url="http://h/v1", model_name="m")
    response = client_alice.post(
        reverse("adventure_create"),
        {"title": "  A   Cold  Coast ", "premise": "Snow.", "persona": "A trapper.", "style": "Terse.",
         "model_profile": remote.pk},
    )  # fmt: skip
    adventure = Adventure.objects.get(owner=user)
    assert response.status_code == 302
    assert response["Location"] == reverse("play", args=[adventure.pk])
    assert (adventure.title, adventure.premise, adventure.persona, adventure.style) == (
        "A Cold Coast", "Snow.", "A trapper.", "Terse.",
    )  # fmt: skip
    assert adventure.model_profile == remote
    assert adventure.head.narration == "Snow."
    page = client_alice.get(response["Location"])
    assert page.status_code == 200
    assert "A Cold Coast" in page.content.decode()


def test_creating_with_htmx_redirects_the_browser(client_alice, user):
    profile = tree.default_profile()
    response = client_alice.post(
        reverse("adventure_create"), {"title": "Quick", "model_profile": profile.pk}, headers=HTMX
    )
    adventure = Adventure.objects.get(owner=user)
    assert response["HX-Redirect"] == reverse("play", args=[adventure.pk])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"title": "   "}, "A title is required."),
        ({"title": "t" * 201}, "at most 200 characters"),
        ({"title": "Ok", "model_profile": "999999"}, "Select a valid choice"),
    ],
)
def test_bad_input_to_create_is_400_with_a_message(client_alice, data, message):
    profile = tree.default_profile()
    data = {"model_profile": profile.pk, **data}
    page = client_alice.post(reverse("adventure_create"), data)
    assert page.status_code == 400
    assert message in unescape(page.content.decode())
    partial = client_alice.post(reverse("adventure_create"), data, headers=HTMX)
    assert partial.status_code == 400
    assert 'id="create-form"' in partial.content.decode()
    assert "<!doctype" not in partial.content.decode()
    assert not Adventure.objects.exists()


def test_delete_confirmation_names_what_will_be_lost(client_alice, user):
    adventure = tree.adventure_create(owner=user, title="Doomed", premise="Rain.")
    add_turns(adventure, 4)
    target = Node.objects.get(adventure=adventure, depth=4)
    head = Node.objects.get(pk=target.parent_id)
    tree.sibling_branch_add(
        adventure=adventure, target=target, expected_version=None, kind="do", player_input="Other", narration="N.",
        suggestions=[], state_delta=[], state_after=head.state_after, checks=[],
    )  # fmt: skip
    tree.memory_add(adventure=adventure, text="One")
    tree.memory_add(adventure=adventure, text="Two")
    WorldEntry.objects.create(adventure=adventure, keys=["rain"], content="It always rains.")
    body = unescape(client_alice.get(reverse("adventure_delete", args=[adventure.pk])).content.decode())
    assert "Delete “Doomed”?" in body
    assert "<strong>5</strong> turns" in body
    assert "<strong>2</strong> branches" in body
    assert "<strong>2</strong> memories" in body
    assert "<strong>1</strong> world-book entry" in body
    assert reverse("adventure_export", args=[adventure.pk]) in body
    assert Adventure.objects.filter(pk=adventure.pk).exists()  # asking deletes nothing


def test_confirming_deletes_everything_in_it(client_alice, user):
    adventure = tree.adventure_create(owner=user, title="Doomed", premise="Rain.")
    add_turns(adventure, 2)
    tree.memory_add(adventure=adventure, text="A note")
    response = client_alice.post(reverse("adventure_delete", args=[adventure.pk]))
    assert response.status_code == 302
    assert response["Location"] == reverse("adventure_list")
    assert not Adventure.objects.filter(pk=adventure.pk).exists()
    assert not Node.objects.filter(adventure_id=adventure.pk).exists()
    assert not Branch.objects.filter(adventure_id=adventure.pk).exists()
    assert not Memory.objects.filter(adventure_id=adventure.pk).exists()
    page = client_alice.get(response["Location"]).content.decode()
    assert "Deleted “Doomed”" in unescape(page)


def test_another_players_adventure_cannot_be_deleted(client_alice, other_user):
    theirs = tree.adventure_create(owner=other_user, title="Theirs")
    url = reverse("adventure_delete", args=[theirs.pk])
    assert client_alice.get(url).status_code == 404
    assert client_alice.post(url).status_code == 404
    assert Adventure.objects.filter(pk=theirs.pk).exists()


def test_anonymous_users_and_forged_posts_are_refused(user):
    adventure = tree.adventure_create(owner=user, title="Mine")
    for url in [reverse("adventure_list"), reverse("adventure_delete", args=[adventure.pk])]:
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(reverse("adventure_delete", args=[adventure.pk])).status_code == 403
    assert strict.post(reverse("adventure_create"), {"title": "Forged"}).status_code == 403
    assert Adventure.objects.filter(owner=user).count() == 1
    assert Client().post(reverse("adventure_create"), {"title": "Anon"}).status_code == 302
    assert client_get_405(user)


def client_get_405(user) -> bool:
    client = Client()
    client.force_login(user)
    return client.get(reverse("adventure_create")).status_code == 405
