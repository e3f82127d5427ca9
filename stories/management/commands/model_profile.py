"""Create and list model profiles.

    manage.py model_profile add --name NAME --provider openai|builtin [--base-url URL] [--model MODEL]
        [--api-key-env VAR] [--context-window N] [--max-output-tokens N] [--temperature F]
        [--timeout S] [--no-tools] [--default]
    manage.py model_profile list

`add` prints only the new profile's id, so scripts can capture it. The API key itself is
never given to this command, stored or printed: only the NAME of the variable holding it.
"""

from __future__ import annotations

import os
import re

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import URLValidator
from django.db import transaction

from stories.llm.base import effective_limits
from stories.models import ModelProfile

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MIN_CONTEXT_WINDOW = 512
MIN_OUTPUT_TOKENS = 16


class Command(BaseCommand):
    help = "Create (add) or list model profiles."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{add,list}")
        add = actions.add_parser("add", help="Create a profile and print its id.")
        add.add_argument("--name", required=True)
        add.add_argument("--provider", required=True, choices=[c.value for c in ModelProfile.Provider])
        add.add_argument("--base-url", default="", help="e.g. http://127.0.0.1:8080/v1 (openai only)")
        add.add_argument("--model", default="", help="the model name the server knows (openai only)")
        add.add_argument("--api-key-env", default="", help="NAME of the environment variable holding the key")
        add.add_argument("--context-window", type=int, help="tokens; unknown if omitted (16,384 assumed)")
        add.add_argument("--max-output-tokens", type=int, help="tokens; unknown if omitted")
        add.add_argument("--temperature", type=float, default=0.8)
        add.add_argument("--timeout", type=float, default=60.0, help="seconds without a byte before giving up")
        add.add_argument("--no-tools", action="store_true", help="the server cannot call tools: use JSON output")
        add.add_argument("--default", action="store_true", help="make it the default for new adventures")
        actions.add_parser("list", help="List profiles (never keys).")

    def handle(self, *args, **options) -> None:
        if options["action"] == "add":
            self.add(options)
        else:
            self.list()

    def add(self, options: dict) -> None:
        name = options["name"].strip()
        provider = options["provider"]
        base_url = options["base_url"].strip()
        model = options["model"].strip()
        key_env = options["api_key_env"].strip()
        if not name:
            raise CommandError("--name must not be empty.")
        if ModelProfile.objects.filter(name=name).exists():
            raise CommandError(f"A profile named {name!r} already exists.")
        if provider == ModelProfile.Provider.OPENAI:
            missing = [flag for flag, value in (("--base-url", base_url), ("--model", model)) if not value]
            if missing:
                raise CommandError(f"An openai profile needs {' and '.join(missing)}.")
            try:
                URLValidator(schemes=["http", "https"])(base_url)
            except ValidationError:
                raise CommandError(
                    f"--base-url {base_url!r} is not an http(s) URL, e.g. http://127.0.0.1:8080/v1."
                ) from None
        elif base_url or model or key_env:
            raise CommandError("A builtin profile needs no --base-url, --model or --api-key-env.")
        if key_env and not ENV_NAME.match(key_env):
            # Most likely the key itself was pasted: refuse without echoing it.
            raise CommandError(
                "--api-key-env takes the NAME of an environment variable (letters, digits, underscores), "
                "not the key itself."
            )
        window, output = options["context_window"], options["max_output_tokens"]
        if window is not None and window < MIN_CONTEXT_WINDOW:
            raise CommandError(f"--context-window must be at least {MIN_CONTEXT_WINDOW} tokens.")
        if output is not None and output < MIN_OUTPUT_TOKENS:
            raise CommandError(f"--max-output-tokens must be at least {MIN_OUTPUT_TOKENS} tokens.")
        if window is not None and output is not None and output >= window:
            raise CommandError("--max-output-tokens must be smaller than --context-window.")
        if not 0 <= options["temperature"] <= 2:
            raise CommandError("--temperature must be between 0 and 2.")
        if not options["timeout"] > 0:
            raise CommandError("--timeout must be a positive number of seconds.")

        with transaction.atomic():
            if options["default"]:
                ModelProfile.objects.filter(is_default=True).update(is_default=False)
            profile = ModelProfile.objects.create(
                name=name,
                provider=provider,
                base_url=base_url,
                model_name=model,
                api_key_env=key_env,
                context_window=window,
                max_output_tokens=output,
                temperature=options["temperature"],
                timeout_seconds=options["timeout"],
                supports_tools=not options["no_tools"],
                is_default=options["default"],
            )
        self.stdout.write(str(profile.pk))

    def list(self) -> None:
        rows = [("id", "name", "provider", "model", "context window", "output", "api key variable", "default")]
        for profile in ModelProfile.objects.order_by("pk"):
            window, assumed, output = effective_limits(profile)
            if profile.api_key_env:
                is_set = "set" if os.environ.get(profile.api_key_env) else "NOT SET"
                key = f"{profile.api_key_env} ({is_set})"
            else:
                key = "-"
            rows.append(
                (
                    str(profile.pk),
                    profile.name,
                    profile.provider + ("" if profile.supports_tools or profile.is_builtin else " (no tools)"),
                    profile.model_name or "-",
                    f"{window}" + (" (assumed)" if assumed else ""),
                    str(output),
                    key,
                    "yes" if profile.is_default else "",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
