"""Profiles: ``profiles/<name>.toml`` files whose keys are ``SweepConfig`` field names, found and read; unknown keys
and wrong types are errors that name the file and the key (``config.resolve`` applies them)."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from mtpbench.errors import MtpBenchError


def profile_dirs() -> list[Path]:
    here = Path(__file__).parent
    return [here / "profiles", here.parent / "profiles"]  # installed wheel, then source checkout


def list_profiles() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in profile_dirs():
        for p in sorted(d.glob("*.toml")) if d.is_dir() else []:
            found.setdefault(p.stem, p)
    return found


def _check(path: Path, key: str, value, typ: str):
    def bad(want: str):
        return MtpBenchError(f"{path}: key '{key}' must be {want}, got {type(value).__name__} {value!r}")

    if typ.startswith("tuple[int"):
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not (isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise bad("a list of integers")
        return tuple(value)
    if typ.startswith("tuple[float"):
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = [value]
        try:
            return tuple(parse_rate(v) for v in value)
        except (TypeError, ValueError):
            raise bad("a list of numbers (or \"inf\")") from None
    if typ.startswith("tuple[str"):
        if isinstance(value, str):
            value = [value]
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise bad("a list of strings")
        return tuple(value)
    if typ.startswith("int"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad("an integer")
    elif typ.startswith("float"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise bad("a number")
        value = float(value)
    elif typ == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
    elif typ.startswith("str"):
        if not isinstance(value, str):
            raise bad("a string")
    elif typ == "dict" and not isinstance(value, dict):
        raise bad("a table")
    return value


def parse_rate(v) -> float:
    """A request rate: a positive number, or inf ("inf" in text)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError(v)
    x = float(v)
    if math.isnan(x):
        raise ValueError(v)
    return x


def load_profile(name_or_path: str, types: dict[str, str]) -> tuple[Path, dict]:
    """A profile's values by key, each checked against ``types`` (field name -> its type as written)."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.is_file()):
        profiles = list_profiles()
        if name_or_path not in profiles:
            raise MtpBenchError(f"unknown profile {name_or_path!r} (known: {', '.join(profiles) or 'none'})")
        path = profiles[name_or_path]
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise MtpBenchError(f"{path}: not valid TOML ({e})") from None
    out = {}
    for key, value in raw.items():
        if key not in types:
            raise MtpBenchError(f"{path}: unknown key '{key}'")
        out[key] = _check(path, key, value, types[key])
    return path, out
