"""Epoch seconds <-> google.protobuf.Timestamp, the one time type of the API."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

__all__ = ["seconds", "timestamp"]


def timestamp(epoch_s: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(epoch_s * 1e9))
    return ts


def seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9
