"""The play page's views through the test client: scoping to the player, anonymous users,
CSRF, plain-words refusals with their status, Post/Redirect/Get without JavaScript, and
the htmx partials (the job poll, earlier pages, the notice)."""

from __future__ import annotations

from html import unescape
from types import SimpleNamespace

import pytest
from django.test import Client
from django.urls import reverse

from stories import tree
from stories.models import Adventure, Branch, Memory, Node, TurnJob, WorldEntry

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def plain(adventure: Adventure, text: str) -> dict:
    head = Node.objects.get(pk=Adventure.objects.get(pk=adventure.pk).head_id)
    return {
        "kind": "do",
        "player_input": text,
        "narration": f"You {text.lower()}.",
        "suggestions": ["Look around"],
        "state_delta": [],
        "state_after": head.state_after,
        "checks": [],
    }


@pytest.fixture
def scene(user):
    """Alice's adventure: two turns on the main branch (the second with two attempts), a
    second branch beside turn 2, a memory, a world entry and a failed job."""
    adventure = tree.adventure_create(owner=user, title="Cave", premise="A cave mouth.")
    tree.node_append(adventure=adventure, expected_version=None, **plain(adventure, "Enter"))
    second = tree.node_append(adventure=adventure, expected_version=None, **plain(adventure, "Light a torch"))
    retried = tree.attempt_add(adventure=adventure, tip=second, expected_version=None, **_content(adventure))
    side = tree.sibling_branch_add(
        adventure=adventure, target=retried, expected_version=None, **plain(adventure, "Run")
    )
    tree.branch_switch(adventure=adventure, branch=second.branch, expected_version=None)
    adventure.refresh_from_db()
    memory = tree.memory_add(adventure=adventure, text="Bats sleep here.")
    entry = WorldEntry.objects.create(adventure=adventure, keys=["cave"], content="Bats live in the cave.")
    job = TurnJob.objects.create(
        adventure=adventure, kind="do", player_input="Shout", status=TurnJob.Status.FAILED,
        stage=TurnJob.Stage.FINISHED, expected_version=adventure.version, error_code="model_unavailable",
        error_message="The model server could not be reached.",
    )  # fmt: skip
    return SimpleNamespace(
        adventure=adventure, second=second, retried=retried, side_branch=side.branch, main=second.branch,
        memory=memory, entry=entry, job=job,
    )  # fmt: skip


def _content(adventure):
    content = plain(adventure, "Light a torch")
    content.pop("kind")
    content.pop("player_input")
    return content


def routes(s) -> list[tuple[str, str, list, dict]]:
    """Every URL of the play and adventures pages: (method, name, args, valid POST data)."""
    a = s.adventure.pk
    v = {"expected_version": s.adventure.version}
    return [
        ("get", "play", [a], {}),
        ("get", "play_job", [a, s.job.pk], {}),
        ("get", "node_edit", [a, s.retried.pk], {}),
        ("get", "branch_delete", [a, s.side_branch.pk], {}),
        ("get", "adventure_delete", [a], {}),
        ("post", "play_turn", [a], {"kind": "do", "text": "Wave", **v}),
        ("post", "play_job_cancel", [a, s.job.pk], {}),
        ("post", "play_job_retry", [a, s.job.pk], {}),
        ("post", "play_undo", [a], v),
        ("post", "play_redo", [a], v),
        ("post", "node_switch", [a, s.second.pk], v),
        ("post", "node_fork", [a, s.second.pk], v),
        ("post", "node_rewind", [a, s.adventure.head.parent_id], v),
        ("post", "branch_switch", [a, s.side_branch.pk], v),
        ("post", "branch_rename", [a, s.side_branch.pk], {"name": "Running away"}),
        ("post", "branch_delete", [a, s.side_branch.pk], {}),
        ("post", "memory_add", [a], {"text": "Another note"}),
        ("post", "memory_pin", [a, s.memory.pk], {"pinned": "on"}),
        ("post", "memory_delete", [a, s.memory.pk], {}),
        ("post", "world_add", [a], {"keys": "torch", "content": "Torches gutter.", "priority": "0", "enabled": "on"}),
        ("post", "world_edit", [a, s.entry.pk], {"keys": "cave", "content": "Changed.", "priority": "1"}),
        ("post", "world_toggle", [a, s.entry.pk], {}),
        ("post", "adventure_delete", [a], {}),
    ]


