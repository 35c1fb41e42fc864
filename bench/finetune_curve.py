#!/usr/bin/env python3
"""The curve of a `sparq finetune --log FILE.csv` run: training loss (each step, and its mean over
a window of steps) and each --eval-text's perplexity against trained tokens; prints the points of
the curve with the wall time each was reached at.

usage: finetune_curve.py LOG.csv OUT.png|OUT.svg [--title TEXT] [--ref NAME=PERPLEXITY ...]

--ref draws a horizontal line per reference (e.g. the dense model's perplexity on that text) and
prints each point's ratio to the reference of the same text name. A text's name is its file name
without folders, or the whole --eval-text path where two texts share one.
"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    steps, points = [], []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["kind"] == "step":
                steps.append((int(r["tokens"]), float(r["loss"])))
            elif r["kind"] == "eval":
                points.append((int(r["step"]), int(r["tokens"]), float(r["seconds"]), r["text"],
                               float(r["perplexity"])))
    return steps, points


def short_names(texts):
    base = {t: os.path.basename(t) for t in texts}
    clash = len(set(base.values())) < len(base)
    return {t: (t if clash else base[t]) for t in texts}


def clock(seconds):
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def main(argv):
    args, title, refs = [], None, {}
    i = 0
    while i < len(argv):
        if argv[i] == "--title":
            title = argv[i + 1]
            i += 2
        elif argv[i] == "--ref":
            name, _, value = argv[i + 1].partition("=")
            refs[name] = float(value)
            i += 2
        else:
            args.append(argv[i])
            i += 1
    if len(args) != 2:
        sys.exit(__doc__)
    steps, points = read(args[0])
    if not steps and not points:
        sys.exit(f"{args[0]}: no rows (is it a `sparq finetune --log` file?)")
    texts = []
    for p in points:
        if p[3] not in texts:
            texts.append(p[3])
    names = short_names(texts)
    print(f"{args[0]}: {len(steps)} steps, {len(points)} points of the curve")
    print("| step | tokens | wall time | " + " | ".join(names[t] for t in texts) + " |")
    print("|---|---|---|" + "---|" * len(texts))
    by_step = {}
    for step, tokens, sec, text, ppl in points:
        by_step.setdefault((step, tokens), {})[text] = (ppl, sec)
    for (step, tokens), row in sorted(by_step.items()):
        cells = []
        for t in texts:
            if t not in row:
                cells.append("")
                continue
            ppl = row[t][0]
            ref = refs.get(names[t])
            cells.append(f"{ppl:.3f}" + (f" ({ppl / ref:.3f}x)" if ref else ""))
        sec = max(v[1] for v in row.values())
        print(f"| {step} | {tokens} | {clock(sec)} | " + " | ".join(cells) + " |")

    fig, (ax_loss, ax_ppl) = plt.subplots(1, 2, figsize=(11, 4.2))
    if steps:
        x = [t for t, _ in steps]
        y = [v for _, v in steps]
        ax_loss.plot(x, y, color="0.75", lw=0.8, label="each step")
        w = max(1, len(y) // 50)
        if w > 1:
            mean = [sum(y[max(0, k - w + 1):k + 1]) / (k + 1 - max(0, k - w + 1))
                    for k in range(len(y))]
            ax_loss.plot(x, mean, color="C0", lw=1.5, label=f"mean of {w} steps")
        ax_loss.legend()
    ax_loss.set_xlabel("trained tokens")
    ax_loss.set_ylabel("training loss")
    for k, t in enumerate(texts):
        pts = [(p[1], p[4]) for p in points if p[3] == t]
        ax_ppl.plot([a for a, _ in pts], [b for _, b in pts], "o-", color=f"C{k}", label=names[t])
        ref = refs.get(names[t])
        if ref:
            ax_ppl.axhline(ref, color=f"C{k}", ls="--", lw=0.8, label=f"{names[t]}: reference")
    ax_ppl.set_xlabel("trained tokens")
    ax_ppl.set_ylabel("perplexity")
    if points and all(p[4] > 0 and math.isfinite(p[4]) for p in points):
        ax_ppl.set_yscale("log")
    if texts:
        ax_ppl.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args[1], dpi=110)
    print(f"wrote {args[1]}")


if __name__ == "__main__":
    main(sys.argv[1:])
