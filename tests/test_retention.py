"""The retention pass (checkpoints/retention.py, docs/retention.md): what it protects, that a
second pass deletes nothing, that a turn racing the pass never loses its checkpoint, and the
explicit branch deletion report.

The trees here are grown with real turns (`turns.turn_request`, run eagerly under the real
Redis lock) on a small-window offline profile, so the checkpoints are the ones the turn
pipeline commits, on several branches. The helpers are shared with
test_retention_forms.py and test_prune_command.py.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pytest
from django.db import connection

from checkpoints import retention, store
from checkpoints.context import TURN_TOOLS, build_dynamic_tail, compact_now, prepare
from checkpoints.hashing import canonical_json
from checkpoints.models import ContextCheckpoint
from checkpoints.testing import make_profile, snapshot, use_profile
from stories import paths, tree, turns
from stories.integrity import check_adventure
from stories.llm.tools import SUBMIT_TURN_PLAN
from stories.models import Adventure, Branch, Node, TurnJob
from stories.synthetic import build_story

pytestmark = pytest.mark.django_db(transaction=True)


# --- shared helpers -----------------------------------------------------------------------------


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create(username="owner")


def small_profile():
    # 9,000 tokens: a 300-byte-per-node story compacts every few turns.
    return make_profile("retention-window", context_window=9_000, max_output_tokens=1_024)


@pytest.fixture
def small():
    return small_profile()


def fresh(adventure: Adventure) -> Adventure:
    return Adventure.objects.select_related("model_profile", "head__branch").get(pk=adventure.pk)


def version(adventure: Adventure) -> int:
    return Adventure.objects.values_list("version", flat=True).get(pk=adventure.pk)


def turn(adventure: Adventure, kind: str = "do", text: str = "I look around.", node: Node | None = None) -> TurnJob:
    """One real turn through the pipeline (eager Celery, real Redis lock); it must succeed."""
    job, _created = turns.turn_request(
        adventure=fresh(adventure), kind=kind, text=text, node=node, expected_version=version(adventure)
    )
    job.refresh_from_db()
    assert job.status == TurnJob.Status.DONE, (job.kind, job.error_code, job.error_message)
    return job


def undo(adventure: Adventure, times: int) -> None:
    for _ in range(times):
        tree.undo(adventure=adventure, expected_version=version(adventure))


def grow(owner, profile) -> Adventure:
    """A 60-node, 2-fork story played on with real turns so that committed checkpoints sit
    on several branches, some superseded, one hosted on an attempt the pager can switch
    back to. The head ends on a retried tip (two attempts at its coordinate)."""
    adventure = use_profile(build_story(nodes=60, forks=2, bytes_per_node=300, owner=owner), profile)
    main = fresh(adventure).head.branch
    for index in range(14):  # compacts twice on the main line: the first checkpoint is superseded
        turn(adventure, text=f"I walk the sea wall, step {index}.")
    undo(adventure, 5)
    for index in range(8):  # a fork after the shared checkpoint, compacting on its own branch
        turn(adventure, text=f"I climb the lighthouse stair, step {index}.")
    side = fresh(adventure).head
    regenerate_target = paths.node_at(side, side.depth - 4)
    turn(adventure, kind="regenerate", node=regenerate_target, text="")  # a sibling branch off the fork...
    for index in range(6):  # ...played on until it compacts on its own branch
        turn(adventure, text=f"I search the keeper's room, step {index}.")
    # A live tip hosting its own checkpoint (the admin's "compact this branch now"): a retry
    # there composes at its parent, from the checkpoint this one superseded.
    assert compact_now(adventure, side).created
    tree.branch_switch(adventure=adventure, branch=main, expected_version=version(adventure))
    tip = fresh(adventure).head
    result = compact_now(adventure, tip)  # hosted on the tip itself...
    assert result.created, result.outcome
    turn(adventure, kind="retry", text="")  # ...which the retry leaves as a non-live attempt
    assert not Node.objects.get(pk=tip.pk).live
    return fresh(adventure)


def branch_tips(adventure: Adventure) -> list[Node]:
    """Each branch's live node of greatest depth (computed here, not by the module under test)."""
    found = []
    for branch in Branch.objects.filter(adventure=adventure).order_by("pk"):
        tip = Node.objects.select_related("branch").filter(branch=branch, live=True).order_by("-depth").first()
        if tip is not None:
            found.append(tip)
    return found


