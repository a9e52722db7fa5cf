"""DCGM compatibility: the field catalog and dcgm-exporter's counters-CSV format.

``dcgm.fields`` says what each DCGM field means and where the agent reads it; ``dcgm.counters``
parses the CSV that selects fields. ``default-counters.csv`` is the selection used by default.
"""
