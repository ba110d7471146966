"""Citation extraction: eyecite (legal_graph.py) against the hand-written extractor it replaced.

    python benchmarks/bench_citations.py [--passages FILE] [--old-rev REV] [--sample 50]
                                         [--seed 26] [--json]

Both extractors read every passage the way the graph load does (title + text, the source and
title as the rule-family hint). The old extractor is ``legal_graph.py`` of ``--old-rev`` (default
OLD_REV, the last commit with the hand-written extractor), read with ``git show`` and loaded as a
module: no copy of the old code is kept.

Reports citations (every reference, a resolved "Id." included) and distinct authorities by kind
(case, statute, rule, constitution), passages with at least one citation, the agreement of the two
per passage and kind, the forms eyecite found, and a seeded random sample of the new extractor's
citations with the text around each, [[marked]], for checking by hand (docs/CITATIONS.md).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import types
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import legal_graph as lg  # noqa: E402
import load_corpus  # noqa: E402

DEFAULT_PASSAGES = REPO.parent / "shared" / "data" / "corpus" / "passages.jsonl"
KINDS = ("case", "statute", "rule", "constitution")
OLD_REV = "ad8fe2f"
"""The last commit whose legal_graph.py finds every citation with hand-written patterns."""


def load_old(rev: str) -> types.ModuleType:
    """``legal_graph.py`` as it was at ``rev``, imported under another name."""
    try:
        src = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:legal_graph.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"cannot read legal_graph.py at {rev!r} with git: {exc}")
    mod = types.ModuleType("legal_graph_old")
    mod.__file__ = str(REPO / "legal_graph.py")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, f"{rev}:legal_graph.py", "exec"), mod.__dict__)
    return mod


def compare_key(auth: Any) -> str:
    """A key under which the old and new extractors' authorities can be compared: U.S.C.
    sections by title and section, cases by the last word of the first party and the first word
    of the second (the old extractor keyed cases by name, eyecite by reporter citation)."""
    if auth.kind == "case":
        if " v. " not in auth.name:
            return f"case-cite:{auth.id}"
        left, right = auth.name.split(" v. ", 1)
        lw, rw = lg.tokens(left), lg.tokens(right)
        return f"case:{lw[-1] if lw else ''} v {rw[0] if rw else ''}"
    if auth.id.startswith("usc:"):
        _, title, section = auth.id.split(":", 2)
        return f"usc:{title}:{section}"
    if " U.S.C. § " in auth.id:
        title, section = auth.id.split(" U.S.C. § ", 1)
        return f"usc:{title}:{section}"
    return auth.id


def body_of(p: dict[str, Any]) -> tuple[str, str]:
    title = str(p.get("title") or "")
    text = str(p.get("text") or "")
    return (f"{title}\n{text}" if title else text), f"{p.get('source') or ''} {title}"


def eyecite_forms(body: str) -> Counter[str]:
    from eyecite import get_citations

    return Counter(type(c).__name__ for c in get_citations(body))


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.passages.exists():
        sys.exit(f"no passages file at {args.passages}: pass --passages FILE (JSONL)")
    old = load_old(args.old_rev)
    passages = [rec for _, rec in load_corpus.iter_rows(args.passages)]
    found: dict[str, dict[str, list]] = {"old": {}, "new": {}}
    seconds = {"old": 0.0, "new": 0.0}
    forms: Counter[str] = Counter()
    for p in passages:
        body, context = body_of(p)
        pid = lg.passage_id(p)
        t = time.perf_counter()
        found["old"][pid] = [(0, 0, a, c) for a, c in old.extract_authorities(body, context)]
        seconds["old"] += time.perf_counter() - t
        t = time.perf_counter()
        found["new"][pid] = lg.locate_authorities(body, context)
        seconds["new"] += time.perf_counter() - t
        forms.update(eyecite_forms(body))
    report: dict[str, Any] = {
        "passages_file": str(args.passages),
        "passages": len(passages),
        "old_rev": args.old_rev,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "eyecite_forms": dict(forms.most_common()),
    }
    for side in ("old", "new"):
        report[side] = summarize(found[side])
    report["agreement"] = agreement(found["old"], found["new"])
    report["sample_seed"] = args.seed
    report["sample"] = sample(passages, found["new"], args.sample, args.seed)
    return report


def summarize(by_passage: dict[str, list]) -> dict[str, Any]:
    cites: Counter[str] = Counter()
    authorities: dict[str, set[str]] = defaultdict(set)
    passages: Counter[str] = Counter()
    for items in by_passage.values():
        kinds = set()
        for _, _, auth, _ in items:
            kind = auth.kind if auth.kind in KINDS else "other"
            cites[kind] += 1
            authorities[kind].add(auth.id)
            kinds.add(kind)
        passages.update(kinds)
    return {
        "citations": {k: cites[k] for k in (*KINDS, "other") if cites[k] or k in KINDS},
        "citations_total": sum(cites.values()),
        "authorities": {k: len(authorities[k]) for k in KINDS},
        "passages_with_citation": sum(bool(v) for v in by_passage.values()),
        "passages_with_kind": {k: passages[k] for k in KINDS},
    }


def agreement(old: dict[str, list], new: dict[str, list]) -> dict[str, Any]:
    """Per kind: (passage, authority) pairs both extractors find, only the old, only the new,
    and their Jaccard overlap (cases and U.S.C. sections compared by :func:`compare_key`)."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        a = {(pid, compare_key(x[2])) for pid, v in old.items() for x in v if x[2].kind == kind}
        b = {(pid, compare_key(x[2])) for pid, v in new.items() for x in v if x[2].kind == kind}
        union = len(a | b) or 1
        out[kind] = {
            "both": len(a & b),
            "old_only": len(a - b),
            "new_only": len(b - a),
            "jaccard": round(len(a & b) / union, 3),
        }
    return out


