from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from stories import views_accounts, views_health
from stories.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("healthz", views_health.healthz, name="healthz"),
    path("accounts/signup/", views_accounts.signup, name="signup"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("stories.urls")),
]
