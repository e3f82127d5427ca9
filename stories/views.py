"""Player pages. Thin: look up (scoped to the owner), call one domain function, render."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from .models import Adventure


@login_required
@require_GET
def adventure_list(request: HttpRequest) -> HttpResponse:
    adventures = Adventure.objects.filter(owner=request.user).select_related("model_profile", "head")
    return render(request, "stories/adventure_list.html", {"adventures": adventures})