def snapshot(adventure: Adventure) -> tuple:
    fresh = Adventure.objects.filter(pk=adventure.pk).values_list("version", "head_id").first()
    return (
        fresh,
        Node.objects.filter(adventure_id=adventure.pk).count(),
        Branch.objects.filter(adventure_id=adventure.pk).count(),
        list(Branch.objects.filter(adventure_id=adventure.pk).values_list("name", flat=True)),
        list(Memory.objects.filter(adventure_id=adventure.pk).values_list("text", "pinned")),
        list(WorldEntry.objects.filter(adventure_id=adventure.pk).values_list("content", "enabled")),
        list(TurnJob.objects.filter(adventure_id=adventure.pk).values_list("status", flat=True)),
    )


# --- Who may ask ----------------------------------------------------------------------------


def test_every_page_and_action_is_404_for_another_player(scene, other_user):
    outsider = Client()
    outsider.force_login(other_user)
    before = snapshot(scene.adventure)
    for method, name, args, data in routes(scene):
        url = reverse(name, args=args)
        response = getattr(outsider, method)(url, data)
        assert response.status_code == 404, (name, response.status_code)
        htmx = getattr(outsider, method)(url, data, headers=HTMX)
        assert htmx.status_code == 404, (name, "htmx", htmx.status_code)
    assert snapshot(scene.adventure) == before


def test_objects_of_another_adventure_are_404_under_this_one(scene, client_alice, user):
    other = tree.adventure_create(owner=user, title="Elsewhere", premise="A field.")
    other_branch = Branch.objects.get(adventure=other)
    other_node = Node.objects.get(pk=other.head_id)
    a, v = scene.adventure.pk, {"expected_version": scene.adventure.version}
    for name, args in [
        ("branch_switch", [a, other_branch.pk]),
        ("branch_delete", [a, other_branch.pk]),
        ("node_switch", [a, other_node.pk]),
        ("node_fork", [a, other_node.pk]),
    ]:
        assert client_alice.post(reverse(name, args=args), v).status_code == 404, name
    turn = {"kind": "regenerate", "node": other_node.pk, **v}
    assert client_alice.post(reverse("play_turn", args=[a]), turn).status_code == 404


def test_anonymous_users_are_sent_to_log_in(scene):
    anonymous = Client()
    for method, name, args, data in routes(scene):
        url = reverse(name, args=args)
        response = getattr(anonymous, method)(url, data)
        assert response.status_code == 302, name
        assert response["Location"].startswith(reverse("login")), name


def test_posts_without_a_csrf_token_are_refused(scene, user):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    before = snapshot(scene.adventure)
    for method, name, args, data in routes(scene):
        if method == "post":
            response = strict.post(reverse(name, args=args), data)
            assert response.status_code == 403, name
    assert snapshot(scene.adventure) == before


def test_each_view_refuses_the_wrong_method(scene, client_alice):
    for method, name, args, _data in routes(scene):
        url = reverse(name, args=args)
        if method == "post" and name not in {"branch_delete", "adventure_delete"}:
            assert client_alice.get(url).status_code == 405, name
        if method == "get" and name in {"play", "play_job", "node_edit"}:
            assert client_alice.post(url).status_code == 405, name


# --- Refusals in plain words ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("play_turn", {"kind": "do", "text": "  "}, "Write what your character does or says first."),
        ("play_turn", {"kind": "fly", "text": "Up"}, "Select a valid choice"),
        ("play_turn", {"kind": "do", "text": "x" * 4001}, "a turn can be at most 4,000"),
        ("play_turn", {"kind": "do", "text": "Hi", "expected_version": ""}, "did not say which version"),
        ("play_undo", {"expected_version": "soon"}, "did not say which version"),
        ("memory_add", {"text": "   "}, "A memory can't be blank."),
        ("world_add", {"keys": "torch", "content": ""}, "Content: This field is required."),
        ("world_add", {"keys": "", "content": "Floating text."}, "Give at least one trigger word"),
        ("world_add", {"keys": "x", "content": "Big.", "priority": "5000"}, "less than or equal to 1000"),
    ],
)
def test_bad_input_gives_a_clear_message_and_400(scene, client_alice, name, data, message):
    url = reverse(name, args=[scene.adventure.pk])
    data = {"expected_version": scene.adventure.version, **data}
    before = snapshot(scene.adventure)
    page = client_alice.post(url, data)
    assert page.status_code == 400
    assert message in unescape(page.content.decode())
    assert "<!doctype html>" in page.content.decode()  # without htmx: the play page with the notice
    partial = client_alice.post(url, data, headers=HTMX)
    assert partial.status_code == 400
    assert partial["HX-Retarget"] == "#notice"
    assert message in unescape(partial.content.decode())
    assert snapshot(scene.adventure) == before


