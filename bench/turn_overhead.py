"""Server-side time of one turn, excluding the model, and the play page's render time, at
path depths 100, 1,000 and 10,000.

A turn goes through the real pipeline: stories.turns.turn_request (validation, version check,
TurnJob row), the task run eagerly in-process (CELERY_TASK_ALWAYS_EAGER=1; the per-adventure
lock in a private redis-server), context.prepare (path read, budget, nearest checkpoint and its
validation, compaction when due), the built-in narrator (no delay), plan validation, the
next-turn proof and the commit. The model's own time is taken out by wrapping the built-in
narrator's chat(): every call (turn and summary) is timed and subtracted, less the time spent in
the pipeline's own callbacks during it (progress writes, cancel polls), which stays in.

Each story is built by stories.synthetic (one fork every 50 nodes, 1,000-byte narrations), then
compacted once with context.compact_now (reported, not part of the turn figures: a story played
through the product compacts as it grows). Turns rotate over the three stories in a shuffled
order each round, so noise lands on all depths alike; figures are medians after a warm-up.
"""

from __future__ import annotations

import argparse
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
    fmt_ms,
    fmt_ratio,
    headline,
    median,
    progress,
    record_sql,
    setup_django,
    stopwatch,
    table,
)

DEPTHS = (100, 1_000, 10_000)
FORK_EVERY = 50
ACTIONS = (
    "I look around the harbour for the missing harbourmaster.",
    "I ask Maren what she saw on the night the lighthouse went dark.",
    "I walk along the quay towards the lighthouse.",
    "I wait and listen to the rain.",
    "I search the cellar behind the bar.",
    "I follow the fresh footprints in the mud.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="measured turns per depth")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up turns per depth")
    parser.add_argument("--renders", type=int, default=31, help="measured page renders per depth")
    parser.add_argument("--depths", default=",".join(str(d) for d in DEPTHS))
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]

    redis = RedisServer().start()
    try:
        setup_django("turns", CELERY_TASK_ALWAYS_EAGER="1", REDIS_URL=redis.url, STORYTREE_TURN_RATE="1000000/min")
        run(depths, args)
    finally:
        redis.stop()


