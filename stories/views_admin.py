"""The operator dashboard: an admin page (staff only, wrapped by `admin_site.admin_view`)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from .dashboard import dashboard_stats


def dashboard(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Storytree dashboard",
        "stats": dashboard_stats(),
    }
    return TemplateResponse(request, "admin/storytree_dashboard.html", context)
