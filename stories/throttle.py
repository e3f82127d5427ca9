"""Per-user rate limits (fixed windows counted in Redis, shared by every web process).

The limits are settings of the form "COUNT/PERIOD" (PERIOD: s, min, hour, day). A Redis
outage does not block players here: the request goes on and meets the component that
really needs Redis (the turn queue), which answers 503.
"""

from __future__ import annotations

import logging
import math
import time

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .locks import redis_client

log = logging.getLogger(__name__)

PERIODS = {"s": 1, "sec": 1, "min": 60, "m": 60, "hour": 3600, "h": 3600, "day": 86400, "d": 86400}


class RateLimited(Exception):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def parse_rate(value: str) -> tuple[int, int]:
    try:
        count, period = value.split("/", 1)
        return int(count), PERIODS[period.strip().lower()]
    except (ValueError, KeyError):
        raise ImproperlyConfigured(f"A rate must look like 30/min or 10/hour, got {value!r}") from None


LIMITS = {
    "turns": ("STORYTREE_TURN_RATE", "turns"),
    "imports": ("STORYTREE_IMPORT_RATE", "imports"),
}


def hit(user_id: int, scope: str) -> None:
    """Count one request; raise RateLimited when the user is over the scope's limit."""
    setting, noun = LIMITS[scope]
    count, period = parse_rate(getattr(settings, setting))
    now = time.time()
    window = int(now // period)
    key = f"storytree:rate:{scope}:{user_id}:{window}"
    try:
        client = redis_client()
        pipe = client.pipeline()
        pipe.incr(key)
        pipe.expire(key, period + 1)
        used = pipe.execute()[0]
    except redis.RedisError as exc:
        log.warning("rate limit for %s not checked, Redis is down: %s", scope, exc)
        return
    if used > count:
        retry_after = max(1, math.ceil((window + 1) * period - now))
        raise RateLimited(
            f"You have made {count} {noun} requests in a short time. Wait {retry_after} s and try again.",
            retry_after,
        )
