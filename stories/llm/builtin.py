"""The offline narrator: no weights, no network, same tools and schemas as a real model.

It reads the request the prompt encoder writes:

- the FIRST system message's content is JSON with `"stable_prefix"`:
  `{"premise", "persona", "style", ...}`;
- the LAST user message's content is JSON with either `"dynamic_tail"`:
  `{"input": {"kind": do|say|story|continue, "text"}, "world_entries": [{"keys", "content"}],
  "memories": [str], "state": <player projection>, "fixed_outcomes": [...] | null}`
  or `"summary_request"`: `{"previous_summary", "nodes": [{"depth", "input", "narration"}],
  "max_chars"}`. Content that is not JSON is taken as the player's own words;
- a `tool` message after it is a check result: `{"outcome": "success"|"partial"|"failure"}`.

It asks for a check (`request_check`, only when offered and not yet asked this action) when
the action reads as a risky attempt, otherwise narrates through `submit_turn_plan` using the
player's words, the persona and the triggered world entries; it answers a summary request
with an extractive summary of the public text it was given. Output is a pure function of the
request and the seed (a hash of the request when no seed is given). The narration streams
through `on_text` in several pieces, `STORYTREE_BUILTIN_CHUNK_DELAY_MS` apart.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings

from stories.state import validate_delta

from .base import ChatResult, ToolCall
from .errors import ModelCancelled, ModelMalformed
from .tools import (
    MAX_KEY_POINT_CHARS,
    MAX_KEY_POINTS,
    MAX_NARRATION_CHARS,
    MAX_SUGGESTION_CHARS,
    MAX_SUMMARY_CHARS,
    REQUEST_CHECK,
    SUBMIT_CONTEXT_SUMMARY,
    SUBMIT_TURN_PLAN,
    ToolSpec,
    validate_arguments,
)

if TYPE_CHECKING:
    from stories.models import ModelProfile

MODEL_NAME = "builtin"

# Words that make an action a risky attempt, and the skill each one tests.
RISKY_ACTIONS: tuple[tuple[str, str], ...] = (
    (r"climb|scal(e|ing)\b|jump|leap|swim|vault", "athletics"),
    (r"sneak|creep|hide\b|hiding|tiptoe", "stealth"),
    (r"pick(s|ed|ing)?\b(?!\s+up)|lockpick|steal|stole|pickpocket|pilfer", "sleight of hand"),
    (r"fight|fought|attack|strike|struck|stab|punch|kick|duel|wrestl", "combat"),
    (r"persuad|convinc|bribe|negotiat|charm", "persuasion"),
    (r"\blie\b(?!\s+down)|lying to|bluff|deceiv|trick", "deception"),
    (r"force (open|the)|break (down|open|through)|smash|lift the", "strength"),
)
_RISKY = [(re.compile(r"\b(?:" + pattern + ")", re.IGNORECASE), skill) for pattern, skill in RISKY_ACTIONS]

OUTCOME_LINES = {
    "success": (
        "It works, cleaner than you dared hope.",
        "For once everything goes your way.",
        "You pull it off, and the moment bends in your favour.",
    ),
    "partial": (
        "It half works: you get what you wanted, but not without a cost.",
        "You manage it, barely, and something slips out of place.",
        "It is not pretty, but it is done, more or less.",
    ),
    "failure": (
        "It goes wrong almost at once.",
        "Your luck runs out, and the attempt falls apart.",
        "It fails, and the failure makes a noise of its own.",
    ),
}
CONTINUE_LINES = (
    "The moment stretches, and the world moves on without waiting for you.",
    "Time passes. Small sounds fill the quiet.",
    "The scene shifts a little, as scenes do.",
)
CLOSING_LINES = (
    "The air grows still, as if the place is waiting for your next move.",
    "Somewhere nearby, something shifts, and you are not sure it was the wind.",
    "For a heartbeat nothing happens. Then the world takes a breath.",
    "The path ahead is quiet, but not empty.",
    "You have the feeling this is not the end of it.",
)
SUGGESTIONS = ("Look around", "Wait and listen", "Search the area", "Go back the way you came", "Press on")

_FIRST_PERSON = {
    "i": "you",
    "me": "you",
    "my": "your",
    "mine": "yours",
    "myself": "yourself",
    "i'm": "you're",
    "i've": "you've",
    "i'll": "you'll",
    "i'd": "you'd",
}
_TAKE = re.compile(
    r"\b(?:take|pick up|grab|pocket|collect)\s+(?:the |a |an |some )?([\w' -]{2,60}?)\s*(?:[.,!;]|$)", re.I
)
_DROP = re.compile(
    r"\b(?:drop|give away|throw away|discard)\s+(?:the |a |an |my )?([\w' -]{2,60}?)\s*(?:[.,!;]|$)", re.I
)


class BuiltinNarrator:
    def __init__(self, profile: ModelProfile | None = None, *, chunk_delay_ms: int | None = None) -> None:
        self.profile = profile
        self.chunk_delay_ms = chunk_delay_ms

    def chat(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[ToolSpec],
        max_output_tokens: int,
        max_tool_calls: int = 1,
        cancel: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
        seed: int | None = None,
    ) -> ChatResult:
        if cancel and cancel():
            raise ModelCancelled()
        offered = {spec.name: spec for spec in tools}
        prompt_bytes = len(
            json.dumps(
                {"messages": messages, "tools": [[s.name, s.description, s.parameters] for s in tools]},
                ensure_ascii=False,
            ).encode()
        )
        if seed is None:
            seed = int.from_bytes(
                hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).digest()[:8], "big"
            )
        rng = random.Random(seed)
        request = _read_request(messages)

        if "summary_request" in request or set(offered) == {SUBMIT_CONTEXT_SUMMARY.name}:
            if SUBMIT_CONTEXT_SUMMARY.name not in offered:
                raise ModelMalformed("a summary was requested but submit_context_summary was not offered")
            call = ToolCall(SUBMIT_CONTEXT_SUMMARY.name, _summary(request.get("summary_request"), messages))
            return self._result(call, SUBMIT_CONTEXT_SUMMARY, prompt_bytes)

        turn = _Turn(messages, request)
        skill = turn.risky_skill()
        if REQUEST_CHECK.name in offered and skill and turn.outcome is None and not turn.check_asked:
            call = ToolCall(REQUEST_CHECK.name, _check_arguments(rng, skill, turn.text))
            return self._result(call, REQUEST_CHECK, prompt_bytes)
        if SUBMIT_TURN_PLAN.name not in offered:
            raise ModelMalformed("no tool the offline narrator can answer with was offered")
        plan = _turn_plan(rng, turn, skill)
        self._stream(plan["narration"], rng, cancel, on_text)
        return self._result(ToolCall(SUBMIT_TURN_PLAN.name, plan), SUBMIT_TURN_PLAN, prompt_bytes)

    def _result(self, call: ToolCall, spec: ToolSpec, prompt_bytes: int) -> ChatResult:
        validate_arguments(spec, call.arguments)  # the narrator is held to the same schema
        return ChatResult(tool_calls=[call], model=MODEL_NAME, prompt_bytes=prompt_bytes)

    def _stream(
        self, text: str, rng: random.Random, cancel: Callable[[], bool] | None, on_text: Callable[[str], None] | None
    ) -> None:
        delay_ms = self.chunk_delay_ms
        if delay_ms is None:
            delay_ms = getattr(settings, "STORYTREE_BUILTIN_CHUNK_DELAY_MS", 0)
        for index, piece in enumerate(split_for_streaming(text, rng)):
            if cancel and cancel():
                raise ModelCancelled()
            if index and delay_ms:
                time.sleep(delay_ms / 1000)
            if on_text:
                on_text(piece)
        if cancel and cancel():
            raise ModelCancelled()


def split_for_streaming(text: str, rng: random.Random, pieces: int | None = None) -> list[str]:
    """`text` cut at whitespace into several pieces that concatenate back to it exactly."""
    words = re.findall(r"\S+\s*|\s+", text)
    count = pieces or max(2, min(12, len(words) // 3 + rng.randint(0, 2)))
    count = min(count, len(words)) or 1
    size, extra = divmod(len(words), count)
    result, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        result.append("".join(words[start:end]))
        start = end
    return [piece for piece in result if piece]


# -- reading the request -------------------------------------------------------------------


def _json_object(content: Any) -> dict[str, Any] | None:
    if isinstance(content, list):  # content parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        return None
    try:
        value = json.loads(content)
    except (json.JSONDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _read_request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    if last_user is None:
        return {}
    parsed = _json_object(last_user.get("content"))
    if parsed is not None:
        return parsed
    text = last_user.get("content")
    return {"plain_text": text if isinstance(text, str) else ""}


class _Turn:
    """The parts of a play request the narrator uses."""

    def __init__(self, messages: list[dict[str, Any]], request: dict[str, Any]) -> None:
        tail = request.get("dynamic_tail") if isinstance(request.get("dynamic_tail"), dict) else {}
        system = next((m for m in messages if m.get("role") == "system"), None)
        prefix = (_json_object(system.get("content")) or {}) if system else {}
        prefix = prefix.get("stable_prefix") if isinstance(prefix.get("stable_prefix"), dict) else {}
        player_input = tail.get("input") if isinstance(tail.get("input"), dict) else {}
        if "plain_text" in request:
            player_input = {"kind": "do", "text": request["plain_text"]}
        self.kind = player_input.get("kind") if player_input.get("kind") in ("do", "say", "story", "continue") else "do"
        self.text = str(player_input.get("text") or "").strip()
        if not self.text and self.kind != "continue":
            self.kind = "continue"
        self.persona = _first_sentence(str(prefix.get("persona") or ""), 200)
        self.premise = str(prefix.get("premise") or "")
        self.entries = [e for e in tail.get("world_entries") or [] if isinstance(e, dict) and e.get("content")]
        self.memories = [str(m) for m in tail.get("memories") or [] if m]
        state = tail.get("state") if isinstance(tail.get("state"), dict) else {}
        self.inventory = [str(i) for i in state.get("inventory") or []]
        self.facts = [str(f) for f in state.get("facts") or []]
        self.npcs = [str(n) for n in state.get("relationships") or {}]
        self.outcome = _fixed_outcome(tail.get("fixed_outcomes"))
        self.check_asked = False
        # Messages after the request: our own check call and its qualitative result.
        index = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        for message in messages[index + 1 :]:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                self.check_asked = True
            if message.get("role") == "tool":
                result = _json_object(message.get("content")) or {}
                if result.get("outcome") in OUTCOME_LINES:
                    self.outcome = result["outcome"]

    def risky_skill(self) -> str | None:
        if self.kind not in ("do", "say"):
            return None
        for pattern, skill in _RISKY:
            if pattern.search(self.text):
                return skill
        return None


def _fixed_outcome(fixed: Any) -> str | None:
    for item in fixed or []:
        outcome = item.get("outcome") if isinstance(item, dict) else item
        if outcome in OUTCOME_LINES:
            return outcome
    return None


# -- writing the answer --------------------------------------------------------------------


def _check_arguments(rng: random.Random, skill: str, text: str) -> dict[str, Any]:
    difficulty = rng.choice(("easy", "moderate", "moderate", "hard"))
    if re.search(r"!|reckless|blindly|at once", text, re.I) and difficulty != "hard":
        difficulty = "hard"
    return {"skill": skill, "difficulty": difficulty, "reason": _fit(f"You try to {_second_person(text)}", 300)}


def _turn_plan(rng: random.Random, turn: _Turn, skill: str | None) -> dict[str, Any]:
    parts: list[str] = []
    if turn.persona and rng.random() < 0.7:
        parts.append(f"As {_persona_phrase(turn.persona)}, you gather yourself.")
    if turn.kind == "do":
        parts.append(_sentence(_capitalize(_second_person(turn.text))))
    elif turn.kind == "say":
        parts.append(f'You say, "{turn.text}"')
    elif turn.kind == "story":
        parts.append(_sentence(turn.text))
    else:
        parts.append(rng.choice(CONTINUE_LINES))
    if turn.outcome:
        parts.append(rng.choice(OUTCOME_LINES[turn.outcome]))
    for entry in turn.entries[:2]:
        parts.append(_first_sentence(str(entry["content"]), 400))
    if turn.memories and rng.random() < 0.5:
        parts.append(f"You remember: {_first_sentence(rng.choice(turn.memories), 200)}")
    parts.append(rng.choice(CLOSING_LINES))
    narration = _fit(" ".join(part for part in parts if part), MAX_NARRATION_CHARS)
    return {
        "narration": narration,
        "suggestions": _suggestions(rng, turn),
        "state_delta": validate_delta(_delta(rng, turn, skill)),
    }


def _suggestions(rng: random.Random, turn: _Turn) -> list[str]:
    pool = list(SUGGESTIONS)
    for entry in turn.entries:
        keys = [str(k) for k in entry.get("keys") or [] if str(k).strip()]
        if keys:
            pool.append(f"Ask about {keys[0].strip()}")
    pool += [f"Talk to {npc}" for npc in turn.npcs]
    chosen = rng.sample(pool, k=min(len(pool), rng.choice((2, 3))))
    return [_fit(s, MAX_SUGGESTION_CHARS) for s in dict.fromkeys(chosen)]


def _delta(rng: random.Random, turn: _Turn, skill: str | None) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    succeeded = turn.outcome != "failure"
    if turn.kind == "do" and succeeded:
        taken = _TAKE.search(turn.text)
        if taken and taken.group(1).strip():
            ops.append({"op": "add_item", "item": _fit(taken.group(1).strip(), 200)})
        dropped = _DROP.search(turn.text)
        if dropped and dropped.group(1).strip() in turn.inventory:
            ops.append({"op": "remove_item", "item": dropped.group(1).strip()})
    for npc in turn.npcs:
        if npc.lower() in turn.text.lower():
            step = rng.choice((1, 2))
            ops.append({"op": "adjust_relationship", "npc": npc, "by": step if succeeded else -step})
            break
    for entry in turn.entries[:1]:
        keys = [str(k).strip() for k in entry.get("keys") or [] if str(k).strip()]
        fact = _fit(f"{keys[0]}: {_first_sentence(str(entry['content']), 160)}" if keys else entry["content"], 200)
        if fact not in turn.facts:
            ops.append({"op": "add_fact", "fact": fact})
    if skill and turn.outcome == "success":
        ops.append({"op": "set_flag", "flag": _fit(f"hidden:{skill} success", 200)})
    return ops


def _summary(request: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    request = request if isinstance(request, dict) else {}
    limit = request.get("max_chars")
    limit = min(limit, MAX_SUMMARY_CHARS) if isinstance(limit, int) and limit > 0 else MAX_SUMMARY_CHARS
    pieces: list[str] = _sentences(str(request.get("previous_summary") or ""))
    points: list[str] = []
    nodes = [n for n in request.get("nodes") or [] if isinstance(n, dict)]
    if not nodes and not pieces and "summary_request" not in request:
        # Not a structured request: summarize the last user message's words.
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        pieces = _sentences(str(last_user.get("content") or ""))
    for node in nodes:
        said = str(node.get("input") or "").strip()
        if said:
            pieces.append(f'You chose: "{_first_sentence(said, 200)}"')
            points.append(_fit(said, MAX_KEY_POINT_CHARS))
        first = _first_sentence(str(node.get("narration") or ""), 300)
        if first:
            pieces.append(first)
    summary = _newest_that_fit(pieces, limit) or _fit("Nothing of note has happened yet.", limit)
    return {"summary": summary, "key_points": points[-MAX_KEY_POINTS:]}


def _newest_that_fit(pieces: list[str], limit: int) -> str:
    """The newest pieces whose joined length fits `limit`, in story order."""
    kept: list[str] = []
    used = 0
    for piece in reversed([p for p in pieces if p.strip()]):
        cost = len(piece) + (1 if kept else 0)
        if used + cost > limit:
            if not kept:
                kept.append(_fit(piece, limit))
            break
        kept.append(piece)
        used += cost
    return " ".join(reversed(kept))


# -- text helpers ----------------------------------------------------------------------------


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?…])\s+", text.strip()) if s.strip()]


def _first_sentence(text: str, limit: int) -> str:
    sentences = _sentences(text)
    return _fit(sentences[0], limit) if sentences else ""


def _fit(text: str, limit: int) -> str:
    """`text` within `limit` characters, cut at a word boundary with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "…"


def _second_person(text: str) -> str:
    text = re.sub(r"^\s*I\s+am\b", "are", text)
    text = re.sub(r"^\s*I\s+(?=\w)", "", text)

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        replacement = _FIRST_PERSON.get(word.lower(), word)
        return replacement.capitalize() if word[0].isupper() and word[0] != "I" else replacement

    return re.sub(r"\b(?:I'm|I've|I'll|I'd|I|me|my|mine|myself)\b", swap, text, flags=re.I)


def _capitalize(text: str) -> str:
    text = text.strip()
    if not text:
        return text
    if not re.match(r"you\b", text, re.I):
        if len(text) > 1 and text[1].islower():
            text = text[0].lower() + text[1:]
        text = "You " + text
    return text[0].upper() + text[1:]


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?…\"'" else text + "."


def _persona_phrase(persona: str) -> str:
    persona = re.sub(r"^(?:you are|i am|i'm)\s+", "", persona.strip(), flags=re.I)
    return persona.rstrip(".!?…")
