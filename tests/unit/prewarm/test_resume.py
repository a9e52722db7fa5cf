"""The resume rules (agent/prewarm/resume.py): what a partial's fetch asks for, and when an answer
describes another object than the one the partial's bytes came from."""

from __future__ import annotations

from agent.prewarm.resume import object_change, resume_headers

KEY = "https://b.s3.example.com/m.bin?v=2"
OLD = {"url": KEY, "etag": '"abc"', "last_modified": "Mon, 01 Jun 2026 00:00:00 GMT", "total": 10}


def test_a_partial_of_the_same_identity_asks_for_the_rest_if_its_etag_still_holds() -> None:
    assert resume_headers(4, OLD, KEY) == {"Range": "bytes=4-", "If-Range": '"abc"'}


def test_nothing_is_resumed_for_another_identity_or_an_empty_partial() -> None:
    assert resume_headers(4, OLD, KEY + "&v=3") == {}
    assert resume_headers(0, OLD, KEY) == {}


def test_a_weak_etag_is_not_sent_in_if_range_and_a_date_is_used_without_any_etag() -> None:
    assert resume_headers(4, {**OLD, "etag": 'W/"abc"'}, KEY) == {"Range": "bytes=4-"}
    dated = {**OLD, "etag": None}
    assert resume_headers(4, dated, KEY)["If-Range"] == OLD["last_modified"]


def test_the_same_object_is_no_change() -> None:
    assert object_change(OLD, '"abc"', OLD["last_modified"], 10) is None
    assert object_change(OLD, 'W/"abc"', None, None) is None  # weakness alone is no change
    assert object_change({}, '"new"', None, 99) is None  # nothing known to compare


def test_a_changed_etag_or_size_is_said_with_both_values() -> None:
    why = object_change(OLD, '"def"', None, 7)
    assert why == (
        'object changed at origin (ETag "abc" -> "def", size 10 -> 7 bytes); restarting from 0'
    )


def test_last_modified_counts_only_where_no_etags_were_compared() -> None:
    later = "Tue, 02 Jun 2026 00:00:00 GMT"
    assert object_change(OLD, '"abc"', later, 10) is None
    why = object_change({**OLD, "etag": None}, None, later, 10)
    assert why is not None and "Last-Modified changed" in why


def test_an_etag_unfit_to_show_is_not_echoed() -> None:
    hostile = '"' + "x" * 500 + '"'
    why = object_change(OLD, hostile, None, None)
    assert why is not None and "x" * 65 not in why and "(not shown)" in why
    why = object_change(OLD, '"a\r\nSet-Cookie: s"', None, None)
    assert why is not None and "Set-Cookie" not in why
