"""The Prometheus deployment files agree with what the app exports: compose runs Prometheus against
the api's /metrics with the api's token, the alert rules parse and name only metrics we export."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from agent_async.engine import QueueStats
from agent_async.metrics.collector import MetricsSnapshot, families

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = {"AgentJobFailureRateHigh", "AgentQueueOldestJobWaiting", "AgentNoLiveWorker", "AgentMetricsUnavailable"}
_METRIC = re.compile(r"\bagent_async_[a-z_]+\b")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def exported_sample_names() -> set[str]:
    """Every sample name the exposition can hold (a counter's _total, a histogram's series)."""
    names: set[str] = set()
    for family in families(MetricsSnapshot(), workers_alive=0, queue=QueueStats(0, 0, 0.0), guards={}):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def test_every_alert_expression_names_exported_metrics() -> None:
    rules = [rule for group in load(PROMETHEUS / "alerts.yml")["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == ALERTS
    exported = exported_sample_names()
    assert {"agent_async_jobs_finished_total", "agent_async_job_duration_seconds_bucket",
            "agent_async_workers_alive"} <= exported
    for rule in rules:
        named = set(_METRIC.findall(rule["expr"]))
        assert named <= exported, (rule["alert"], named - exported)
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
    failure = next(r for r in rules if r["alert"] == "AgentJobFailureRateHigh")["expr"]
    assert 'status="failure"' in failure, "the status label is exported in lower case"


def test_prometheus_scrapes_the_api_with_the_metrics_token() -> None:
    config = load(PROMETHEUS / "prometheus.yml")
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    (scrape,) = config["scrape_configs"]
    assert scrape["metrics_path"] == "/metrics"
    assert scrape["honor_labels"] is True, "our `job` label would be renamed exported_job"
    assert scrape["static_configs"] == [{"targets": ["api:8000"]}]
    assert scrape["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/metrics_token"}

    compose = load(ROOT / "compose.yaml")
    services = compose["services"]
    assert "AGENT_METRICS_TOKEN" in services["api"]["environment"]
    assert compose["secrets"]["metrics_token"] == {"environment": "AGENT_METRICS_TOKEN"}
    prometheus = services["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:")
    assert prometheus["restart"] == "unless-stopped"
    assert prometheus["secrets"] == ["metrics_token"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert prometheus["depends_on"]["api"]["condition"] == "service_healthy"
    # The workers have no scrape target of their own: they count into Redis.
    assert "AGENT_METRICS_TOKEN" not in services["worker"]["environment"]
