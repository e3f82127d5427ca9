"""The operator's Django admin: every page renders for a superuser on a populated database,
changelists cost the same number of queries for 3 rows as for 30, nodes are read-only, and
each admin action does what it says."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from checkpoints.models import ContextCheckpoint
from stories import paths, tree
from stories.models import Adventure, ApiToken, Branch, Memory, ModelProfile, Node, TurnJob, WorldEntry
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db

OUR_MODELS = [ModelProfile, Adventure, Branch, Node, Memory, WorldEntry, TurnJob, ApiToken, ContextCheckpoint]


# --- helpers ---------------------------------------------------------------------------------


def changelist_url(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def change_url(obj) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def run_action(client, model, action: str, objects, follow: bool = True):
    return client.post(
        changelist_url(model),
        {"action": action, admin.helpers.ACTION_CHECKBOX_NAME: [obj.pk for obj in objects]},
        follow=follow,
    )


def fake_checkpoint(adventure: Adventure, host: Node, covered: Node) -> ContextCheckpoint:
    """A row shaped like the store's (coordinates consistent), with hashes that recompute to nothing."""
    retained = paths.node_at(host, covered.depth + 1)
    return ContextCheckpoint.objects.create(
        adventure=adventure,
        host_node=host,
        branch_id=host.branch_id,
        depth=host.depth,
        covered_through=covered,
        covered_depth=covered.depth,
        retained_from=retained,
        checkpoint_schema_version=1,
        prompt_schema_version=3,
        stable_prefix_hash="0" * 64,
        summary_json={"summary": "Earlier, things happened.", "key_points": [], "classification": "story"},
        source_hash="f" * 64,
        model_name="storytree-builtin",
        summary_bytes=64,
        covered_bytes=4000,
    )


def make_job(adventure: Adventure, status: str, **fields) -> TurnJob:
    now = timezone.now()
    defaults = {
        "kind": "do",
        "player_input": "I open the door.",
        "expected_head_id": adventure.head_id,
        "expected_version": adventure.version,
        "status": status,
    }
    if status != TurnJob.Status.QUEUED:
        defaults["started_at"] = now - timedelta(seconds=3)
        defaults["attempts"] = 1
    if status in {TurnJob.Status.DONE, TurnJob.Status.FAILED, TurnJob.Status.CANCELLED}:
        defaults["finished_at"] = now
        defaults["stage"] = TurnJob.Stage.FINISHED
    if status == TurnJob.Status.FAILED:
        defaults.update(error_code="model_timeout", error_message="The model did not answer in time.")
    return TurnJob.objects.create(adventure=adventure, **{**defaults, **fields})


@pytest.fixture
def populated(user):
    """One forked synthetic story with every kind of row around it."""
    story = build_story(nodes=15, forks=2, bytes_per_node=300, owner=user, title="The Drowned Bell")
    head = Node.objects.get(pk=story.head_id)
    tree.memory_add(adventure=story, text="Maren keeps the bell-tower key.", pinned=True)
    WorldEntry.objects.create(adventure=story, keys=["Maren"], content="Maren is the harbourmaster's daughter.")
    WorldEntry.objects.create(adventure=story, keys=[], always_on=True, content="It always rains in Saltmarsh.")
    for status in TurnJob.Status.values:
        make_job(story, status)
    make_job(story, TurnJob.Status.RUNNING, kind="compact", stage="compacting", progress_done=2, progress_total=5)
    checkpoint = fake_checkpoint(story, head, paths.node_at(head, head.depth - 4))
    ApiToken.issue(user, name="laptop")
    ModelProfile.objects.create(name="Local llama", provider="openai", base_url="http://127.0.0.1:8080/v1",
                                model_name="llama", api_key_env="STORYTREE_TEST_UNSET_KEY")  # fmt: skip
    return {"story": story, "head": head, "checkpoint": checkpoint}


# --- every page renders ----------------------------------------------------------------------


