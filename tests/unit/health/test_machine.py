"""The health state machine, one test per transition (agent/health/machine.py): failing
signals fail at once, degrading ones need N in the window, marks clear only after the hold-down,
and the cap on changes keeps a flapping GPU at its worse state."""

from __future__ import annotations

from agent.health.machine import Mark, Policy, Signal, State, observe, settle

POLICY = Policy(degrade_events=3, degrade_window_s=60, hold_down_s=100, max_changes_per_hour=4)
FATAL = "XID 79 (GPU has fallen off the bus): needs reboot-node"


def failing(at: float, action: str = "reboot-node", reason: str = FATAL) -> Signal:
    return Signal(State.FAILED, reason, action, at)


def degrading(at: float) -> Signal:
    return Signal(State.DEGRADED, "XID 13 (Graphics Engine Exception)", "restart-application", at)


def run(mark: Mark, *signals: Signal) -> Mark:
    for signal in signals:
        mark, _ = observe(mark, signal, POLICY)
    return mark


def test_a_failing_signal_fails_a_healthy_gpu_at_once_with_its_action_and_pods() -> None:
    mark, change = observe(Mark(), failing(10), POLICY, ["ml/train-0", "ml/train-0", "a/b"])
    assert mark.state is State.FAILED and mark.since == 10
    assert mark.action == "reboot-node" and mark.reason == FATAL
    assert mark.pods == ("a/b", "ml/train-0")
    assert change is not None and change.before is State.HEALTHY and change.mark is mark


def test_a_failing_signal_fails_a_degraded_gpu() -> None:
    degraded = run(Mark(), degrading(1), degrading(2), degrading(3))
    assert degraded.state is State.DEGRADED
    mark, change = observe(degraded, failing(4), POLICY)
    assert mark.state is State.FAILED
    assert change is not None and change.before is State.DEGRADED


def test_one_application_xid_does_not_degrade() -> None:
    mark, change = observe(Mark(), degrading(1), POLICY)
    assert mark.state is State.HEALTHY and change is None


def test_n_degrading_signals_within_the_window_degrade() -> None:
    mark = run(Mark(), degrading(1), degrading(2))
    assert mark.state is State.HEALTHY
    mark, change = observe(mark, degrading(3), POLICY)
    assert mark.state is State.DEGRADED and change is not None
    assert "3 degrading signals within 60 s" in mark.reason
    assert mark.action == "restart-application"


def test_n_degrading_signals_spread_wider_than_the_window_do_not_degrade() -> None:
    mark = run(Mark(), degrading(0), degrading(40), degrading(80), degrading(120))
    assert mark.state is State.HEALTHY


def test_degraded_clears_only_after_the_hold_down_since_the_last_signal() -> None:
    mark = run(Mark(), degrading(1), degrading(2), degrading(3), degrading(50))
    same, change = settle(mark, 50 + 99, POLICY)
    assert same.state is State.DEGRADED and change is None
    healthy, change = settle(mark, 50 + 100, POLICY)
    assert healthy.state is State.HEALTHY and change is not None
    assert change.before is State.DEGRADED and healthy.action == "none"
    assert healthy.reason.startswith("no new error for 100 s since XID 13")


def test_failed_clears_only_after_the_hold_down_and_a_new_signal_restarts_it() -> None:
    mark = run(Mark(), failing(0))
    assert settle(mark, 99, POLICY)[0].state is State.FAILED
    mark = run(mark, failing(90))  # the condition again: the hold-down starts over
    assert mark.state is State.FAILED and mark.since == 0  # no new transition
    assert settle(mark, 189, POLICY)[0].state is State.FAILED
    healthy, change = settle(mark, 190, POLICY)
    assert healthy.state is State.HEALTHY and change is not None
    assert change.before is State.FAILED
    assert "since " + FATAL in healthy.reason


def test_failed_clears_to_degraded_while_the_window_still_holds_degrading_signals() -> None:
    mark = run(Mark(), failing(0), degrading(80), degrading(90), degrading(95))
    assert mark.state is State.FAILED
    after, change = settle(mark, 100, POLICY)
    assert after.state is State.DEGRADED and change is not None
    assert change.before is State.FAILED
    # its hold-down counts from the last degrading signal
    assert settle(after, 194, POLICY)[0].state is State.DEGRADED
    assert settle(after, 195, POLICY)[0].state is State.HEALTHY


def test_a_failed_mark_keeps_the_strongest_action() -> None:
    reset = failing(0, "reset-gpu", "XID 48 (Double Bit ECC Error): needs reset-gpu")
    mark = run(Mark(), reset, failing(1))
    assert mark.action == "reboot-node" and mark.reason == FATAL
    mark = run(mark, reset)
    assert mark.action == "reboot-node"


def test_the_cap_holds_a_flapping_gpu_failed_and_says_so_once() -> None:
    mark, t = Mark(), 0.0
    for _ in range(2):  # 4 changes: failed, healthy, failed, healthy
        mark = run(mark, failing(t))
        t += 100
        mark, change = settle(mark, t, POLICY)
        assert mark.state is State.HEALTHY and change is not None
    mark = run(mark, failing(t))  # worse is never held back: the 5th change happens
    assert mark.state is State.FAILED
    held, change = settle(mark, t + 100, POLICY)
    assert held.state is State.FAILED and held.held
    assert change is not None and change.held and change.before is State.FAILED
    text = held.describe(POLICY)
    assert "held failed: 4 changes in the last hour reach health.max_changes_per_hour (4)" in text
    again, change = settle(held, t + 200, POLICY)
    assert again.state is State.FAILED and change is None  # said once
    # once the hour has room again, it clears
    cleared, change = settle(held, 3600 + 101, POLICY)
    assert cleared.state is State.HEALTHY and change is not None and not cleared.held


def test_a_healthy_mark_stays_healthy_without_signals() -> None:
    mark, change = settle(Mark(since=5), 10_000, POLICY)
    assert mark.state is State.HEALTHY and change is None