def test_a_blank_branch_name_is_refused(scene, client_alice):
    url = reverse("branch_rename", args=[scene.adventure.pk, scene.side_branch.pk])
    response = client_alice.post(url, {"name": "   "})
    assert response.status_code == 400
    assert "A branch name can't be blank." in unescape(response.content.decode())
    long = client_alice.post(url, {"name": "n" * 101}, headers=HTMX)
    assert long.status_code == 400
    assert "at most 100 characters" in long.content.decode()


def test_a_bad_page_anchor_is_400(scene, client_alice):
    response = client_alice.get(reverse("play", args=[scene.adventure.pk]), {"before": "abc"}, headers=HTMX)
    assert response.status_code == 400
    assert "before:" in response.content.decode()


def test_a_stale_version_says_the_story_moved_on_and_offers_the_head(scene, client_alice):
    url = reverse("play_undo", args=[scene.adventure.pk])
    stale = {"expected_version": scene.adventure.version - 1}
    page = client_alice.post(url, stale)
    assert page.status_code == 409
    assert "This story moved on in another tab." in page.content.decode()
    partial = client_alice.post(url, stale, headers=HTMX)
    assert partial.status_code == 409
    body = partial.content.decode()
    assert 'id="reload-head"' in body
    assert f'hx-get="{reverse("play", args=[scene.adventure.pk])}"' in body
    assert Adventure.objects.get(pk=scene.adventure.pk).version == scene.adventure.version


def test_deleting_the_branch_being_read_or_an_ancestor_is_refused(scene, client_alice):
    url = reverse("branch_delete", args=[scene.adventure.pk, scene.main.pk])
    page = client_alice.get(url)
    assert page.status_code == 409
    assert "can't be deleted" in unescape(page.content.decode())
    assert client_alice.post(url).status_code == 409
    assert Branch.objects.filter(pk=scene.main.pk).exists()


# --- Without JavaScript: every POST redirects back (Post/Redirect/Get) ------------------------


def test_plain_posts_redirect_back_to_the_play_page(scene, client_alice, redis_url, django_capture_on_commit_callbacks):
    a = scene.adventure
    play = reverse("play", args=[a.pk])

    def post(name, args, data=None):
        response = client_alice.post(reverse(name, args=args), data or {})
        assert response.status_code == 302, (name, response.status_code)
        assert response["Location"].startswith(play), (name, response["Location"])
        return response

    version = lambda: Adventure.objects.get(pk=a.pk).version  # noqa: E731
    with django_capture_on_commit_callbacks(execute=True):  # the job is sent once its row commits
        post("play_turn", [a.pk], {"kind": "do", "text": "I look up", "expected_version": version()})
    assert Adventure.objects.get(pk=a.pk).head.player_input == "I look up"
    post("play_undo", [a.pk], {"expected_version": version()})
    post("play_redo", [a.pk], {"expected_version": version()})
    post("branch_switch", [a.pk, scene.side_branch.pk], {"expected_version": version()})
    assert Adventure.objects.get(pk=a.pk).head.branch_id == scene.side_branch.pk
    post("branch_rename", [a.pk, scene.side_branch.pk], {"name": "  The   run "})
    assert Branch.objects.get(pk=scene.side_branch.pk).name == "The run"
    post("branch_rename", [a.pk, scene.side_branch.pk], {"name": "", "clear": "on"})
    assert Branch.objects.get(pk=scene.side_branch.pk).name == ""
    post("memory_add", [a.pk], {"text": "Written by hand", "pinned": "on"})
    assert Memory.objects.get(text="Written by hand").pinned
    post("memory_pin", [a.pk, scene.memory.pk], {"pinned": "on"})
    assert Memory.objects.get(pk=scene.memory.pk).pinned
    post("memory_pin", [a.pk, scene.memory.pk])
    assert not Memory.objects.get(pk=scene.memory.pk).pinned
    post("world_toggle", [a.pk, scene.entry.pk])
    assert not WorldEntry.objects.get(pk=scene.entry.pk).enabled
    post(
        "world_edit", [a.pk, scene.entry.pk], {"keys": "cave, bat", "content": "New.", "priority": "3", "enabled": "on"}
    )
    entry = WorldEntry.objects.get(pk=scene.entry.pk)
    assert (entry.keys, entry.content, entry.priority, entry.enabled) == (["cave", "bat"], "New.", 3, True)
    post("memory_delete", [a.pk, scene.memory.pk])
    assert not Memory.objects.filter(pk=scene.memory.pk).exists()
    page = client_alice.get(play)
    assert page.status_code == 200


