"""check-lossless's outputs from its record: the one-screen summary (lossless.md, what the CLI prints), lossless.png
and lossless.json."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mtpbench.lossless.verdict import DIVERGENT_CLASS, NUMERICAL, _gap, aa_label


def _f(x, fmt: str = ".3g") -> str:
    return "unknown" if x is None else format(x, fmt)


def summary(record: dict) -> str:
    """The one-screen summary (lossless.md, printed by the CLI)."""
    lines = _greedy_lines(record) if record["kind"] == "greedy" else _sampling_lines(record)
    return _header(record) + "\n" + "\n".join(lines) + "\n"


def _header(record: dict) -> str:
    """The verdict, what was checked, and the drafting arm's facts."""
    c = record["config"]
    reason = record.get("inconclusive_reason")
    head = (f"# check-lossless: {record['verdict']}" + (f" ({reason})" if reason else "") + "\n\n"
            f"{c['model']} on {c['backend']} ({record['engine'].get('dtype')}), k = {c['k']} ({c['mode'][0]}) "
            f"against k = 0, temperature {c['temperature']:g}, {record['num_prompts']} prompts x "
            f"{c['max_tokens']} tokens, seed {c['seed']}"
            + (", PLANTED LOSSY CONTROL (--planted-lossy)" if c["planted_lossy"] else "")
            + (", PLANTED LOSSY CONTROL (--planted-subtle)" if c.get("planted_subtle") else "")
            + "\n")
    arm = record["engine"].get("drafting_arm") or {}
    ran, acc = arm.get("engine") or {}, arm.get("acceptance")
    facts = []
    if ran.get("runner"):
        from mtpbench.runners import label

        facts.append(f"drafted by vLLM's {label(ran['runner'], ran.get('drafter'))}")
    if acc is None:  # never dropped silently: a check of a drafting arm that may not have drafted
        facts.append("spec-decode counters unknown (the backend reported none)")
    elif not acc.get("num_drafts"):
        facts.append(f"num_drafts {acc.get('num_drafts')}: NOTHING WAS DRAFTED")
    else:
        facts.append(f"num_drafts {acc['num_drafts']}, accepted {_f(acc.get('num_accepted_tokens'), 'd')} of "
                     f"{_f(acc.get('num_draft_tokens'), 'd')} draft tokens (acceptance length "
                     f"{_f(acc.get('acceptance_length'))})")
    if c.get("speculative_overrides"):
        import json

        facts.append(f"speculative_config overrides {json.dumps(c['speculative_overrides'])}")
    if facts:
        head += "drafting arm: " + "; ".join(facts) + "\n"
    if ran.get("sampler_fault") not in (None, "unknown") and c["temperature"] > 0:  # the probe of its own sampler
        head += f"known fault of this vLLM build: {ran['sampler_fault']}\n"
    if record["kind"] == "greedy" and record.get("why"):  # e.g. nothing drafted
        head += f"why: {record['why']}\n"
    for note in record["engine"].get("notes") or []:  # e.g. TLS verification off (--insecure)
        head += f"note: {note}\n"
    return head


def _greedy_lines(record: dict) -> list[str]:
    lines = [f"- identical to k = 0: {record['identical_share']:.1%} of prompts; divergent "
             f"{record['num_divergent']}, numerical {record['num_numerical']}"
             + (f", {record['num_length_differences']} of other length (the same tokens, one run stopped sooner)"
                if record.get("num_length_differences") else ""),
             f"- numerical threshold: |logit gap| (the target's logit of the k = 0 token minus that of the "
             f"token the other run emitted) <= {record['numerical_threshold']:.3g} (set by "
             f"{record['numerical_threshold_source']}; dtype floor {record['dtype_floor']:.3g}"
             + (f", cap {record['numerical_threshold_cap']:.3g}" if "numerical_threshold_cap" in record else "") + ")",
             f"- A/A control ({aa_label(record['aa_batch_sizes'], record.get('aa_copies', 1))}): identical "
             f"{record['aa_identical_share']:.1%}"
             + (f" (divergences within rounding {record['num_aa_numerical']}, beyond it "
                f"{record['num_aa_beyond_bound']})" if "num_aa_numerical" in record else "")
             + f", teacher-forced log-prob noise {_f(record['aa_logprob_noise'])}"
             + (" (no finite number: see why)" if record["aa_logprob_noise"] is None else "")]
    if record.get("why"):
        lines.insert(0, f"- why: {record['why']}")
    for p in record["per_prompt"]:
        for arm, d in (("spec", p["divergence"]), ("A/A", p.get("aa_divergence"))):
            if d:
                lines.append(f"  - {p['prompt_id']}: token {d['position']}, k0 {d['k0_token']} vs {arm} "
                             f"{d['spec_token']}, logit gap {_gap(d)} (top-two margin {d['margin']:.3g}) -> "
                             f"{d.get('class') or 'unclassified'}")
    return lines


