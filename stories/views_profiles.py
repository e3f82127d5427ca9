"""The model profiles page: which models this instance offers, and their limits."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from .llm.base import effective_limits, profile_label
from .models import ModelProfile


@login_required
@require_GET
def profile_list(request: HttpRequest) -> HttpResponse:
    rows = []
    for profile in ModelProfile.objects.order_by("-is_default", "name"):
        window, window_assumed, requested_output = effective_limits(profile)
        rows.append(
            {
                "profile": profile,
                "label": profile_label(profile),
                "window": window,
                "window_assumed": window_assumed,
                "requested_output": requested_output,
                "window_text": f"{window:,}",
                "output_text": f"{requested_output:,}",
            }
        )
    return render(request, "stories/profile_list.html", {"rows": rows})
