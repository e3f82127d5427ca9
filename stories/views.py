"""The adventures page: list, create, delete. Thin: look up (scoped to the owner), call one
domain function, render. The play page and its actions are in `views_play.py`."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from . import tree
from .forms import AdventureForm
from .llm.base import profile_label
from .models import Adventure, Branch, Memory, Node, WorldEntry


def _list_page(request: HttpRequest, form: AdventureForm, *, status: int = 200) -> HttpResponse:
    adventures = Adventure.objects.filter(owner=request.user).select_related("model_profile", "head")
    rows = [
        {
            "adventure": adventure,
            "length": adventure.head.depth if adventure.head else 0,
            "model": profile_label(adventure.model_profile),
        }
        for adventure in adventures
    ]
    template = "stories/adventure_list.html#create-form" if request.htmx else "stories/adventure_list.html"
    return render(request, template, {"rows": rows, "form": form}, status=status)


@login_required
@require_GET
def adventure_list(request: HttpRequest) -> HttpResponse:
    return _list_page(request, AdventureForm())


@login_required
@require_POST
def adventure_create(request: HttpRequest) -> HttpResponse:
    form = AdventureForm(request.POST)
    if not form.is_valid():
        return _list_page(request, form, status=400)
    data = form.cleaned_data
    adventure = tree.adventure_create(
        owner=request.user,
        title=data["title"],
        premise=data["premise"],
        persona=data["persona"],
        style=data["style"],
        model_profile=data["model_profile"],
    )
    url = reverse("play", args=[adventure.pk])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@login_required
@require_http_methods(["GET", "POST"])
def adventure_delete(request: HttpRequest, adventure_id: int) -> HttpResponse:
    adventure = get_object_or_404(Adventure, pk=adventure_id, owner=request.user)
    if request.method == "POST":
        title = adventure.title
        tree.adventure_delete(adventure=adventure)
        messages.success(request, f"Deleted “{title}” and everything in it.")
        url = reverse("adventure_list")
        return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    counts = {
        # Every turn on every branch, retried attempts included: all of it goes.
        "turns": Node.objects.filter(adventure=adventure, depth__gt=0).count(),
        "branches": Branch.objects.filter(adventure=adventure).count(),
        "memories": Memory.objects.filter(adventure=adventure).count(),
        "world_entries": WorldEntry.objects.filter(adventure=adventure).count(),
    }
    return render(request, "stories/adventure_delete.html", {"adventure": adventure, "counts": counts})