def _stage_lines(stage: dict, label: str, record: dict) -> list[str]:
    """One stage's tests: off vs on, the A/A control, the excess test and the scorer's fit."""
    t, aa, ex, one = stage.get("test"), stage.get("aa_test"), stage.get("excess_test"), stage.get("score_tests")
    lines = []
    if t:
        # the p that decides and its level; its two parts are not tests of their own (a part below the level is
        # no finding), and no interval at another level is shown beside it (issue 55: "lossless" beside a 95 %
        # interval of the shift that excluded 0)
        lv = record.get("levels") or {}
        # stage 1 raises an alarm at its level; a second stage (label "stage 2 ") confirms at its own
        at = (f", lossy below {lv['confirm_two_sample']:g} (with stage 1's alarm)"
              if label and "confirm_two_sample" in lv else
              f", an alarm below {lv['alarm_two_sample']:g}" if "alarm_two_sample" in lv else "")
        lines.append(f"- {label}off vs on: p = {t['p_value']:.3g} (the two-sample test{at}; its parts: scores "
                     f"{t['p_value_scores']:.3g}, tokens {t['p_value_tokens']:.3g}); mean "
                     f"target log-prob {t['mean_logprob_a']:.4g} -> {t['mean_logprob_b']:.4g} nats/token, shift "
                     f"{t['logprob_diff']:+.3g}; smallest detectable shift {_f(t['mde_logprob'])}")
    if ex:
        lines.append(f"- {label}excess log p + H, drafting arm against both arms without drafting: z = "
                     f"{_f(ex['z'], '+.3g')} (p = {ex['p_value']:.3g}); {_f(ex['excess_on'], '+.3g')} against "
                     f"{_f(ex['excess_off'], '+.3g')} nats/token")
    if aa:
        lines.append(f"- {label}A/A control (off vs off): p = {aa['p_value']:.3g} (inconclusive below "
                     f"{record['alpha_aa']:g}), shift {aa['logprob_diff']:+.3g}")
    law = stage.get("acceptance_law")
    if law:  # absent from records written before the law test joined the verdict
        from mtpbench.metrics.law import law_lines

        lines += [f"- {label}drafting arm's {x.lstrip()}" if i == 0 else f"  {x}"
                  for i, x in enumerate(law_lines(law))]
    if one:
        def z(name):
            x = one.get(name)
            return "none" if x is None else f"z = {_f(x['z'], '+.3g')}"

        lines.append(f"- {label}scorer's fit, each arm against the target's law (sum(log p + H) / sqrt(sum Var); "
                     f"reported, it decides nothing): off {z('off')}, on {z('on')}, off again {z('off_aa')}")
    return lines


