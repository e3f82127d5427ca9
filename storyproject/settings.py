"""Storytree settings: one file, every knob read from the environment.

The typed helpers below fail loudly on a bad value instead of guessing, so a
typo in a deployment's environment stops the process at start-up with the
variable's name in the message.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("STORYTREE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def envint(name: str, default: int | None, *, minimum: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def envfloat(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def envsecret(name: str) -> str | None:
    """A secret from NAME, or from the file named by NAME_FILE."""
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from None
    return None


DEBUG = envbool("DEBUG", True)

SECRET_KEY = envsecret("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) is required when DEBUG=0")
    # Development only: a random key kept under var/ so sessions survive restarts.
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(64))
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "stories",
    "checkpoints",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "storyproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "storyproject.wsgi.application"
ASGI_APPLICATION = "storyproject.asgi.application"


def _database_from_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        # sqlite:///relative/path or sqlite:////absolute/path
        name = url.split("sqlite:///", 1)[1] if "sqlite:///" in url else ""
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL {url!r} names no SQLite file")
        return _sqlite(Path(name) if name.startswith("/") else BASE_DIR / name)
    if parsed.scheme in {"postgres", "postgresql", "pgsql"}:
        import dj_database_url

        config = dj_database_url.parse(url, conn_max_age=envint("DB_CONN_MAX_AGE", 0))
        config["ENGINE"] = "django.db.backends.postgresql"
        return config
    raise ImproperlyConfigured(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (sqlite or postgres)")


def _sqlite(path: Path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {
            # WAL lets the web server read while a worker commits a turn.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
            "transaction_mode": "IMMEDIATE",
            "timeout": envint("SQLITE_BUSY_TIMEOUT", 20, minimum=0),
        },
        # A file (not :memory:) so real worker processes can share it; per-process so
        # concurrent test runs on one machine never share one.
        "TEST": {"NAME": path.with_name(f"test_{os.getpid()}_{path.name}")},
    }


DATABASES = {
    "default": _database_from_url(os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'storytree.sqlite3'}"))
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "adventure_list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# --- Security: production (DEBUG=0) passes `manage.py check --deploy` cleanly.
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# No inline script anywhere: every script is a static file. Inline style attributes are allowed.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}
if envbool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Redis and Celery
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0")
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = envint("CELERY_TASK_SOFT_TIME_LIMIT", 600, minimum=1)
CELERY_TASK_TIME_LIMIT = envint("CELERY_TASK_TIME_LIMIT", 660, minimum=1)
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker that dies mid-task gives the message back after this many seconds.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT", 900, minimum=10)}
CELERY_BEAT_SCHEDULE: dict = {}
# The retention pass (docs/retention.md), nightly when enabled; needs `celery -A storyproject beat`.
STORYTREE_PRUNE_NIGHTLY = envbool("STORYTREE_PRUNE_NIGHTLY", False)
if STORYTREE_PRUNE_NIGHTLY:
    from celery.schedules import crontab

    CELERY_BEAT_SCHEDULE["prune-nightly"] = {
        "task": "checkpoints.tasks_retention.prune_all_task",
        "schedule": crontab(hour=3, minute=30),
    }
# Finished turn jobs older than this many days (and not protected) are deleted by the pass.
STORYTREE_JOB_RETENTION_DAYS = envint("STORYTREE_JOB_RETENTION_DAYS", 30, minimum=1)

# --- The default model profile, created on first migrate when none exists.
STORYTREE_DEFAULT_PROVIDER = os.environ.get("STORYTREE_DEFAULT_PROVIDER", "builtin")
if STORYTREE_DEFAULT_PROVIDER not in {"builtin", "openai"}:
    raise ImproperlyConfigured(
        f"STORYTREE_DEFAULT_PROVIDER must be builtin or openai, got {STORYTREE_DEFAULT_PROVIDER!r}"
    )
STORYTREE_DEFAULT_BASE_URL = os.environ.get("STORYTREE_DEFAULT_BASE_URL", "")
STORYTREE_DEFAULT_MODEL = os.environ.get("STORYTREE_DEFAULT_MODEL", "")
STORYTREE_DEFAULT_API_KEY_ENV = os.environ.get("STORYTREE_DEFAULT_API_KEY_ENV", "")
STORYTREE_DEFAULT_CONTEXT_WINDOW = envint("STORYTREE_DEFAULT_CONTEXT_WINDOW", None, minimum=512)
STORYTREE_DEFAULT_MAX_OUTPUT_TOKENS = envint("STORYTREE_DEFAULT_MAX_OUTPUT_TOKENS", None, minimum=16)
# Delay between streamed chunks of the built-in narrator, for demos (0 in tests).
STORYTREE_BUILTIN_CHUNK_DELAY_MS = envint("STORYTREE_BUILTIN_CHUNK_DELAY_MS", 0, minimum=0)

# --- Caps (whole tree, explained to the player as such)
STORYTREE_MAX_NODES_PER_ADVENTURE = envint("STORYTREE_MAX_NODES_PER_ADVENTURE", 50_000, minimum=1)
STORYTREE_MAX_BRANCHES_PER_ADVENTURE = envint("STORYTREE_MAX_BRANCHES_PER_ADVENTURE", 2_000, minimum=1)
STORYTREE_MAX_ATTEMPTS_PER_COORDINATE = envint("STORYTREE_MAX_ATTEMPTS_PER_COORDINATE", 20, minimum=1)
STORYTREE_MAX_INPUT_CHARS = envint("STORYTREE_MAX_INPUT_CHARS", 4_000, minimum=1)
# Per-user rate limits, "COUNT/PERIOD" with PERIOD one of s, min, hour, day.
STORYTREE_TURN_RATE = os.environ.get("STORYTREE_TURN_RATE", "30/min")
STORYTREE_IMPORT_RATE = os.environ.get("STORYTREE_IMPORT_RATE", "20/hour")
# A worker killed mid-turn frees its adventure after this many seconds (heartbeat-renewed lock).
STORYTREE_JOB_LOCK_TTL = envint("STORYTREE_JOB_LOCK_TTL", 15, minimum=1)
STORYTREE_IMPORT_MAX_BYTES = envint("STORYTREE_IMPORT_MAX_BYTES", 50 * 1024 * 1024, minimum=1024)
STORYTREE_IMPORT_MAX_MEMORIES = envint("STORYTREE_IMPORT_MAX_MEMORIES", 20_000, minimum=0)
STORYTREE_IMPORT_MAX_WORLD_ENTRIES = envint("STORYTREE_IMPORT_MAX_WORLD_ENTRIES", 5_000, minimum=0)
STORYTREE_IMPORT_MAX_TEXT_CHARS = envint("STORYTREE_IMPORT_MAX_TEXT_CHARS", 100_000, minimum=100)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # The OpenAI SDK's HTTP client logs every model request at INFO; keep the worker log readable.
    "loggers": {"httpx": {"level": "WARNING"}},
}

# In development the web server serves static files straight from static/.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
