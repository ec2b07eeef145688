"""One self-contained page: inline CSS, figures embedded as PNG data URIs, tables that sort by a click on their
header (a few lines of inline script; with scripts off the page reads the same, unsorted), no request to anything
outside the file. Each feature's ``page.py`` builds its page from these pieces."""

from __future__ import annotations

import base64
import html
from pathlib import Path

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1120px;margin:0 auto;padding:24px 28px 48px;background:#fff;min-height:100vh}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #e3e6ea;padding-bottom:4px}
h3{font-size:16px;margin:20px 0 6px}
.kind{color:#5b6475;font-size:13px;margin:0 0 16px}
.answer{font-size:18px;line-height:1.45;background:#eef5ff;border-left:5px solid #2f6fde;padding:12px 16px;margin:8px 0 12px}
.answer.bad{background:#fff1f0;border-color:#d93a2b} .answer.warn{background:#fff8e6;border-color:#d99a00}
.answer.good{background:#eefaf1;border-color:#23914a}
.sub{color:#3b4352;margin:4px 0 16px}
.figs{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:8px 16px;align-items:start}
figure{margin:16px 0;text-align:center} figure.wide{grid-column:1/-1} figure img{max-width:100%;height:auto;border:1px solid #e3e6ea}
figcaption{color:#5b6475;font-size:13px}
.scroll{overflow-x:auto;margin:8px 0 16px}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #e3e6ea;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#f1f3f6;position:sticky;top:0;cursor:pointer;white-space:normal}
td:first-child,td:last-child{white-space:normal;min-width:6em} td:first-child,th:first-child{text-align:left}
tr:nth-child(even) td{background:#fafbfc}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px}
pre{background:#f6f7f9;padding:10px;overflow-x:auto;border:1px solid #e3e6ea}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;font-size:13px} dt{color:#5b6475} dd{margin:0}
"""

# click a header to sort by that column (numbers as numbers); nothing else, and nothing fetched
SORT_JS = """
document.querySelectorAll("table.sortable th").forEach(function(th,i){th.title="sort";th.addEventListener("click",
function(){var t=th.closest("table"),b=t.tBodies[0],rows=Array.from(b.rows),up=th.dataset.up!=="1";
t.querySelectorAll("th").forEach(function(h){h.dataset.up=""});th.dataset.up=up?"1":"0";
function key(r){var s=(r.cells[i]||{}).textContent||"";var n=parseFloat(s.replace(/[^0-9eE.+-].*$/,""));
return isNaN(n)?s:n}rows.sort(function(a,b){var x=key(a),y=key(b);
if(typeof x==="number"&&typeof y==="number")return up?x-y:y-x;return up?String(x).localeCompare(y):String(y).localeCompare(x)});
rows.forEach(function(r){b.appendChild(r)})})});
"""


def esc(x) -> str:
    return html.escape("" if x is None else str(x))


def figure(path: Path, caption: str = "", wide: bool = False) -> str:
    """A PNG embedded in the page (none: nothing); ``wide``: the whole row of a ``figs`` grid."""
    path = Path(path)
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = esc(caption or path.stem.replace("_", " "))
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    cls = ' class="wide"' if wide else ""
    return f'<figure{cls}><img alt="{alt}" src="data:image/png;base64,{data}">{cap}</figure>'


def table(headers: list[str], rows: list[list], caption: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<div class="scroll"><table class="sortable">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def provenance(prov: dict | None, extra: dict | None = None) -> str:
    """Where and with what the run ran: machine, CPU and flags, versions, the command line (mtpbench never puts a
    secret on it: keys and secret headers come from environment variables), git commit."""
    prov = prov or {}
    hw = prov.get("hardware") or {}
    flags = hw.get("cpu_flags") or {}
    items = {"date": prov.get("date"), "machine": f"{hw.get('cpu') or '?'} ({hw.get('machine') or '?'}), "
             f"{hw.get('cpus_usable') or hw.get('cpu_count') or '?'} usable cores",
             "CPU flags": " ".join(k for k, v in flags.items() if v) or "none recorded",
             "GPUs": ", ".join(g.get("name", "?") for g in hw.get("gpus") or []) or "none",
             "versions": ", ".join(f"{k} {v}" for k, v in (prov.get("versions") or {}).items() if v),
             "command": " ".join(map(str, prov.get("argv") or [])) or None,
             "git commit": prov.get("git_sha"), "load average": prov.get("load_average"), **(extra or {})}
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items.items() if v not in (None, "", []))
    return f"<h2>Provenance</h2><dl>{rows}</dl>"


def document(title: str, kind: str, answer: str, tone: str, body: str, sub: str = "") -> str:
    """The page: its answer first (``tone``: good, bad, warn or plain), then ``body`` (figures, tables,
    provenance)."""
    sub_html = f'<p class="sub">{esc(sub)}</p>' if sub else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{esc(title)}</h1><p class=\"kind\">{esc(kind)}</p>"
            f"<p class=\"answer {esc(tone)}\" id=\"answer\">{esc(answer)}</p>{sub_html}{body}"
            f"</main><script>{SORT_JS}</script></body></html>\n")


def write(path: Path, text: str) -> Path:
    from mtpbench.files import write_text

    write_text(Path(path), text)
    return Path(path)
