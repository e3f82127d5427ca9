"""Export a story as a bundle file; import a bundle or a SillyTavern chat (stories/bundles.py)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import filesizeformat
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods

from . import bundles, throttle
from .bundles import BundleError
from .models import Adventure
from .streaming import download

# Room for the multipart framing around the file itself.
MULTIPART_SLACK_BYTES = 64 * 1024
# Corrections beyond this many are summarised in one message.
MAX_WARNING_MESSAGES = 5


class BundleUploadForm(forms.Form):
    file = forms.FileField(
        label="Story file",
        help_text="A Storytree bundle (.storytree.json, from Export) or a SillyTavern chat (.jsonl).",
    )


@login_required
@require_GET
def adventure_export(request: HttpRequest, adventure_id: int) -> StreamingHttpResponse:
    adventure = get_object_or_404(Adventure, pk=adventure_id, owner=request.user)
    return download(
        request,
        bundles.export_stream(adventure),
        filename=bundles.export_filename(adventure),
        content_type="application/json; charset=utf-8",
    )


def _max_bytes() -> int:
    return bundles.Caps.from_settings().max_bytes


def _form_page(request: HttpRequest, form: BundleUploadForm, *, status: int = 200, fault=None) -> HttpResponse:
    context = {"form": form, "fault": fault, "max_bytes": _max_bytes()}
    return render(request, "stories/import.html", context, status=status)


def _too_large(request: HttpRequest, size: int | None) -> HttpResponse:
    limit = _max_bytes()
    told = f"That file is {filesizeformat(size)}; " if size else "That file is too large; "
    fault = {
        "headline": "The file is too large to import.",
        "path": "$",
        "reason": f"{told}files up to {filesizeformat(limit)} can be imported.",
    }
    return _form_page(request, BundleUploadForm(), status=413, fault=fault)


@login_required
@csrf_exempt
def adventure_import(request: HttpRequest) -> HttpResponse:
    # A body declared larger than the cap is refused before anything reads it (the CSRF
    # check would parse the whole upload first); nothing is written, so nothing is forged.
    if request.method == "POST":
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > _max_bytes() + MULTIPART_SLACK_BYTES:
            return _too_large(request, declared)
    return _adventure_import(request)


@csrf_protect
@require_http_methods(["GET", "POST"])
def _adventure_import(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _form_page(request, BundleUploadForm())
    form = BundleUploadForm(request.POST, request.FILES)
    if not form.is_valid():
        return _form_page(request, form, status=400)
    upload = form.cleaned_data["file"]
    try:
        throttle.hit(request.user.pk, "imports")
    except throttle.RateLimited as limited:
        fault = {"headline": "Too many imports.", "path": "$", "reason": limited.message}
        response = _form_page(request, BundleUploadForm(), status=429, fault=fault)
        response["Retry-After"] = str(limited.retry_after)
        return response
    try:
        adventure = bundles.import_any(upload, owner=request.user, filename=upload.name)
    except BundleError as error:
        if error.status == 413:
            return _too_large(request, upload.size)
        fault = {"headline": "This file can't be imported.", "path": error.path, "reason": error.reason}
        return _form_page(request, BundleUploadForm(), status=400, fault=fault)
    messages.success(request, f"Imported “{adventure.title}”.")
    warnings = adventure.import_warnings
    for warning in warnings[:MAX_WARNING_MESSAGES]:
        messages.warning(request, f"Corrected while importing: {warning}")
    if len(warnings) > MAX_WARNING_MESSAGES:
        messages.warning(request, f"… and {len(warnings) - MAX_WARNING_MESSAGES} more corrections like these.")
    return redirect("adventure_list")
