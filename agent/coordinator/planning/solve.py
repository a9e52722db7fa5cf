"""The fleet planner's exact combination step: one option per GPU for the whole fleet (pure).

An integer program over GPU classes (GPUs in the same state, offering devices to the same
demand entries, are interchangeable), solved with HiGHS (`highspy`, the HiGHS project's own
binding: MIT, in-process, no pinned protobuf; OR-Tools pins protobuf below ours, and PuLP's CBC
runs as a subprocess through files):

* ``x[c, o]`` integer: GPUs of class ``c`` that take option ``o``; they sum to the class size;
* ``z[g, e]`` integer: devices of group ``g`` (one profile, counted by the same entries) given
  to entry ``e``; a group gives no more than its GPUs' options hold;
* ``u[e]``: how far entry ``e`` stays short of its demand.

Objectives, each solved to proven optimality and then held as a constraint for the next
(lexicographic): the shortfall of each priority level, highest first; then instances destroyed;
then mutations; then fragmentation (`agent.coordinator.planning.options` defines the three).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import NotSupported

__all__ = ["ClassSpec", "Problem", "Solution", "SolverMissing", "solve"]


class SolverMissing(NotSupported):
    """highspy is not installed (a declared dependency): the fleet planner needs it."""


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """``count`` interchangeable GPUs; per option its supply per group and its cost."""

    count: int
    supply: tuple[tuple[tuple[int, int], ...], ...]  # per option: (group, devices)
    cost: tuple[tuple[int, int, int], ...]  # per option: (destroyed, mutations, frag)


@dataclass(frozen=True, slots=True)
class Problem:
    classes: tuple[ClassSpec, ...]
    #: per group: the entries its devices may count toward.
    groups: tuple[tuple[int, ...], ...]
    demand: tuple[int, ...]
    priority: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Solution:
    #: per class: how many of its GPUs take each option.
    choice: tuple[tuple[int, ...], ...]
    #: (group, entry) -> devices given.
    given: dict[tuple[int, int], int]
    #: every stage proven optimal (False: a time limit cut one short; the plan is still valid).
    optimal: bool


_BANNER_LOCK = threading.Lock()
_quiet = False


def _highs() -> Any:
    global _quiet
    try:
        import highspy
    except ImportError as exc:  # pragma: no cover - the dependency is declared
        raise SolverMissing(
            "the fleet planner needs highspy (a dependency of gpu-node-agent): pip install highspy"
        ) from exc
    with _BANNER_LOCK:
        if _quiet:
            return highspy.Highs()
        # HiGHS prints a banner from C on the first instance of a process; keep stdout (JSON
        # output of the CLI) clean by pointing fd 1 away for that one construction.
        sys.stdout.flush()
        saved = os.dup(1)
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)
        _quiet = True
        return h


def trivial(problem: Problem) -> Solution | None:
    """Every GPU stays, when that already meets all demand or nothing else is possible."""
    stay = tuple((c.count, *([0] * (len(c.cost) - 1))) for c in problem.classes)
    # The greedy split is exact only when no two entries share a group: else ask the solver.
    if any(len(es) > 1 for es in problem.groups):
        return None
    given = _greedy_given(problem, stay)
    if all(len(c.cost) == 1 for c in problem.classes) or not any(problem.demand):
        return Solution(stay, given, True)
    got = [0] * len(problem.demand)
    for (_, e), n in given.items():
        got[e] += n
    if all(g >= d for g, d in zip(got, problem.demand, strict=True)):
        return Solution(stay, given, True)
    return None


def _greedy_given(problem: Problem, choice: Sequence[Sequence[int]]) -> dict[tuple[int, int], int]:
    supply = [0] * len(problem.groups)
    for c, picks in zip(problem.classes, choice, strict=True):
        for o, n in enumerate(picks):
            for g, k in c.supply[o]:
                supply[g] += n * k
    need = list(problem.demand)
    given: dict[tuple[int, int], int] = {}
    for g, entries in enumerate(problem.groups):
        for e in sorted(entries, key=lambda e: -problem.priority[e]):
            take = min(need[e], supply[g])
            if take:
                given[(g, e)] = take
                need[e] -= take
                supply[g] -= take
    return given


def solve(problem: Problem, *, time_limit_s: float = 30.0) -> Solution:
    """The lexicographic optimum (see the module doc), or the best found within the limit."""
    easy = trivial(problem)
    if easy is not None:
        return easy
    h = _highs()  # first: it says clearly when highspy is missing
    model = _Model(problem)
    h.silent()
    h.passModel(model.lp())
    h.setOptionValue("mip_rel_gap", 0.0)
    # Every objective is an integer: a gap below 1 proves the optimum.
    h.setOptionValue("mip_abs_gap", 0.99)
    h.setOptionValue("threads", 1)
    solution, optimal = _run_stages(h, model.stages(), model.n_col, time_limit_s)
    choice = [[0] * len(k.cost) for k in problem.classes]
    for j, (c, o) in enumerate(model.x_cols):
        choice[c][o] = round(solution[j])
    frozen = tuple(tuple(row) for row in choice)
    n_x = len(model.x_cols)
    given = {
        model.z_cols[j]: n for j in range(len(model.z_cols)) if (n := round(solution[n_x + j]))
    }
    return Solution(frozen, given, optimal)


class _Model:
    """The MIP: columns x (a class's option count), z (supply given to a demand entry), e (an
    entry's unmet demand); rows: one per class (= count), one per group (z - supply <= 0), one
    per entry (>= demand)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.x_cols: list[tuple[int, int]] = [
            (c, o) for c, k in enumerate(problem.classes) for o in range(len(k.cost))
        ]
        self.z_cols = [(g, e) for g, es in enumerate(problem.groups) for e in es]
        self.n_e = len(problem.demand)
        self.n_col = len(self.x_cols) + len(self.z_cols) + self.n_e

    def _columns(self) -> tuple[list[int], list[int], list[float]]:
        """The constraint matrix, column-wise (start, index, value)."""
        problem, n_x, n_z = self.problem, len(self.x_cols), len(self.z_cols)
        n_cls, n_grp = len(problem.classes), len(problem.groups)
        cols: list[list[tuple[int, float]]] = [[] for _ in range(self.n_col)]
        for j, (c, o) in enumerate(self.x_cols):
            cols[j].append((c, 1.0))
            for g, k in problem.classes[c].supply[o]:
                cols[j].append((n_cls + g, -float(k)))
        for j, (g, e) in enumerate(self.z_cols):
            cols[n_x + j] += [(n_cls + g, 1.0), (n_cls + n_grp + e, 1.0)]
        for e in range(self.n_e):
            cols[n_x + n_z + e].append((n_cls + n_grp + e, 1.0))
        start, index, value = [0], [], []
        for col in cols:
            for r, v in sorted(col):
                index.append(r)
                value.append(v)
            start.append(len(index))
        return start, index, value

    def lp(self) -> Any:
        import highspy
        import numpy as np

        problem, inf = self.problem, highspy.kHighsInf
        n_cls, n_grp, n_e = len(problem.classes), len(problem.groups), self.n_e
        upper = (
            [float(problem.classes[c].count) for c, _ in self.x_cols]
            + [float(problem.demand[e]) for _, e in self.z_cols]
            + [float(d) for d in problem.demand]
        )
        row_lower = (
            [float(c.count) for c in problem.classes]
            + [-inf] * n_grp
            + [float(d) for d in problem.demand]
        )
        row_upper = [float(c.count) for c in problem.classes] + [0.0] * n_grp + [inf] * n_e
        start, index, value = self._columns()
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = self.n_col, n_cls + n_grp + n_e
        lp.col_cost_ = np.zeros(self.n_col)
        lp.col_lower_, lp.col_upper_ = np.zeros(self.n_col), np.array(upper)
        lp.row_lower_, lp.row_upper_ = np.array(row_lower), np.array(row_upper)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.array(start, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value)
        integer = len(self.x_cols) + len(self.z_cols)
        lp.integrality_ = [highspy.HighsVarType.kInteger] * integer + [
            highspy.HighsVarType.kContinuous
        ] * n_e
        return lp

    def stages(self) -> list[list[float]]:
        """The objectives in lexicographic order: unmet demand by priority, highest first,
        then each part of the options' cost."""
        problem, n_e = self.problem, self.n_e
        unmet = len(self.x_cols) + len(self.z_cols)
        stages: list[list[float]] = []
        levels = sorted(
            {problem.priority[e] for e in range(n_e) if problem.demand[e]}, reverse=True
        )
        for level in levels:
            cost = [0.0] * self.n_col
            for e in range(n_e):
                if problem.priority[e] == level:
                    cost[unmet + e] = 1.0
            stages.append(cost)
        for part in range(3):
            cost = [0.0] * self.n_col
            for j, (c, o) in enumerate(self.x_cols):
                cost[j] = float(problem.classes[c].cost[o][part])
            stages.append(cost)
        return stages


def _run_stages(
    h: Any, stages: list[list[float]], n_col: int, time_limit_s: float
) -> tuple[list[float], bool]:
    """Optimise each stage in turn, pinning its optimum as a row for the next; (the last
    stage's solution, whether every stage was proven optimal)."""
    import highspy
    import numpy as np

    optimal = True
    deadline = _clock() + time_limit_s
    solution: list[float] | None = None
    everything = np.arange(n_col, dtype=np.int32)
    for cost in stages:
        h.setOptionValue("time_limit", max(0.1, deadline - _clock()))
        h.changeColsCost(n_col, everything, np.array(cost))
        h.run()
        status = h.getModelStatus()
        found = h.getSolution().col_value
        if status != highspy.HighsModelStatus.kOptimal:
            if len(found) != n_col or h.getInfo().primal_solution_status != 2:
                break  # no feasible point this stage: keep the last stage's
            optimal = False
        solution = list(found)
        best = round(sum(c * v for c, v in zip(cost, solution, strict=True)))
        nz = [j for j, c in enumerate(cost) if c]
        if nz:
            h.addRow(
                -highspy.kHighsInf,
                float(best),
                len(nz),
                np.array(nz, dtype=np.int32),
                np.array([cost[j] for j in nz]),
            )
    if solution is None:  # pragma: no cover - staying everywhere is always feasible
        raise RuntimeError("the fleet plan found no feasible point")
    return solution, optimal


def _clock() -> float:
    import time

    return time.monotonic()
