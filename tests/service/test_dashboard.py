"""The Grafana dashboard and the Prometheus alerts name only metrics and labels that a real
server exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from service.metrics import _SPECS
from tests.support import METRICS_TOKEN, TENANTS, client, privatize

pytestmark = pytest.mark.server
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = re.compile(r"\b((?:sentdp|bentoml)_[a-z_]+)\b")
GROUPING = re.compile(r"\bby \(([^)]*)\)")
SUFFIXES = {"Counter": ("_total",), "Histogram": ("_bucket", "_sum", "_count")}
UNTRIGGERED = {"sentdp_tenant_busy_refusals_total", "sentdp_worker_late_requests_total"}
"""Refusals this test does not provoke; their names are checked against service.metrics."""


def expressions() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "sentdp-dashboard.json").read_text())
    found = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    found += [rule["expr"] for group in alerts["groups"] for rule in group["rules"]]
    return found


def defined() -> dict[str, tuple[str, ...]]:
    """Every exposed sentdp series name and its labels, from service.metrics."""
    names: dict[str, tuple[str, ...]] = {}
    for kind, base, labels, _ in _SPECS.values():
        for suffix in SUFFIXES[kind]:
            names[base + suffix] = (*labels, "le") if suffix == "_bucket" else labels
    return names


def test_every_metric_and_label_in_the_dashboard_and_alerts_exists(server) -> None:
    privatize(server, "d-user")
    with client(server, TENANTS[0].key) as http:
        body = {"user": "d-user", "epsilon": 1.0, "documents": [{"text": "A b. C d."}]}
        for _ in range(2):  # a replay
            assert http.post("/privatize", json=body, headers={"Idempotency-Key": "d1"}).is_success
        refund = {"user": "d-user", "epsilon": 1.0, "documents": [{"sentences": ["FAULT:before"]}]}
        assert http.post("/privatize", json=refund).status_code == 503
    with client(server, TENANTS[3].key) as http:  # a tenant with no budget: a 402
        assert http.post("/privatize", json=body).status_code == 402
    with client(server, METRICS_TOKEN) as http:
        exposed = http.get("/metrics").text
    live = set(re.findall(r"^([a-z_]+)[{ ]", exposed, re.MULTILINE))
    series = defined()
    exprs = expressions()
    assert len(exprs) >= 15
    named = {name for expr in exprs for name in NAME.findall(expr)}
    assert "bentoml_service_request_total" in named
    for name in sorted(named):
        if name.startswith("sentdp_"):
            assert name in series, f"{name} is not a metric sentdp defines"
        if name not in UNTRIGGERED:
            assert name in live, f"{name} is not on a live server's /metrics"
    for expr in exprs:
        labels = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")}
        for name in NAME.findall(expr):
            allowed = set(series.get(name, ())) | {"le"}
            if name.startswith("bentoml_"):
                allowed = {"le", "endpoint", "http_response_code", "service_name"}
            assert labels <= allowed, (expr, labels - allowed)
