"""Which world-book entries and memories reach this turn's prompt.

Only entries triggered this turn reach the model: always-on entries first,
then entries whose keys appear in the current input or in the newest few
nodes of the path (the adventure's scan depth), by priority. Budgeting them
against the prompt is the context layer's job; this module only selects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .models import Adventure, Memory, Node, WorldEntry

WORD = re.compile(r"[\w']+", re.UNICODE)


def _key_pattern(key: str) -> re.Pattern[str] | None:
    key = key.strip()
    if not key:
        return None
    # Whole-word, case-insensitive: "Maren" triggers on "maren's" but not on "Marenko".
    return re.compile(rf"(?<![\w]){re.escape(key)}(?![\w])", re.IGNORECASE)


def triggered_entries(adventure: Adventure, *, input_text: str, recent_nodes: Iterable[Node]) -> list[WorldEntry]:
    """Enabled entries that are always on or whose keys occur in the input or the recent nodes."""
    haystack = "\n".join([input_text, *(f"{n.player_input}\n{n.narration}" for n in recent_nodes)])
    chosen = []
    for entry in WorldEntry.objects.filter(adventure=adventure, enabled=True):
        if entry.always_on:
            chosen.append(entry)
            continue
        for key in entry.keys or []:
            pattern = _key_pattern(str(key))
            if pattern and pattern.search(haystack):
                chosen.append(entry)
                break
    chosen.sort(key=lambda e: (not e.always_on, -e.priority, e.pk))
    return chosen


def relevant_memories(memories: Iterable[Memory], *, input_text: str, limit: int = 8) -> list[Memory]:
    """Pinned memories first, then the ones sharing the most words with the input (plain lexical scoring)."""
    words = {w.lower() for w in WORD.findall(input_text) if len(w) > 2}
    pinned, scored = [], []
    for memory in memories:
        if memory.pinned:
            pinned.append(memory)
            continue
        overlap = len(words & {w.lower() for w in WORD.findall(memory.text)})
        if overlap:
            scored.append((overlap, memory.depth, memory.pk, memory))
    scored.sort(key=lambda item: (-item[0], -item[1], -item[2]))
    return (pinned + [item[3] for item in scored])[: max(limit, len(pinned))]


# --- The rules for a world entry's trigger words (the page form and the API both use them) ---

MAX_KEYS = 20
MAX_KEY_CHARS = 100


class InvalidEntry(ValueError):
    """A world entry the player must fix; the message says how."""


def clean_keys(keys: Iterable[str]) -> list[str]:
    cleaned = [str(key).strip() for key in keys if str(key).strip()]
    if len(cleaned) > MAX_KEYS:
        raise InvalidEntry(f"At most {MAX_KEYS} trigger words.")
    if any(len(key) > MAX_KEY_CHARS for key in cleaned):
        raise InvalidEntry(f"Each trigger word can be at most {MAX_KEY_CHARS} characters.")
    return cleaned


def check_entry(*, keys: list[str], always_on: bool) -> None:
    if not keys and not always_on:
        raise InvalidEntry("Give at least one trigger word, or mark the entry always on.")
