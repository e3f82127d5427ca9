"""Bench-only models: the trees a Django developer would pick instead of ours.

Installed only by `bench/settings.py`; the product's INSTALLED_APPS never names this app.
Each model lives in its own SQLite file (see `routers.ContenderRouter`).
"""
