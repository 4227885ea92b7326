"""Observability: Prometheus metrics computed from the index stores
(:mod:`iqbridge.observability.metrics`, needs ``prometheus-client``) and OpenTelemetry
spans around the facade's calls (:mod:`iqbridge.observability.tracing`, off until
configured; needs ``opentelemetry-api`` only then). See docs/observability.md."""