def encoded(adventure: Adventure, at: Node, *, regenerate: bool = False) -> bytes:
    """The request a turn composed at `at` sends, as the encoder writes it (compacting first
    when the budget says so; nothing is saved)."""
    adventure = fresh(adventure)
    at = Node.objects.select_related("branch").get(pk=at.pk)
    tools = [SUBMIT_TURN_PLAN] if regenerate else TURN_TOOLS
    tail = build_dynamic_tail(adventure, head=at, kind="do", text="I wait and listen.", state=at.state_after)
    prepared = prepare(adventure=adventure, head=at, dynamic_tail=tail, tools=tools)
    return canonical_json(prepared.messages).encode()


def compositions(adventure: Adventure, *, pager: bool = True) -> dict[str, bytes]:
    """The encoded prompt of every turn a player can start with one click: play at each
    branch tip and at the head, retry and regenerate of each tip (composed at its parent),
    and, with `pager`, play at each other attempt at the head's coordinate (switched to,
    composed, switched back: only `version` changes)."""
    out: dict[str, bytes] = {}
    head = fresh(adventure).head
    for tip in [*branch_tips(adventure), head]:
        out[f"play@{tip.pk}"] = encoded(adventure, tip)
        if tip.parent_id is not None:
            parent = Node.objects.get(pk=tip.parent_id)
            out[f"retry@{tip.pk}"] = encoded(adventure, parent)
            out[f"regenerate@{tip.pk}"] = encoded(adventure, parent, regenerate=True)
    if pager:
        for attempt in tree.attempts_at(head).exclude(pk=head.pk):
            tree.attempt_switch(adventure=adventure, node=attempt, expected_version=version(adventure))
            out[f"switch@{attempt.pk}"] = encoded(adventure, attempt)
            tree.attempt_switch(adventure=adventure, node=head, expected_version=version(adventure))
        assert fresh(adventure).head_id == head.pk
    return out


def violations(adventure: Adventure) -> list:
    """The invariant checker's findings, less one false positive of checkpoints/integrity.py:
    a checkpoint hosted on an attempt that a retry made non-live, whose retained_from is the
    host itself (compact_now on a tip, then retry), is reported as "not one root path"
    because the checker asks `on_path(host, retained)` of a non-live node. The store treats
    the row correctly (unusable until the pager switches back to its host)."""
    found = []
    for violation in check_adventure(Adventure.objects.get(pk=adventure.pk)):
        if violation.code == "checkpoint_range":
            pk = int(violation.message.split()[1].rstrip(":"))
            cp = ContextCheckpoint.objects.select_related("host_node").get(pk=pk)
            if not cp.host_node.live and cp.retained_from_id == cp.host_node_id:
                continue
        found.append(violation)
    return found


def assert_no_orphans(adventure: Adventure) -> None:
    """Every remaining row's references resolve, inside this adventure, and the invariants hold."""
    assert violations(adventure) == []
    rows = ContextCheckpoint.objects.filter(adventure=adventure)
    for name in ("host_node", "covered_through", "retained_from", "branch"):
        assert not rows.exclude(**{f"{name}__adventure": adventure}).exists(), name
    jobs = TurnJob.objects.filter(adventure=adventure)
    for name in ("expected_head", "target_node", "result_node"):
        assert not jobs.filter(**{f"{name}__isnull": False}).exclude(**{f"{name}__adventure": adventure}).exists()
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA foreign_key_check")
            assert cursor.fetchall() == []


def head_path_node(adventure: Adventure, back: int) -> Node:
    head = fresh(adventure).head
    return paths.node_at(head, head.depth - back)