def test_every_changelist_and_change_page_renders(admin_client, populated):
    registered = set(admin.site._registry)
    assert set(OUR_MODELS) <= registered, "every Storytree model has an admin"
    for model in OUR_MODELS:
        response = admin_client.get(changelist_url(model))
        assert response.status_code == 200, model
        obj = model.objects.order_by("pk").last()
        assert obj is not None, f"the fixture made no {model.__name__}"
        response = admin_client.get(change_url(obj))
        assert response.status_code == 200, model
    # Searching and filtering too (they build different queries).
    assert admin_client.get(changelist_url(Node), {"q": "Action"}).status_code == 200
    assert admin_client.get(changelist_url(TurnJob), {"status__exact": "failed"}).status_code == 200
    assert admin_client.get(changelist_url(Adventure), {"o": "-8"}).status_code == 200  # by stored bytes


def test_adventure_list_shows_length_branches_and_storage(admin_client, populated):
    story = populated["story"]
    response = admin_client.get(changelist_url(Adventure))
    adventure = response.context["cl"].result_list[0]
    assert adventure.head.depth == populated["head"].depth == 12  # 15 nodes - 2 abandoned at forks - root
    assert adventure.n_branches == 3
    assert adventure.storage_bytes > 15 * 300  # every node's narration at least
    # The change page lists the compact job with its progress.
    page = admin_client.get(change_url(story)).content.decode()
    assert "Summarizing earlier chapters" in page and "2/5" in page


def test_model_profile_shows_assumed_window_and_key_variable_never_the_key(admin_client, populated, monkeypatch):
    monkeypatch.setenv("STORYTREE_TEST_SET_KEY", "sk-very-secret-value")
    ModelProfile.objects.create(name="Hosted", provider="openai", base_url="https://api.example.com/v1",
                                model_name="big", api_key_env="STORYTREE_TEST_SET_KEY", context_window=131072)  # fmt: skip
    page = admin_client.get(changelist_url(ModelProfile)).content.decode()
    assert "16,384 tokens (assumed)" in page
    assert "131,072 tokens" in page
    assert "<code>STORYTREE_TEST_SET_KEY</code> set" in page
    assert "<code>STORYTREE_TEST_UNSET_KEY</code> missing" in page
    assert "sk-very-secret-value" not in page


def test_api_token_pages_never_show_the_hash(admin_client, populated):
    token = ApiToken.objects.get()
    page = admin_client.get(change_url(token)).content.decode()
    assert token.prefix in page
    assert token.key_hash not in page
    assert admin_client.get(reverse("admin:stories_apitoken_add")).status_code == 403


# --- bounded queries -------------------------------------------------------------------------


def _grow(model, n: int, user) -> None:
    """Bring `model`'s table to exactly `n` rows (each with its relations set)."""
    have = model.objects.count()
    missing = n - have
    assert missing >= 0
    if model is ModelProfile:
        for i in range(missing):
            ModelProfile.objects.create(name=f"Profile {have + i}", provider="openai", model_name="m")
    elif model is Adventure:
        for i in range(missing):
            build_story(nodes=3, bytes_per_node=50, owner=user, title=f"Story {have + i}")
    elif model is Node:
        story = build_story(nodes=missing, bytes_per_node=50, owner=user) if missing else None
        assert story is None or Node.objects.count() == n
    elif model is Branch:
        # build_story with F forks makes F + 1 branches.
        build_story(nodes=2 * (missing - 1) + 1, forks=missing - 1, bytes_per_node=20, owner=user)
    elif model in {Memory, WorldEntry, TurnJob, ApiToken, ContextCheckpoint}:
        story = Adventure.objects.first() or build_story(nodes=60, bytes_per_node=50, owner=user)
        head = Node.objects.get(pk=story.head_id)
        for i in range(missing):
            if model is Memory:
                tree.memory_add(adventure=story, text=f"Memory {have + i}")
            elif model is WorldEntry:
                WorldEntry.objects.create(adventure=story, keys=[f"key{i}"], content=f"Entry {i}")
            elif model is TurnJob:
                make_job(story, TurnJob.Status.values[i % len(TurnJob.Status.values)])
            elif model is ApiToken:
                ApiToken.issue(user, name=f"token {i}")
            else:
                host = paths.node_at(head, have + i + 2)
                fake_checkpoint(story, host, paths.node_at(head, have + i))
    assert model.objects.count() == n


