"""Canonical JSON and the two checkpoint hashes. The model never supplies a hash.

- `stable_prefix_hash`: SHA-256 of the exact canonical stable-prefix encoding (the system
  message content `prompt.py` sends), so it changes exactly when the premise, persona,
  style, bound world-book provenance or a version/safety field changes.
- `source_hash`: SHA-256 over the checkpoint and prompt schema versions, the stable prefix
  hash, the adventure id and the ordered root-to-covered sequence of (node id, parent id,
  player input, narration). Nothing else: never suggestions, deltas, checks, state, world
  entries, provider bodies or credentials.
- `summary_digest`: binds a stored summary to its source hash, so an edited summary is a
  cache miss like an edited hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Protocol


class _NodeLike(Protocol):
    pk: Any
    parent_id: Any
    player_input: str
    narration: str


def canonical_json(value: Any) -> str:
    """The one canonical encoding: sorted keys, no whitespace, UTF-8 text (not \\u escapes),
    no NaN. Prompt message contents use it too, so bytes on the wire are deterministic."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256_hex(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def stable_prefix_hash(stable_prefix_encoding: str) -> str:
    """Hash of the exact stable-prefix encoding (a `canonical_json` string)."""
    return sha256_hex(stable_prefix_encoding)


class SourceHasher:
    """Streaming `source_hash`: feed nodes root first, then `hexdigest()`.

    Streaming keeps a 50,000-node path from being materialised as one list just to hash it.
    Each record is one canonical JSON line, so no two different sequences share an encoding.
    """

    def __init__(
        self, *, checkpoint_schema_version: int, prompt_schema_version: int, stable_prefix_hash: str, adventure_id: int
    ) -> None:
        self._hash = hashlib.sha256()
        self._count = 0
        header = {
            "checkpoint_schema_version": checkpoint_schema_version,
            "prompt_schema_version": prompt_schema_version,
            "stable_prefix_hash": stable_prefix_hash,
            "adventure_id": adventure_id,
        }
        self._hash.update(canonical_json({"source": header}).encode("utf-8") + b"\n")

    def add(self, node: _NodeLike) -> None:
        record = [node.pk, node.parent_id, node.player_input, node.narration]
        self._hash.update(canonical_json(record).encode("utf-8") + b"\n")
        self._count += 1

    def add_all(self, nodes: Iterable[_NodeLike]) -> SourceHasher:
        for node in nodes:
            self.add(node)
        return self

    @property
    def count(self) -> int:
        return self._count

    def hexdigest(self) -> str:
        # Bind the count too: a prefix of the sequence never hashes like the whole.
        final = self._hash.copy()
        final.update(canonical_json({"nodes": self._count}).encode("utf-8"))
        return final.hexdigest()


def source_hash(
    *,
    checkpoint_schema_version: int,
    prompt_schema_version: int,
    stable_prefix_hash: str,
    adventure_id: int,
    nodes: Iterable[_NodeLike],
) -> str:
    """`source_hash` of an ordered root-to-covered node sequence."""
    return (
        SourceHasher(
            checkpoint_schema_version=checkpoint_schema_version,
            prompt_schema_version=prompt_schema_version,
            stable_prefix_hash=stable_prefix_hash,
            adventure_id=adventure_id,
        )
        .add_all(nodes)
        .hexdigest()
    )


def summary_digest(*, summary: str, key_points: list[str], classification: str, source_hash: str) -> str:
    """Binds a stored summary to the source it summarizes (set by the runtime, checked on read)."""
    return sha256_hex(
        canonical_json(
            {"classification": classification, "key_points": key_points, "summary": summary, "source_hash": source_hash}
        )
    )
