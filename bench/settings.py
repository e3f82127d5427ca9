"""Settings for the benchmarks: the product's settings plus the bench-only contender app,
django-treebeard and django-mptt (so the product's INSTALLED_APPS never includes them),
and one SQLite file per contender with the product's own SQLite options (WAL, same pragmas,
IMMEDIATE transactions)."""

from __future__ import annotations

import os

from storyproject.settings import *  # noqa: F403
from storyproject.settings import INSTALLED_APPS, VAR_DIR, _sqlite

INSTALLED_APPS = [*INSTALLED_APPS, "treebeard", "mptt", "bench.contenders"]

BENCH_DIR = VAR_DIR / "bench"
BENCH_DIR.mkdir(parents=True, exist_ok=True)
_prefix = os.environ.get("BENCH_DB_PREFIX", "bench")
for _alias in ("adjacency", "cte", "treebeard", "mptt"):
    DATABASES[_alias] = _sqlite(BENCH_DIR / f"{_prefix}_{_alias}.sqlite3")  # noqa: F405
DATABASE_ROUTERS = ["bench.contenders.routers.ContenderRouter"]

# The Django test client's host.
ALLOWED_HOSTS = [*ALLOWED_HOSTS, "testserver"]  # noqa: F405
