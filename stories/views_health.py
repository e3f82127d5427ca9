from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET


def database_up() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:  # any driver error means "not answering"
        return False


def redis_up() -> bool:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        return bool(client.ping())
    except redis.RedisError:
        return False


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    db, rd = database_up(), redis_up()
    status = 200 if db and rd else 503
    return JsonResponse({"database": "up" if db else "down", "redis": "up" if rd else "down"}, status=status)