def run(depths: list[int], args) -> None:
    import random

    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import Resolver404, resolve

    from checkpoints.context import compact_now
    from stories import turns
    from stories.models import Adventure, TurnJob
    from stories.synthetic import build_story

    owner = get_user_model().objects.create_user("bench-player", password="bench-player-password")
    timer = ModelTimer().install()
    stories: dict[int, int] = {}
    setup_rows = []
    for depth in depths:
        forks = depth // FORK_EVERY
        progress(f"turn_overhead: building depth {depth:,} ({forks} forks)")
        adventure = build_story(nodes=depth + forks + 1, forks=forks, bytes_per_node=1000, owner=owner)
        assert Adventure.objects.get(pk=adventure.pk).head.depth == depth
        timer.reset()
        with stopwatch() as took:
            result = compact_now(adventure)
        setup_rows.append(
            [
                f"{depth:,}",
                forks,
                result.outcome,
                timer.summary_calls,
                fmt_ms(took[0] - timer.seconds),
                fmt_ms(timer.seconds),
            ]
        )
        stories[depth] = adventure.pk

    per_turn: dict[int, list[dict]] = {d: [] for d in depths}
    rng = random.Random(11)
    order = list(depths)
    progress(f"turn_overhead: {args.warmup} warm-up + {args.turns} measured turns per depth")
    for round_ in range(args.warmup + args.turns):
        rng.shuffle(order)
        for depth in order:
            adventure = Adventure.objects.select_related("head", "model_profile").get(pk=stories[depth])
            text = ACTIONS[(round_ + depth) % len(ACTIONS)]
            timer.reset()

            def play(adventure=adventure, text=text):
                return turns.turn_request(
                    adventure=adventure, kind="do", text=text, expected_version=adventure.version,
                    idempotency_key=uuid.uuid4().hex,
                )  # fmt: skip

            with stopwatch() as took:
                statements, (job, _created) = record_sql("default", play)
            job = TurnJob.objects.get(pk=job.pk)
            if job.status != TurnJob.Status.DONE:
                raise SystemExit(f"turn at depth {depth} ended {job.status}: {job.error_code} {job.error_message}")
            if round_ >= args.warmup:
                per_turn[depth].append(
                    {
                        "total": took[0],
                        "model": timer.seconds,
                        "overhead": took[0] - timer.seconds,
                        "queries": len(statements),
                        "calls": timer.calls,
                        "summary_calls": timer.summary_calls,
                    }
                )

    # The play page, or the story endpoint while it does not exist yet.
    client = Client()
    client.force_login(owner)
    some_id = stories[depths[0]]
    play_page, why_not = False, "no URL is routed to it"
    try:
        resolve(f"/adventures/{some_id}/")
        status = client.get(f"/adventures/{some_id}/").status_code
        play_page, why_not = status == 200, f"it answers HTTP {status}"
    except Resolver404:
        pass
    except Exception as exc:  # the page is being built by another engineer: say what it raised
        why_not = f"it raises {type(exc).__name__}: {str(exc)[:120]}"
    pages = []
    if play_page:
        pages.append(("play page GET /adventures/<id>/", "/adventures/{id}/"))
    pages.append(("GET /api/v1/adventures/<id>/story", "/api/v1/adventures/{id}/story"))
    renders: dict[str, dict[int, tuple[float, int, int]]] = {}
    for label, url in pages:
        renders[label] = {}
        for depth in depths:
            path = url.format(id=stories[depth])
            statements, response = record_sql("default", lambda path=path: client.get(path))
            if response.status_code != 200:
                raise SystemExit(f"{path} answered {response.status_code}")
            size = len(response.content)
            times = []
            for i in range(args.renders + 2):
                with stopwatch() as took:
                    client.get(path)
                if i >= 2:
                    times.append(took[0])
            renders[label][depth] = (median(times), len(statements), size)
    timer.uninstall()

    emit("## turn_overhead.py — one turn's server-side time without the model, and the page render")
    emit()
    emit(
        "Real pipeline (turn_request → TurnJob → task run eagerly in-process → prepare/compact → narrator → "
        "validate → next-turn proof → commit), built-in narrator with no delay, default profile (16,384-token "
        "window, assumed). Model time = time inside the narrator's chat() (turn and summary calls), minus the "
        "pipeline's own callbacks during it. "
        f"Median of {args.turns} turns per depth after {args.warmup} warm-up, interleaved across depths."
    )
    emit()
    emit("Set-up, not in the turn figures: one compaction of each synthetic path with `compact_now`:")
    emit()
    emit(table(["depth", "forks", "outcome", "summary calls", "time without model", "model time"], setup_rows))
    emit()
    rows = []
    for depth in depths:
        runs = per_turn[depth]
        rows.append(
            [
                f"{depth:,}",
                fmt_ms(median([r["overhead"] for r in runs])),
                fmt_ms(sum(r["overhead"] for r in runs) / len(runs)),
                fmt_ms(max(r["overhead"] for r in runs)),
                fmt_ms(median([r["model"] for r in runs])),
                f"{median([r['queries'] for r in runs]):.0f}",
                f"{sum(r['calls'] for r in runs) / len(runs):.2f}",
                f"{sum(r['summary_calls'] for r in runs)}",
            ]
        )
    emit(
        table(
            ["depth", "turn without model (median)", "mean (compaction turns included)", "slowest turn without model",
             "model (median)", "SQL statements (median)", "model calls per turn", "summary calls in all measured turns"],
            rows,
        )
    )  # fmt: skip
    emit()
    rows = []
    for label, per_depth in renders.items():
        for depth in depths:
            seconds, queries, size = per_depth[depth]
            rows.append([label, f"{depth:,}", fmt_ms(seconds), queries, f"{size:,} B"])
    if not play_page:
        emit(
            f"The play page (`/adventures/<id>/`) does not work in this checkout yet ({why_not}), so the render is "
            "measured on the story endpoint the page reads, `GET /api/v1/adventures/<id>/story` (30 newest nodes), "
            "through the Django test client."
        )
        emit()
    emit(table(["page (Django test client)", "depth", f"median of {args.renders}", "SQL statements", "body"], rows))
    emit()
    lo, hi = depths[0], depths[-1]
    turn_ratio = median([r["overhead"] for r in per_turn[hi]]) / median([r["overhead"] for r in per_turn[lo]])
    emit("Headline ratios (same run):")
    emit()
    lines = [f"- turn without model, depth {hi:,} ÷ depth {lo:,}: **{fmt_ratio(turn_ratio)}**"]
    for label, per_depth in renders.items():
        lines.append(f"- {label}, depth {hi:,} ÷ depth {lo:,}: **{fmt_ratio(per_depth[hi][0] / per_depth[lo][0])}**")
    emit("\n".join(lines))
    emit()
    medians = " / ".join(fmt_ms(median([r["overhead"] for r in per_turn[d]])) for d in depths)
    rows = [
        [f"turn without the model, depth {' / '.join(f'{d:,}' for d in depths)}", medians, "", ""],
        [f"turn without the model, depth {hi:,} ÷ {lo:,}", fmt_ratio(turn_ratio), "", ""],
    ]
    for label, per_depth in renders.items():
        rows.append(
            [
                f"{label} render, depth {' / '.join(f'{d:,}' for d in depths)}",
                " / ".join(fmt_ms(per_depth[d][0]) for d in depths),
                "",
                "",
            ]
        )
        rows.append([f"{label} render, depth {hi:,} ÷ {lo:,}", fmt_ratio(per_depth[hi][0] / per_depth[lo][0]), "", ""])
    headline("turn_overhead", rows)


if __name__ == "__main__":
    main()
