"""N concurrent simulated players against a real server stack, over HTTP on 127.0.0.1.

The script starts everything itself and stops every process it started: a redis-server on a
free port, a Celery worker (prefork, 2 processes, as the Procfile runs it), uvicorn serving
storyproject.asgi (DEBUG=0, the product's settings), all on a throwaway SQLite file under
var/bench/, with the built-in narrator and no streaming delay. The per-user turn rate limit is
raised for the run (it would otherwise cap each player at 30 turns a minute; 429s are still
counted).

Each player signs in with its own API token and loops: request a turn (POST .../turns with
expected_version and an idempotency key), poll the job every 100 ms until it finishes, read the
story window (GET .../story, which also gives the new version), and now and then undo. Some
players are a second tab on another player's story, so they meet 409s and recover by re-reading
the version. The run is bounded in time and in requests per player. Afterwards the integrity
checker (stories.integrity.check_adventure) runs on every adventure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bootstrap  # noqa: E402

bootstrap()

from bench.common import (  # noqa: E402
    BENCH_VAR,
    ROOT,
    RedisServer,
    emit,
    fmt_ms,
    free_port,
    headline,
    progress,
    setup_django,
    table,
    wait_for,
)

ACTIONS = (
    "I look around the inn.",
    "I ask Maren about the harbourmaster.",
    "I walk down to the quay.",
    "I climb the rocks towards the lighthouse.",
    "I search the keeper's room.",
    "I wait and listen.",
)
POLL_SECONDS = 0.1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = {}
        self.status: dict[int, int] = {}
        self.turns_committed = 0
        self.turn_seconds: list[float] = []  # request to job done, as a player waits for it
        self.jobs_failed: dict[str, int] = {}
        self.exceptions: dict[str, int] = {}
        self.requests = 0

    def record(self, route: str, seconds: float, status: int) -> None:
        with self.lock:
            self.latency.setdefault(route, []).append(seconds)
            self.status[status] = self.status.get(status, 0) + 1
            self.requests += 1


class Player(threading.Thread):
    def __init__(
        self, index: int, port: int, token: str, adventure_id: int, stats: Stats, deadline: float, max_requests: int
    ):
        super().__init__(name=f"player-{index}", daemon=True)
        self.index, self.port, self.token, self.adventure_id = index, port, token, adventure_id
        self.stats, self.deadline, self.max_requests = stats, deadline, max_requests
        self.rng = random.Random(index)
        self.sent = 0
        self.version: int | None = None
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, route: str, body: dict | None = None) -> tuple[int, dict]:
        self.sent += 1
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        start = time.perf_counter()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
            raw = response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            with self.stats.lock:
                name = type(exc).__name__
                self.stats.exceptions[name] = self.stats.exceptions.get(name, 0) + 1
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return 0, {}
        self.stats.record(route, time.perf_counter() - start, status)
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {}
        return status, payload

    def budget_left(self) -> bool:
        return time.monotonic() < self.deadline and self.sent < self.max_requests

    def refresh(self) -> None:
        status, body = self.call("GET", f"/api/v1/adventures/{self.adventure_id}/story?limit=30", "GET story")
        if status == 200:
            self.version = body.get("version", self.version)

    def run(self) -> None:
        try:
            self.refresh()
            while self.budget_left():
                if self.rng.random() < 0.08:
                    status, body = self.call(
                        "POST",
                        f"/api/v1/adventures/{self.adventure_id}/undo",
                        "POST undo",
                        {"expected_version": self.version},
                    )
                    if status == 200:
                        self.version = body.get("version", self.version)
                    else:
                        self.refresh()
                    continue
                started = time.perf_counter()
                status, body = self.call(
                    "POST",
                    f"/api/v1/adventures/{self.adventure_id}/turns",
                    "POST turns",
                    {"kind": "do", "text": self.rng.choice(ACTIONS), "expected_version": self.version,
                     "idempotency_key": uuid.uuid4().hex},
                )  # fmt: skip
                if status == 202:
                    self.wait_for_job(body["id"], started)
                    self.refresh()
                elif status == 429:
                    time.sleep(min(2.0, float(body.get("retry_after", 1) if isinstance(body, dict) else 1)))
                    self.refresh()
                else:
                    # 409 (another tab moved the story, or a turn is in progress) or an error: re-read, go on.
                    time.sleep(0.05)
                    self.refresh()
        finally:
            if self.conn is not None:
                self.conn.close()

    def wait_for_job(self, job_id: int, started: float) -> None:
        grace = self.deadline + 30
        while time.monotonic() < grace:
            time.sleep(POLL_SECONDS)
            status, body = self.call("GET", f"/api/v1/jobs/{job_id}", "GET job")
            if status != 200:
                continue
            if body.get("status") == "done":
                with self.stats.lock:
                    self.stats.turns_committed += 1
                    self.stats.turn_seconds.append(time.perf_counter() - started)
                return
            if body.get("status") in {"failed", "cancelled"}:
                code = (body.get("error") or {}).get("code", body["status"])
                with self.stats.lock:
                    self.stats.jobs_failed[code] = self.stats.jobs_failed.get(code, 0) + 1
                return


class Stack:
    """redis-server, a Celery worker and uvicorn, each in its own process group, stopped by pid."""

    def __init__(self, database: Path) -> None:
        self.redis = RedisServer()
        self.port = free_port()
        self.database = database
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.logs: dict[str, Path] = {}

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "storyproject.settings",
            "DATABASE_URL": f"sqlite:///{self.database}",
            "REDIS_URL": self.redis.url,
            "DEBUG": "0",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "SECURE_SSL_REDIRECT": "0",
            "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
            "SECURE_HSTS_SECONDS": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "STORYTREE_BUILTIN_CHUNK_DELAY_MS": "0",
            "STORYTREE_TURN_RATE": "1000000/min",
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
        env.pop("BENCH_DB_PREFIX", None)
        return env

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = BENCH_VAR / f"load_{name}.log"
        self.logs[name] = log
        handle = open(log, "w")  # noqa: SIM115 - closed when the process is stopped
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env(), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append((name, proc))
        return proc

    def start(self, worker_concurrency: int) -> None:
        self.redis.start()
        venv = Path(sys.executable).parent
        worker = self.spawn(
            "worker",
            [str(venv / "celery"), "-A", "storyproject", "worker", "--loglevel=INFO", f"--concurrency={worker_concurrency}",
             "--pool=prefork", "--without-gossip", "--without-mingle", f"--hostname=bench-{os.getpid()}@%h"],
        )  # fmt: skip
        self.spawn(
            "web",
            [str(venv / "uvicorn"), "storyproject.asgi:application", "--host", "127.0.0.1", "--port", str(self.port),
             "--no-access-log", "--log-level", "warning"],
        )  # fmt: skip

        def worker_ready() -> bool:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited:\n{self.logs['worker'].read_text()[-2000:]}")
            return "ready." in self.logs["worker"].read_text(errors="replace")

        wait_for(worker_ready, 60, "the Celery worker")
        wait_for(self.healthy, 60, "uvicorn to answer /healthz")

    def healthy(self) -> bool:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited:\n{self.logs[name].read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/healthz")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except (OSError, http.client.HTTPException):
            return False

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--players", type=int, default=20)
    parser.add_argument("--shared", type=int, default=4, help="players that are a second tab on another player's story")
    parser.add_argument("--duration", type=float, default=45.0, help="seconds of play")
    parser.add_argument("--max-requests", type=int, default=3_000, help="per player")
    parser.add_argument("--worker-concurrency", type=int, default=2)
    args = parser.parse_args()
    if not 0 <= args.shared < args.players:
        raise SystemExit("--shared must be below --players")

    database = setup_django("load")
    from django.contrib.auth import get_user_model
    from django.db import connections

    from stories.models import Adventure, ApiToken
    from stories.tree import adventure_create

    owners = args.players - args.shared
    User = get_user_model()
    seats = []
    for index in range(owners):
        user = User.objects.create_user(f"player{index}")
        _token, key = ApiToken.issue(user, name="bench")
        adventure = adventure_create(
            owner=user,
            title=f"Story {index}",
            premise="Rain hammers the slate roofs of Saltmarsh.",
            persona="A navigator.",
        )
        seats.append((key, adventure.pk))
    for index in range(args.shared):
        seats.append(seats[index % owners])  # a second tab: same player, same story
    connections.close_all()

    stack = Stack(database)
    stats = Stats()
    try:
        progress(f"load: starting redis, worker, uvicorn on 127.0.0.1:{stack.port}")
        stack.start(args.worker_concurrency)
        progress(f"load: {args.players} players for {args.duration:.0f} s")
        start = time.monotonic()
        deadline = start + args.duration
        players = [
            Player(i, stack.port, key, adv, stats, deadline, args.max_requests) for i, (key, adv) in enumerate(seats)
        ]
        for player in players:
            player.start()
        for player in players:
            player.join(args.duration + 90)
        elapsed = time.monotonic() - start
        alive = sum(p.is_alive() for p in players)
    finally:
        progress("load: stopping the stack")
        stack.stop()

    from stories.integrity import check_adventure
    from stories.models import TurnJob

    violations = []
    adventures = list(Adventure.objects.all())
    for adventure in adventures:
        violations += [f"adventure {adventure.pk}: {v}" for v in check_adventure(adventure)]
    unfinished = TurnJob.objects.filter(status__in=[TurnJob.Status.QUEUED, TurnJob.Status.RUNNING]).count()
    nodes_written = sum(a.nodes.count() - 1 for a in adventures)

    emit("## load.py — concurrent players over HTTP against uvicorn + Celery + Redis + SQLite")
    emit()
    emit(
        f"{args.players} players ({args.shared} of them a second tab on another player's story) for "
        f"{args.duration:.0f} s on 127.0.0.1: uvicorn (1 process), a Celery worker (prefork × {args.worker_concurrency}), "
        "redis-server, SQLite (WAL), built-in narrator without delay, DEBUG=0, turn rate limit raised. "
        f"Each player: POST a turn, poll the job every {POLL_SECONDS * 1000:.0f} ms, GET the story window, undo now and then."
    )
    emit()
    all_latency = [s for values in stats.latency.values() for s in values]
    statuses = ", ".join(f"{code or 'no answer'} × {n:,}" for code, n in sorted(stats.status.items()))
    rows = [
        ["wall time", f"{elapsed:.1f} s"],
        ["HTTP requests", f"{stats.requests:,} ({stats.requests / elapsed:.0f}/s)"],
        ["turns committed", f"**{stats.turns_committed:,}** (**{stats.turns_committed / elapsed:.2f}/s**); nodes written: {nodes_written:,}"],
        ["turn as a player waits for it (POST to job done), p50 / p95",
         f"{fmt_ms(percentile(stats.turn_seconds, 0.5))} / {fmt_ms(percentile(stats.turn_seconds, 0.95))}"],
        ["request latency, all requests, p50 / p95",
         f"**{fmt_ms(percentile(all_latency, 0.5))} / {fmt_ms(percentile(all_latency, 0.95))}**"],
        ["requests in flight on average (Little's law: rate × mean latency)",
         f"{stats.requests / elapsed * (sum(all_latency) / max(len(all_latency), 1)):.1f}"],
        ["HTTP statuses", statuses],
        ["409s", f"{stats.status.get(409, 0):,}"],
        ["429s", f"{stats.status.get(429, 0):,}"],
        ["errors: 5xx", f"{sum(n for code, n in stats.status.items() if code >= 500):,}"],
        ["errors: no answer (connection)", ", ".join(f"{k} × {v}" for k, v in stats.exceptions.items()) or "0"],
        ["jobs that failed", ", ".join(f"{k} × {v}" for k, v in stats.jobs_failed.items()) or "0"],
        ["jobs left queued or running after the stack stopped", f"{unfinished}"],
        ["players still running at the end", f"{alive}"],
        ["integrity checker on every adventure", f"**{'clean' if not violations else f'{len(violations)} violations'}** ({len(adventures)} adventures)"],
    ]  # fmt: skip
    emit(table(["measure", "value"], rows))
    emit()
    rows = []
    for route, values in sorted(stats.latency.items()):
        rows.append(
            [
                route,
                f"{len(values):,}",
                fmt_ms(percentile(values, 0.5)),
                fmt_ms(percentile(values, 0.95)),
                fmt_ms(max(values)),
            ]
        )
    emit(table(["request", "count", "p50", "p95", "max"], rows))
    emit()
    errors = sum(n for code, n in stats.status.items() if code >= 500) + sum(stats.exceptions.values())
    headline(
        "load",
        [
            [f"{args.players} players: turns committed per second", f"{stats.turns_committed / elapsed:.2f}", "", ""],
            [
                "request latency p50 / p95",
                f"{fmt_ms(percentile(all_latency, 0.5))} / {fmt_ms(percentile(all_latency, 0.95))}",
                "",
                "",
            ],
            [
                "409s / 5xx and connection errors",
                f"{stats.status.get(409, 0):,} / {errors}",
                "no errors",
                "yes" if not errors else "no",
            ],
            [
                "integrity checker afterwards",
                "clean" if not violations else f"{len(violations)} violations",
                "clean",
                "yes" if not violations else "no",
            ],
        ],
    )
    if violations:
        emit("Integrity violations:")
        emit()
        emit("\n".join(f"- {v}" for v in violations[:20]))
        emit()


if __name__ == "__main__":
    main()
