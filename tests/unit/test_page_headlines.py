"""The answer sentences of report.html from rows alone, including the rows a real run gave that broke a first
version: a schedule's point where the load's k was 0 (nothing drafted, no acceptance length, no k = 0 beside it)."""

from mtpbench.sweep.page import headline


def row(k, **kw):
    return {"mode": "vllm", "k": k, "mtp_layers": 3, "category": "all", "status": "ok", "speedup": None,
            "acceptance_length": None, **kw}


def test_a_sweep_that_drafted_nothing_says_so():
    text, tone = headline([row(1)])
    assert text.startswith("Nothing was drafted at vllm k = 1") and tone == "plain"


def test_acceptance_without_timings():
    text, _ = headline([row(1, acceptance_length=1.7), row(2, acceptance_length=2.1)])
    assert text.startswith("Acceptance length peaks at 2.10 (vllm k = 2")


def test_speedup_beyond_noise_within_noise_and_below():
    assert headline([row(2, speedup=1.3, speedup_ci_low=1.1, speedup_ci_high=1.5, acceptance_length=2.0,
                         speedup_decision="faster")])[1] == "good"
    assert headline([row(2, speedup=1.1, speedup_ci_low=0.9, speedup_ci_high=1.3,
                         speedup_decision="open")])[0].startswith("No k is faster")
    assert headline([row(2, speedup=0.8, speedup_ci_low=0.7, speedup_ci_high=0.9, speedup_decision="slower")])[1] == "bad"
    assert "no interval" in headline([row(2, speedup=1.2)])[0]
    assert headline([{**row(1), "status": "failed"}])[1] == "bad"


def test_a_speedup_near_1_is_printed_off_1_word_for_word():
    """A speedup and interval ends just off 1 print with the digits that keep them off it, at the row's level (95 %
    where none is saved); every point faster beyond noise is named, "; " between them."""
    near = row(1, speedup=0.996, speedup_ci_low=0.991, speedup_ci_high=0.9995, speedup_decision="slower")
    assert headline([near]) == ("Drafting is slower here: every drafting point runs below plain decoding beyond "
                                "noise; the highest speedup, vllm k = 1, 3 MTP layers, runs at 0.996x [95 %: 0.99 to "
                                "0.9995].", "bad")
    fast = [row(k, speedup=1.2 + k / 100, speedup_ci_low=1.004, speedup_ci_high=1.4, speedup_decision="faster",
                speedup_level=0.975) for k in (1, 2)]
    assert headline(fast)[0] == (
        "Best: vllm k = 2, 3 MTP layers at 1.22x the speed of plain decoding [97.5 %: 1.004 to 1.40]; faster than "
        "plain decoding beyond noise at 2 of 2 timed points: vllm k = 1, 3 MTP layers; vllm k = 2, 3 MTP layers.")
