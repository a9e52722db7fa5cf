"""DCGM compatibility: field catalog and dcgm-exporter counters CSVs (filled by the telemetry work)."""
