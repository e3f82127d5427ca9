from __future__ import annotations

from django.urls import path

from . import views, views_account, views_play
from .views_bundles import adventure_export, adventure_import
from .views_profiles import profile_list

ADVENTURE = "adventures/<int:adventure_id>/"

urlpatterns = [
    path("", views.adventure_list, name="adventure_list"),
    path("profiles/", profile_list, name="profile_list"),
    path("account/", views_account.account, name="account"),
    path("account/tokens/", views_account.token_create, name="token_create"),
    path("account/tokens/<int:token_id>/revoke/", views_account.token_revoke, name="token_revoke"),
    path("adventures/<int:adventure_id>/export/", adventure_export, name="adventure_export"),
    path("adventures/import/", adventure_import, name="adventure_import"),
    # The adventures page and the play page (stories/views.py, stories/views_play.py).
    path("adventures/new/", views.adventure_create, name="adventure_create"),
    path(f"{ADVENTURE}delete/", views.adventure_delete, name="adventure_delete"),
    path(ADVENTURE, views_play.play, name="play"),
    path(f"{ADVENTURE}turns/", views_play.play_turn, name="play_turn"),
    path(f"{ADVENTURE}jobs/<int:job_id>/", views_play.play_job, name="play_job"),
    path(f"{ADVENTURE}jobs/<int:job_id>/cancel/", views_play.play_job_cancel, name="play_job_cancel"),
    path(f"{ADVENTURE}jobs/<int:job_id>/retry/", views_play.play_job_retry, name="play_job_retry"),
    path(f"{ADVENTURE}undo/", views_play.play_undo, name="play_undo"),
    path(f"{ADVENTURE}redo/", views_play.play_redo, name="play_redo"),
    path(f"{ADVENTURE}nodes/<int:node_id>/switch/", views_play.node_switch, name="node_switch"),
    path(f"{ADVENTURE}nodes/<int:node_id>/fork/", views_play.node_fork, name="node_fork"),
    path(f"{ADVENTURE}nodes/<int:node_id>/rewind/", views_play.node_rewind, name="node_rewind"),
    path(f"{ADVENTURE}nodes/<int:node_id>/edit/", views_play.node_edit, name="node_edit"),
    path(f"{ADVENTURE}branches/<int:branch_id>/switch/", views_play.branch_switch, name="branch_switch"),
    path(f"{ADVENTURE}branches/<int:branch_id>/rename/", views_play.branch_rename, name="branch_rename"),
    path(f"{ADVENTURE}branches/<int:branch_id>/delete/", views_play.branch_delete, name="branch_delete"),
    path(f"{ADVENTURE}memories/", views_play.memory_add, name="memory_add"),
    path(f"{ADVENTURE}memories/<int:memory_id>/pin/", views_play.memory_pin, name="memory_pin"),
    path(f"{ADVENTURE}memories/<int:memory_id>/delete/", views_play.memory_delete, name="memory_delete"),
    path(f"{ADVENTURE}world/", views_play.world_add, name="world_add"),
    path(f"{ADVENTURE}world/<int:entry_id>/edit/", views_play.world_edit, name="world_edit"),
    path(f"{ADVENTURE}world/<int:entry_id>/toggle/", views_play.world_toggle, name="world_toggle"),
]