def prove_safe(adventure: Adventure, *, prompts: dict[str, bytes], story: dict[str, Any], kept: set[int]) -> None:
    """What every deletion form must leave true (DESIGN.md, Retention): (b) every tip composes
    byte-identically, (d) no orphan rows and nothing protected went, (a) the head plays,
    (c) regenerate from an older node works."""
    assert snapshot(adventure) == story  # (d) authority untouched (before the pager bumps `version`)
    assert compositions(adventure) == prompts  # (b)
    remaining = set(ContextCheckpoint.objects.filter(adventure=adventure).values_list("pk", flat=True))
    assert kept <= remaining  # (d) protected rows kept
    assert_no_orphans(adventure)  # (d)
    played = turn(adventure, text="I keep going after the pass.")  # (a)
    assert fresh(adventure).head_id == played.result_node_id
    older = head_path_node(adventure, 6)
    regenerated = turn(adventure, kind="regenerate", node=older, text="")  # (c)
    node = Node.objects.get(pk=regenerated.result_node_id)
    assert node.regenerated_from_id == older.pk and node.parent_id == older.parent_id
    assert node.branch_id != older.branch_id
    assert_no_orphans(adventure)


# --- what is protected ----------------------------------------------------------------------


def test_the_grown_tree_has_checkpoints_on_several_branches_and_some_reclaimable(owner, small, redis_url):
    adventure = grow(owner, small)
    rows = ContextCheckpoint.objects.filter(adventure=adventure)
    assert rows.order_by().values("branch").distinct().count() >= 3
    plan = retention.plan(adventure)
    assert plan.reclaimable_checkpoints and plan.protected_checkpoints
    assert set(plan.reclaimable_checkpoints) | plan.protected_checkpoints == set(rows.values_list("pk", flat=True))
    assert not set(plan.reclaimable_checkpoints) & plan.protected_checkpoints


def test_it_protects_what_every_one_click_turn_uses(owner, small, redis_url):
    adventure = grow(owner, small)
    plan = retention.plan(adventure)
    head = fresh(adventure).head
    # The checkpoint each tip's prompt actually uses (or the one its compaction starts from).
    stored = set(ContextCheckpoint.objects.values_list("pk", flat=True))
    used_stored = 0
    for tip in [*branch_tips(adventure), head]:
        tail = build_dynamic_tail(adventure, head=tip, kind="do", text="", state=tip.state_after)
        used = prepare(adventure=fresh(adventure), head=tip, dynamic_tail=tail, tools=TURN_TOOLS).checkpoint
        if used is not None and used.pk in stored:
            assert used.pk in plan.protected_checkpoints, (tip.pk, used.pk)
            used_stored += 1
    assert used_stored >= 3
    # The pager's other attempt hosts a checkpoint: unusable while not live, usable once switched to.
    attempt = tree.attempts_at(head).exclude(pk=head.pk).get()
    own = ContextCheckpoint.objects.get(host_node=attempt)
    assert own.pk in plan.protected_checkpoints
    tree.attempt_switch(adventure=adventure, node=attempt, expected_version=version(adventure))
    tail = build_dynamic_tail(adventure, head=attempt, kind="do", text="", state=attempt.state_after)
    switched = prepare(adventure=fresh(adventure), head=Node.objects.get(pk=attempt.pk), dynamic_tail=tail,
                       tools=TURN_TOOLS)  # fmt: skip
    assert switched.checkpoint == own and switched.pending_checkpoint is None


def test_a_queued_job_protects_the_checkpoint_its_turn_will_use(owner, small, redis_url):
    adventure = grow(owner, small)
    superseded = [
        cp
        for cp in ContextCheckpoint.objects.filter(pk__in=retention.plan(adventure).reclaimable_checkpoints)
        if cp.host_node.live and paths.on_path(fresh(adventure).head, cp.host_node)
    ]
    assert superseded, "the main line's first checkpoint is superseded by its second"
    old = superseded[0]
    target = paths.node_at(fresh(adventure).head, old.depth + 1)
    job = TurnJob.objects.create(
        adventure=adventure,
        kind=TurnJob.Kind.REGENERATE,
        target_node=target,
        expected_head=fresh(adventure).head,
        expected_version=version(adventure),
    )
    plan = retention.plan(adventure)
    assert old.pk in plan.protected_checkpoints and job.pk in plan.protected_jobs
    retention.prune_adventure(adventure=adventure)
    assert ContextCheckpoint.objects.filter(pk=old.pk).exists()
    assert TurnJob.objects.filter(pk=job.pk, status=TurnJob.Status.QUEUED).exists()