def test_a_plain_turn_that_is_still_running_shows_its_job_on_the_play_page(scene, client_alice):
    job = TurnJob.objects.create(
        adventure=scene.adventure, kind="do", player_input="Whistle", status=TurnJob.Status.RUNNING,
        stage=TurnJob.Stage.NARRATING, partial_text="The echo comes back", expected_version=scene.adventure.version,
    )  # fmt: skip
    page = client_alice.get(reverse("play", args=[scene.adventure.pk]), {"job": job.pk}).content.decode()
    assert "The echo comes back" in page
    assert 'aria-live="polite"' in page
    assert '<noscript><meta http-equiv="refresh" content="2"></noscript>' in page  # no JS: the page reloads itself
    assert 'hx-trigger="every 400ms"' in page


# --- htmx partials ---------------------------------------------------------------------------


def test_the_job_poll_shows_stage_progress_and_streamed_text(scene, client_alice):
    job = TurnJob.objects.create(
        adventure=scene.adventure, kind="do", player_input="Wait", status=TurnJob.Status.RUNNING,
        stage=TurnJob.Stage.COMPACTING, progress_done=2, progress_total=5, expected_version=scene.adventure.version,
    )  # fmt: skip
    url = reverse("play_job", args=[scene.adventure.pk, job.pk])
    body = client_alice.get(url, headers=HTMX).content.decode()
    assert "Summarizing earlier chapters 2/5" in body
    assert "HX-Retarget" not in client_alice.get(url, headers=HTMX)
    TurnJob.objects.filter(pk=job.pk).update(stage=TurnJob.Stage.NARRATING, partial_text="You <wait> & listen")
    body = client_alice.get(url, headers=HTMX).content.decode()
    assert "Narrating" in body
    assert "You &lt;wait&gt; &amp; listen" in body


def test_a_failed_job_answers_with_the_reason_and_retry(scene, client_alice):
    url = reverse("play_job", args=[scene.adventure.pk, scene.job.pk])
    response = client_alice.get(url, headers=HTMX)
    assert response["HX-Retarget"] == "#job"
    body = response.content.decode()
    assert "The model server could not be reached." in body
    assert reverse("play_job_retry", args=[scene.adventure.pk, scene.job.pk]) in body
    assert 'hx-swap-oob="true"' in body  # the composer comes back, with the words that failed
    assert ">Shout</textarea>" in body
    assert "every 400ms" not in body  # polling stops


def test_a_done_job_redraws_the_whole_play_region(scene, client_alice):
    TurnJob.objects.filter(pk=scene.job.pk).update(status=TurnJob.Status.DONE)
    response = client_alice.get(reverse("play_job", args=[scene.adventure.pk, scene.job.pk]), headers=HTMX)
    assert response["HX-Retarget"] == "#play"
    assert response["HX-Reswap"] == "outerHTML"
    assert 'id="rail"' in response.content.decode()


def test_retrying_a_job_after_the_story_moved_is_refused(scene, client_alice):
    tree.undo(adventure=scene.adventure, expected_version=None)
    response = client_alice.post(reverse("play_job_retry", args=[scene.adventure.pk, scene.job.pk]), headers=HTMX)
    assert response.status_code == 409
    assert "This story moved on in another tab." in response.content.decode()


def test_cancelling_a_queued_job(scene, client_alice):
    job = TurnJob.objects.create(
        adventure=scene.adventure, kind="do", player_input="Hum", expected_version=scene.adventure.version
    )
    response = client_alice.post(reverse("play_job_cancel", args=[scene.adventure.pk, job.pk]), headers=HTMX)
    assert response.status_code == 200
    assert "Cancelled." in response.content.decode()
    assert TurnJob.objects.get(pk=job.pk).status == TurnJob.Status.CANCELLED


