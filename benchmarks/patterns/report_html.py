"""report.html beside report.md: the same report as one self-contained page (the PNG plots embedded as
data URIs, the styles inline), readable offline and mailable as one file."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2430; background: #f6f7f9;
       max-width: 1200px; margin: 0 auto; padding: 20px 28px; }
h1 { font-size: 26px; } h2 { margin-top: 32px; border-bottom: 1px solid #e2e5ea; padding-bottom: 4px; }
table { border-collapse: collapse; background: #fff; margin: 10px 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #e2e5ea; padding: 4px 10px; text-align: left; }
th { background: #eef0f3; } tr:hover td { background: #f4f8ff; }
code { background: #eef0f3; border-radius: 4px; padding: 0 4px; font-size: 90%; }
img { max-width: 100%; background: #fff; border: 1px solid #e2e5ea; border-radius: 6px; margin: 8px 0; }
"""
IMG = re.compile(r'<img src="([^"/]+\.png)"')


def markdown_to_html(markdown: str, images: Path, title: str) -> str:
    """A standalone page for ``markdown``: tables rendered, each ``![..](x.png)`` under ``images`` inlined."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)

    def inline(m: re.Match[str]) -> str:
        png = images / html.unescape(m.group(1))
        if not png.is_file():
            return m.group(0)
        return f'<img src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"'

    body = IMG.sub(inline, body)
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
        f"<body>\n{body}</body></html>\n"
    )


def write_html(report_md: Path) -> Path:
    """Write ``report.html`` beside ``report_md`` (its plots are the PNGs in the same folder)."""
    text = report_md.read_text()
    title = next((line[2:] for line in text.splitlines() if line.startswith("# ")), "kvreuse report")
    path = report_md.with_suffix(".html")
    path.write_text(markdown_to_html(text, report_md.parent, title))
    return path
