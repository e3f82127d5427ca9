from __future__ import annotations

import pytest


@pytest.mark.django_db
def test_healthz_reports_database_and_redis_up(client, redis_url):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"database": "up", "redis": "up"}


@pytest.mark.django_db
def test_healthz_reports_redis_down_with_503(client, settings):
    from tests.conftest import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"database": "up", "redis": "down"}
