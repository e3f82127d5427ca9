"""The per-adventure generation lock, held in Redis.

Two turns (or a turn and a compaction) of one adventure never generate at
once. The lock has a short TTL kept alive by a heartbeat thread, so a worker
killed with SIGKILL frees it within `lock_ttl()` seconds instead of blocking
the story until some long timeout.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.conf import settings


def lock_ttl() -> int:
    """Seconds a dead worker's lock outlives it (STORYTREE_JOB_LOCK_TTL)."""
    return settings.STORYTREE_JOB_LOCK_TTL


class LockBusy(Exception):
    """Another job of this adventure holds the lock."""


class LockLost(Exception):
    """The lock is no longer ours: it expired, or Redis restarted and forgot it."""


class HeldLock:
    """What `adventure_lock` yields: lets the holder check, before it commits, that it still
    holds the lock (the heartbeat cannot renew it while Redis is down)."""

    def __init__(self, lock) -> None:
        self._lock = lock

    def verify(self) -> None:
        """Raise LockLost when the lock is not ours any more; redis.RedisError when Redis is gone."""
        if not self._lock.owned():
            raise LockLost("the adventure lock expired or was lost")


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=5)


def lock_name(adventure_id: int) -> str:
    return f"storytree:adventure-lock:{adventure_id}"


def holder(adventure_id: int) -> str | None:
    """The job id holding the adventure's lock, or None when it is free."""
    value = redis_client().get(lock_name(adventure_id))
    return value.decode() if value else None


@contextmanager
def adventure_lock(adventure_id: int, owner: str, *, wait: float = 30.0) -> Iterator[HeldLock]:
    client = redis_client()
    ttl = lock_ttl()
    lock = client.lock(lock_name(adventure_id), timeout=ttl, blocking_timeout=wait, thread_local=False)
    if not lock.acquire(blocking=True, blocking_timeout=wait, token=owner.encode()):
        raise LockBusy(f"adventure {adventure_id} is busy")
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(max(ttl / 3, 0.5)):
            try:
                lock.extend(ttl, replace_ttl=True)
            except redis.RedisError:
                return

    thread = threading.Thread(target=beat, name=f"lock-heartbeat-{adventure_id}", daemon=True)
    thread.start()
    try:
        yield HeldLock(lock)
    finally:
        stop.set()
        thread.join(2)
        # Expired, or Redis gone: the TTL frees it either way.
        with contextlib.suppress(redis.RedisError):
            lock.release()
