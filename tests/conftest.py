"""Shared fixtures: real Redis, a real Celery worker, Debian's Chromium.

The Redis server and the worker are real processes; the worker talks to the
same test database file as the test (SQLite file or Postgres database), so
tests that use it must use `transactional_db` (committed rows).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

pytest_plugins = ["tests.fake_openai"]

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


class RedisServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="storytree-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs it)"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self.ping, message="redis-server to answer")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def redis_url(redis_server: RedisServer, settings) -> str:
    """Point this test's Django (and Celery) at the real Redis."""
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    settings.REDIS_URL = redis_server.url
    settings.CELERY_BROKER_URL = redis_server.url
    from storyproject.celery import app

    if app.conf.broker_url != redis_server.url:
        # Forget pooled connections to the previous broker; they are rebuilt lazily.
        app.conf.broker_url = redis_server.url
        app._pool = None
        app.amqp._producer_pool = None
    return redis_server.url


def database_url_for_subprocess() -> str:
    """The test database as a DATABASE_URL another process can open."""
    sd = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(sd['NAME']).resolve()}"
    host = sd.get("HOST") or "127.0.0.1"
    port = sd.get("PORT") or 5432
    auth = sd.get("USER") or ""
    if sd.get("PASSWORD"):
        auth += f":{sd['PASSWORD']}"
    return f"postgresql://{auth}@{host}:{port}/{sd['NAME']}"


class CeleryWorker:
    def __init__(self, broker_url: str, extra_env: dict[str, str] | None = None) -> None:
        self.broker_url = broker_url
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen | None = None
        fd, self.log_path = tempfile.mkstemp(prefix="storytree-worker-", suffix=".log")
        self.log = os.fdopen(fd, "w")

    def start(self) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": database_url_for_subprocess(),
            "REDIS_URL": self.broker_url,
            "DJANGO_SETTINGS_MODULE": "storyproject.settings",
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "PYTHONPATH": str(ROOT),
            **self.extra_env,
        }
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "storyproject", "worker",
                "--loglevel=INFO", "--concurrency=1", "--pool=prefork", "--without-gossip", "--without-mingle",
                "--include=tests.worker_tasks", f"--hostname=test-{os.getpid()}-{free_port()}@%h",
            ],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self.ready, timeout=30, message="the Celery worker to be ready")

    def ready(self) -> bool:
        assert self.proc and self.proc.poll() is None, f"worker exited early:\n{self.output()}"
        return "ready." in self.output()

    def output(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole worker process group (parent and pool children)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)
        self.proc = None


@pytest.fixture
def celery_worker(redis_url: str, transactional_db) -> Iterator[CeleryWorker]:
    from storyproject.celery import app

    app.conf.task_always_eager = False
    worker = CeleryWorker(redis_url)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def start_worker(redis_url: str, transactional_db):
    """Factory for tests that need to start (or restart) workers themselves."""
    from storyproject.celery import app

    app.conf.task_always_eager = False
    workers: list[CeleryWorker] = []

    def start(**extra_env: str) -> CeleryWorker:
        worker = CeleryWorker(redis_url, extra_env)
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="session")
def browser():
    # Playwright's sync API runs an event loop in this thread; the ORM calls the
    # tests make around it are still synchronous, so allow them.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture(autouse=True)
def _eager_celery_by_default(settings):
    """Unit tests run tasks in-process unless they ask for a real worker."""
    from storyproject.celery import app

    app.conf.task_always_eager = True
    # Tests that play many turns should not meet the per-user rate limit; its own tests lower it.
    settings.STORYTREE_TURN_RATE = "100000/min"
    yield
    app.conf.task_always_eager = settings.CELERY_TASK_ALWAYS_EAGER


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("mallory", password="correct horse battery")


@pytest.fixture
def client_alice(client, user):
    client.force_login(user)
    return client
