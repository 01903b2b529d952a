"""The Markdown report as one self-contained HTML page, its figures embedded, so that a viewer that cannot
follow relative image links (MLflow's artifact view) shows it whole.

Only the Markdown ``render_report`` writes is understood: ``#``/``##`` headings, paragraphs with
``*emphasis*`` and `` `code` ``, pipe tables, and images alone on a line.
"""

from __future__ import annotations

import base64
import html
import mimetypes
import re
from pathlib import Path

IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)]+)\)")
INLINE = ((re.compile(r"`([^`]+)`"), r"<code>\1</code>"), (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
          (re.compile(r"\*([^*]+)\*"), r"<em>\1</em>"))
STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em;color:#1f272d;font-size:14px}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #d1d9e1;padding:3px 8px;text-align:right}
th{background:#f2f5f7}td:first-child,th:first-child{text-align:left}img{max-width:100%;margin:.5em 0}
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:1.6em}"""


def report_html(markdown: str, root: str | Path, title: str = "specrank report") -> str:
    """HTML of ``markdown``; images (paths relative to ``root``) become data URIs, missing ones their alt text."""
    body = [_block(block.strip(), Path(root)) for block in re.split(r"\n\s*\n", markdown) if block.strip()]
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _block(block: str, root: Path) -> str:
    if block.startswith("#"):
        level = len(block) - len(block.lstrip("#"))
        return f"<h{level}>{_inline(block[level:].strip())}</h{level}>"
    if block.startswith("|"):
        return _table(block.splitlines())
    image = IMAGE.fullmatch(block)
    if image:
        return _image(image["alt"], root / image["src"])
    return f"<p>{_inline(block)}</p>"


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    for pattern, repl in INLINE:
        out = pattern.sub(repl, out)
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(lines: list[str]) -> str:
    header, rows = _cells(lines[0]), [_cells(line) for line in lines[2:]]  # lines[1]: the |---| separator
    head = "".join(f"<th>{_inline(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _image(alt: str, path: Path) -> str:
    if not path.is_file():
        return f"<p><em>{html.escape(alt)} (missing: {html.escape(path.name)})</em></p>"
    kind = mimetypes.guess_type(path.name)[0] or "image/png"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:{kind};base64,{data}"><figcaption>{html.escape(alt)}</figcaption></figure>'
