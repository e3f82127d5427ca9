"""`manage.py model_profile add|list`."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from stories.models import ModelProfile

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("model_profile", *args, stdout=out)
    return out.getvalue()


LLAMA = ["add", "--name", "Local llama", "--provider", "openai", "--base-url", "http://127.0.0.1:8080/v1"]


def test_it_adds_an_openai_profile_and_prints_its_id():
    out = run(
        *LLAMA, "--model", "qwen2.5-7b-instruct", "--api-key-env", "LLAMA_KEY", "--context-window", "8192",
        "--max-output-tokens", "1024", "--temperature", "0.6", "--timeout", "90", "--no-tools",
    )  # fmt: skip
    profile = ModelProfile.objects.get(pk=int(out.strip()))
    assert out.strip() == str(profile.pk)
    assert (profile.name, profile.provider, profile.base_url, profile.model_name) == (
        "Local llama", "openai", "http://127.0.0.1:8080/v1", "qwen2.5-7b-instruct",
    )  # fmt: skip
    assert profile.api_key_env == "LLAMA_KEY"
    assert (profile.context_window, profile.max_output_tokens) == (8192, 1024)
    assert (profile.temperature, profile.timeout_seconds) == (0.6, 90.0)
    assert profile.supports_tools is False
    assert profile.is_default is False


def test_it_adds_a_builtin_profile():
    pk = int(run("add", "--name", "Offline 2", "--provider", "builtin"))
    profile = ModelProfile.objects.get(pk=pk)
    assert profile.is_builtin and profile.context_window is None and profile.supports_tools


def test_default_moves_to_the_new_profile():
    old = ModelProfile.objects.get(is_default=True)  # the profile created on first migrate
    pk = int(run(*LLAMA, "--model", "m", "--default"))
    old.refresh_from_db()
    assert old.is_default is False
    assert list(ModelProfile.objects.filter(is_default=True).values_list("pk", flat=True)) == [pk]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "--name", "x", "--provider", "openai", "--model", "m"], "needs --base-url"),
        (["add", "--name", "x", "--provider", "openai", "--base-url", "http://127.0.0.1:8080/v1"], "needs --model"),
        (["add", "--name", "x", "--provider", "openai"], "needs --base-url and --model"),
        (["add", "--name", "x", "--provider", "openai", "--base-url", "localhost:8080", "--model", "m"], "not an http"),
        (["add", "--name", "x", "--provider", "builtin", "--model", "m"], "builtin profile needs no"),
        ([*LLAMA, "--model", "m", "--api-key-env", "sk-abc123-secret"], "NAME of an environment variable"),
        ([*LLAMA, "--model", "m", "--context-window", "100"], "at least 512"),
        ([*LLAMA, "--model", "m", "--max-output-tokens", "4"], "at least 16"),
        ([*LLAMA, "--model", "m", "--context-window", "2048", "--max-output-tokens", "2048"], "smaller than"),
        ([*LLAMA, "--model", "m", "--temperature", "3"], "between 0 and 2"),
        ([*LLAMA, "--model", "m", "--timeout", "0"], "positive"),
        (["add", "--name", "Offline narrator", "--provider", "builtin"], "already exists"),
    ],
)
def test_it_refuses_bad_input_clearly(args, message):
    before = ModelProfile.objects.count()
    with pytest.raises(CommandError, match=message) as caught:
        run(*args)
    assert "sk-abc123-secret" not in str(caught.value)
    assert ModelProfile.objects.count() == before


def test_a_refused_default_leaves_the_old_default(monkeypatch):
    old = ModelProfile.objects.get(is_default=True)
    with pytest.raises(CommandError):
        run("add", "--name", "x", "--provider", "openai", "--default")
    old.refresh_from_db()
    assert old.is_default


def test_list_shows_limits_and_key_variables_but_never_keys(monkeypatch):
    monkeypatch.setenv("LLAMA_KEY", "sk-canary-list-0001")
    monkeypatch.delenv("OLLAMA_KEY", raising=False)
    run(*LLAMA, "--model", "qwen", "--api-key-env", "LLAMA_KEY", "--context-window", "8192")
    run(
        "add", "--name", "Ollama", "--provider", "openai", "--base-url", "http://127.0.0.1:11434/v1",
        "--model", "llama3.1:8b", "--api-key-env", "OLLAMA_KEY", "--max-output-tokens", "9000",
    )  # fmt: skip
    out = run("list")
    assert "sk-canary-list-0001" not in out
    lines = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert "8192" in lines["Local"] and "(assumed)" not in lines["Local"]
    assert "LLAMA_KEY (set)" in lines["Local"]
    assert "16384 (assumed)" in lines["Ollama"] and "OLLAMA_KEY (NOT SET)" in lines["Ollama"]
    assert "4096" in lines["Ollama"]  # requested output is capped at 4096
    assert "yes" in lines["Offline"]  # the default