def sample(
    passages: list[dict[str, Any]], new: dict[str, list], n: int, seed: int
) -> list[dict[str, Any]]:
    """``n`` of the new extractor's citations, drawn with ``seed``, each with its context."""
    bodies = {lg.passage_id(p): body_of(p)[0] for p in passages}
    every = [(pid, item) for pid in sorted(new) for item in new[pid]]
    picked = random.Random(seed).sample(every, min(n, len(every)))
    rows = []
    for pid, (start, end, auth, cite) in picked:
        body = bodies[pid]
        before = " ".join(body[max(0, start - 160) : start].split())
        after = " ".join(body[end : end + 60].split())
        rows.append(
            {
                "passage": pid,
                "kind": auth.kind,
                "id": auth.id,
                "name": auth.name,
                "cite": cite,
                "context": f"...{before} [[{' '.join(body[start:end].split())}]] {after}...",
            }
        )
    return rows


def print_human(r: dict[str, Any]) -> None:
    print(f"{r['passages']} passages from {r['passages_file']} (old extractor: {r['old_rev']})")
    print(f"seconds: old {r['seconds']['old']}, new {r['seconds']['new']}")
    print(f"{'':24}{'old':>8}{'new':>8}")
    for kind in KINDS:
        print(
            f"citations {kind:14}{r['old']['citations'][kind]:>8}{r['new']['citations'][kind]:>8}"
        )
    print(f"{'citations total':24}{r['old']['citations_total']:>8}{r['new']['citations_total']:>8}")
    for kind in KINDS:
        o, n = r["old"]["authorities"][kind], r["new"]["authorities"][kind]
        print(f"authorities {kind:12}{o:>8}{n:>8}")
    o, n = r["old"]["passages_with_citation"], r["new"]["passages_with_citation"]
    print(f"{'passages with >=1':24}{o:>8}{n:>8}")
    for kind in KINDS:
        o, n = r["old"]["passages_with_kind"][kind], r["new"]["passages_with_kind"][kind]
        print(f"  with {kind:18}{o:>8}{n:>8}")
    print("agreement per (passage, authority):  both  old-only  new-only  jaccard")
    for kind, a in r["agreement"].items():
        print(f"  {kind:14}{a['both']:>18}{a['old_only']:>10}{a['new_only']:>10}{a['jaccard']:>9}")
    print("eyecite forms:", ", ".join(f"{k} {v}" for k, v in r["eyecite_forms"].items()))
    print(f"\nsample of {len(r['sample'])} citations (seed {r['sample_seed']}):")
    for i, s in enumerate(r["sample"], 1):
        print(f"{i:2}. [{s['kind']}] {s['id']} | {s['name']} | as written: {s['cite']}")
        print(f"    {s['passage']}: {s['context']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--passages",
        type=Path,
        default=DEFAULT_PASSAGES,
        help="passages JSONL (default: ../shared/data/corpus/passages.jsonl beside the repo)",
    )
    ap.add_argument(
        "--old-rev", default=OLD_REV, help=f"git revision of the old extractor ({OLD_REV})"
    )
    ap.add_argument("--sample", type=int, default=50, help="citations to sample for hand checks")
    ap.add_argument("--seed", type=int, default=26, help="seed of the sample")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print_human(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
