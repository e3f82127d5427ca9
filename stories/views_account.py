"""The account page: API tokens (created here or with `manage.py create_api_token USER`)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from .models import ApiToken


@login_required
def account(request: HttpRequest) -> HttpResponse:
    tokens = ApiToken.objects.filter(user=request.user).order_by("-created_at")
    new_key = request.session.pop("new_api_token", None)
    return render(request, "stories/account.html", {"tokens": tokens, "new_key": new_key})


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "").strip()[:100]
    if ApiToken.objects.filter(user=request.user).count() >= 20:
        messages.error(request, "You already have 20 tokens; revoke one first.")
        return redirect("account")
    _, key = ApiToken.issue(request.user, name=name)
    # Shown exactly once, on the next page (Post/Redirect/Get); only the hash is stored.
    request.session["new_api_token"] = key
    return redirect("account")


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    get_object_or_404(ApiToken, pk=token_id, user=request.user).delete()
    messages.success(request, "Token revoked.")
    return redirect("account")