def _changelist_queries(client, model) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(changelist_url(model))
    assert response.status_code == 200
    assert response.context["cl"].result_count == model.objects.count()
    return len(queries)


@pytest.mark.parametrize("model", OUR_MODELS, ids=lambda m: m.__name__)
def test_changelist_queries_do_not_grow_with_rows(admin_client, admin_user, model, monkeypatch):
    if model is ContextCheckpoint:
        # The validity column runs the store's validator, which reads each checkpoint's covered
        # path by design; its cost is bounded by the page (next test). Here: the admin's own queries.
        monkeypatch.setattr("checkpoints.admin.checkpoint_validity", lambda checkpoint: (True, "ok"))
    _grow(model, 3, admin_user)
    few = _changelist_queries(admin_client, model)
    _grow(model, 30, admin_user)
    many = _changelist_queries(admin_client, model)
    assert few == many, f"{model.__name__}: {few} queries for 3 rows, {many} for 30"


def test_checkpoint_validity_is_computed_for_the_page_only(admin_client, admin_user, monkeypatch):
    from checkpoints.admin import ContextCheckpointAdmin
    from stories import dashboard

    validated = []

    def counting(checkpoint):
        validated.append(checkpoint.pk)
        return dashboard.checkpoint_validity(checkpoint)

    monkeypatch.setattr("checkpoints.admin.checkpoint_validity", counting)
    page_size = ContextCheckpointAdmin.list_per_page
    _grow(ContextCheckpoint, page_size + 1, admin_user)
    full_page = _changelist_queries(admin_client, ContextCheckpoint)
    assert len(validated) == page_size
    _grow(ContextCheckpoint, page_size + 10, admin_user)
    assert _changelist_queries(admin_client, ContextCheckpoint) == full_page


# --- nodes are read-only ---------------------------------------------------------------------


def test_node_change_page_is_read_only(admin_client, populated):
    node = populated["head"]
    page = admin_client.get(change_url(node)).content.decode()
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    before = Node.objects.filter(pk=node.pk).values().get()
    response = admin_client.post(change_url(node), {"narration": "Rewritten.", "live": "", "depth": 99})
    assert response.status_code == 403
    assert Node.objects.filter(pk=node.pk).values().get() == before


def test_node_add_and_delete_are_refused(admin_client, populated):
    assert admin_client.get(reverse("admin:stories_node_add")).status_code == 403
    node = populated["head"]
    assert admin_client.post(reverse("admin:stories_node_delete", args=[node.pk]), {"post": "yes"}).status_code == 403
    assert Node.objects.filter(pk=node.pk).exists()


# --- actions ---------------------------------------------------------------------------------


def test_invalidate_makes_a_checkpoint_unusable(admin_client, user, redis_url, django_capture_on_commit_callbacks):
    from checkpoints import store

    story = build_story(nodes=40, bytes_per_node=1500, owner=user, title="Long road")
    checkpoint = _real_checkpoint(admin_client, story, django_capture_on_commit_callbacks)
    assert _usable(story) == checkpoint

    response = run_action(admin_client, ContextCheckpoint, "invalidate_selected", [checkpoint])
    assert response.status_code == 200
    assert any("Invalidated 1 checkpoint" in m for m in messages_of(response))
    checkpoint.refresh_from_db()
    assert checkpoint.invalidated is True
    assert _usable(story) is None
    assert store.validate_checkpoint(checkpoint) == (False, "invalidated")
    page = admin_client.get(changelist_url(ContextCheckpoint)).content.decode()
    assert "stale: invalidated" in page


def _real_checkpoint(admin_client, story: Adventure, on_commit) -> ContextCheckpoint:
    """Compact through the admin action and return the checkpoint it wrote. The task is sent
    on commit (run here, as the test's transaction never commits) and runs eagerly."""
    before = set(ContextCheckpoint.objects.values_list("pk", flat=True))
    with on_commit(execute=True):
        response = run_action(admin_client, Adventure, "compact_head_branch", [story])
    assert response.status_code == 200, response.content
    job = TurnJob.objects.filter(adventure=story, kind="compact").order_by("-pk").first()
    assert job.status == TurnJob.Status.DONE, (job.error_code, job.error_message, messages_of(response))
    created = ContextCheckpoint.objects.exclude(pk__in=before)
    assert created.count() == 1
    return created.get()


