"""Diagnostics: the LEGW curvature probe, trust-ratio telemetry and the
critical batch (and a batch schedule growing from it)."""

from date_optax._src.critical_batch import (
    FAR_FACTOR,
    critical_batch,
    propose_batch_schedule,
)
from date_optax._src.diagnostics import lipschitz_estimate
from date_optax._src.metric_writer import MetricWriter, read_metrics_csv
from date_optax._src.plots import plot_trust_ratio_heatmap
from date_optax._src.telemetry import per_layer_ratios, trust_ratio_summary

__all__ = [
    "FAR_FACTOR",
    "MetricWriter",
    "critical_batch",
    "lipschitz_estimate",
    "per_layer_ratios",
    "plot_trust_ratio_heatmap",
    "propose_batch_schedule",
    "read_metrics_csv",
    "trust_ratio_summary",
]
