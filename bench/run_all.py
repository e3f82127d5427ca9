"""Run every benchmark and write bench/RESULTS.md (`make bench`).

Each script prints Markdown on stdout (collected here) and progress on stderr (passed through
and kept in var/bench/NAME.log). A script that fails is reported in RESULTS.md with the end of
its log, the others still run, and the exit status is non-zero.
"""

from __future__ import annotations

import json
import platform
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import BENCH_VAR, ROOT, bootstrap, git_commit, table  # noqa: E402

bootstrap()

SCRIPTS = ["paths", "turn_overhead", "prefix_reuse", "storage", "load"]
RESULTS = ROOT / "bench" / "RESULTS.md"


def run(name: str) -> tuple[str, float, int]:
    log_path = BENCH_VAR / f"{name}.log"
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / f"{name}.py")], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

        def pump() -> None:
            for line in proc.stderr:
                sys.stderr.write(line)
                log.write(line)
            log.flush()

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        out = proc.stdout.read()
        code = proc.wait()
        thread.join(10)
    elapsed = time.monotonic() - start
    if code != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        out += f"\n## {name}.py FAILED (exit {code})\n\n```\n{tail}\n```\n"
    return out, elapsed, code


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    versions = []
    for package in ("Django", "django-treebeard", "django-mptt", "celery", "uvicorn"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (missing)")
    return (
        f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        + ", ".join(versions)
    )


def main() -> None:
    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    headlines = BENCH_VAR / "headlines"
    if headlines.exists():
        for old in headlines.glob("*.json"):
            old.unlink()
    started = time.monotonic()
    sections, timings, failed = [], [], []
    for name in SCRIPTS:
        print(f"== bench/{name}.py", file=sys.stderr, flush=True)
        out, elapsed, code = run(name)
        sections.append(out.strip())
        timings.append([f"`bench/{name}.py`", f"{elapsed:.0f} s", "ok" if code == 0 else f"**failed ({code})**"])
        if code:
            failed.append(name)
    total = time.monotonic() - started

    rows = []
    for name in SCRIPTS:
        path = headlines / f"{name}.json"
        if path.exists():
            for measure, value, target, met in json.loads(path.read_text()):
                rows.append([f"{name}", measure, value, target, {"yes": "yes", "no": "**no**"}.get(met, met)])
    text = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (bench/run_all.py) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit "
        f"`{git_commit()}`, {total / 60:.1f} minutes in all.",
        "",
        f"Machine: {machine()}. Machines are shared and noisy: every figure is a median over repeated runs after a "
        "warm-up, and every comparison is a ratio measured in the same run.",
        "",
        "## Headlines",
        "",
        table(["script", "measure", "value", "target", "met"], rows) if rows else "(no headlines: see below)",
        "",
        table(["script", "time", "status"], timings),
        "",
        *[section + "\n" for section in sections],
    ]
    RESULTS.write_text("\n".join(text).rstrip() + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)} in {total / 60:.1f} min", file=sys.stderr)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
