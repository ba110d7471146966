"""Probe: does fine-tuning the bundled MiniLM on bar questions lift dense recall on held-out ones?

Two folds over barexam_dev: fine-tune on the (question, gold passage) pairs of one half (in-batch
negatives, symmetric InfoNCE, linear warm-up and decay), then score dense Recall@10 with the
question alone on the other half, exact search over the whole corpus, with and without centring on
the corpus mean (the product's default). The base model is scored the same way, so each fold is a
paired before/after on questions the training never saw.

Needs torch and sentence-transformers (``make setup``) and ``../shared/data``. It only measures: the
product ships the model as it comes. Results are in the README ("Measured here").

    python benchmarks/probe_finetune.py              # both folds, 3 epochs, lr 2e-5, batch 8
    python benchmarks/probe_finetune.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import eval_common as ec  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"


def recall_at_10(model: Any, passages: list[dict], items: list[dict]) -> dict[str, list[bool]]:
    """Per item: is its gold passage in the top 10, by plain and by centred cosine."""
    import numpy as np

    pv = model.encode([p["text"] for p in passages], batch_size=32, normalize_embeddings=True)
    qv = model.encode(
        [ec.item_question(q) for q in items], batch_size=16, normalize_embeddings=True
    )
    row = {str(p["idx"]): i for i, p in enumerate(passages)}
    gold = np.asarray([row[ec.gold_ids(q)[0]] for q in items])
    out: dict[str, list[bool]] = {}
    for name, shift in (("plain", 0.0), ("centred", 1.0)):
        scores = (qv - shift * pv.mean(axis=0)) @ pv.T
        better = (scores > scores[np.arange(len(items)), gold][:, None]).sum(axis=1)
        out[name] = (better < 10).tolist()
    return out


def fine_tune(
    model: Any, pairs: list[tuple[str, str]], epochs: int, lr: float, batch: int
) -> float:
    """In-batch-negative fine-tuning of ``model`` on (query, passage) pairs; returns seconds."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    steps = epochs * -(-len(pairs) // batch)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * max(0.0, 1 - i / steps)
    )

    def encode(texts: list[str]) -> Any:
        tokenize = getattr(model, "preprocess", None) or model.tokenize
        features = tokenize(texts)
        return F.normalize(model(features)["sentence_embedding"], dim=-1)

    model.train()
    start = time.perf_counter()
    rng = random.Random(0)
    for _ in range(epochs):
        rng.shuffle(pairs)
        for b in range(0, len(pairs), batch):
            chunk = pairs[b : b + batch]
            if len(chunk) < 2:
                continue
            sim = encode([q for q, _ in chunk]) @ encode([p for _, p in chunk]).T * 20.0
            labels = torch.arange(len(chunk))
            loss = (F.cross_entropy(sim, labels) + F.cross_entropy(sim.T, labels)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)

    passages_path = SHARED / "corpus" / "passages.jsonl"
    qa_path = SHARED / "qa" / "barexam_dev.jsonl"
    if not passages_path.exists() or not qa_path.exists():
        print(f"needs {passages_path} and {qa_path}", file=sys.stderr)
        return 2
    import torch
    from sentence_transformers import SentenceTransformer

    import rag_utils

    torch.manual_seed(0)
    passages = [json.loads(line) for line in passages_path.open(encoding="utf-8")]
    items = ec.load_qa(qa_path)
    text = {str(p["idx"]): p["text"] for p in passages}

    def load() -> Any:
        model = SentenceTransformer(str(rag_utils.default_model_path()), device="cpu")
        model.max_seq_length = 256
        return model

    with torch.no_grad():
        base = recall_at_10(load(), passages, items)
    folds = []
    for train_half in (0, 1):
        train = [q for i, q in enumerate(items) if i % 2 == train_half]
        held = [i for i in range(len(items)) if i % 2 != train_half]
        pairs = [(ec.item_question(q), text[ec.gold_ids(q)[0]]) for q in train]
        model = load()
        seconds = fine_tune(model, pairs, args.epochs, args.lr, args.batch_size)
        with torch.no_grad():
            tuned = recall_at_10(model, passages, items)
        fold: dict[str, Any] = {"train": "even" if train_half == 0 else "odd", "pairs": len(pairs)}
        fold["train_seconds"] = round(seconds, 1)
        for name in ("plain", "centred"):
            before = [base[name][i] for i in held]
            after = [tuned[name][i] for i in held]
            fold[name] = {
                "held_out_before": round(sum(before) / len(held), 3),
                "held_out_after": round(sum(after) / len(held), 3),
                "gained": sum(a and not b for a, b in zip(after, before, strict=True)),
                "lost": sum(b and not a for a, b in zip(after, before, strict=True)),
            }
        folds.append(fold)
    result = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "folds": folds}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"dense Recall@10 on the held-out half (question alone, {len(items)} items)")
    for f in folds:
        for name in ("plain", "centred"):
            r = f[name]
            print(
                f"train {f['train']:4} ({f['pairs']} pairs, {f['train_seconds']} s)  {name:7} "
                f"{r['held_out_before']:.3f} -> {r['held_out_after']:.3f} "
                f"(+{r['gained']} / -{r['lost']})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
