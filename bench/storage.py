"""Database bytes per turn over 1,000 turns with 50 forks, and how they grow, next to a
LangGraph-style baseline that stores the whole story state with every turn.

Ours: 1,000 turns played through the real pipeline (turn_request, task run eagerly, built-in
narrator, default profile), a fork every 20 turns (undo twice, then play: the new turn goes on a
new branch). Bytes are SQLite's own page counts (dbstat) for the tables and their indexes:
the tree (nodes, branches), the checkpoint cache, and the turn-job log, measured every 100 turns.

Baseline: what a checkpointer in the style of LangGraph's SqliteSaver writes for the same play:
one row per committed turn (its table shape: thread, namespace, checkpoint id, parent id, type,
checkpoint blob, metadata blob) whose blob is the whole serialized state of the story so far
(every message on the path from the premise to the new turn, and the story state). A fork is a
new row whose parent is the older checkpoint. Its own SQLite file with the same pragmas (WAL,
synchronous=NORMAL). This is generous to the baseline: LangGraph writes at least one
checkpoint per graph step (input and model steps), plus a writes table.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bootstrap  # noqa: E402

bootstrap()

from bench.common import (  # noqa: E402
    BENCH_VAR,
    RedisServer,
    emit,
    fmt_bytes,
    fmt_ratio,
    headline,
    progress,
    remove_sqlite,
    setup_django,
    table,
    table_bytes,
)

ACTIONS = (
    ("do", "I look around the harbour for the missing harbourmaster."),
    ("say", "Maren, when did you last see him?"),
    ("do", "I walk along the quay towards the lighthouse."),
    ("continue", ""),
    ("do", "I search the cellar behind the bar."),
    ("do", "I follow the fresh footprints in the mud."),
    ("say", "Who else knows about the logbook?"),
)
TREE = ["stories_node", "stories_branch"]
CACHE = ["checkpoints_contextcheckpoint"]
LOG = ["stories_turnjob"]


class Baseline:
    """A LangGraph-SqliteSaver-shaped table, one whole-state row per turn."""

    def __init__(self, path: Path) -> None:
        remove_sqlite(path)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(
            "CREATE TABLE checkpoints (thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '', "
            "checkpoint_id TEXT NOT NULL, parent_checkpoint_id TEXT, type TEXT, checkpoint BLOB, metadata BLOB, "
            "PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id))"
        )
        self.thread = uuid.uuid4().hex
        self.messages: dict[int, tuple] = {}  # node id -> the path's messages (shared tuples, no copies)
        self.checkpoint_of: dict[int, str] = {}

    def root(self, node) -> None:
        self.messages[node.pk] = ({"type": "system", "content": node.narration},)
        self.checkpoint_of[node.pk] = self._write(node, None, 0)

    def turn(self, node, step: int) -> None:
        new = []
        if node.player_input:
            new.append({"type": "human", "content": node.player_input})
        new.append({"type": "ai", "content": node.narration, "suggestions": node.suggestions})
        self.messages[node.pk] = self.messages[node.parent_id] + tuple(new)
        self.checkpoint_of[node.pk] = self._write(node, self.checkpoint_of[node.parent_id], step)

    def _write(self, node, parent: str | None, step: int) -> str:
        checkpoint_id = str(uuid.uuid4())
        blob = json.dumps(
            {
                "v": 1,
                "id": checkpoint_id,
                "channel_values": {"messages": list(self.messages[node.pk]), "state": node.state_after},
                "channel_versions": {"messages": step, "state": step},
            },
            ensure_ascii=False,
        ).encode()
        metadata = json.dumps({"source": "loop", "step": step, "parents": {}}).encode()
        self.db.execute(
            "INSERT INTO checkpoints VALUES (?, '', ?, ?, 'json', ?, ?)",
            (self.thread, checkpoint_id, parent, blob, metadata),
        )
        return checkpoint_id

    def size(self) -> int:
        row = self.db.execute(
            "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = 'checkpoints')"
        ).fetchone()
        return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=1_000)
    parser.add_argument("--forks", type=int, default=50)
    parser.add_argument("--every", type=int, default=100, help="measure every N turns")
    args = parser.parse_args()
    redis = RedisServer().start()
    try:
        setup_django("storage", CELERY_TASK_ALWAYS_EAGER="1", REDIS_URL=redis.url, STORYTREE_TURN_RATE="1000000/min")
        run(args)
    finally:
        redis.stop()


def run(args) -> None:
    from django.contrib.auth import get_user_model

    from stories import tree, turns
    from stories.models import Adventure, Node, TurnJob

    owner = get_user_model().objects.create_user("bench-storage")
    adventure = tree.adventure_create(
        owner=owner,
        title="The Dark Lighthouse",
        premise="Rain hammers the slate roofs of Saltmarsh as you step into the Drowned Lantern, the only inn still lit.",
        persona="Ilsa Varn, a former ship's navigator.",
        style="Atmospheric, grounded, second person, present tense.",
    )
    baseline = Baseline(BENCH_VAR / "storage_baseline.sqlite3")
    baseline.root(Node.objects.get(pk=adventure.head_id))
    fork_every = max(1, args.turns // max(args.forks, 1))

    def ours() -> dict[str, int]:
        return {
            "tree": table_bytes("default", TREE),
            "cache": table_bytes("default", CACHE),
            "log": table_bytes("default", LOG),
        }

    empty = ours()
    empty_baseline = baseline.size()
    rows = []
    committed = forks = 0
    progress(f"storage: {args.turns} turns, a fork every {fork_every}")
    while committed < args.turns:
        adventure = Adventure.objects.select_related("head", "model_profile").get(pk=adventure.pk)
        if committed and committed % fork_every == fork_every // 2 and forks < args.forks and adventure.head.depth > 2:
            tree.undo(adventure=adventure, expected_version=adventure.version)
            tree.undo(adventure=adventure, expected_version=adventure.version)
            forks += 1
        kind, text = ACTIONS[committed % len(ACTIONS)]
        job, _ = turns.turn_request(
            adventure=adventure,
            kind=kind,
            text=text,
            expected_version=adventure.version,
            idempotency_key=uuid.uuid4().hex,
        )
        job = TurnJob.objects.get(pk=job.pk)
        if job.status != TurnJob.Status.DONE:
            raise SystemExit(f"turn {committed} ended {job.status}: {job.error_code} {job.error_message}")
        node = Node.objects.get(pk=job.result_node_id)
        committed += 1
        baseline.turn(node, committed)
        if committed % args.every == 0:
            sizes = ours()
            rows.append((committed, sizes, baseline.size(), node.depth))
            progress(f"storage: {committed} turns")

    branches = adventure.branches.count()
    emit("## storage.py — bytes per turn, ours vs a whole-state-per-turn checkpointer")
    emit()
    emit(
        f"{args.turns:,} turns through the real pipeline (built-in narrator, default profile), {forks} forks "
        f"({branches} branches), measured with SQLite's dbstat (table and index pages, empty tables subtracted). "
        "Baseline: a LangGraph-SqliteSaver-shaped table with one row per turn holding the whole serialized story "
        "so far (its own SQLite file, same pragmas)."
    )
    emit()
    out = []
    previous = None
    for turns_done, sizes, base, depth in rows:
        tree_b = sizes["tree"] - empty["tree"]
        total = sum(sizes.values()) - sum(empty.values())
        base_b = base - empty_baseline
        marginal = ""
        if previous is not None:
            marginal = f"{fmt_bytes((total - previous[0]) / (turns_done - previous[2]))} / {fmt_bytes((base_b - previous[1]) / (turns_done - previous[2]))}"
        out.append(
            [
                f"{turns_done:,}",
                f"{depth:,}",
                fmt_bytes(tree_b),
                fmt_bytes(sizes["cache"] - empty["cache"]),
                fmt_bytes(sizes["log"] - empty["log"]),
                fmt_bytes(total),
                fmt_bytes(total / turns_done),
                fmt_bytes(base_b),
                fmt_bytes(base_b / turns_done),
                marginal,
                fmt_ratio(base_b / total),
            ]
        )
        previous = (total, base_b, turns_done)
    emit(
        table(
            ["turns", "head depth", "ours: tree", "ours: checkpoints", "ours: job log", "ours: total", "ours per turn",
             "baseline", "baseline per turn", "per turn since the row above (ours / baseline)", "baseline ÷ ours"],
            out,
        )
    )  # fmt: skip
    emit()
    first, last = rows[0], rows[-1]

    def slope(a: float, b: float) -> float:
        return math.log(b / a) / math.log(last[0] / first[0])

    ours_first = sum(first[1].values()) - sum(empty.values())
    ours_last = sum(last[1].values()) - sum(empty.values())
    base_first, base_last = first[2] - empty_baseline, last[2] - empty_baseline
    k_ours, k_base = slope(ours_first, ours_last), slope(base_first, base_last)
    emit(
        "Growth, as the exponent k in bytes ∝ turns^k between the first and the last measurement (1 = linear, 2 = quadratic):"
    )
    emit()
    emit(
        f"- ours: **k = {k_ours:.2f}** ({'linear' if k_ours < 1.15 else 'worse than linear'}), {fmt_bytes(ours_last / last[0])} per turn at {last[0]:,} turns"
    )
    emit(
        f"- baseline: **k = {k_base:.2f}** ({'linear' if k_base < 1.15 else 'worse than linear'}), {fmt_bytes(base_last / last[0])} per turn at {last[0]:,} turns"
    )
    emit(
        f"- at {last[0]:,} turns the baseline takes **{fmt_ratio(base_last / ours_last)}** the bytes of ours (all our tables, checkpoints and job log included)"
    )
    emit()
    headline(
        "storage",
        [
            [
                f"bytes per turn at {last[0]:,} turns, ours / baseline",
                f"{fmt_bytes(ours_last / last[0])} / {fmt_bytes(base_last / last[0])}",
                "",
                "",
            ],
            [
                "growth exponent k, ours / baseline",
                f"{k_ours:.2f} / {k_base:.2f}",
                "ours linear",
                "yes" if k_ours < 1.15 else "no",
            ],
            [f"baseline ÷ ours at {last[0]:,} turns", fmt_ratio(base_last / ours_last), "", ""],
        ],
    )


if __name__ == "__main__":
    main()
