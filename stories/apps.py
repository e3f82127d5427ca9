from __future__ import annotations

from django.apps import AppConfig


class StoriesConfig(AppConfig):
    name = "stories"
    default_auto_field = "django.db.models.BigAutoField"