def test_earlier_pages_load_before_the_first_turn_shown(client_alice, user):
    from stories.synthetic import build_story

    adventure = build_story(nodes=75, forks=0, bytes_per_node=60, owner=user)
    page = client_alice.get(reverse("play", args=[adventure.pk])).content.decode()
    assert page.count('<article class="node') == 30
    assert 'data-depth="45"' in page and 'data-depth="44"' not in page
    first = Node.objects.get(adventure=adventure, depth=45)
    older = f"?before={first.pk}&amp;v={adventure.version}"
    assert f'href="/adventures/{adventure.pk}/{older}"' in page
    assert 'hx-trigger="intersect once, click"' in page
    partial = client_alice.get(
        reverse("play", args=[adventure.pk]), {"before": first.pk, "v": adventure.version}, headers=HTMX
    ).content.decode()
    assert partial.count('<article class="node') == 30
    assert 'data-depth="15"' in partial and 'data-depth="44"' in partial and 'data-depth="45"' not in partial
    assert "<!doctype" not in partial
    # From a tab that is behind, the earlier page is refused rather than mixed into another story.
    stale = client_alice.get(
        reverse("play", args=[adventure.pk]), {"before": first.pk, "v": adventure.version - 1}, headers=HTMX
    )
    assert stale.status_code == 409
    # Without JavaScript the link is a page of its own, with a way back to the newest turns.
    windowed = client_alice.get(reverse("play", args=[adventure.pk]), {"before": first.pk}).content.decode()
    assert 'data-depth="44"' in windowed and "Newer turns" in windowed


def test_the_attempt_pager_and_forks_are_offered_where_they_apply(scene, client_alice):
    # At the tip with two attempts: the pager, retry, and a fork from the other attempt.
    page = client_alice.get(reverse("play", args=[scene.adventure.pk])).content.decode()
    assert 'aria-label="Attempt 2 of 2"' in page
    assert reverse("node_switch", args=[scene.adventure.pk, scene.second.pk]) in page
    assert reverse("node_fork", args=[scene.adventure.pk, scene.second.pk]) in page
    assert 'value="retry"' in page
    # Forking from the other attempt moves the head onto a new branch with it.
    response = client_alice.post(
        reverse("node_fork", args=[scene.adventure.pk, scene.second.pk]),
        {"expected_version": scene.adventure.version},
        headers=HTMX,
    )
    assert response["HX-Retarget"] == "#play"
    adventure = Adventure.objects.get(pk=scene.adventure.pk)
    assert adventure.head_id == scene.second.pk
    assert adventure.head.branch_id not in {scene.main.pk, scene.side_branch.pk}


def test_the_rail_marks_the_branch_being_read_and_offers_no_delete_for_it(scene, client_alice):
    body = client_alice.get(reverse("play", args=[scene.adventure.pk])).content.decode()
    rail = body[body.index('id="rail"') : body.index('id="state"')]
    assert rail.count('aria-current="true"') == 1
    assert reverse("branch_delete", args=[scene.adventure.pk, scene.side_branch.pk]) in rail
    assert reverse("branch_delete", args=[scene.adventure.pk, scene.main.pk]) not in rail
    assert "Fork at turn 2" in rail and "Main story" in rail


def test_user_text_is_escaped_everywhere(client_alice, user):
    evil = "<script>alert(1)</script>"
    adventure = tree.adventure_create(owner=user, title=evil, premise=evil, persona=evil)
    tree.node_append(adventure=adventure, expected_version=None, **{**plain(adventure, evil), "suggestions": [evil]})
    tree.memory_add(adventure=adventure, text=evil)
    WorldEntry.objects.create(adventure=adventure, keys=[evil], content=evil)
    Branch.objects.filter(adventure=adventure).update(name=evil)
    for url in [reverse("play", args=[adventure.pk]), reverse("adventure_list")]:
        body = client_alice.get(url).content.decode()
        assert "<script>alert" not in body, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body, url


def test_a_head_move_while_a_turn_is_written_keeps_showing_the_turn(scene, client_alice):
    job = TurnJob.objects.create(
        adventure=scene.adventure, kind="do", player_input="Sing", status=TurnJob.Status.RUNNING,
        stage=TurnJob.Stage.NARRATING, expected_version=scene.adventure.version,
    )  # fmt: skip
    response = client_alice.post(
        reverse("play_undo", args=[scene.adventure.pk]), {"expected_version": scene.adventure.version}, headers=HTMX
    )
    body = response.content.decode()
    assert response["HX-Retarget"] == "#play"
    assert reverse("play_job", args=[scene.adventure.pk, job.pk]) in body
    assert 'hx-trigger="every 400ms"' in body
    assert 'id="send" disabled' in body
