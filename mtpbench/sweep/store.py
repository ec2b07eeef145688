"""A sweep's output folder: what an earlier run left there, and the one rule for reusing or replacing it.

Every sweep (and each sweep of a tune) goes through ``claim`` before its engine starts and before it writes:

* an empty or new folder: measured as asked;
* an earlier sweep with the same settings (its run.json's fingerprint): the points it finished are reused, and the
  caller says how many and that ``--replace`` measures them anew (as an interrupted sweep resumes);
* an earlier sweep with other settings, or another command's results: refused in one line naming what differs,
  before anything is written, unless ``--replace``; a run.json that does not parse: refused, named unreadable;
* files that are not mtpbench's at all (no JSON among them): refused, a few named, unless ``--force`` writes beside
  them (issue 56: a sweep wrote its run.json into a folder of unrelated files and started measuring);
* ``--replace``: the earlier folder is moved aside whole (``<out>.replaced-<time>``, readable by ``mtpbench report``)
  and the sweep starts afresh, so an interrupted replacing run never leaves the earlier complete run unreadable.

``reused`` and ``differences`` are pure; ``claim`` reads the folder and, with ``--replace``, moves it."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mtpbench.errors import MtpBenchError


@dataclass(frozen=True)
class Claim:
    """What a sweep found in its folder: the points it reuses (of ``planned``) and where an earlier run was moved."""
    reused: tuple[str, ...] = ()
    planned: int = 0
    moved_to: str | None = None

    def message(self, out: str) -> str | None:
        """The line said before the sweep runs (None: nothing to say)."""
        if self.moved_to:
            return f"--replace: the earlier results in {out} were moved to {self.moved_to}; measuring afresh"
        if not self.reused:
            return None
        n = len(self.reused)
        if n == self.planned:
            every = "the 1 point was" if n == 1 else f"all {n} points were"
            return (f"nothing to measure: {every} measured before in {out} with the same settings; the results "
                    f"below are those (--replace measures them anew)")
        return (f"reusing {n} of {self.planned} points measured before in {out} with the same settings "
                f"({', '.join(self.reused)}); --replace measures them anew")


def tell(claim: Claim, out: str, say: Callable[[str], None] | None) -> None:
    """Say what the folder's earlier results mean for this run (reused, moved aside), if anything (``say``: where
    the line goes; default: stderr)."""
    text = claim.message(out)
    if text:
        (say or (lambda line: print(line, file=sys.stderr)))(text)


def sweep_fingerprint(config: dict, versions: dict, prompts_sha256: str) -> dict:
    """What a sweep's points are measured with (run.json and every point file keep it): its measured settings
    (``config.fingerprint``), the versions and the prompts' digest."""
    from mtpbench.config import fingerprint

    return {**fingerprint(config, versions), "prompts_sha256": prompts_sha256}


def differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """The settings two records differ in, by dotted name (a version as versions.NAME, a tune's sweep setting as
    sweep.NAME), in ``now``'s order, then any the saved one alone has."""
    out = []
    for key in [*now, *(k for k in saved if k not in now)]:
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def refusal(out: Path, what: str, saved, now: dict) -> MtpBenchError:
    """The one-line refusal of a folder holding other results: what differs (at most three settings, then a
    count), and the two ways on."""
    if not isinstance(saved, dict):
        return MtpBenchError(f"--out {out} holds files but no {what}'s settings (another command's results, or a "
                             f"{what} from before mtpbench recorded them): give another --out, or --replace to move "
                             f"them aside and measure")
    diff = differences(saved, now)
    shown = "; ".join(f"{d} {json.dumps(_get(saved, d))} there, {json.dumps(_get(now, d))} now" for d in diff[:3])
    more = f"; and {len(diff) - 3} more" if len(diff) > 3 else ""
    return MtpBenchError(f"--out {out} holds a {what} measured with other settings ({shown}{more}): give another "
                         f"--out, or --replace to move it aside and measure afresh")


def _saved(path: Path, key: str):
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, json.JSONDecodeError, AttributeError):
        return None


def reused(out: Path, fp: dict, names: list[str]) -> tuple[str, ...]:
    """The points of ``names`` whose saved file in ``out`` holds the same fingerprint (a finished point; a failed
    one is measured again)."""
    return tuple(name for name in names if _saved(out / f"{name}.json", "fingerprint") == fp)


def _holds_results(out: Path) -> bool:
    return out.is_dir() and any(p.suffix == ".json" or p.name.endswith(".json.tmp") for p in out.iterdir())


def foreign(out: Path, force: bool) -> None:
    """Refuse, in one line naming a few of them, a folder holding files but no mtpbench results (no JSON), unless
    ``force``."""
    if force or not out.is_dir() or _holds_results(out):
        return
    names = sorted(p.name for p in out.iterdir())
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise MtpBenchError(f"--out {out} holds files that are not mtpbench's ({shown}): give another --out, or "
                            f"--force to write beside them")


def unreadable(path: Path) -> str | None:
    """Why a JSON file that exists does not parse (None: it parses, or is not there)."""
    try:
        json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return str(e)
    return None


def claim(out: Path, fp: dict, names: list[str], replace: bool, attached: bool = False,
          dry_run: bool = False, force: bool = False) -> Claim:
    """The rule above, for a sweep of the points ``names`` with fingerprint ``fp`` into ``out``; ``attached``: a
    server mtpbench did not start, whose points are never reused (it may have changed since); ``dry_run``: say what
    would happen, move nothing; ``force``: write beside files that are not mtpbench's."""
    out = Path(out)
    if not _holds_results(out):
        foreign(out, force)
        return Claim(planned=len(names))
    if replace:
        return Claim(planned=len(names), moved_to=f"{out}.replaced-<time>" if dry_run else move_aside(out))
    why = unreadable(out / "run.json")
    if why:
        raise MtpBenchError(f"--out {out}: its run.json is unreadable ({why}): give another --out, or --replace to "
                            f"move the folder aside and measure")
    saved = _saved(out / "run.json", "fingerprint")
    if saved != fp:
        raise refusal(out, "sweep", saved, fp)
    return Claim(reused=() if attached else reused(out, fp, names), planned=len(names))


def move_aside(out: Path) -> str:
    """Move the folder ``out`` to a new sibling ``<out>.replaced-<time>``, whole; where it went."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    to, i = out.with_name(f"{out.name}.replaced-{stamp}"), 1
    while to.exists():
        i += 1
        to = out.with_name(f"{out.name}.replaced-{stamp}-{i}")
    try:
        out.rename(to)
    except OSError as e:
        raise MtpBenchError(f"--replace: cannot move the earlier results in {out} aside ({e.strerror})") from None
    return str(to)


def claim_tune(out: Path, config: dict, replace: bool, force: bool = False) -> Claim:
    """The same rule for a tune's folder, before its tune.json is written: the same settings (its tune.json's
    config) resume, each sweep reusing what it saved; other settings or other files are refused unless
    ``--replace`` moves the folder aside."""
    out = Path(out)
    if not _holds_results(out):
        foreign(out, force)
        return Claim()
    if replace:
        return Claim(moved_to=move_aside(out))
    saved = _saved(out / "tune.json", "config")
    if saved != config:
        raise refusal(out, "tune", saved, config)
    return Claim()
