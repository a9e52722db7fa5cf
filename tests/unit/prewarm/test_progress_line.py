"""The progress line `gpu-agent prewarm file|model|image|apply` prints on stderr while it waits,
and a prewarm operation's progress in words (`gpu-agent operations`, fleet rollouts)."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import cache_pb2, operations_pb2
from agent.cli.prewarm import progress_line
from agent.wire.operations import ItemProgress, operation_from

MIB = 1 << 20


def test_a_fetch_in_flight_shows_its_rate_and_eta() -> None:
    items = [ItemProgress("a", 12 * MIB, 24 * MIB, 6.0 * MIB, 2.0)]
    assert progress_line(items, None) == "12.0 MiB / 24.0 MiB  50.0% 6.0 MiB/s ETA 2s"


def test_no_fetch_in_flight_shows_no_rate_rather_than_zero() -> None:
    """The agent sends rate 0 for an item with no live fetch (queued, or its size not yet
    known): "0 B/s" would be a measurement nobody made."""
    assert progress_line([ItemProgress("a", 0, None, 0.0, None)], None) == "0 B / ?"


def test_the_last_line_says_how_long_the_warm_took_not_a_rate_of_zero() -> None:
    """Once the operation ended nothing is fetching, so its rate is 0; the line says it is done
    and how long this command waited instead."""
    items = [ItemProgress("a", 24 * MIB, 24 * MIB, 0.0, None)]
    assert progress_line(items, 0.42) == "24.0 MiB / 24.0 MiB 100.0% done in 0.4s"


def test_the_total_is_unknown_while_any_item_s_size_is() -> None:
    items = [ItemProgress("a", MIB, 2 * MIB, MIB, 1.0), ItemProgress("b", 0, None, 0.0, None)]
    assert progress_line(items, None).startswith("1.0 MiB / ? 1.0 MiB/s")


def test_a_warm_that_failed_or_was_cancelled_is_not_said_to_be_done() -> None:
    """A sha256 mismatch ended with ``0 B / ? done in 0.0s`` above its error."""
    items = [ItemProgress("a", 0, None, 0.0, None)]
    assert progress_line(items, 0.04, "failed") == "0 B / ? failed after 0.0s"
    assert progress_line(items, 1.5, "cancelled") == "0 B / ? cancelled after 1.5s"


def test_what_has_no_byte_count_yet_is_named_instead_of_a_bare_question_mark() -> None:
    """An image pull reports no bytes (containerd does not), nor does a file before its
    answer's headers or while a dropped connection is retried: the line stayed "0 B / ?" for
    the whole pull, minutes long, saying nothing of what ran. It names what is fetching with
    no size yet, and counts the items still queued for a worker."""
    pulling = ItemProgress("a", 0, None, 0.0, None, name="vllm", state="fetching")
    assert progress_line([pulling], None) == "0 B / ? fetching vllm"
    queued = ItemProgress("b", 0, 4 * MIB, 0.0, None, name="w", state="queued")
    line = progress_line([pulling, queued], None)
    assert line == "0 B / ? fetching vllm, 1 queued", line
    sized = ItemProgress("c", MIB, 2 * MIB, MIB, 1.0, name="x", state="fetching")
    assert progress_line([sized], None) == "1.0 MiB / 2.0 MiB  50.0% 1.0 MiB/s ETA 1s"
    assert progress_line([pulling], 3.0) == "0 B / ? done in 3.0s"


def test_a_fetch_waiting_to_resume_says_so_and_why() -> None:
    """A dropped connection left the line at its bytes, with no word of the wait."""
    note = "attempt 2 of 6 in 2.0s: connection closed at 1048576 of 2097152 bytes"
    waiting = ItemProgress("a", MIB, 2 * MIB, 0.0, None, name="w", state="fetching", retrying=note)
    line = progress_line([waiting], None)
    assert line == f"1.0 MiB / 2.0 MiB  50.0% retrying w: {note}", line
    other = ItemProgress("b", 0, MIB, 0.0, None, name="v", state="fetching", retrying=note)
    assert progress_line([waiting, other], None).endswith(f"retrying w: {note} (+1)")


def _operation(*states: int, ended: int) -> operations_pb2.Operation:
    items = [
        operations_pb2.PrewarmItemProgress(item_id=f"i{n}", name=f"shard-{n}", state=s)
        for n, s in enumerate(states)
    ]
    op = operations_pb2.Operation(name="operations/a", kind="prewarm")
    op.metadata.prewarm.CopyFrom(
        operations_pb2.PrewarmProgress(items=items, items_total=len(items), items_done=ended)
    )
    return op


def test_an_operation_whose_items_all_failed_does_not_read_done() -> None:
    """`operations list/show/wait` and a fleet rollout's node line said "2/2 items done" for
    a prewarm whose every item failed. Ended items are named by how they ended."""
    failed, ready = cache_pb2.CACHE_ITEM_STATE_FAILED, cache_pb2.CACHE_ITEM_STATE_READY
    fetching = cache_pb2.CACHE_ITEM_STATE_FETCHING
    assert operation_from(_operation(failed, failed, ended=2)).progress == "2 failed of 2 items"
    mixed = operation_from(_operation(ready, failed, fetching, ended=2)).progress
    assert mixed == "1 ready, 1 failed of 3 items, 1 in progress", mixed
    unnamed = _operation(0, 0, ended=1)  # an agent that names no item state
    assert operation_from(unnamed).progress == "1/2 items ended, 1 in progress"
