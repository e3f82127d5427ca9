"""Import a SillyTavern chat (`.jsonl`) as a plain linear story on one branch.

The file is JSON Lines: an optional first line of chat metadata (`user_name`,
`character_name`, `chat_metadata`, ...), then one object per message with `name`,
`is_user`, `is_system`, `mes` and, for character messages, `swipes` (the
alternative replies) and `swipe_id` (the one shown).

Mapping: the character's greeting is the opening (depth 0); each later character
message is one node whose player input is the user messages before it (joined by a
blank line) and whose narration is the message; a character message with no user
message before it is a `continue`; a trailing user message becomes a node with no
narration yet. Swipes become sibling attempts at that node's coordinate, the
`swipe_id` one live. System messages are skipped.

The chat is converted into a bundle document and goes through the same validation
and writing as any bundle (`stories.bundles.import_document`); faults in the chat
itself are `BundleError`s whose path is `$[i].field`, `i` counting the file's lines
from 0.
"""

from __future__ import annotations

import copy
import json
from pathlib import PurePath
from typing import Any

from .bundles import (
    FORMAT,
    MODEL_NAME_MAX,
    TITLE_MAX,
    VERSION,
    BundleError,
    Caps,
    _check_text,
    import_document,
    parse_json,
)
from .llm.schema import json_type_name
from .models import Adventure, Node
from .tree import INITIAL_STATE

METADATA_KEYS = ("user_name", "character_name", "chat_metadata", "create_date")
MESSAGE_KEYS = ("mes", "is_user")


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line
    return ""


def looks_like_chat(text: str) -> bool:
    """Is the first line a SillyTavern chat header or message?"""
    try:
        first = json.loads(_first_line(text))
    except ValueError:
        return False
    return isinstance(first, dict) and (
        any(key in first for key in METADATA_KEYS) or all(key in first for key in MESSAGE_KEYS)
    )


