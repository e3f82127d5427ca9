from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_sign_up_in_chromium_and_htmx_is_loaded(live_server, page):
    page.goto(f"{live_server.url}/accounts/signup/")
    page.fill("#id_username", "browserplayer")
    page.fill("#id_password1", "a sturdy passphrase 42")
    page.fill("#id_password2", "a sturdy passphrase 42")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator("h1").inner_text() == "My adventures"
    page.wait_for_function("() => window.htmx !== undefined")
    assert page.evaluate("() => typeof window.htmx.ajax") == "function"
