"""The model profiles page and the one function computing its limits."""

from __future__ import annotations

import pytest
from django.urls import reverse

from stories.llm.base import effective_limits, profile_label
from stories.models import ModelProfile

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("window", "output", "expected"),
    [
        (None, None, (16384, True, 4096)),
        (8192, None, (8192, False, 4096)),
        (8192, 1024, (8192, False, 1024)),
        (131072, 32768, (131072, False, 4096)),
        (None, 512, (16384, True, 512)),
    ],
)
def test_effective_limits(window, output, expected):
    assert effective_limits(ModelProfile(context_window=window, max_output_tokens=output)) == expected


def test_profile_labels():
    assert profile_label(ModelProfile(provider="builtin")) == "offline narrator, no AI model"
    remote = ModelProfile(provider="openai", base_url="http://127.0.0.1:11434/v1", model_name="llama3.1:8b")
    assert profile_label(remote) == "llama3.1:8b at 127.0.0.1:11434"


def test_it_requires_login(client):
    response = client.get(reverse("profile_list"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_rejects_post(client_alice):
    assert client_alice.post(reverse("profile_list")).status_code == 405


def test_it_shows_each_profile_with_its_label_limits_and_assumed_warning(client_alice):
    ModelProfile.objects.create(
        name="Local llama",
        provider="openai",
        base_url="http://127.0.0.1:8080/v1",
        model_name="qwen2.5-7b",
        api_key_env="LLAMA_SECRET_VAR",
        context_window=8192,
        max_output_tokens=1024,
    )
    response = client_alice.get(reverse("profile_list"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Offline narrator" in html and "offline narrator, no AI model" in html
    assert "Local llama" in html and "qwen2.5-7b at 127.0.0.1:8080" in html
    assert "8,192 tokens" in html and "1,024 tokens" in html
    assert "16,384 tokens" in html and "4,096 tokens" in html
    rows = {row["profile"].name: row for row in response.context["rows"]}
    assert rows["Offline narrator"]["window_assumed"] is True
    assert rows["Local llama"]["window_assumed"] is False
    assert html.count("assumed, not known") == 1
    assert "LLAMA_SECRET_VAR" not in html  # players have no business with operator config


@pytest.mark.django_db
def test_every_signed_in_page_links_the_model_profiles(client, user):
    client.force_login(user)
    assert 'href="/profiles/"' in client.get("/").content.decode()