def _usable(story: Adventure):
    """The checkpoint the store would use for the head's next turn (None when none is usable)."""
    from checkpoints import store
    from checkpoints.prompt import current_stable_prefix_hash

    story = Adventure.objects.select_related("model_profile").get(pk=story.pk)
    head = Node.objects.select_related("branch").get(pk=story.head_id)
    checkpoint, _misses = store.nearest_usable(
        story,
        head,
        stable_prefix_hash=current_stable_prefix_hash(story),
        model_name=store.model_identity(story.model_profile),
        max_summary_tokens=10**9,
    )
    return checkpoint


def test_compact_action_creates_a_checkpoint_and_shows_progress(
    admin_client, user, redis_url, django_capture_on_commit_callbacks
):
    story = build_story(nodes=40, bytes_per_node=1500, owner=user, title="Long road")
    checkpoint = _real_checkpoint(admin_client, story, django_capture_on_commit_callbacks)
    assert checkpoint.adventure_id == story.pk
    assert checkpoint.covered_depth < Node.objects.get(pk=story.head_id).depth
    job = TurnJob.objects.get(adventure=story, kind="compact")
    assert job.target_node_id == story.head_id and job.expected_version == story.version
    page = admin_client.get(change_url(story)).content.decode()
    assert f"#{job.pk}" in page and "Done" in page
    # Its validity column recomputes the hashes and finds them good.
    assert "✔ valid" in admin_client.get(changelist_url(ContextCheckpoint)).content.decode()


def test_compact_action_refuses_a_second_concurrent_compaction(admin_client, populated):
    # The fixture has a running compact job on this story.
    story = populated["story"]
    before = TurnJob.objects.filter(kind="compact").count()
    response = run_action(admin_client, Adventure, "compact_head_branch", [story])
    assert any("already running" in m for m in messages_of(response))
    assert TurnJob.objects.filter(kind="compact").count() == before


def test_rebuild_now_enqueues_a_compact_job_for_the_host(
    admin_client, populated, monkeypatch, django_capture_on_commit_callbacks
):
    import checkpoints.tasks

    sent = []
    monkeypatch.setattr(checkpoints.tasks.compact_adventure_task, "delay", sent.append)
    story, checkpoint = populated["story"], populated["checkpoint"]
    TurnJob.objects.filter(kind="compact").update(status=TurnJob.Status.DONE)
    with django_capture_on_commit_callbacks(execute=True):
        response = run_action(admin_client, ContextCheckpoint, "rebuild_now", [checkpoint])
    job = TurnJob.objects.filter(adventure=story, kind="compact", status="queued").get()
    assert sent == [job.pk]
    assert job.target_node_id == checkpoint.host_node_id
    assert any(f"compact job {job.pk}" in m for m in messages_of(response))


def test_retry_requeues_a_failed_job_once(admin_client, user, monkeypatch, django_capture_on_commit_callbacks):
    import stories.tasks

    sent = []
    # Keep the requeued job queued (eager mode would run it at once) and see that it was sent.
    monkeypatch.setattr(stories.tasks.run_turn_job, "delay", sent.append)
    story = tree.adventure_create(owner=user, title="Retry me", premise="A quiet harbour.")
    failed = make_job(story, TurnJob.Status.FAILED)

    with django_capture_on_commit_callbacks(execute=True):
        response = run_action(admin_client, TurnJob, "retry_failed", [failed])
    assert any(f"Job {failed.pk}: requeued" in m for m in messages_of(response))
    failed.refresh_from_db()
    assert failed.status == TurnJob.Status.QUEUED
    assert failed.stage == TurnJob.Stage.WAITING
    assert failed.error_code == "" and failed.finished_at is None
    assert failed.attempts == 1  # counted when a worker claims it, not when requeued
    assert sent == [failed.pk]

    response = run_action(admin_client, TurnJob, "retry_failed", [failed])
    assert any(f"Job {failed.pk}: not retried" in m for m in messages_of(response))
    assert sent == [failed.pk]
    failed.refresh_from_db()
    assert failed.status == TurnJob.Status.QUEUED