def test_it_deletes_nothing_it_cannot_prove_safe(owner, small, redis_url, monkeypatch):
    adventure = grow(owner, small)
    # A fresh process (the nightly task's worker): no source hash verified yet. (The store
    # memoizes verified hashes per process, so a process that verified a row before the
    # damage would not notice it; `check_story_integrity` always recomputes.)
    monkeypatch.setattr(store, "_VERIFIED", OrderedDict())
    total = ContextCheckpoint.objects.filter(adventure=adventure).count()
    # Broken authority (a shared early node loses its parent): validating any checkpoint that
    # covers it raises BrokenAncestry, so no deletion can be proven safe and none happens.
    early = head_path_node(adventure, fresh(adventure).head.depth - 5)
    Node.objects.filter(pk=early.pk).update(parent=None)
    plan = retention.plan(adventure)
    report = retention.prune_adventure(adventure=adventure)
    Node.objects.filter(pk=early.pk).update(parent=early.parent_id)
    assert plan.reclaimable_checkpoints == [] and report.skipped == "broken_ancestry"
    assert report.checkpoints.reclaimable.rows == 0
    assert ContextCheckpoint.objects.filter(adventure=adventure).count() == total


# --- idempotence and races --------------------------------------------------------------------


def test_a_second_pass_deletes_nothing(owner, small, redis_url):
    adventure = grow(owner, small)
    first = retention.prune_adventure(adventure=adventure)
    assert first.checkpoints.reclaimable.rows > 0
    assert first.checkpoints.after.rows == ContextCheckpoint.objects.filter(adventure=adventure).count()
    rows = set(ContextCheckpoint.objects.values_list("pk", flat=True))
    second = retention.prune_adventure(adventure=adventure)
    assert second.checkpoints.reclaimable.rows == second.jobs.reclaimable.rows == 0
    assert second.checkpoints.before == second.checkpoints.after == first.checkpoints.after
    assert set(ContextCheckpoint.objects.values_list("pk", flat=True)) == rows


def test_a_job_queued_between_plan_and_delete_keeps_what_it_needs(owner, small, redis_url):
    """The locked recompute sees a job requested after the first plan: the superseded
    checkpoint that job's regenerate will start from is no longer reclaimable."""
    from storyproject.celery import app

    adventure = grow(owner, small)
    head = fresh(adventure).head
    seen: dict[str, Any] = {}

    def request_regenerate(plan: retention.Plan) -> None:
        old = next(
            cp
            for cp in ContextCheckpoint.objects.filter(pk__in=plan.reclaimable_checkpoints)
            if cp.host_node.live and paths.on_path(head, cp.host_node)
        )
        seen["old"] = old
        app.conf.task_always_eager = False  # requested and queued; nobody runs it yet
        try:
            job, _ = turns.turn_request(
                adventure=fresh(adventure), kind="regenerate", node=paths.node_at(head, old.depth + 1),
                expected_version=version(adventure),
            )  # fmt: skip
        finally:
            app.conf.task_always_eager = True
        seen["job"] = job

    report = retention.prune_adventure(adventure=adventure, before_delete=request_regenerate)
    old, job = seen["old"], seen["job"]
    assert ContextCheckpoint.objects.filter(pk=old.pk).exists()
    assert report.checkpoints.reclaimable.rows > 0  # the others still went
    # The job runs from that checkpoint: nothing had to be compacted again.
    before = set(ContextCheckpoint.objects.values_list("pk", flat=True))
    turns.turn_run(job.pk)
    job.refresh_from_db()
    assert job.status == TurnJob.Status.DONE, job.error_message
    assert set(ContextCheckpoint.objects.values_list("pk", flat=True)) == before


