"""Security headers: a CSP that allows no inline script, and production cookie settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.django_db


def test_every_page_carries_a_csp_without_inline_script(client, user):
    client.force_login(user)
    for url in ["/", "/accounts/login/", "/account/", "/profiles/"]:
        response = client.get(url)
        policy = response["Content-Security-Policy"]
        directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
        assert directives["script-src"] == "'self'", url
        assert "unsafe-inline" not in directives["script-src"]
        assert directives["frame-ancestors"] == "'none'"


def test_templates_hold_no_inline_script():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "templates"
    for template in root.rglob("*.html"):
        text = template.read_text()
        for line in text.splitlines():
            stripped = line.strip().lower()
            if "<script" in stripped:
                assert " src=" in stripped or 'type="application/json"' in stripped, f"{template}: {line}"
            assert " onclick=" not in stripped and " hx-on" not in stripped, f"{template}: {line}"


def test_production_settings_pass_the_deploy_check():
    env = {**os.environ, "DEBUG": "0", "SECRET_KEY": "x" * 60 + "A1b2C3d4", "ALLOWED_HOSTS": "story.example.com"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        capture_output=True, text=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key():
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "SECRET_KEY_FILE"}}
    env["DEBUG"] = "0"
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], capture_output=True, text=True, env=env,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )  # fmt: skip
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_a_bad_setting_value_fails_loudly():
    env = {**os.environ, "STORYTREE_MAX_INPUT_CHARS": "lots"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], capture_output=True, text=True, env=env,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )  # fmt: skip
    assert result.returncode != 0
    assert "STORYTREE_MAX_INPUT_CHARS must be an integer" in result.stderr
