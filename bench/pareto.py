#!/usr/bin/env python3
"""Perplexity against weight bytes read per decoded token, and against decode tok/s, for every row
of one `sparq bench model --json` run (llama.cpp's rows included), with the Pareto front marked.

usage: pareto.py ROWS.json [ROWS.json ...] OUT.png|OUT.svg [--title TEXT]

Rows without a perplexity are skipped (run bench model with --ppl-text). A row is on the front of a
panel when no other row is at least as good on both axes and better on one (lower perplexity and,
left, fewer bytes per token; right, more tok/s). Rows of several files are plotted together: give
only files measured in the same run / on the same CPU and threads (the title says which).
llama.cpp's rows have no weight_bytes_per_token; their file size stands in (it reads every weight
once per token), and their label says so.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def label(r):
    if r.get("runtime") == "llama.cpp":
        return "llama.cpp " + r.get("model", "").split(" ")[-1].replace("SmolLM2-135M-Instruct.", "")
    # bench model names a model's extra variants "FILE [dense bf16]", "FILE [as stored]".
    name = r.get("model", "").split("/")[-1].replace(".sparq", "").replace(".gguf", "")
    name = name.replace("SmolLM2-135M-Instruct.", "")
    return name + f" ({r.get('values', '?')})" if r.get("values") else name


def front(points, better):
    """Indices of the points no other point dominates; better(a, b): a is at least as good."""
    out = []
    for i, p in enumerate(points):
        dominated = any(
            j != i and better(q, p) and q != p for j, q in enumerate(points))
        if not dominated:
            out.append(i)
    return out


def load(paths):
    rows = []
    for path in paths:
        data = json.load(open(path))
        rows.extend(data if isinstance(data, list) else data.get("rows", []))
    keep = []
    for r in rows:
        if not r.get("perplexity"):
            continue
        bpt = r.get("weight_bytes_per_token")
        if bpt is None and r.get("runtime") == "llama.cpp":
            bpt = r.get("file_bytes")
        if bpt is None or not r.get("decode_tok_s"):
            continue
        keep.append({"label": label(r), "ppl": r["perplexity"], "mb": bpt / 1e6,
                     "tok_s": r["decode_tok_s"], "peer": r.get("runtime") == "llama.cpp",
                     "cpu": r.get("cpu_model", "?"), "isa": r.get("isa", "?"),
                     "threads": r.get("threads", "?")})
    return keep


def panel(ax, rows, xkey, xlabel, better):
    """Draws one panel; returns the labels on its front, by x."""
    pts = [(r[xkey], r["ppl"]) for r in rows]
    on = set(front(pts, better))
    for i, r in enumerate(rows):
        ax.scatter(r[xkey], r["ppl"], marker="s" if r["peer"] else "o", s=30,
                   color="tab:red" if r["peer"] else ("tab:blue" if i in on else "tab:gray"),
                   zorder=3)
        # Numbers, not names, beside the points: the variants of one model sit close together.
        ax.annotate(str(i + 1), (r[xkey], r["ppl"]), fontsize=8, xytext=(3, 3),
                    textcoords="offset points")
    fr = sorted((pts[i] for i in on), key=lambda p: p[0])
    ax.plot([p[0] for p in fr], [p[1] for p in fr], "--", color="tab:blue", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("perplexity (lower is better)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    return [rows[i]["label"] for i in sorted(on, key=lambda i: pts[i][0])]


def main():
    args = sys.argv[1:]
    title = None
    if "--title" in args:
        i = args.index("--title")
        title = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    *inputs, out = args
    rows = load(inputs)
    if not rows:
        sys.exit("no rows with perplexity, decode tok/s and bytes per token in " + ", ".join(inputs))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 4.6), dpi=90,
                                  gridspec_kw={"width_ratios": [1, 1, 0.9]})
    by_bytes = panel(a, rows, "mb", "weight MB read per decoded token (lower is better)",
                     lambda q, p: q[0] <= p[0] and q[1] <= p[1])
    by_speed = panel(b, rows, "tok_s", "decode tok/s (higher is better)",
                     lambda q, p: q[0] >= p[0] and q[1] <= p[1])
    c.axis("off")
    key = [f"{i + 1}  {r['label']}: ppl {r['ppl']:.1f}, {r['mb']:.0f} MB, {r['tok_s']:.0f} tok/s"
           for i, r in enumerate(rows)]
    c.text(0, 1, "\n".join(key) + "\n\nblue: on the Pareto front (dashed)\nred square: llama.cpp",
           va="top", fontsize=7.5, family="monospace", transform=c.transAxes)
    r0 = rows[0]
    fig.suptitle(title or f"{r0['cpu']} ({r0['isa']}), {r0['threads']} threads", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out} ({len(rows)} rows)")
    print("front, perplexity vs MB per token: " + "; ".join(by_bytes))
    print("front, perplexity vs decode tok/s: " + "; ".join(by_speed))


if __name__ == "__main__":
    main()
