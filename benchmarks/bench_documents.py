"""Read-and-chunk speed and memory of documents.py on a long PDF (embedding excluded).

    python benchmarks/bench_documents.py                 # a synthetic 500-page opinion PDF
    python benchmarks/bench_documents.py --pages 100     # a shorter one
    python benchmarks/bench_documents.py --pdf FILE.pdf  # your own file
    python benchmarks/bench_documents.py --json          # machine-readable

The synthetic PDF (fpdf2, written to a temporary folder and not timed) is what ``load_corpus.py
docs`` meets in a long opinion: a caption page, then pages of paragraphs from Terry v. Ohio and
28 U.S.C. § 1441 (public domain) with star-paging markers, a running head and page numbers.  The
run reads it (pypdf text extraction with the hidden-text visitors, paragraphs, metadata) and
chunks it with the default window (240 estimated tokens, 40 overlap) three times: cold (the
first file of a process: imports, eyecite and courts-db tables), warm (timed: what each further
file costs) and under tracemalloc (the peak of Python allocations).  Peak resident memory (VmHWM) is reported
beside it.  Results are also written to benchmarks/results/bench_documents.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import peak_rss_mb, printer, save

import documents

PARAGRAPHS = [
    "This case presents serious questions concerning the role of the Fourth Amendment in the "
    "confrontation on the street between the citizen and the policeman investigating suspicious "
    "circumstances.",
    "The Fourth Amendment provides that the right of the people to be secure in their persons, "
    "houses, papers, and effects, against unreasonable searches and seizures, shall not be "
    "violated. This inestimable right of personal security belongs as much to the citizen on the "
    "streets of our cities as to the homeowner closeted in his study to dispose of his secret "
    "affairs.",
    "We have recently held that the Fourth Amendment protects people, not places, and wherever an "
    "individual may harbor a reasonable expectation of privacy, he is entitled to be free from "
    "unreasonable governmental intrusion. Of course, the specific content and incidents of this "
    "right must be shaped by the context in which it is asserted.",
    "Except as otherwise expressly provided by Act of Congress, any civil action brought in a "
    "State court of which the district courts of the United States have original jurisdiction, "
    "may be removed by the defendant or the defendants, to the district court of the United "
    "States for the district and division embracing the place where such action is pending.",
    "A civil action otherwise removable solely on the basis of the jurisdiction under section "
    "1332(a) of this title may not be removed if any of the parties in interest properly joined "
    "and served as defendants is a citizen of the State in which such action is brought.",
    "The officer must be able to point to specific and articulable facts which, taken together "
    "with rational inferences from those facts, reasonably warrant that intrusion. And in making "
    "that assessment it is imperative that the facts be judged against an objective standard: "
    "would the facts available to the officer at the moment of the seizure or the search warrant "
    "a man of reasonable caution in the belief that the action taken was appropriate?",
]


def write_pdf(path: Path, pages: int) -> None:
    """A synthetic opinion of ``pages`` pages (see the module docstring)."""
    from fpdf import FPDF

    class Opinion(FPDF):
        def header(self) -> None:
            if self.page_no() > 1:
                self.set_font("Helvetica", size=8)
                self.cell(0, 5, "Cite as: 392 U.S. 1 (1968)", new_x="LMARGIN", new_y="NEXT")
                self.ln(2)

        def footer(self) -> None:
            self.set_y(-15)
            self.set_font("Helvetica", size=8)
            self.cell(0, 5, str(self.page_no()), align="C")

    pdf = Opinion()
    pdf.set_font("Helvetica", size=11)
    pdf.add_page()
    for line in (
        "SUPREME COURT OF THE UNITED STATES",
        "TERRY v. OHIO, 392 U.S. 1 (1968)",
        "Argued December 12, 1967. Decided June 10, 1968.",
        "MR. CHIEF JUSTICE WARREN delivered the opinion of the Court.",
    ):
        pdf.multi_cell(0, 6, line, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
    n = 0
    while pdf.page_no() < pages:
        text = PARAGRAPHS[n % len(PARAGRAPHS)]
        if n % 4 == 3:  # a star-paging marker every few paragraphs
            text = text.replace(". ", f". *{2 + n // 4} ", 1)
        pdf.multi_cell(0, 6, text, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
        n += 1
    pdf.output(str(path))


def read_and_chunk(path: Path) -> tuple[documents.Document, list[dict[str, Any]], dict[str, float]]:
    t0 = time.perf_counter()
    doc = documents.read_document(path)
    t1 = time.perf_counter()
    chunks = documents.chunk_document(doc)
    t2 = time.perf_counter()
    return doc, chunks, {"read_s": t1 - t0, "chunk_s": t2 - t1}


def run(args: argparse.Namespace, say: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_documents_") as tmp:
        if args.pdf:
            path = Path(args.pdf)
        else:
            path = Path(tmp) / f"opinion_{args.pages}p.pdf"
            t0 = time.perf_counter()
            write_pdf(path, args.pages)
            say(f"wrote {path.name} ({path.stat().st_size / 2**20:.1f} MB) in "
                f"{time.perf_counter() - t0:.1f} s (not timed below)")  # fmt: skip
        rss_before = peak_rss_mb()
        t0 = time.perf_counter()
        read_and_chunk(path)  # cold: imports, eyecite and courts-db tables, pypdf's fonts
        cold = time.perf_counter() - t0
        doc, chunks, times = read_and_chunk(path)  # warm: what each further file costs
        rss_after = peak_rss_mb()
        tracemalloc.start()
        read_and_chunk(path)
        _, py_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        pages = doc.pages or 0
        total = times["read_s"] + times["chunk_s"]
        tokens = [documents.estimate_tokens(c["text"]) for c in chunks]
        return {
            "file": str(path) if args.pdf else f"synthetic {args.pages}-page opinion PDF",
            "bytes": path.stat().st_size,
            "pages": pages,
            "kind": doc.kind,
            "authority": {k: doc.meta.get(k) for k in ("citation", "court", "date")},
            "blocks": len(doc.blocks),
            "chunks": len(chunks),
            "chunk_tokens_mean": round(sum(tokens) / max(len(tokens), 1), 1),
            "chunk_tokens_max": max(tokens, default=0),
            "star_pinned": sum(c.get("pin", "").startswith("*") for c in chunks),
            "read_s": round(times["read_s"], 2),
            "chunk_s": round(times["chunk_s"], 2),
            "seconds": round(total, 2),
            "cold_seconds": round(cold, 2),
            "pages_per_s": round(pages / total, 1) if total else None,
            "tracemalloc_peak_mb": round(py_peak / 2**20, 1),
            "peak_rss_mb": round(rss_after, 1),
            "rss_growth_mb": round(rss_after - rss_before, 1),
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pages", type=int, default=500, help="pages of the synthetic PDF (500)")
    p.add_argument("--pdf", help="benchmark this PDF instead of a synthetic one")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    args = p.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.ERROR)  # pypdf's warnings on odd files are not results

    say = printer(args.json)
    try:
        result = run(args, say)
    except documents.DocumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.no_save:
        save("bench_documents", result)
    if args.json:
        print(json.dumps(result, indent=2))
    say(
        f"{result['file']}: {result['pages']} pages, {result['blocks']} paragraphs -> "
        f"{result['chunks']} chunks ({result['kind']}; mean {result['chunk_tokens_mean']} tokens, "
        f"max {result['chunk_tokens_max']}; {result['star_pinned']} pinned to a star page)"
    )
    say(
        f"read {result['read_s']} s + chunk {result['chunk_s']} s = {result['seconds']} s "
        f"({result['pages_per_s']} pages/s); the first file of a process "
        f"{result['cold_seconds']} s (imports and tables)"
    )
    say(
        f"memory: tracemalloc peak {result['tracemalloc_peak_mb']} MB; peak RSS "
        f"{result['peak_rss_mb']} MB (+{result['rss_growth_mb']} MB while reading)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
