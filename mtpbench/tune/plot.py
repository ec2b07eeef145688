"""tune.png: tokens/s against load, one line per k (measured points with the band of their speedup interval,
the prediction dashed), the schedule's envelope over them and the validated schedule marked."""

from __future__ import annotations

from pathlib import Path


def plot(path: Path, result: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ks = sorted({r["k"] for r in rows})
    for i, k in enumerate(ks):
        color = colors[i % len(colors)]
        meas = sorted((r for r in rows if r["k"] == k and r["measured"]), key=lambda r: r["load"])
        pred = sorted((r for r in rows if r["k"] == k and r["predicted_tokens_per_sec"] is not None),
                      key=lambda r: r["load"])
        if pred:
            ax.plot([r["load"] for r in pred], [r["predicted_tokens_per_sec"] for r in pred], "--", color=color,
                    alpha=0.6, linewidth=1)
        if meas:
            xs = [r["load"] for r in meas]
            ax.plot(xs, [r["output_tokens_per_sec"] for r in meas], "o-", color=color, label=f"k = {k}")
            band = [(r["load"], r["output_tokens_per_sec"] / r["speedup"] * r["speedup_ci_low"],
                     r["output_tokens_per_sec"] / r["speedup"] * r["speedup_ci_high"])
                    for r in meas if r["speedup_ci_low"] is not None and r["speedup"]]
            if band:
                ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band], color=color,
                                alpha=0.15, linewidth=0)
        elif pred:
            ax.plot([], [], "--", color=color, label=f"k = {k} (predicted only)")
    envelope = sorted(((r["load"], r["predicted_tokens_per_sec"]) for r in rows
                       if r["k"] == r["scheduled_k"] and r["predicted_tokens_per_sec"] is not None))
    if envelope:
        ax.plot([e[0] for e in envelope], [e[1] for e in envelope], color="black", linewidth=3, alpha=0.35,
                label="schedule (predicted)")
    validated = [r for r in ((result.get("validation") or {}).get("rows") or []) if r["arm"] == "schedule"]
    if validated:
        ax.plot([r["load"] for r in validated], [r["output_tokens_per_sec"] for r in validated], "*", color="black",
                markersize=14, label="schedule (validated)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(result["unit"])
    ax.set_ylabel("output tokens/s")
    hw = ((result.get("provenance") or {}).get("hardware") or {}).get("cpu") or ""
    ax.set_title(f"{result['decision']}\n{result['backend']}, {hw}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
