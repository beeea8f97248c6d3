"""report.html: the pattern report as one offline page (tables rendered, plots embedded), checked as
text and in the system Chromium with the network off."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest

from kvreuse.benchmarks.patterns.report_html import markdown_to_html
from tests.ui_browser import browser, keep_screenshot

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "patterns_default" / "results.json"


def _png(path: Path) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def test_tables_rendered_plots_inlined_markup_escaped(tmp_path):
    png = _png(tmp_path / "plot.png")
    md = "# Title\n\n| a | b |\n|---|---|\n| 1 | <script>x</script> |\n\n![plot](plot.png)\n\n![gone](missing.png)\n"
    page = markdown_to_html(md, tmp_path, "Title")
    assert "<table>" in page and "<td>1</td>" in page
    assert "<script>" not in page and "&lt;script&gt;" in page  # report text is text, never markup
    data = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    assert base64.b64decode(data) == png
    assert 'src="missing.png"' in page  # a missing plot stays a plain link rather than failing
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing to fetch from elsewhere


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pattern_report_page_reads_offline(tmp_path):
    from kvreuse.benchmarks.patterns.report import write_report

    write_report(json.loads(RESULTS.read_text()), tmp_path)
    html_path = tmp_path / "report.html"
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs and html_path.read_text().count("data:image/png;base64,") == len(pngs)
    for p in pngs:  # report.html stands alone: moved away from its PNGs it still shows them
        (tmp_path / p).unlink()
    with browser() as b:
        context = b.new_context(offline=True, viewport={"width": 1280, "height": 900})
        fetched: list[str] = []
        context.route("**/*", lambda route: (fetched.append(route.request.url), route.continue_()))
        page = context.new_page()
        page.goto(html_path.as_uri())
        # exactly one: "Verdicts at agent scale" is another heading
        assert page.locator("h2", has_text=re.compile(r"^Verdicts$")).count() == 1
        # the first table after the heading (a paragraph explaining the rules comes between them)
        verdict_rows = page.locator("xpath=//h2[. = 'Verdicts']/following-sibling::table[1]/tbody/tr")
        assert verdict_rows.count() >= 3
        images = page.locator("img").evaluate_all("imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
        assert images == [True] * len(pngs)
        assert fetched == [html_path.as_uri()], fetched  # only the file itself
        keep_screenshot(page, tmp_path, "report.png", full_page=False)  # the top: header and verdicts
        context.close()
