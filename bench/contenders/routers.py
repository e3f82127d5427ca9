"""Each contender in its own SQLite file. The adjacency models serve two contenders
(`adjacency` and `cte`): their default is `adjacency`, and the CTE contender names its
database explicitly (`.using("cte")` / `connections["cte"]`)."""

from __future__ import annotations

CONTENDER_ALIASES = ("adjacency", "cte", "treebeard", "mptt")
_HOME = {
    "adjnode": "adjacency",
    "adjcheckpoint": "adjacency",
    "tbnode": "treebeard",
    "tbcheckpoint": "treebeard",
    "mpnode": "mptt",
    "mpcheckpoint": "mptt",
}


class ContenderRouter:
    def _home(self, model, hints):
        if model._meta.app_label != "contenders":
            return None
        instance = hints.get("instance")
        if instance is not None and instance._state.db:
            return instance._state.db
        return _HOME[model._meta.model_name]

    def db_for_read(self, model, **hints):
        return self._home(model, hints)

    def db_for_write(self, model, **hints):
        return self._home(model, hints)

    def allow_relation(self, obj1, obj2, **hints):
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if db in CONTENDER_ALIASES:
            return app_label == "contenders"
        if app_label == "contenders":
            return False
        return None
