"""Path reads and writes: our path module against what a Django developer would pick instead.

Shapes (nodes, forks): (100, 1), (1,000, 20), (10,000, 200), built by stories.synthetic and
copied row for row (same ids, same content columns) into each contender's own SQLite file,
all with the product's SQLite options (WAL, synchronous=NORMAL, foreign keys, IMMEDIATE):

- ours: stories/paths.py over (branch, depth) with cached lineage; stories.tree.node_append
- adjacency: a parent pointer, walked one query per node (ids only, then the page in one query:
  the most favourable way to walk)
- cte: the same adjacency table, read with one `WITH RECURSIVE ... LIMIT` query
- treebeard: django-treebeard MP_Node (steplen=1), ancestors picked by path prefixes
- mptt: django-mptt (nested sets), `get_ancestors()` and its insert

Operations: the newest 32 nodes of the head's path; a page of 32 at the root (depths 0..31);
the nearest checkpoint 10 and 2,000 nodes above the head (off-path checkpoints on every
abandoned fork node, and one every 100 depths further down); appending one node at the head;
the bytes of the node tables and their indexes (after VACUUM; ours includes stories_branch).
Every contender must return the same rows as ours, or the script stops.

Times are medians of interleaved runs after a warm-up; ratios are ours ÷ theirs from the same
run (below 1: we are faster). Each op is given the head already loaded (ours with its branch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bootstrap  # noqa: E402

bootstrap()

from bench.common import (  # noqa: E402
    BENCH_VAR,
    checkpoint_and_vacuum,
    emit,
    fmt_bytes,
    fmt_ms,
    fmt_ratio,
    headline,
    interleaved,
    median,
    progress,
    record_sql,
    remove_sqlite,
    replayer,
    setup_django,
    table,
    table_bytes,
)

SHAPES = [(100, 1), (1_000, 20), (10_000, 200)]
# (repeat, warm-up) per shape, and the cap on the per-node walk's timed runs (at depth
# 10,000 one run of it is ~10,000 queries, seconds on a busy machine).
REPEATS = {100: (31, 3), 1_000: (25, 2), 10_000: (21, 2)}
SLOW_WALK_RUNS = {100: 31, 1_000: 11, 10_000: 5}
WINDOW = 32
GAPS = (10, 2_000)
BACKGROUND_EVERY = 100
CONTENDERS = ["ours", "adjacency", "cte", "treebeard", "mptt"]
LABELS = {
    "ours": "ours (paths.py)",
    "adjacency": "adjacency, per node",
    "cte": "adjacency + recursive CTE",
    "treebeard": "treebeard MP_Node",
    "mptt": "django-mptt",
}
SUMMARY = "A summary of the story so far. " * 50
STORY = 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--shapes", default=",".join(f"{n}:{f}" for n, f in SHAPES))
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in item.split(":")) for item in args.shapes.split(",")]

    setup_django("paths")
    from django.db import connections

    template = BENCH_VAR / "paths_template.sqlite3"
    checkpoint_and_vacuum("default")
    connections["default"].close()
    ours_db = Path(connections["default"].settings_dict["NAME"])
    remove_sqlite(template)
    template.write_bytes(ours_db.read_bytes())

    emit("## paths.py — path reads and writes against the usual Django trees")
    emit()
    emit(
        "Same rows in every contender (ids, 1,000-byte narration, every content column of `stories.Node`), "
        "each in its own SQLite file with the product's pragmas (WAL, synchronous=NORMAL, IMMEDIATE). "
        "Times are medians of interleaved runs after a warm-up; **ours ÷ theirs** below 1 means we are faster. "
        "`q` = SQL queries per operation. The per-node walk reads ids one query per node and the page in one "
        "more query (its most favourable form); treebeard picks ancestors by the 32 path prefixes it needs "
        "(not `get_ancestors()`, which lists every prefix); mptt uses `get_ancestors()`."
    )
    emit()
    targets: list[tuple[str, str, str, bool]] = []
    for nodes, forks in shapes:
        repeat, warmup = REPEATS.get(nodes, (9, 1))
        if args.quick:
            repeat, warmup = 3, 1
        targets += run_shape(nodes, forks, template, ours_db, repeat, warmup)
    emit("### paths.py targets")
    emit()
    emit(
        table(
            ["target", "measured", "limit", "met"],
            [(t, m, lim, "yes" if ok else "**no**") for t, m, lim, ok in targets],
        )
    )
    emit()
    emit(
        "Where a time target is missed while *SQL alone* meets it, the time goes to building the Django query and "
        "the model objects, not to the database: the path design holds, its Python does not (yet)."
    )
    emit()
    headline("paths", [[t, m, lim, "yes" if ok else "no"] for t, m, lim, ok in targets])


def reset_databases(template: Path, ours_db: Path) -> None:
    from django.db import connections

    from bench.contenders import models as cm

    connections.close_all()
    remove_sqlite(ours_db)
    ours_db.write_bytes(template.read_bytes())
    for alias in ("adjacency", "cte", "treebeard", "mptt"):
        remove_sqlite(Path(connections[alias].settings_dict["NAME"]))
        with connections[alias].schema_editor() as editor:
            editor.create_model(cm.NODE_MODELS[alias])
            editor.create_model(cm.CHECKPOINT_MODELS[alias])


# --- copying our tree into the contenders --------------------------------------------------------

CONTENT = [
    "kind", "player_input", "narration", "suggestions", "state_delta", "state_after", "checks",
    "model_name", "prompt_bytes", "prompt_stable_bytes", "created_at",
]  # fmt: skip


def copy_tree(adventure) -> None:
    from bench.contenders.models import AdjNode, MpNode, TbNode
    from stories.models import Node

    rows = list(
        Node.objects.filter(adventure=adventure).order_by("depth", "id").values("id", "parent_id", "depth", *CONTENT)
    )
    for alias in ("adjacency", "cte"):
        AdjNode.objects.using(alias).bulk_create(
            [
                AdjNode(
                    id=r["id"], story=STORY, parent_id=r["parent_id"], depth=r["depth"], **{k: r[k] for k in CONTENT}
                )
                for r in rows
            ],
            batch_size=500,
        )
    children: dict[int | None, list[int]] = {}
    for r in rows:
        children.setdefault(r["parent_id"], []).append(r["id"])
    by_id = {r["id"]: r for r in rows}

    # treebeard: each child's path is its parent's plus its 1-based position (what add_child writes).
    paths: dict[int, str] = {}
    tb = []
    for r in rows:
        if r["parent_id"] is None:
            path = TbNode._get_path(None, 1, 1)
        else:
            position = children[r["parent_id"]].index(r["id"]) + 1
            path = TbNode._get_path(paths[r["parent_id"]], r["depth"] + 1, position)
        paths[r["id"]] = path
        tb.append(
            TbNode(id=r["id"], story=STORY, path=path, depth=r["depth"] + 1, numchild=len(children.get(r["id"], [])),
                   **{k: r[k] for k in CONTENT})
        )  # fmt: skip
    TbNode.objects.bulk_create(tb, batch_size=500)

    # mptt: nested sets by an iterative depth-first walk (children in id order, as mptt appends them).
    lft: dict[int, int] = {}
    rght: dict[int, int] = {}
    counter = 1
    root = children[None][0]
    stack: list[tuple[int, bool]] = [(root, False)]
    while stack:
        node_id, done = stack.pop()
        if done:
            rght[node_id] = counter
            counter += 1
            continue
        lft[node_id] = counter
        counter += 1
        stack.append((node_id, True))
        for child in reversed(children.get(node_id, [])):
            stack.append((child, False))
    MpNode.objects.bulk_create(
        [
            MpNode(id=r["id"], story=STORY, parent_id=r["parent_id"], lft=lft[r["id"]], rght=rght[r["id"]], tree_id=1,
                   level=r["depth"], **{k: r[k] for k in CONTENT})
            for r in rows
        ],
        batch_size=500,
    )  # fmt: skip
    assert len(by_id) == len(lft)


# --- the operations --------------------------------------------------------------------------------


class Heads:
    """The head object each contender starts from (and moves by appending)."""

    def __init__(self, adventure) -> None:
        from bench.contenders.models import AdjNode, MpNode, TbNode
        from stories.models import Adventure, Node

        self.adventure = Adventure.objects.get(pk=adventure.pk)
        self.ours = Node.objects.select_related("branch").get(pk=self.adventure.head_id)
        self.adjacency = AdjNode.objects.using("adjacency").get(pk=self.ours.pk)
        self.cte = AdjNode.objects.using("cte").get(pk=self.ours.pk)
        self.treebeard = TbNode.objects.get(pk=self.ours.pk)
        self.mptt = MpNode.objects.get(pk=self.ours.pk)


def newest_ops(h: Heads) -> dict:
    from bench.contenders.models import AdjNode, TbNode
    from stories import paths

    def ours():
        return [n.pk for n in paths.newest(h.ours, WINDOW)]

    def adjacency():
        node = h.adjacency
        out = [node]
        while len(out) < WINDOW and node.parent_id is not None:
            node = AdjNode.objects.using("adjacency").get(pk=node.parent_id)
            out.append(node)
        return [n.pk for n in reversed(out)]

    def cte():
        sql = (
            "WITH RECURSIVE anc(id, parent_id) AS ("
            " SELECT id, parent_id FROM contenders_adjnode WHERE id = %s"
            " UNION ALL SELECT p.id, p.parent_id FROM contenders_adjnode p JOIN anc ON p.id = anc.parent_id"
            f" LIMIT {WINDOW})"
            " SELECT n.* FROM anc JOIN contenders_adjnode n ON n.id = anc.id ORDER BY n.depth"
        )
        return [n.pk for n in AdjNode.objects.using("cte").raw(sql, [h.cte.pk])]

    def treebeard():
        head = h.treebeard
        step = TbNode.steplen
        depth = head.depth
        prefixes = [head.path[: d * step] for d in range(max(1, depth - WINDOW + 1), depth + 1)]
        return [n.pk for n in TbNode.objects.filter(path__in=prefixes).order_by("depth")]

    def mptt():
        head = h.mptt
        qs = head.get_ancestors(include_self=True).filter(level__gt=head.level - WINDOW)
        return [n.pk for n in qs]

    return {"ours": ours, "adjacency": adjacency, "cte": cte, "treebeard": treebeard, "mptt": mptt}


def root_page_ops(h: Heads) -> dict:
    from bench.contenders.models import AdjNode, TbNode
    from stories import paths

    def ours():
        return [n.pk for n in paths.newest(h.ours, WINDOW, before_depth=WINDOW)]

    def adjacency():
        ids = []
        node_id, parent_id = h.adjacency.pk, h.adjacency.parent_id
        depth = h.adjacency.depth
        while True:
            if depth < WINDOW:
                ids.append(node_id)
            if parent_id is None:
                break
            node_id, parent_id, depth = (
                AdjNode.objects.using("adjacency").filter(pk=parent_id).values_list("id", "parent_id", "depth").get()
            )
        return [n.pk for n in AdjNode.objects.using("adjacency").filter(pk__in=ids).order_by("depth")]

    def cte():
        sql = (
            "WITH RECURSIVE anc(id, parent_id, depth) AS ("
            " SELECT id, parent_id, depth FROM contenders_adjnode WHERE id = %s"
            " UNION ALL SELECT p.id, p.parent_id, p.depth FROM contenders_adjnode p JOIN anc ON p.id = anc.parent_id"
            " LIMIT %s)"
            " SELECT n.* FROM anc JOIN contenders_adjnode n ON n.id = anc.id WHERE anc.depth < %s ORDER BY n.depth"
        )
        return [n.pk for n in AdjNode.objects.using("cte").raw(sql, [h.cte.pk, h.cte.depth + 1, WINDOW])]

    def treebeard():
        head = h.treebeard
        step = TbNode.steplen
        prefixes = [head.path[: d * step] for d in range(1, min(WINDOW, head.depth) + 1)]
        return [n.pk for n in TbNode.objects.filter(path__in=prefixes).order_by("depth")]

    def mptt():
        return [n.pk for n in h.mptt.get_ancestors(include_self=True).filter(level__lt=WINDOW)]

    return {"ours": ours, "adjacency": adjacency, "cte": cte, "treebeard": treebeard, "mptt": mptt}


def nearest_ops(h: Heads) -> dict:
    from django.db.models import F, Value
    from django.db.models.functions import Length, Substr

    from bench.contenders.models import AdjCheckpoint, MpCheckpoint, TbCheckpoint
    from checkpoints.models import ContextCheckpoint
    from stories import paths

    def ours():
        queryset = ContextCheckpoint.objects.filter(adventure=h.adventure, host_node__live=True)
        return paths.nearest(queryset, h.ours).host_node_id

    def adjacency():
        from bench.contenders.models import AdjNode

        hosts = set(AdjCheckpoint.objects.using("adjacency").filter(story=STORY).values_list("host_id", flat=True))
        node_id, parent_id = h.adjacency.pk, h.adjacency.parent_id
        while node_id not in hosts:
            if parent_id is None:
                return None
            node_id, parent_id = (
                AdjNode.objects.using("adjacency").filter(pk=parent_id).values_list("id", "parent_id").get()
            )
        return AdjCheckpoint.objects.using("adjacency").get(host_id=node_id).host_id

    def cte():
        sql = (
            "WITH RECURSIVE anc(id, parent_id, cp) AS ("
            " SELECT n.id, n.parent_id, (SELECT c.id FROM contenders_adjcheckpoint c WHERE c.host_id = n.id)"
            " FROM contenders_adjnode n WHERE n.id = %s"
            " UNION ALL SELECT p.id, p.parent_id, (SELECT c.id FROM contenders_adjcheckpoint c WHERE c.host_id = p.id)"
            " FROM contenders_adjnode p JOIN anc ON p.id = anc.parent_id WHERE anc.cp IS NULL)"
            " SELECT c.* FROM anc JOIN contenders_adjcheckpoint c ON c.id = anc.cp LIMIT 1"
        )
        rows = list(AdjCheckpoint.objects.using("cte").raw(sql, [h.cte.pk]))
        return rows[0].host_id if rows else None

    def treebeard():
        head = h.treebeard
        row = (
            TbCheckpoint.objects.filter(story=STORY)
            .alias(prefix=Substr(Value(head.path), 1, Length("host__path")))
            .filter(host__path=F("prefix"))
            .order_by("-host__depth")
            .first()
        )
        return row.host_id if row else None

    def mptt():
        head = h.mptt
        row = (
            MpCheckpoint.objects.filter(
                story=STORY, host__tree_id=head.tree_id, host__lft__lte=head.lft, host__rght__gte=head.rght
            )
            .order_by("-host__level")
            .first()
        )
        return row.host_id if row else None

    return {"ours": ours, "adjacency": adjacency, "cte": cte, "treebeard": treebeard, "mptt": mptt}


def append_ops(h: Heads) -> dict:
    from bench.contenders.models import AdjNode, MpNode, TbNode
    from stories import tree
    from stories.synthetic import _text

    def content(depth: int) -> dict:
        return {
            "kind": "do",
            "player_input": f"Action {depth}",
            "narration": _text(depth, 1000),
            "suggestions": ["Look around", "Press on"],
            "state_delta": [{"op": "adjust_relationship", "npc": "Maren", "by": 1}],
            "state_after": {"flags": {}, "relationships": {"Maren": 1}, "inventory": [], "facts": []},
            "checks": [],
            "model_name": "storytree-builtin",
        }

    def ours():
        head = h.ours
        h.ours = tree.node_append(
            adventure=h.adventure, expected_version=h.adventure.version, **content(head.depth + 1)
        )

    def adjacency():
        head = h.adjacency
        h.adjacency = AdjNode.objects.using("adjacency").create(
            story=STORY, parent=head, depth=head.depth + 1, **content(head.depth + 1)
        )

    def cte():
        head = h.cte
        h.cte = AdjNode.objects.using("cte").create(
            story=STORY, parent=head, depth=head.depth + 1, **content(head.depth + 1)
        )

    def treebeard():
        head = h.treebeard
        h.treebeard = TbNode.objects.add_child(head, {"story": STORY, **content(head.depth)})

    def mptt():
        head = h.mptt
        h.mptt = MpNode.objects.create(story=STORY, parent=head, **content(head.level + 1))

    return {"ours": ours, "adjacency": adjacency, "cte": cte, "treebeard": treebeard, "mptt": mptt}


ALIAS_OF = {"ours": "default", "adjacency": "adjacency", "cte": "cte", "treebeard": "treebeard", "mptt": "mptt"}


def place_checkpoints(h: Heads, gap: int) -> int:
    """Delete every checkpoint, then: the nearest on the path `gap` above the head, one every
    BACKGROUND_EVERY depths below it, and a decoy on every node off the path (the abandoned
    attempts at each fork, which share depths with the path). Returns the nearest host's id."""
    from bench.contenders.models import AdjCheckpoint, MpCheckpoint, TbCheckpoint
    from checkpoints.models import ContextCheckpoint
    from stories import paths
    from stories.models import Node

    head = h.ours
    target = head.depth - gap
    path_ids = {n.depth: n.pk for n in paths.iter_path(head)}
    on_path = set(path_ids.values())
    hosts = [path_ids[target]] + [path_ids[d] for d in range(0, target, BACKGROUND_EVERY) if d > 0]
    decoys = list(Node.objects.filter(adventure=h.adventure).exclude(pk__in=on_path).values_list("pk", flat=True))
    every = hosts + decoys
    nodes = {n.pk: n for n in Node.objects.filter(pk__in=every)}

    ContextCheckpoint.objects.all().delete()
    ContextCheckpoint.objects.bulk_create(
        [
            ContextCheckpoint(
                adventure=h.adventure, host_node_id=pk, branch_id=nodes[pk].branch_id, depth=nodes[pk].depth,
                covered_through_id=nodes[pk].parent_id, covered_depth=nodes[pk].depth - 1, retained_from_id=pk,
                checkpoint_schema_version=1, prompt_schema_version=3, stable_prefix_hash="0" * 64,
                summary_json={"summary": SUMMARY, "key_points": []}, source_hash="0" * 64,
                model_name="builtin:-", summary_bytes=len(SUMMARY),
            )
            for pk in every
        ]
    )  # fmt: skip
    for alias, model in (
        ("adjacency", AdjCheckpoint),
        ("cte", AdjCheckpoint),
        ("treebeard", TbCheckpoint),
        ("mptt", MpCheckpoint),
    ):
        model.objects.using(alias).all().delete()
        model.objects.using(alias).bulk_create([model(story=STORY, host_id=pk, summary=SUMMARY) for pk in every])
    return path_ids[target]