def test_a_pass_racing_a_turn_never_deletes_the_checkpoint_the_turn_commits(owner, small, redis_url):
    """The pass runs in a thread and is held between its plan and its locked delete while the
    main thread plays a turn that compacts and commits a new checkpoint."""
    adventure = grow(owner, small)
    planned, go = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def hold(plan: retention.Plan) -> None:
        planned.set()
        assert go.wait(30)

    def run_pass() -> None:
        try:
            outcome["report"] = retention.prune_adventure(adventure=adventure, before_delete=hold)
        except BaseException as exc:  # surfaced below
            outcome["error"] = exc
        finally:
            planned.set()
            connection.close()

    thread = threading.Thread(target=run_pass)
    thread.start()
    try:
        assert planned.wait(30)
        before = set(ContextCheckpoint.objects.values_list("pk", flat=True))
        new: set[int] = set()
        for index in range(12):  # this profile compacts every six turns or so
            job = turn(adventure, text=f"The tide turns, wave {index}.")
            new = set(ContextCheckpoint.objects.values_list("pk", flat=True)) - before
            if new:
                break
        assert new, "a racing turn compacted and committed a checkpoint"
    finally:
        go.set()
        thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    assert set(ContextCheckpoint.objects.filter(pk__in=new).values_list("pk", flat=True)) == new
    assert outcome["report"].checkpoints.reclaimable.rows > 0
    # The turn's new tip composes from the new checkpoint, which a later pass also keeps.
    tip = Node.objects.get(pk=job.result_node_id)
    assert new <= retention.plan(adventure).protected_checkpoints
    assert ContextCheckpoint.objects.get(pk__in=new).host_node_id == tip.parent_id
    assert_no_orphans(adventure)


# --- explicit branch deletion ---------------------------------------------------------------------


def test_branch_deletion_reports_rows_and_bytes_and_refuses_the_story_being_read(owner, small, redis_url):
    adventure = grow(owner, small)
    head = fresh(adventure).head
    for entry in head.branch.lineage:  # the head's branch and every branch it borrows from
        with pytest.raises(tree.ProtectedBranch):
            tree.branch_delete(adventure=adventure, branch=Branch.objects.get(pk=entry[0]))
    on_path = {entry[0] for entry in head.branch.lineage}
    side = next(
        b for b in Branch.objects.filter(adventure=adventure).order_by("-pk")
        if b.pk not in on_path and ContextCheckpoint.objects.filter(branch=b).exists()
    )  # fmt: skip
    doomed = [side.pk, *(b.pk for b in tree.branch_descendants(side))]
    nodes = Node.objects.filter(branch_id__in=doomed)
    expected_nodes = nodes.count()
    dry = tree.branch_delete(adventure=adventure, branch=side, dry_run=True)
    assert dry.dry_run and Branch.objects.filter(pk=side.pk).exists()
    assert dry.rows["stories.Branch"] == len(doomed) and dry.rows["stories.Node"] == expected_nodes
    assert dry.rows["checkpoints.ContextCheckpoint"] >= 1
    assert set(dry.bytes) == set(dry.rows) - {"stories.Branch"} or set(dry.bytes) == set(dry.rows)
    assert dry.bytes["stories.Node"] > 0 and dry.total_bytes == sum(dry.bytes.values())
    done = tree.branch_delete(adventure=adventure, branch=side)
    assert (done.rows, done.bytes) == (dry.rows, dry.bytes)
    assert not Branch.objects.filter(pk__in=doomed).exists() and not nodes.exists()
    assert not ContextCheckpoint.objects.filter(branch_id__in=doomed).exists()
    assert_no_orphans(adventure)
    # The retention pass after it still finds a consistent tree.
    retention.prune_adventure(adventure=adventure)
    assert_no_orphans(adventure)
    turn(adventure, text="I go on.")