def test_compact_with_the_queue_down_fails_the_job_with_a_reason(
    admin_client, user, monkeypatch, django_capture_on_commit_callbacks
):
    from kombu.exceptions import OperationalError

    import checkpoints.tasks

    def down(job_id):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    monkeypatch.setattr(checkpoints.tasks.compact_adventure_task, "delay", down)
    story = build_story(nodes=5, bytes_per_node=20, owner=user, title="Offline")
    with django_capture_on_commit_callbacks(execute=True):
        run_action(admin_client, Adventure, "compact_head_branch", [story])
    job = TurnJob.objects.get(adventure=story, kind="compact")
    assert job.status == TurnJob.Status.FAILED and job.error_code == "queue_unavailable"
    # The next request is not blocked by a job that never ran.
    monkeypatch.setattr(checkpoints.tasks.compact_adventure_task, "delay", lambda job_id: None)
    with django_capture_on_commit_callbacks(execute=True):
        response = run_action(admin_client, Adventure, "compact_head_branch", [story])
    assert TurnJob.objects.filter(adventure=story, kind="compact", status="queued").count() == 1
    assert any("is queued" in m for m in messages_of(response))


def test_retrying_a_failed_compaction_requests_a_new_one(
    admin_client, populated, monkeypatch, django_capture_on_commit_callbacks
):
    import checkpoints.tasks

    sent = []
    monkeypatch.setattr(checkpoints.tasks.compact_adventure_task, "delay", sent.append)
    story = populated["story"]
    TurnJob.objects.filter(kind="compact").update(status=TurnJob.Status.FAILED)
    failed = TurnJob.objects.get(kind="compact")
    with django_capture_on_commit_callbacks(execute=True):
        run_action(admin_client, TurnJob, "retry_failed", [failed])
    fresh = TurnJob.objects.get(adventure=story, kind="compact", status="queued")
    assert sent == [fresh.pk] and fresh.pk != failed.pk


def test_integrity_check_reports_success_and_violations(admin_client, user):
    story = build_story(nodes=9, forks=2, bytes_per_node=20, owner=user, title="Sound")
    response = run_action(admin_client, Adventure, "check_integrity", [story])
    assert messages_of(response) == ["“Sound”: integrity OK."]

    broken = build_story(nodes=5, bytes_per_node=20, owner=user, title="Broken")
    # The head on a node that is not live: invariant 3.
    Node.objects.filter(pk=broken.head_id).update(live=False)
    response = run_action(admin_client, Adventure, "check_integrity", [broken])
    [error] = messages_of(response)
    assert error.startswith("“Broken”: ") and "violation" in error


def test_integrity_check_includes_checkpoints(admin_client, populated):
    # The fixture's checkpoint has hashes that recompute to nothing: invariant 5.
    response = run_action(admin_client, Adventure, "check_integrity", [populated["story"]])
    [error] = messages_of(response)
    assert "violation" in error


def test_export_bundle_streams_one_adventure(admin_client, populated, user):
    story = populated["story"]
    response = run_action(admin_client, Adventure, "export_bundle", [story], follow=False)
    assert response.status_code == 200
    assert response.streaming
    assert f"adventure-{story.pk}.json" in response["Content-Disposition"]
    body = b"".join(response.streaming_content)
    assert b"The Drowned Bell" in body

    other = build_story(nodes=3, bytes_per_node=20, owner=user)
    response = run_action(admin_client, Adventure, "export_bundle", [story, other])
    assert any("exactly one" in m for m in messages_of(response))


# --- who gets in -----------------------------------------------------------------------------


def test_players_get_the_admin_login_page(client, user, populated):
    client.force_login(user)
    login = reverse("admin:login")
    for url in [reverse("admin:index"), reverse("admin:storytree_dashboard"), changelist_url(Adventure),
                change_url(populated["story"])]:  # fmt: skip
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(login), url


def test_admin_index_links_the_dashboard(admin_client):
    page = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:storytree_dashboard") in page
    # Not repeated on an app's index page.
    assert reverse("admin:storytree_dashboard") not in admin_client.get("/admin/stories/").content.decode()
