from __future__ import annotations

from django.apps import AppConfig


class ContendersConfig(AppConfig):
    name = "bench.contenders"
    label = "contenders"
    default_auto_field = "django.db.models.BigAutoField"
