from __future__ import annotations

from django.urls import path

from . import views, views_account
from .views_bundles import adventure_export, adventure_import
from .views_profiles import profile_list

urlpatterns = [
    path("", views.adventure_list, name="adventure_list"),
    path("profiles/", profile_list, name="profile_list"),
    path("account/", views_account.account, name="account"),
    path("account/tokens/", views_account.token_create, name="token_create"),
    path("account/tokens/<int:token_id>/revoke/", views_account.token_revoke, name="token_revoke"),
    path("adventures/<int:adventure_id>/export/", adventure_export, name="adventure_export"),
    path("adventures/import/", adventure_import, name="adventure_import"),
]