def append_breakdown(statements) -> str:
    """One line per statement of our append: what it is and, for a read, what it costs alone."""
    import re

    lines = []
    for sql, params, _many in statements:
        head = " ".join(sql.split())
        verb = head.split(" ", 1)[0].upper()
        table_name = re.search(r'(?:FROM|INTO|UPDATE) "([a-z_]+)"', head)
        what = f"{verb} {table_name.group(1) if table_name else ''}".strip()
        if "COUNT(*)" in head:
            what += " COUNT(*) (the node cap)"
        cost = ""
        if verb == "SELECT":
            replay = replayer("default", [(sql, params, False)])
            cost = " — " + fmt_ms(median(interleaved({"q": replay}, repeat=25, warmup=3)["q"]))
        elif verb == "BEGIN":
            what = head
        lines.append(f"- `{what}`{cost}")
    return "\n".join(lines)


def run_shape(nodes: int, forks: int, template: Path, ours_db: Path, repeat: int, warmup: int) -> list:
    from stories.synthetic import build_story

    progress(f"paths: building {nodes:,} nodes / {forks} forks")
    reset_databases(template, ours_db)
    adventure = build_story(nodes=nodes, forks=forks, bytes_per_node=1000)
    copy_tree(adventure)
    for alias in ALIAS_OF.values():
        checkpoint_and_vacuum(alias)
    sizes = {
        "ours": table_bytes("default", ["stories_node", "stories_branch"]),
        "adjacency": table_bytes("adjacency", ["contenders_adjnode"]),
        "cte": table_bytes("cte", ["contenders_adjnode"]),
        "treebeard": table_bytes("treebeard", ["contenders_tbnode"]),
        "mptt": table_bytes("mptt", ["contenders_mpnode"]),
    }
    h = Heads(adventure)
    depth = h.ours.depth

    results: dict[str, dict[str, tuple[float, int]]] = {}
    sql_only: dict[str, dict[str, float]] = {}
    walk_limit = {"adjacency": min(repeat, SLOW_WALK_RUNS.get(nodes, 5))}

    def measure(label: str, ops: dict) -> None:
        answers, statements = {}, {}
        for name, fn in ops.items():
            statements[name], answers[name] = record_sql(ALIAS_OF[name], fn)
        for name, answer in answers.items():
            if answer != answers["ours"]:
                raise SystemExit(
                    f"{label}: {name} answered {str(answer)[:200]} where ours answered {str(answers['ours'])[:200]}"
                )
        progress(f"paths: {nodes:,} nodes: {label}")
        times = interleaved(ops, repeat=repeat, warmup=warmup, seed=nodes, limit=walk_limit)
        results[label] = {name: (median(times[name]), len(statements[name])) for name in ops}
        replays = {name: replayer(ALIAS_OF[name], statements[name]) for name in ops}
        times = interleaved(replays, repeat=repeat, warmup=warmup, seed=nodes + 2, limit=walk_limit)
        sql_only[label] = {name: median(times[name]) for name in ops}

    measure(f"newest {WINDOW}", newest_ops(h))
    measure(f"page of {WINDOW} at the root", root_page_ops(h))
    for gap in GAPS:
        if depth < gap:
            continue
        place_checkpoints(h, gap)
        measure(f"nearest checkpoint {gap:,} above", nearest_ops(h))

    # Appending moves every head; the counting run appends one node too.
    appends = append_ops(h)
    queries = {}
    append_sql = []
    for name, fn in appends.items():
        statements, _ = record_sql(ALIAS_OF[name], fn)
        queries[name] = len(statements)
        if name == "ours":
            append_sql = statements
    progress(f"paths: {nodes:,} nodes: append")
    times = interleaved(appends, repeat=repeat, warmup=warmup, seed=nodes + 1)
    results["append one node at the head"] = {name: (median(times[name]), queries[name]) for name in appends}

    emit(
        f"### {nodes:,} nodes, {forks} forks (head at depth {depth:,}; median of {repeat} runs after {warmup} warm-up; "
        f"the per-node walk's reads: {walk_limit['adjacency']} runs)"
    )
    emit()
    headers = ["operation", *[LABELS[c] for c in CONTENDERS]]
    rows = []
    for label, per in results.items():
        rows.append([label, *[f"{fmt_ms(per[c][0])} · {per[c][1]} q" for c in CONTENDERS]])
    rows.append(["database size (node tables + indexes)", *[fmt_bytes(sizes[c]) for c in CONTENDERS]])
    emit(table(headers, rows))
    emit()
    emit("**ours ÷ theirs** (time, or bytes for size; below 1 = we are faster / smaller):")
    emit()
    rows = []
    for label, per in results.items():
        rows.append([label, *[fmt_ratio(per["ours"][0] / per[c][0]) for c in CONTENDERS[1:]]])
    rows.append(["database size", *[fmt_ratio(sizes["ours"] / sizes[c]) for c in CONTENDERS[1:]]])
    emit(table(["operation", *[LABELS[c] for c in CONTENDERS[1:]]], rows))
    emit()
    emit(
        "Diagnosis: the same read statements replayed on a plain cursor (no query building, no model objects), "
        "median time, and ours ÷ theirs at that level:"
    )
    emit()
    rows = []
    for label, per in sql_only.items():
        rows.append(
            [label, *[fmt_ms(per[c]) for c in CONTENDERS], *[fmt_ratio(per["ours"] / per[c]) for c in CONTENDERS[1:]]]
        )
    emit(table(["SQL only", *[LABELS[c] for c in CONTENDERS], *[f"÷ {c}" for c in CONTENDERS[1:]]], rows))
    emit()

    emit(f"Our append's {len(append_sql)} statements (`tree.node_append`), each read replayed alone (median of 25):")
    emit()
    emit(append_breakdown(append_sql))
    emit()

    targets = []
    shape = f"{nodes:,}/{forks}"
    label = f"newest {WINDOW}"
    ratio = results[label]["ours"][0] / results[label]["cte"][0]
    sql_ratio = sql_only[label]["ours"] / sql_only[label]["cte"]
    targets.append(
        (
            f"newest window ≤ 1.3× the recursive CTE ({shape})",
            f"{fmt_ratio(ratio)} (SQL alone {fmt_ratio(sql_ratio)})",
            "≤ 1.30×",
            ratio <= 1.3,
        )
    )
    if nodes >= 10_000:
        for label in (f"page of {WINDOW} at the root", f"nearest checkpoint {GAPS[1]:,} above"):
            if label in results:
                speedup = results[label]["cte"][0] / results[label]["ours"][0]
                sql_speedup = sql_only[label]["cte"] / sql_only[label]["ours"]
                targets.append(
                    (
                        f"{label}: ≥ 10× faster than the CTE ({shape})",
                        f"{fmt_ratio(speedup)} faster (SQL alone {fmt_ratio(sql_speedup)})",
                        "≥ 10×",
                        speedup >= 10,
                    )
                )
    append = results["append one node at the head"]
    ratio = append["ours"][0] / append["adjacency"][0]
    targets.append((f"append ≤ 1.5× a plain adjacency insert ({shape})", fmt_ratio(ratio), "≤ 1.50×", ratio <= 1.5))
    ratio = sizes["ours"] / sizes["adjacency"]
    targets.append((f"size ≤ 1.2× the adjacency list ({shape})", fmt_ratio(ratio), "≤ 1.20×", ratio <= 1.2))
    return targets


if __name__ == "__main__":
    main()