def _sampling_lines(record: dict) -> list[str]:
    lines = [f"- {record['samples_per_prompt']} continuations of each prompt per arm (off, on, off again), "
             "independent seeds; every token scored by a teacher-forced k = 0 pass",
             f"- why: {record['why']}"]
    lines += _stage_lines(record, "", record)
    if record.get("score_tests_unavailable"):
        lines.append(f"- excess test unavailable ({record['score_tests_unavailable']}): the two-sample test decides "
                     "alone")
    lv = record.get("levels")
    if lv:
        # records written before the combination existed have no "combine" level: their rule had none
        both = (f", or both stages combined (weighted by their continuations) below {lv['combine']:g} the same way"
                if "combine" in lv else "")
        lines.append(f"- alarm (fresh draws must confirm it): excess p < {lv['alarm_excess']:g} or two-sample p < "
                     f"{lv['alarm_two_sample']:g}; lossy: a second stage at fresh seeds and twice the continuations shows it "
                     f"again on its own, excess p < {lv['confirm_excess']:g} the same way or two-sample p < "
                     f"{lv['confirm_two_sample']:g}{both}")
        if "alarm_law" in lv:
            lines.append(f"- the verifier's law (one-sided, over-acceptance, over the positions and jointly): alarm "
                         f"p < {lv['alarm_law']:g}, again on its own p < {lv['confirm_law']:g}, both stages combined "
                         f"p < {lv['combine_law']:g}")
    if record.get("confirmation"):
        lines.append(f"- alarm: {record['alarm']}; a second stage at fresh seeds, twice the continuations:")
        lines += ["  " + x for x in _stage_lines(record["confirmation"], "stage 2 ", record)]
        c = record.get("combined")  # absent from records written before the combination existed
        if c:
            said = [f"{name} z = {x['z']:+.3g}, p = {x['p_value']:.3g}" + ("" if x["same_way"] else ", the stages "
                                                                            "pointing different ways")
                    for name, x in (("two-sample", c["two_sample"]), ("excess", c.get("excess"))) if x]
            lines.append(f"  - both stages combined (weighted by their continuations): {'; '.join(said)}")
    if "detectable_shift" in record:
        lines.append(f"- smallest detectable shift (80 % power): {_f(record['detectable_shift'])} nats/token; "
                     f"lossless needs it <= {record['max_detectable_shift']:g} (--max-detectable-shift)")
    return lines


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    try:
        pp = record["per_prompt"]
        x = np.arange(len(pp))
        if record["kind"] == "greedy":
            gaps = [abs(p["divergence"]["logit_gap"]) if p["divergence"] and p["divergence"]["logit_gap"] is not None
                    else np.nan for p in pp]
            colors = [{DIVERGENT_CLASS: "tab:red", NUMERICAL: "tab:orange"}.get((p["divergence"] or {}).get("class"),
                                                                                 "tab:gray") for p in pp]
            ax.bar(x, np.nan_to_num(gaps, nan=0.0), color=colors)
            for i, p in enumerate(pp):
                if not p["divergence"]:
                    ax.text(i, 0, "=", ha="center", va="bottom", fontsize=8, color="tab:green")
            ax.axhline(record["numerical_threshold"], color="gray", ls="--", lw=1, label="numerical threshold")
            ax.set_ylabel("|logit gap| k = 0 token vs drafted run's")
            ax.legend(fontsize=7)
            ax.set_title(f"greedy k = {record['config']['k']} vs k = 0: {record['verdict']} "
                         f"(identical {record['identical_share']:.0%}; '=' identical)", fontsize=9)
        else:
            for off, (name, color) in enumerate((("off", "tab:blue"), ("on", "tab:red"), ("off_aa", "tab:gray"))):
                ys = [p[f"mean_logprob_{name}"] for p in pp]
                ax.plot(x + (off - 1) * 0.2, [np.nan if y is None else y for y in ys], "o", color=color,
                        label={"off": "k = 0", "on": f"k = {record['config']['k']}", "off_aa": "k = 0 (A/A)"}[name])
            ax.set_ylabel("mean target log-prob / token")
            ax.legend(fontsize=7)
            t = record["test"]
            p = "" if not t else f", p = {t['p_value']:.3g}"
            ax.set_title(f"sampling T = {record['config']['temperature']:g}: {record['verdict']}{p}", fontsize=9)
        ax.set_xticks(x)
        ax.set_xticklabels([str(p["prompt_id"]) for p in pp], rotation=60, fontsize=6)
        fig.tight_layout()
        tmp = path.with_name(path.name + ".tmp.png")
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)


ARMS = (("off", "tab:blue", "k = 0"), ("on", "tab:red", "drafting"), ("off_aa", "tab:gray", "k = 0 (A/A)"))


def detail_plot(record: dict, path: Path) -> Path | None:
    """Sampling: each arm's score distribution over prompts (mean target log-prob per token of each prompt's
    continuations) and, by position, how often a prompt's continuations share their most frequent token (the law at
    each position, seen through its mode); None for a greedy check. From ``per_prompt`` alone (what lossless.json
    keeps)."""
    from collections import Counter

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pp = record.get("per_prompt") or []
    if record.get("kind") == "greedy" or not pp or f"tokens_{ARMS[0][0]}" not in pp[0]:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    try:
        for name, color, label in ARMS:
            means = [p[f"mean_logprob_{name}"] for p in pp if p.get(f"mean_logprob_{name}") is not None]
            axes[0].hist(means, bins=min(20, max(len(means), 1)), histtype="step", color=color, label=label)
            per_prompt = [p.get(f"tokens_{name}") or [] for p in pp]
            n = max((len(c) for conts in per_prompt for c in conts), default=0)
            share = []
            for i in range(n):
                shares = [Counter(toks).most_common(1)[0][1] / len(toks) for conts in per_prompt
                          if (toks := [c[i] for c in conts if len(c) > i])]
                share.append(np.mean(shares) if shares else np.nan)
            axes[1].plot(range(n), share, "o-", color=color, ms=3, label=label)
        axes[0].set(xlabel="mean target log-prob per token, one value per prompt", ylabel="prompts",
                    title="score distribution")
        axes[1].set(xlabel="position", ylabel="share of the modal token", title="token frequency by position")
        for ax in axes:
            ax.legend(fontsize=7)
            ax.title.set_fontsize(9)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def write_outputs(out: Path, record: dict) -> None:
    from mtpbench.files import make_out_dir, write_json, write_text

    make_out_dir(out)
    write_json(out / "lossless.json", record)
    write_text(out / "lossless.md", summary(record))
    plot(record, out / "lossless.png")
    detail_plot(record, out / "lossless_detail.png")
    from mtpbench.html.pages import render
    from mtpbench.lossless.page import page

    render(page, out)
