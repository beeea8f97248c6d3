"""docs/grafana/kvreuse.json queries only series the server exports, by labels those series have."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kvreuse.runtime.cache.shadows import ShadowStats
from kvreuse.runtime.engine.stats import EngineStats
from kvreuse.runtime.server.cache_info import CacheCollector, CacheSnapshot
from kvreuse.runtime.server.metrics import ServerMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "kvreuse.json"


def _exported() -> dict[str, set[str]]:
    """Sample name -> its label names, from a registry as the server builds it, every series touched once."""
    stats = EngineStats(*([1] * 14), shadows=ShadowStats(1, 1, {"lru": 1}))
    metrics = ServerMetrics(lambda: stats)
    pages = dict.fromkeys(("total", "free", "tree", "pinned", "evictable", "in_use", "evicted_total"), 1)
    snap = CacheSnapshot(pages, 16, "reuse", [(("t", "s"), 16, 1.0)], {"ttl": 1}, {"t": {"ttl": 1}})
    metrics.registry.register(CacheCollector(lambda: snap))
    metrics.observe_request(10, 5, 3, 0.1, 0.2)
    metrics.cache_miss.labels("append_only").inc()
    metrics.http_requests.labels("/v1/chat/completions", "200").inc()
    metrics.rejected.inc()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


def _targets(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def test_every_query_names_an_exported_series_and_its_labels():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported()
    used = set()
    for title, expr in _targets(dashboard):
        assert expr.count("(") == expr.count(")"), (title, expr)
        series = re.findall(r"\b(kvreuse_\w+)", expr)
        assert series, (title, expr)
        labels = set(re.findall(r"by \(([^)]*)\)", expr))
        for name in series:
            assert name in exported, f"{title}: {name} is not exported"
            used.add(name)
            for group in labels:
                for label in (x.strip() for x in group.split(",")):
                    assert label == "le" or label in exported[name], f"{title}: {name} has no label {label}"
    # every family the server exports is on the dashboard
    families = {re.sub(r"_(bucket|count|sum|created)$", "", n) for n in exported}
    on_board = {re.sub(r"_(bucket|count|sum)$", "", n) for n in used}
    missing = {f for f in families if not any(u == f or u.startswith(f + "_") for u in on_board)}
    assert not missing, missing


def test_dashboard_imports_cleanly():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    inputs = {f"${{{i['name']}}}" for i in dashboard["__inputs"]}
    for p in dashboard["panels"]:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] != "row":
            assert p["datasource"]["uid"] in inputs and p["targets"], p["title"]
