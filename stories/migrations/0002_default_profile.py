"""A fresh install gets one default model profile, from the STORYTREE_DEFAULT_* settings
(the built-in offline narrator unless configured otherwise)."""

from django.conf import settings
from django.db import migrations


def create_default_profile(apps, schema_editor):
    ModelProfile = apps.get_model("stories", "ModelProfile")
    if ModelProfile.objects.exists():
        return
    provider = settings.STORYTREE_DEFAULT_PROVIDER
    ModelProfile.objects.create(
        name="Offline narrator" if provider == "builtin" else (settings.STORYTREE_DEFAULT_MODEL or "Default model"),
        provider=provider,
        base_url=settings.STORYTREE_DEFAULT_BASE_URL,
        model_name=settings.STORYTREE_DEFAULT_MODEL or ("storytree-builtin" if provider == "builtin" else ""),
        api_key_env=settings.STORYTREE_DEFAULT_API_KEY_ENV,
        context_window=settings.STORYTREE_DEFAULT_CONTEXT_WINDOW,
        max_output_tokens=settings.STORYTREE_DEFAULT_MAX_OUTPUT_TOKENS,
        is_default=True,
    )


class Migration(migrations.Migration):
    dependencies = [("stories", "0001_initial")]
    operations = [migrations.RunPython(create_default_profile, migrations.RunPython.noop)]
