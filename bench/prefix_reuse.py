"""Prompt prefix reuse over 200 turns on a small-window profile: how much of each prompt is a
byte-identical prefix of the previous one (what a provider's prefix cache can reuse), how
often the checkpoint rotates (the one deliberate cache break), and how many model calls go to
compaction.

Played through the real pipeline (turn_request, task run eagerly, built-in narrator without
delay) on a builtin profile with a 4,096-token context window. Our estimator counts one token
per UTF-8 byte (DESIGN.md, context budget); if the product refuses that window, the script says
so and plays on the smallest larger window (in steps of 1,024) that it accepts.

A prompt is the first request of a turn (not the continuation after a hidden check),
serialized as the JSON list of its messages in order; the shared prefix is the longest common
byte prefix with the previous turn's prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bootstrap  # noqa: E402

bootstrap()

from bench.common import (  # noqa: E402
    ModelTimer,
    RedisServer,
    emit,
    fmt_bytes,
    headline,
    median,
    progress,
    setup_django,
    table,
)

WINDOW = 4_096
MAX_OUTPUT = 512
PREMISE = (
    "Rain hammers the slate roofs of Saltmarsh as you step into the Drowned Lantern, the only inn still lit. "
    "The harbourmaster has gone missing, the lighthouse has been dark for three nights, and the innkeeper "
    "Maren keeps glancing at the cellar door."
)
PERSONA = "Ilsa Varn, a former ship's navigator with a steady hand and a debt to the harbourmaster."
STYLE = "Atmospheric, grounded, second person, present tense."
PLAYS = (
    ("do", "I shake the rain from my coat and look around the inn."),
    ("say", "Maren, when did you last see the harbourmaster?"),
    ("do", "I walk down to the quay and look at the dark lighthouse."),
    ("continue", ""),
    ("do", "I climb the slick rocks towards the lighthouse door."),
    ("say", "Is anyone there? I'm a friend of the harbourmaster."),
    ("do", "I search the keeper's room for his logbook."),
    ("story", "A gull screams somewhere above, and the lamp room door creaks open on its own."),
    ("do", "I take the brass key from the hook."),
    ("do", "I sneak back past the sleeping watchman."),
    ("say", "Maren, I found the keeper's logbook. It lists ships that never arrived."),
    ("continue", ""),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    redis = RedisServer().start()
    try:
        setup_django("prefix", CELERY_TASK_ALWAYS_EAGER="1", REDIS_URL=redis.url, STORYTREE_TURN_RATE="1000000/min")
        run(args.turns)
    finally:
        redis.stop()


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix (binary search on slices: C-speed comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def checkpoint_of(messages: list[dict]) -> int | None:
    """covered_through_depth of the checkpoint the prompt carries (None: no checkpoint)."""
    if len(messages) < 2 or messages[1].get("role") != "user":
        return None
    try:
        content = json.loads(messages[1]["content"])
    except (TypeError, ValueError):
        return None
    part = content.get("checkpoint") if isinstance(content, dict) else None
    return part.get("covered_through_depth") if isinstance(part, dict) else None


def new_story(owner, window: int):
    from stories.models import ModelProfile, WorldEntry
    from stories.tree import adventure_create

    profile = ModelProfile.objects.create(
        name=f"bench {window}", provider="builtin", model_name="builtin", context_window=window,
        max_output_tokens=MAX_OUTPUT,
    )  # fmt: skip
    adventure = adventure_create(
        owner=owner, title="The Dark Lighthouse", premise=PREMISE, persona=PERSONA, style=STYLE, model_profile=profile
    )
    WorldEntry.objects.create(
        adventure=adventure, keys=["Maren", "innkeeper"], priority=5,
        content="Maren, the innkeeper, is hiding her smuggler brother in the cellar.",
    )  # fmt: skip
    WorldEntry.objects.create(
        adventure=adventure, keys=["lighthouse"], priority=3,
        content="The lighthouse keeper's logbook records ships that never arrived.",
    )  # fmt: skip
    return adventure


def fixed_parts(adventure) -> dict[str, int]:
    """What the budget takes before any history, in estimated tokens (bytes)."""
    from checkpoints import budget as b
    from checkpoints.prompt import system_message
    from stories.llm.base import effective_limits
    from stories.llm.tools import REQUEST_CHECK, SUBMIT_TURN_PLAN

    profile = adventure.model_profile
    tools = [REQUEST_CHECK, SUBMIT_TURN_PLAN]
    window, _assumed, output = effective_limits(profile)
    return {
        "requested output": output,
        "system prompt (stable prefix)": b.estimate_tokens(system_message(adventure)["content"]),
        "tool schemas": b.offered_tokens(tools, profile),
        "hidden-check continuation reserve": b.continuation_reserve(tools, profile),
        "safety margin": b.safety_margin(window),
    }


def play(adventure, turn_count: int) -> dict:
    from stories import turns
    from stories.models import Adventure, TurnJob

    timer = ModelTimer().install()
    prompts: list[bytes] = []
    covered: list[int | None] = []
    summary_calls = 0
    failures: dict[str, int] = {}
    streak = 0
    stopped = None
    try:
        for index in range(turn_count):
            adventure = Adventure.objects.select_related("head", "model_profile").get(pk=adventure.pk)
            kind, text = PLAYS[index % len(PLAYS)]
            timer.reset()
            job, _ = turns.turn_request(
                adventure=adventure, kind=kind, text=text, expected_version=adventure.version,
                idempotency_key=uuid.uuid4().hex,
            )  # fmt: skip
            job = TurnJob.objects.get(pk=job.pk)
            summary_calls += timer.summary_calls
            if job.status != TurnJob.Status.DONE:
                # A refused turn writes nothing; the player tries the next action.
                failures[job.error_code] = failures.get(job.error_code, 0) + 1
                streak += 1
                if streak >= 5:
                    stopped = index + 1
                    break
                continue
            streak = 0
            if len(timer.turn_prompts) != 1:
                raise SystemExit(f"turn {index}: expected one turn prompt, saw {len(timer.turn_prompts)}")
            messages = timer.turn_prompts[0]
            prompts.append(json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode())
            covered.append(checkpoint_of(messages))
    finally:
        timer.uninstall()

    shares, rotation_shares, steady_shares = [], [], []
    shared_bytes = total_bytes = 0
    rotations = 0
    for i in range(1, len(prompts)):
        prefix = common_prefix(prompts[i - 1], prompts[i])
        share = prefix / len(prompts[i])
        shares.append(share)
        shared_bytes += prefix
        total_bytes += len(prompts[i])
        if covered[i] != covered[i - 1]:
            rotations += 1
            rotation_shares.append(share)
        else:
            steady_shares.append(share)
    pct = lambda xs: f"{median(xs):.1%}" if xs else "n/a"  # noqa: E731
    played = stopped or turn_count
    return {
        "turns committed": f"{len(prompts)} of {played} tried"
        + (f" (stopped after 5 refusals in a row at turn {stopped})" if stopped else ""),
        "refused turns": ", ".join(f"{code} × {n}" for code, n in failures.items()) or "none",
        "median prompt size": fmt_bytes(median([len(p) for p in prompts])),
        "shared prefix, all bytes (Σ shared ÷ Σ prompt)": f"**{shared_bytes / total_bytes:.1%}**",
        "shared prefix, median turn": pct(shares),
        "shared prefix, median turn without a rotation": pct(steady_shares),
        "shared prefix, median turn with a rotation": pct(rotation_shares),
        "lowest share": f"{min(shares):.1%}",
        "checkpoint rotations": f"**{rotations}**",
        "model calls spent on compaction": f"{summary_calls}",
        "compaction calls per 100 turns": f"**{summary_calls * 100 / played:.1f}**",
    }


def run(turn_count: int) -> None:
    from django.contrib.auth import get_user_model

    from checkpoints.context import context_report

    owner = get_user_model().objects.create_user("bench-prefix")
    refusals = []
    window = WINDOW
    while True:
        adventure = new_story(owner, window)
        report = context_report(adventure)
        if "error" not in report:
            break
        refusals.append((window, report["error"]["code"], fixed_parts(adventure)))
        window += 1024
        if window > 4 * WINDOW:
            raise SystemExit(f"no window up to {4 * WINDOW} is accepted: {refusals}")
    windows = [window] + [w for w in (8_192, 16_384) if w > window]

    results = {}
    budgets = {}
    for w in windows:
        progress(f"prefix_reuse: {turn_count} turns on a {w:,}-token window")
        story = adventure if w == window else new_story(owner, w)
        budgets[w] = context_report(story)["budget"]
        results[w] = play(story, turn_count)

    emit("## prefix_reuse.py — byte-identical prompt prefixes, checkpoint rotations, compaction calls")
    emit()
    if refusals:
        first = refusals[0]
        parts = first[2]
        emit(
            f"**The {WINDOW:,}-token profile (max output {MAX_OUTPUT}) is refused by the product** "
            f"(`{first[1]}`): the estimator counts one token per UTF-8 byte (DESIGN.md), and the fixed parts alone "
            f"take {sum(parts.values()):,} of the {WINDOW:,}: "
            + ", ".join(f"{k} {v:,}" for k, v in parts.items())
            + ". "
            + " ".join(f"{w:,} is refused too (`{code}`)." for w, code, _ in refusals[1:])
            + f" So the same story is played on the smallest accepted window ({window:,}, in steps of 1,024), "
            "and for comparison on 8,192 and 16,384."
        )
        emit()
    emit(
        f"{turn_count} turns per window through the real pipeline, built-in narrator, max output {MAX_OUTPUT}, "
        "the same 12 player actions in a loop (do, say, story, continue, some risky)."
    )
    emit()
    rows = [
        ["hard input budget (B)", *[f"{budgets[w]['hard_input']:,}" for w in windows]],
        [
            "compaction above / down to (B)",
            *[f"{budgets[w]['high_watermark']:,} / {budgets[w]['low_watermark']:,}" for w in windows],
        ],
    ]
    for key in results[windows[0]]:
        rows.append([key, *[results[w][key] for w in windows]])
    emit(table(["measure", *[f"window {w:,}" for w in windows]], rows))
    emit()
    emit(
        "A rotation is a turn whose prompt carries a different checkpoint than the previous prompt. Between "
        "rotations a prompt repeats the previous one up to where the previous dynamic tail began (system prompt, "
        "checkpoint, every verbatim node); the new node and this turn's dynamic tail are the only new bytes. A "
        "rotation replaces the oldest verbatim nodes with a new summary, so the shared prefix ends with the system "
        "prompt."
    )
    emit()
    rows = []
    if refusals:
        rows.append(
            [
                f"{WINDOW:,}-token profile",
                f"refused ({refusals[0][1]}): fixed parts {sum(refusals[0][2].values()):,} B",
                "plays",
                "no",
            ]
        )
    for w in windows:
        r = results[w]
        rows.append(
            [
                f"window {w:,}: shared prefix (Σ bytes)",
                r["shared prefix, all bytes (Σ shared ÷ Σ prompt)"].strip("*"),
                "",
                "",
            ]
        )
        rows.append(
            [
                f"window {w:,}: rotations / compaction calls per 100 turns",
                f"{r['checkpoint rotations'].strip('*')} / {r['compaction calls per 100 turns'].strip('*')}",
                "",
                "",
            ]
        )
    headline("prefix_reuse", rows)


if __name__ == "__main__":
    main()
