"""Diagnostics: the LEGW curvature probe and trust-ratio telemetry."""

from date_optax._src.diagnostics import lipschitz_estimate
from date_optax._src.telemetry import (
    MetricWriter,
    per_layer_ratios,
    plot_trust_ratio_heatmap,
    read_metrics_csv,
    trust_ratio_summary,
)

__all__ = [
    "MetricWriter",
    "lipschitz_estimate",
    "per_layer_ratios",
    "plot_trust_ratio_heatmap",
    "read_metrics_csv",
    "trust_ratio_summary",
]
