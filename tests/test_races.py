"""Twenty clients racing over real HTTP against a live server and real Celery workers.

Several clients share an adventure (two browser tabs on one story), every client does random
tree operations through the JSON API for a bounded time, and afterwards: no response was a
5xx, every refusal was a 400, 409 or 429 carrying a message (a 404 only for an object another
tab had just deleted), every job finished with a readable outcome, the workers logged no
traceback, and `check_adventure` is clean on every adventure.

Runs on whatever database the suite runs on (SQLite by default, PostgreSQL under
`bin/with-postgres`). `STORYTREE_RACE_SECONDS` stretches or shrinks the run.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from django.db import connection

from stories import tree
from stories.integrity import check_adventure
from stories.models import Adventure, ApiToken, Branch, Node, TurnJob
from tests.conftest import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

CLIENTS = 20
SHARED_ADVENTURES = 8  # clients 0..15 are two tabs each on these
DURATION = float(os.environ.get("STORYTREE_RACE_SECONDS", "20"))
REFUSALS = {400, 409, 429}
FINISHED = {"done", "failed", "cancelled"}


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    operations: Counter = field(default_factory=Counter)  # state-changing requests by name
    statuses: Counter = field(default_factory=Counter)  # every response by status
    requests: int = 0
    problems: list[str] = field(default_factory=list)  # anything the test must fail on
    vanished: list[str] = field(default_factory=list)  # 404s for objects another tab deleted
    job_ids: set[int] = field(default_factory=set)
    codes: Counter = field(default_factory=Counter)  # refusals by status and error code

    def record(self, status: int, op: str | None) -> None:
        with self.lock:
            self.requests += 1
            self.statuses[status] += 1
            if op:
                self.operations[op] += 1

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)


class Api:
    """One client: a bearer token and its own connection to the live server."""

    def __init__(self, base_url: str, token: str, tally: Tally) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname, parts.port
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.tally = tally

    def call(self, method: str, path: str, body: dict | None = None, *, op: str | None = None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=self.headers)
            response = conn.getresponse()
            raw = response.read()
            status = response.status
        finally:
            conn.close()
        self.tally.record(status, op)
        data = None
        if raw:
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
        where = f"{method} {path} -> {status}"
        if status >= 500:
            self.tally.problem(f"{where}: {raw[:500]!r}")
        elif status in REFUSALS:
            error = (data or {}).get("error") if isinstance(data, dict) else None
            if not (isinstance(error, dict) and error.get("code") and error.get("message")):
                self.tally.problem(f"{where} without an error message: {raw[:300]!r}")
            else:
                with self.tally.lock:
                    self.tally.codes[f"{status} {error['code']}"] += 1
        elif status >= 400 and status != 404:
            self.tally.problem(f"{where}: unexpected status {raw[:300]!r}")
        return status, data


class Player:
    """A tab: random operations on one adventure, with the version it last saw."""

    def __init__(self, api: Api, adventure_id: int, seed: int, deadline: float) -> None:
        self.api = api
        self.adventure_id = adventure_id
        self.rng = random.Random(seed)
        self.deadline = deadline
        self.version = 1
        self.head: int | None = None
        self.last_job: int | None = None

    # -- reads --------------------------------------------------------------------------

    def refresh(self) -> None:
        status, data = self.api.call("GET", f"/api/v1/adventures/{self.adventure_id}")
        if status == 200:
            self.version, self.head = data["version"], data["head"]

    def adopt(self, status: int, data) -> None:
        """Learn the version from a successful head move (its body is the adventure)."""
        if status == 200 and isinstance(data, dict):
            adventure = data.get("adventure", data)
            if "version" in adventure:
                self.version, self.head = adventure["version"], adventure["head"]

    def attempts(self, node_id: int) -> list[dict]:
        status, data = self.api.call("GET", f"/api/v1/nodes/{node_id}/attempts")
        self.gone_if_404(status, Node, node_id)
        return data["attempts"] if status == 200 else []

    def branches(self) -> list[dict]:
        status, data = self.api.call("GET", f"/api/v1/adventures/{self.adventure_id}/branches")
        return data["branches"] if status == 200 else []

    def story(self) -> list[dict]:
        status, data = self.api.call("GET", f"/api/v1/adventures/{self.adventure_id}/story?limit=50")
        return data["nodes"] if status == 200 else []

    def gone_if_404(self, status: int, model, pk: int) -> None:
        """A 404 is only right for an object another tab deleted meanwhile."""
        if status != 404:
            return
        if model.objects.filter(pk=pk).exists():
            self.api.tally.problem(f"404 for {model.__name__} {pk}, which exists")
        else:
            with self.api.tally.lock:
                self.api.tally.vanished.append(f"{model.__name__} {pk}")

    # -- operations ---------------------------------------------------------------------

    def turn(self, body: dict, op: str) -> None:
        body = {**body, "expected_version": self.version}
        status, data = self.api.call("POST", f"/api/v1/adventures/{self.adventure_id}/turns", body, op=op)
        if status == 404 and body.get("node"):
            self.gone_if_404(status, Node, body["node"])
        if status in (200, 202):
            self.last_job = data["id"]
            with self.api.tally.lock:
                self.api.tally.job_ids.add(data["id"])
            self.follow(data["id"])

    def follow(self, job_id: int) -> None:
        """Poll the job as the player page does, for a while."""
        until = min(time.monotonic() + 3.0, self.deadline)
        while time.monotonic() < until:
            status, data = self.api.call("GET", f"/api/v1/jobs/{job_id}")
            if status != 200 or data["status"] in FINISHED:
                if status == 200 and data["status"] == "failed" and not (data["error"] or {}).get("message"):
                    self.api.tally.problem(f"job {job_id} failed without a message: {data}")
                return
            time.sleep(0.05)

    def play(self) -> None:
        kind = self.rng.choice(["do", "say", "story", "continue"])
        text = "" if kind == "continue" else self.rng.choice(["I climb the wall.", "Hello?", "The wind rises."])
        self.turn({"kind": kind, "text": text}, "play")

    def retry(self) -> None:
        self.turn({"kind": "retry"}, "retry")

    def regenerate(self) -> None:
        nodes = [n for n in self.story() if n["depth"] > 0]
        if nodes:
            self.turn({"kind": "regenerate", "node": self.rng.choice(nodes)["id"]}, "regenerate")

    def switch_attempt(self) -> None:
        if self.head is None:
            return
        options = self.attempts(self.head)
        if options:
            node = self.rng.choice(options)["id"]
            status, data = self.api.call(
                "POST", f"/api/v1/nodes/{node}/switch", {"expected_version": self.version}, op="switch_attempt"
            )
            self.gone_if_404(status, Node, node)
            self.adopt(status, data)

    def fork(self) -> None:
        if self.head is None:
            return
        options = [a for a in self.attempts(self.head) if not a["live"]] or self.attempts(self.head)
        if options:
            node = self.rng.choice(options)["id"]
            status, data = self.api.call(
                "POST", f"/api/v1/nodes/{node}/fork", {"expected_version": self.version}, op="fork"
            )
            self.gone_if_404(status, Node, node)
            self.adopt(status, data)

    def switch_branch(self) -> None:
        branches = self.branches()
        if branches:
            branch = self.rng.choice(branches)["id"]
            status, data = self.api.call(
                "POST", f"/api/v1/branches/{branch}/switch", {"expected_version": self.version}, op="switch_branch"
            )
            self.gone_if_404(status, Branch, branch)
            self.adopt(status, data)

    def undo(self) -> None:
        path = f"/api/v1/adventures/{self.adventure_id}/undo"
        self.adopt(*self.api.call("POST", path, {"expected_version": self.version}, op="undo"))

    def redo(self) -> None:
        path = f"/api/v1/adventures/{self.adventure_id}/redo"
        self.adopt(*self.api.call("POST", path, {"expected_version": self.version}, op="redo"))

    def delete_branch(self) -> None:
        branches = [b for b in self.branches() if b["parent"] is not None]
        if branches:
            branch = self.rng.choice(branches)["id"]
            status, _ = self.api.call("DELETE", f"/api/v1/branches/{branch}", op="delete_branch")
            self.gone_if_404(status, Branch, branch)

    def cancel(self) -> None:
        if self.last_job:
            self.api.call("POST", f"/api/v1/jobs/{self.last_job}/cancel", op="cancel")

    def retry_job(self) -> None:
        if self.last_job:
            status, data = self.api.call("POST", f"/api/v1/jobs/{self.last_job}/retry", op="retry_job")
            if status == 202:
                self.follow(data["id"])

    OPERATIONS = {
        "play": 30,
        "retry": 10,
        "regenerate": 4,
        "switch_attempt": 10,
        "fork": 8,
        "switch_branch": 10,
        "undo": 10,
        "redo": 8,
        "delete_branch": 6,
        "cancel": 2,
        "retry_job": 2,
    }

    def run(self) -> None:
        names, weights = zip(*self.OPERATIONS.items(), strict=True)
        try:
            self.refresh()
            while time.monotonic() < self.deadline:
                if self.rng.random() < 0.7:  # otherwise act on what this tab saw last: stale on purpose
                    self.refresh()
                getattr(self, self.rng.choices(names, weights)[0])()
        except Exception as exc:  # a client crash is a finding, not a hang
            self.api.tally.problem(f"client for adventure {self.adventure_id} crashed: {exc!r}")
        finally:
            connection.close()


@pytest.fixture
def quiet_refusals():
    """Hundreds of expected 409s would each log a warning; server errors still log."""
    logger = logging.getLogger("django.request")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_twenty_clients_racing_over_http_never_break_the_tree(
    live_server, start_worker, django_user_model, quiet_refusals
):
    workers = [start_worker(), start_worker()]
    adventure_count = SHARED_ADVENTURES + (CLIENTS - 2 * SHARED_ADVENTURES)
    adventures, tokens = [], []
    for index in range(adventure_count):
        owner = django_user_model.objects.create_user(f"racer{index}", password="correct horse battery")
        adventures.append(tree.adventure_create(owner=owner, title=f"Race {index}", premise="A crowded market."))
        tokens.append(ApiToken.issue(owner)[1])
    tally = Tally()
    deadline = time.monotonic() + DURATION
    players = []
    for client in range(CLIENTS):
        slot = client // 2 if client < 2 * SHARED_ADVENTURES else client - SHARED_ADVENTURES
        api = Api(live_server.url, tokens[slot], tally)
        players.append(Player(api, adventures[slot].pk, seed=client, deadline=deadline))
    threads = [threading.Thread(target=p.run, name=f"racer-{i}") for i, p in enumerate(players)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DURATION + 120)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), "a client hung"

    # Every job reaches an end with a readable outcome (nobody is left holding a story).
    wait_for(
        lambda: not TurnJob.objects.filter(status__in=["queued", "running"]).exists(),
        timeout=60,
        message="every job to finish",
    )
    jobs = TurnJob.objects.filter(pk__in=tally.job_ids)
    outcomes = Counter(f"{j.status}:{j.error_code}" if j.error_code else j.status for j in jobs)
    silent = [j.pk for j in jobs if j.status == "failed" and not j.error_message]
    logs = "\n".join(w.output() for w in workers)

    refusals = sum(tally.statuses[s] for s in REFUSALS)
    server_errors = sum(n for s, n in tally.statuses.items() if s >= 500)
    print(
        f"\nrace on {connection.vendor}: {CLIENTS} clients, {adventure_count} adventures, {elapsed:.1f} s: "
        f"{sum(tally.operations.values())} operations ({tally.requests} requests), "
        f"409s: {tally.statuses[409]}, 400s: {tally.statuses[400]}, 429s: {tally.statuses[429]}, "
        f"5xx: {server_errors}, 404s for deleted objects: {len(tally.vanished)}\n"
        f"  operations: {dict(tally.operations)}\n  statuses: {dict(sorted(tally.statuses.items()))}\n"
        f"  refusals: {dict(tally.codes)}\n  jobs: {dict(outcomes)}"
    )

    assert tally.problems == [], "\n".join(tally.problems[:20])
    assert server_errors == 0
    assert refusals > 0, "the clients never collided: the race did not happen"
    assert sum(tally.operations.values()) >= CLIENTS * 5
    assert outcomes.get("done", 0) > 0, outcomes
    assert silent == []
    assert "worker_lost" not in "".join(outcomes)
    assert "Traceback" not in logs, logs[-5000:]
    for adventure in Adventure.objects.filter(pk__in=[a.pk for a in adventures]):
        assert check_adventure(adventure) == [], adventure.pk


def test_a_tab_switching_attempts_while_a_turn_reads_the_story_fails_it_as_stale(user, redis_url, monkeypatch):
    """Found by the race above on PostgreSQL: a worker reading the path while another tab
    switched the head's attempt saw a path whose chain did not reach its head and failed the
    job as "broken_ancestry" ("this story's saved history is damaged"). Nothing is damaged:
    the story moved, and the player must be told that."""
    from stories import turns
    from stories.turns import turn_run

    adventure = tree.adventure_create(owner=user, title="Tabs", premise="A quiet pier.")
    first, _ = turns.turn_request(adventure=adventure, kind="do", text="I wait.", expected_version=1)
    second, _ = turns.turn_request(adventure=adventure, kind="retry", expected_version=2)
    fresh = Adventure.objects.get(pk=adventure.pk)
    job = TurnJob.objects.create(
        adventure=fresh, kind="do", player_input="I walk on.", expected_head=fresh.head, expected_version=fresh.version
    )
    other_attempt = Node.objects.get(pk=TurnJob.objects.get(pk=first.pk).result_node_id)
    prepare = turns.ctx.prepare

    def other_tab_switches_first(**kwargs):
        tree.attempt_switch(adventure=fresh, node=other_attempt, expected_version=fresh.version)
        return prepare(**kwargs)

    monkeypatch.setattr(turns.ctx, "prepare", other_tab_switches_first)
    nodes_before = Node.objects.filter(adventure=adventure).count()
    turn_run(job.pk)
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "stale_version"), job.error_message
    assert "another tab" in job.error_message
    assert Node.objects.filter(adventure=adventure).count() == nodes_before
    assert check_adventure(adventure) == []
