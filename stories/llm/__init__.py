"""The model layer: one interface (`base.ModelClient`) over the offline narrator and any
OpenAI-compatible server.

Import from the submodules (`stories.llm.base`, `.errors`, `.tools`); this package module
stays empty so importing `stories.llm.errors` never drags in the SDK or the ORM.
"""
