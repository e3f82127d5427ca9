from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_signup_creates_a_user_and_logs_them_in(client):
    response = client.post(
        reverse("signup"),
        {"username": "newplayer", "password1": "a sturdy passphrase 42", "password2": "a sturdy passphrase 42"},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("adventure_list")
    assert get_user_model().objects.filter(username="newplayer").exists()
    assert client.get(reverse("adventure_list")).status_code == 200


def test_signup_rejects_mismatched_passwords(client):
    response = client.post(
        reverse("signup"), {"username": "x", "password1": "a sturdy passphrase 42", "password2": "different 42 words"}
    )
    assert response.status_code == 400
    assert not get_user_model().objects.filter(username="x").exists()


def test_login_and_logout(client, user):
    response = client.post(reverse("login"), {"username": "alice", "password": "correct horse battery"})
    assert response.status_code == 302
    assert client.get(reverse("adventure_list")).status_code == 200
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    response = client.get(reverse("adventure_list"))
    assert response.status_code == 302


def test_wrong_password_is_refused(client, user):
    response = client.post(reverse("login"), {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert "_auth_user_id" not in client.session


def test_anonymous_user_is_redirected_to_login(client):
    response = client.get(reverse("adventure_list"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
