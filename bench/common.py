"""What every benchmark shares: Django set-up on throwaway SQLite files under var/bench/,
medians over repeated runs after a warm-up, query counts, table sizes, a private
redis-server, a timer around the built-in narrator, and Markdown tables.

Every script prints Markdown on stdout (collected into bench/RESULTS.md by bench/run_all.py)
and progress on stderr.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_VAR = ROOT / "var" / "bench"


def bootstrap() -> None:
    """Make the repository importable when a script runs as `python bench/NAME.py`
    (which puts bench/ itself first on sys.path, where `paths.py` would shadow names)."""
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)


def sqlite_files(path: Path) -> list[Path]:
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


def remove_sqlite(path: Path) -> None:
    for item in sqlite_files(path):
        with contextlib.suppress(FileNotFoundError):
            item.unlink()


def setup_django(prefix: str, **env: str) -> Path:
    """Point Django at var/bench/<prefix>_ours.sqlite3 (deleted first), with bench settings,
    and migrate it. Returns the database path."""
    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    db = BENCH_VAR / f"{prefix}_ours.sqlite3"
    remove_sqlite(db)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["BENCH_DB_PREFIX"] = prefix
    os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("STORYTREE_BUILTIN_CHUNK_DELAY_MS", "0")
    os.environ.update(env)
    import django

    django.setup()
    migrate()
    return db


def migrate(alias: str = "default") -> None:
    from django.core.management import call_command

    call_command("migrate", database=alias, verbosity=0, interactive=False)


def checkpoint_and_vacuum(alias: str = "default") -> None:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        cursor.execute("VACUUM")
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def table_bytes(alias: str, tables: Sequence[str]) -> int:
    """Bytes of the pages holding `tables` and every index on them (SQLite's dbstat)."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        names = list(tables)
        for table in tables:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = %s", [table])
            names += [row[0] for row in cursor.fetchall()]
        marks = ", ".join(["%s"] * len(names))
        cursor.execute(f"SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN ({marks})", names)
        return int(cursor.fetchone()[0])


def record_sql(alias: str, fn: Callable[[], Any]) -> tuple[list[tuple[str, Any, bool]], Any]:
    """(every SQL statement `fn` sent on `alias` as (sql, params, many), its result). Records
    through an execute wrapper, so it has no ceiling (CaptureQueriesContext reads a log that
    stops at 9,000 queries)."""
    from django.db import connections

    statements: list[tuple[str, Any, bool]] = []

    def recorder(execute, sql, params, many, context):
        statements.append((sql, params, many))
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(recorder):
        result = fn()
    return statements, result


def count_queries(alias: str, fn: Callable[[], Any]) -> tuple[int, Any]:
    statements, result = record_sql(alias, fn)
    return len(statements), result


def replayer(alias: str, statements: list[tuple[str, Any, bool]]) -> Callable[[], None]:
    """A function that sends the same read statements on a plain cursor and fetches every row:
    what the database alone costs, without building queries or model objects."""
    from django.db import connections

    def replay() -> None:
        with connections[alias].cursor() as cursor:
            for sql, params, many in statements:
                if many:
                    cursor.executemany(sql, params)
                else:
                    cursor.execute(sql, params)
                if cursor.description:
                    cursor.fetchall()

    return replay


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def interleaved(
    runners: dict[str, Callable[[], Any]],
    *,
    repeat: int,
    warmup: int = 1,
    seed: int = 0,
    limit: dict[str, int] | None = None,
) -> dict[str, list[float]]:
    """Time each runner `warmup + repeat` times, round-robin in a shuffled order each round,
    so machine noise lands on every contender alike. `limit` caps the timed runs of a slow
    runner (it simply sits out the later rounds). Returns the timed runs (seconds)."""
    limit = limit or {}
    import gc

    rng = random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    gc.collect()
    for round_ in range(warmup + repeat):
        rng.shuffle(names)
        # The collector runs between calls, never inside one (as timeit does): a collection
        # triggered by one contender's garbage would otherwise land on whoever runs next.
        # (No full collection per round: it leaves the caches cold for the next call.)
        for name in names:
            if round_ >= warmup + limit.get(name, repeat):
                continue
            gc.disable()
            try:
                start = time.perf_counter()
                runners[name]()
                elapsed = time.perf_counter() - start
            finally:
                gc.enable()
            if round_ >= warmup:
                times[name].append(elapsed)
    return times


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms * 1000:.0f} µs"


def fmt_ratio(value: float) -> str:
    if value != value:  # nan
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}×"
    if value >= 10:
        return f"{value:.1f}×"
    return f"{value:.2f}×"


def fmt_bytes(n: float) -> str:
    for unit, size in (("MB", 1_000_000), ("kB", 1_000)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(out)


def emit(text: str = "") -> None:
    print(text, flush=True)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


class RedisServer:
    """A private redis-server on a free 127.0.0.1 port, no persistence. Stopped by pid."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="storytree-bench-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if not binary:
            raise SystemExit("redis-server is not installed (make bench installs it)")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for(self.ping, 15, "redis-server to answer")
        return self

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class ModelTimer:
    """Wraps the built-in narrator's `chat()` so the model's own time can be subtracted:
    counts calls (turn calls and summary calls apart) and the seconds spent inside them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.summary_calls = 0
        self.turn_prompts: list[list[dict[str, Any]]] = []
        self._original = None

    def install(self) -> ModelTimer:
        from stories.llm import builtin

        original = builtin.BuiltinNarrator.chat
        timer = self

        def chat(self_, *args: Any, **kwargs: Any):
            tools = kwargs.get("tools") or []
            messages = kwargs.get("messages") or []
            if any(getattr(t, "name", "") == "submit_context_summary" for t in tools):
                timer.summary_calls += 1
            elif messages and messages[-1].get("role") == "user":
                # The first request of a turn (a continuation ends with a tool message).
                timer.turn_prompts.append(messages)
            # Time spent in the pipeline's own callbacks (progress writes, cancel polls) is
            # pipeline work, not the model's: it is given back.
            given_back = 0.0

            def timed(callback):
                if callback is None:
                    return None

                def inner(*a: Any, **k: Any):
                    nonlocal given_back
                    start_cb = time.perf_counter()
                    try:
                        return callback(*a, **k)
                    finally:
                        given_back += time.perf_counter() - start_cb

                return inner

            kwargs["on_text"] = timed(kwargs.get("on_text"))
            kwargs["cancel"] = timed(kwargs.get("cancel"))
            start = time.perf_counter()
            try:
                return original(self_, *args, **kwargs)
            finally:
                timer.seconds += time.perf_counter() - start - given_back
                timer.calls += 1

        builtin.BuiltinNarrator.chat = chat
        self._original = original
        return self

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.summary_calls = 0
        self.turn_prompts = []

    def uninstall(self) -> None:
        if self._original is not None:
            from stories.llm import builtin

            builtin.BuiltinNarrator.chat = self._original
            self._original = None


@contextlib.contextmanager
def stopwatch() -> Iterator[list[float]]:
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def headline(script: str, rows: list[list[str]]) -> None:
    """Rows [measure, value, target or "", met: "yes"/"no"/""] for the summary at the top of
    bench/RESULTS.md (collected by bench/run_all.py)."""
    import json

    folder = BENCH_VAR / "headlines"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{script}.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1))
