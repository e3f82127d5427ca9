"""Player-facing forms. They parse and validate input; the rules live in the domain modules
(`stories/tree.py`, `stories/turns.py`), which give the final word with their own messages."""

from __future__ import annotations

from django import forms

from . import worldbook
from .llm.base import profile_label
from .models import Adventure, ModelProfile, WorldEntry

PLAY_KINDS = [("do", "Do"), ("say", "Say"), ("story", "Story"), ("continue", "Continue")]
TURN_KINDS = [*PLAY_KINDS, ("retry", "Retry"), ("regenerate", "Regenerate"), ("edit", "Edit")]


def first_error(form: forms.Form) -> str:
    """One plain sentence for a refused form: the first field's first error, named."""
    for name, errors in form.errors.items():
        if name == "__all__" or name not in form.fields or name in getattr(form, "whole_sentence_errors", ()):
            return str(errors[0])
        return f"{form[name].label}: {errors[0]}"
    return "That request was not understood."


class ProfileChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: ModelProfile) -> str:
        suffix = " (default)" if obj.is_default else ""
        return f"{obj.name}: {profile_label(obj)}{suffix}"


class AdventureForm(forms.ModelForm):
    premise = forms.CharField(
        required=False,
        max_length=20_000,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="Where the story starts. It becomes the opening of the story.",
    )
    persona = forms.CharField(
        label="Player persona", required=False, max_length=4_000, widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Who you play.",
    )  # fmt: skip
    style = forms.CharField(
        label="Style notes", required=False, max_length=4_000, widget=forms.Textarea(attrs={"rows": 2}),
        help_text="How the narrator should write.",
    )  # fmt: skip
    model_profile = ProfileChoiceField(
        queryset=ModelProfile.objects.order_by("-is_default", "name"),
        label="Model",
        empty_label=None,
        help_text="Which model narrates this story.",
    )

    class Meta:
        model = Adventure
        fields = ["title", "premise", "persona", "style", "model_profile"]
        error_messages = {"title": {"required": "A title is required."}}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        default = self.fields["model_profile"].queryset.filter(is_default=True).first()
        if default is not None and not self.is_bound:
            self.initial.setdefault("model_profile", default.pk)

    def clean_title(self) -> str:
        title = " ".join(self.cleaned_data["title"].split())
        if not title:
            raise forms.ValidationError("A title is required.")
        return title


VERSION_MISSING = "Reload the page: this request did not say which version of the story it was made on."


class VersionForm(forms.Form):
    """Every head move names the version of the story the player was looking at."""

    whole_sentence_errors = {"expected_version"}
    expected_version = forms.IntegerField(
        min_value=0,
        error_messages={"required": VERSION_MISSING, "invalid": VERSION_MISSING, "min_value": VERSION_MISSING},
    )


class TurnForm(VersionForm):
    kind = forms.ChoiceField(choices=TURN_KINDS)
    text = forms.CharField(required=False, strip=True, label="Your words")
    node = forms.IntegerField(required=False, min_value=1)
    idempotency_key = forms.CharField(required=False, max_length=100)


class BranchRenameForm(forms.Form):
    # Blank and over-long names are refused by tree.branch_rename, with its own message.
    name = forms.CharField(required=False, strip=False, label="Branch name")
    clear = forms.BooleanField(required=False)


class MemoryForm(forms.Form):
    # Blank and over-long text are refused by tree.memory_add, with its own message.
    text = forms.CharField(label="Memory", required=False, strip=False, widget=forms.Textarea(attrs={"rows": 2}))
    pinned = forms.BooleanField(required=False)


class PinForm(forms.Form):
    pinned = forms.BooleanField(required=False)


class WorldEntryForm(forms.ModelForm):
    keys = forms.CharField(
        required=False,
        label="Trigger words",
        help_text="Comma-separated. The entry reaches the narrator when one of them comes up.",
    )

    content = forms.CharField(max_length=8_000, widget=forms.Textarea(attrs={"rows": 3}))
    priority = forms.IntegerField(min_value=-1000, max_value=1000, initial=0, required=False)

    class Meta:
        model = WorldEntry
        fields = ["keys", "content", "priority", "always_on", "enabled"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and not self.is_bound:
            self.initial["keys"] = ", ".join(self.instance.keys or [])

    def clean_keys(self) -> list[str]:
        try:
            return worldbook.clean_keys((self.cleaned_data.get("keys") or "").split(","))
        except worldbook.InvalidEntry as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean_priority(self) -> int:
        priority = self.cleaned_data.get("priority")
        return 0 if priority is None else priority

    def clean(self):
        cleaned = super().clean()
        if "keys" in cleaned:
            try:
                worldbook.check_entry(keys=cleaned["keys"], always_on=bool(cleaned.get("always_on")))
            except worldbook.InvalidEntry as exc:
                raise forms.ValidationError(str(exc)) from exc
        return cleaned


class WorldToggleForm(forms.Form):
    enabled = forms.BooleanField(required=False)
