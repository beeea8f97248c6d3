"""What an operator asks of every replica at once, which the gateway does not pass on.

SMG 1.13 answers 404 to ``/metrics`` and ``/v1/cache/reset`` on its own port (its Prometheus port
has the gateway's metrics, not the replicas'), so ``kvreuse cluster metrics`` and ``kvreuse cluster
reset`` read the replicas' addresses and the operator key from the running cluster's
``workdir/cluster.json`` and ``workdir/operator-key`` and ask each replica directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


class ClusterFiles:
    """A running cluster as its work directory describes it."""

    def __init__(self, workdir: Path) -> None:
        try:
            self.state = json.loads((workdir / "cluster.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"no running cluster's cluster.json in {workdir}: {e}") from None
        key_file = self.state.get("operator_key_file")
        self.key = Path(key_file).read_text().strip() if key_file else None

    @property
    def replica_urls(self) -> list[str]:
        return [r["url"] for r in self.state["replicas"]]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


def reset_all(urls: list[str], headers: dict[str, str]) -> dict[str, str]:
    """``POST /v1/cache/reset`` on every replica: each one's answer (``ok`` or the error).  One reset
    already empties the shared store for all; each replica must still drop its own pool."""
    out = {}
    for url in urls:
        try:
            r = httpx.post(url + "/v1/cache/reset", json={}, headers=headers, timeout=60)
            out[url] = "ok" if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as e:
            out[url] = f"unreachable: {e}"
    return out


def scrape_all(urls: list[str], headers: dict[str, str]) -> str:
    """Every replica's ``/metrics`` as one Prometheus text page, each sample labelled with its
    ``replica`` (the index in ``--replicas``); a replica that does not answer is left out and
    ``kvreuse_cluster_replica_up{replica}`` says so."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    up = []
    for i, url in enumerate(urls):
        try:
            r = httpx.get(url + "/metrics", headers=headers, timeout=10)
            r.raise_for_status()
        except httpx.HTTPError:
            up.append(f'kvreuse_cluster_replica_up{{replica="{i}"}} 0')
            continue
        up.append(f'kvreuse_cluster_replica_up{{replica="{i}"}} 1')
        for fam in text_string_to_metric_families(r.text):
            _, _, lines = families.setdefault(fam.name, (fam.type, fam.documentation, []))
            for s in fam.samples:
                labels = {"replica": str(i), **s.labels}
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                lines.append(f"{s.name}{{{text}}} {s.value}")
    out = ["# HELP kvreuse_cluster_replica_up 1 when the replica answered this scrape",
           "# TYPE kvreuse_cluster_replica_up gauge", *up]  # fmt: skip
    for name, (kind, doc, lines) in families.items():
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