class _Chat:
    """Builds the bundle document node by node."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self.nodes: list[dict[str, Any]] = []
        self.live_ids: list[int] = []  # the live node's id at each depth
        self.warnings: list[str] = []

    def add(self, *, path: str, kind: str, player_input: str, attempts: list[str], live: int, model: str) -> None:
        depth = len(self.live_ids)
        parent = self.live_ids[-1] if self.live_ids else None
        if len(self.nodes) + len(attempts) > self.caps.nodes:
            raise BundleError(413, path, f"the chat holds more than {self.caps.nodes:,} turns and swipes")
        live_id = 0
        for position, narration in enumerate(attempts):
            node_id = len(self.nodes) + 1
            if position == live:
                live_id = node_id
            self.nodes.append(
                {
                    "id": node_id,
                    "branch": 1,
                    "depth": depth,
                    "parent": parent,
                    "live": position == live,
                    "kind": kind,
                    "input": player_input,
                    "narration": narration,
                    "suggestions": [],
                    "delta": [],
                    "state_after": copy.deepcopy(INITIAL_STATE),
                    "checks": [],
                    "regenerated_from": None,
                    "model_name": model,
                    "created_at": None,
                }
            )
        self.live_ids.append(live_id)


def _message_text(message: dict, key: str, path: str, caps: Caps) -> str:
    value = message.get(key, "")
    if not isinstance(value, str):
        raise BundleError(400, f"{path}.{key}", f"must be a string, got {json_type_name(value)}")
    return _check_text(value, f"{path}.{key}", caps.text_chars)


def _flag(message: dict, key: str, path: str) -> bool:
    value = message.get(key, False)
    if not isinstance(value, bool):
        raise BundleError(400, f"{path}.{key}", f"must be true or false, got {json_type_name(value)}")
    return value


def _attempts(message: dict, path: str, caps: Caps, warnings: list[str]) -> tuple[list[str], int]:
    """The alternative replies and which one is live. `mes` is what the chat showed, so it is
    the live text even where it differs from its swipe (an edited reply)."""
    shown = _message_text(message, "mes", path, caps)
    swipes = message.get("swipes")
    if swipes is None or swipes == []:
        return [shown], 0
    if not isinstance(swipes, list):
        raise BundleError(400, f"{path}.swipes", f"must be a list, got {json_type_name(swipes)}")
    for index, swipe in enumerate(swipes):
        if not isinstance(swipe, str):
            raise BundleError(400, f"{path}.swipes[{index}]", f"must be a string, got {json_type_name(swipe)}")
        _check_text(swipe, f"{path}.swipes[{index}]", caps.text_chars)
    texts = list(swipes)
    chosen = message.get("swipe_id")
    if isinstance(chosen, int) and not isinstance(chosen, bool) and 0 <= chosen < len(texts):
        texts[chosen] = shown
    else:
        warnings.append(f"{path}.swipe_id: {chosen!r} names no swipe; the message's text is the live attempt")
        if shown in texts:
            chosen = texts.index(shown)
        else:
            texts.append(shown)
            chosen = len(texts) - 1
    if len(texts) > caps.attempts:
        # Keep the live reply and the first others up to the per-turn cap.
        others = [index for index in range(len(texts)) if index != chosen][: caps.attempts - 1]
        keep = sorted([chosen, *others])
        warnings.append(
            f"{path}.swipes: {len(texts)} swipes; only {caps.attempts} attempts per turn are kept "
            f"({len(texts) - len(keep)} dropped, the shown one kept)"
        )
        chosen = keep.index(chosen)
        texts = [texts[index] for index in keep]
    return texts, chosen


def _joined(pending: list[str], path: str, caps: Caps) -> str:
    """The user messages before a reply, as one player input (a blank line between them)."""
    joined = "\n\n".join(pending)
    if len(joined) > caps.text_chars:
        raise BundleError(
            400,
            path,
            f"the user messages before this one are {len(joined):,} characters together; "
            f"at most {caps.text_chars:,} are allowed in one turn",
        )
    return joined


def _model_name(message: dict) -> str:
    extra = message.get("extra")
    model = extra.get("model") if isinstance(extra, dict) else None
    return model[:MODEL_NAME_MAX] if isinstance(model, str) else ""


def _parse_lines(text: str) -> list[tuple[int, Any]]:
    """(0-based line index, value) for every non-blank line."""
    values = []
    for index, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            values.append((index, parse_json(line)))
        except BundleError as error:
            raise BundleError(400, f"$[{index}]", f"line {index + 1}: {error.reason}") from None
    if not values:
        raise BundleError(400, "$", "the chat file is empty")
    return values


def _title(filename: str | None, metadata: dict) -> str:
    stem = PurePath(filename).stem.strip() if filename else ""
    character = metadata.get("character_name")
    if stem:
        title = stem
    elif isinstance(character, str) and character.strip():
        title = f"Chat with {character.strip()}"
    else:
        title = "Imported chat"
    return title[:TITLE_MAX]


def chat_document(text: str, *, filename: str | None = None, caps: Caps | None = None) -> tuple[dict, list[str]]:
    """The chat as a bundle document, and the warnings converting it produced."""
    caps = caps or Caps.from_settings()
    lines = _parse_lines(text)
    metadata: dict = {}
    if isinstance(lines[0][1], dict) and "mes" not in lines[0][1]:
        metadata = lines[0][1]
        lines = lines[1:]
    chat = _Chat(caps)
    pending: list[str] = []
    for index, message in lines:
        path = f"$[{index}]"
        if not isinstance(message, dict):
            raise BundleError(
                400, path, f"line {index + 1}: a message must be an object, got {json_type_name(message)}"
            )
        if "mes" not in message:
            raise BundleError(400, f"{path}.mes", f"line {index + 1}: a message needs its text (mes)")
        if _flag(message, "is_system", path):
            continue
        if _flag(message, "is_user", path):
            pending.append(_message_text(message, "mes", path, caps))
            continue
        attempts, live = _attempts(message, path, caps, chat.warnings)
        if not chat.live_ids:
            if pending:  # the user spoke first: an empty opening, then their words
                chat.add(path=path, kind=Node.Kind.OPENING, player_input="", attempts=[""], live=0, model="")
            else:
                chat.add(path=path, kind=Node.Kind.OPENING, player_input="", attempts=attempts, live=live, model="")
                continue
        kind = Node.Kind.STORY if pending else Node.Kind.CONTINUE
        joined = _joined(pending, path, caps)
        chat.add(path=path, kind=kind, player_input=joined, attempts=attempts, live=live, model=_model_name(message))
        pending = []
    if not chat.live_ids:
        chat.add(path="$", kind=Node.Kind.OPENING, player_input="", attempts=[""], live=0, model="")
    if pending:
        end = f"$[{lines[-1][0]}]"
        chat.add(
            path=end, kind=Node.Kind.STORY, player_input=_joined(pending, end, caps), attempts=[""], live=0, model=""
        )

    user_name = metadata.get("user_name")
    opening = next(node for node in chat.nodes if node["depth"] == 0 and node["live"])
    document = {
        "format": FORMAT,
        "version": VERSION,
        "adventure": {
            "title": _title(filename, metadata),
            "premise": opening["narration"],
            "persona": user_name.strip()[:TITLE_MAX] if isinstance(user_name, str) else "",
            "style": "",
            "world_scan_depth": 4,
            "model_profile": None,
        },
        "branches": [{"id": 1, "parent": None, "fork_depth": 0, "name": ""}],
        "nodes": chat.nodes,
        "memories": [],
        "world_entries": [],
        "head": chat.live_ids[-1],
    }
    return document, chat.warnings


def import_chat(text: str, *, owner, filename: str | None = None) -> Adventure:
    """Import a SillyTavern chat as a new adventure of `owner` (one branch)."""
    document, warnings = chat_document(text, filename=filename)
    return import_document(document, owner=owner, warnings=warnings)
