"""Continue from here: stand on an earlier turn; the next turn starts a new line; redo returns."""

from __future__ import annotations

import pytest
from django.urls import reverse

from stories import paths, tree
from stories.integrity import check_adventure
from stories.models import Adventure, ApiToken, Node

pytestmark = pytest.mark.django_db


def content(text: str) -> dict:
    return {
        "kind": "do", "player_input": text, "narration": f"You {text}.", "suggestions": [],
        "state_delta": [], "state_after": {"flags": {}, "relationships": {}, "inventory": [text], "facts": []},
        "checks": [],
    }  # fmt: skip


@pytest.fixture
def story(user):
    adventure = tree.adventure_create(owner=user, title="Rewind", premise="A long road.")
    nodes = [tree.node_append(adventure=adventure, expected_version=None, **content(f"step {i}")) for i in range(5)]
    adventure.refresh_from_db()
    return adventure, nodes


def test_rewind_moves_the_head_back_and_the_next_turn_starts_a_new_line(story):
    adventure, nodes = story
    version = adventure.version
    tree.rewind_to(adventure=adventure, node=nodes[1], expected_version=version)
    adventure.refresh_from_db()
    assert adventure.head_id == nodes[1].pk
    assert adventure.version == version + 1
    assert adventure.head.state_after["inventory"] == ["step 1"]
    assert Node.objects.filter(adventure=adventure).count() == 6  # nothing deleted
    new = tree.node_append(adventure=adventure, expected_version=adventure.version, **content("another way"))
    assert new.branch_id != nodes[2].branch_id
    assert new.parent_id == nodes[1].pk
    assert [n.player_input for n in paths.newest(new, 10)] == ["", "step 0", "step 1", "another way"]
    # The line left is untouched.
    assert [n.pk for n in paths.newest(nodes[4], 10)][1:] == [n.pk for n in nodes]
    assert check_adventure(adventure) == []


def test_redo_walks_back_along_the_line_left(story):
    adventure, nodes = story
    tree.rewind_to(adventure=adventure, node=nodes[0], expected_version=None)
    for expected in nodes[1:]:
        tree.redo(adventure=adventure, expected_version=None)
        adventure.refresh_from_db()
        assert adventure.head_id == expected.pk


def test_rewind_refusals(story, user):
    adventure, nodes = story
    with pytest.raises(tree.StaleVersion):
        tree.rewind_to(adventure=adventure, node=nodes[0], expected_version=adventure.version - 1)
    with pytest.raises(tree.AlreadyTheStory):
        tree.rewind_to(adventure=adventure, node=nodes[4], expected_version=None)
    tree.rewind_to(adventure=adventure, node=nodes[1], expected_version=None)
    with pytest.raises(tree.InvalidInput):  # ahead of the head: that is redo's job
        tree.rewind_to(adventure=adventure, node=nodes[3], expected_version=None)
    other = tree.adventure_create(owner=user, title="Other")
    with pytest.raises(tree.NotInAdventure):
        tree.rewind_to(adventure=other, node=nodes[0], expected_version=None)
    adventure.refresh_from_db()
    assert adventure.head_id == nodes[1].pk


def test_rewind_over_the_api_and_the_page(story, client, user):
    adventure, nodes = story
    _, key = ApiToken.issue(user)
    headers = {"Authorization": f"Bearer {key}"}
    url = f"/api/v1/nodes/{nodes[2].pk}/rewind"
    response = client.post(
        url, {"expected_version": adventure.version}, content_type="application/json", headers=headers
    )
    assert response.status_code == 200
    assert response.json()["head"] == nodes[2].pk
    stale = client.post(url, {"expected_version": adventure.version}, content_type="application/json", headers=headers)
    assert stale.status_code == 409
    ahead = client.post(
        f"/api/v1/nodes/{nodes[4].pk}/rewind", {"expected_version": adventure.version + 1},
        content_type="application/json", headers=headers,
    )  # fmt: skip
    assert ahead.status_code == 400
    assert "story you are reading" in ahead.json()["error"]["message"]

    client.force_login(user)
    page = client.get(reverse("play", args=[adventure.pk]))
    rewind_url = reverse("node_rewind", args=[adventure.pk, nodes[0].pk])
    assert rewind_url in page.content.decode()
    version = Adventure.objects.get(pk=adventure.pk).version
    response = client.post(rewind_url, {"expected_version": version})
    assert response.status_code == 302
    assert Adventure.objects.get(pk=adventure.pk).head_id == nodes[0].pk


def test_a_row_deleted_by_another_request_is_gone_not_a_crash(story, user):
    """Two tabs: one looked a node up, the other deleted its branch before the write."""
    adventure, nodes = story
    tree.rewind_to(adventure=adventure, node=nodes[1], expected_version=None)
    side = tree.node_append(adventure=adventure, expected_version=None, **content("a side path"))
    tree.branch_switch(adventure=adventure, branch=nodes[4].branch, expected_version=None)
    looked_up = Node.objects.select_related("branch").get(pk=side.pk)  # the first tab's lookup
    tree.branch_delete(adventure=adventure, branch=side.branch)  # the second tab's delete
    for operation in (
        lambda: tree.attempt_switch(adventure=adventure, node=looked_up, expected_version=None),
        lambda: tree.rewind_to(adventure=adventure, node=looked_up, expected_version=None),
        lambda: tree.sibling_branch_add(adventure=adventure, target=looked_up, expected_version=None, **content("x")),
        lambda: tree.branch_rename(branch=looked_up.branch, name="Gone already"),
    ):
        with pytest.raises(tree.Gone) as refused:
            operation()
        assert refused.value.http_status == 404
        assert "another tab" in refused.value.message
    assert check_adventure(Adventure.objects.get(pk=adventure.pk)) == []
