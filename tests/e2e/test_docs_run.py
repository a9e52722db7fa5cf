"""Docs are tests: every command block in README.md and docs/*.md runs, in order, as written.

The conventions a doc follows (and this test enforces):

- A ```` ```sh ```` block is shell commands. Each document's blocks run top to bottom in ONE bash
  session (so an ``export`` or a ``gpu-agent serve &`` in one block holds for the next), in a
  fresh temporary working directory holding a copy of ``examples/`` (docs name those files as
  ``examples/mig-config.yaml`` etc., as a user in a checkout would). Every command's exit
  status is checked; the first one that fails fails the test, naming the doc, the line and the
  command, with the session's output.
- A command expected to fail says so in its comment with ``(exit N)``: it must exit exactly N.
- A ```` ```console ```` block is a transcript: its ``$ `` lines are commands and run as above;
  the other lines are example output and are not compared.
- A block that cannot run here (it needs a cluster, a registry, a real GPU, or installs
  software) carries an HTML comment on the line right before its fence:
  ``<!-- not run: REASON -->``. Nothing else skips a block; the test prints every skipped block
  with its reason, and a marker without a reason is refused.
- Every fence names its language (```` ``` ```` alone is refused), and a block with a line that
  starts with ``gpu-agent`` must be ``sh`` or ``console``: a command cannot hide in a ``text``
  block.
- A command ending in ``&`` runs in the background; after ``gpu-agent serve &`` the session
  waits for the agent's socket. Every background job is killed when the document ends.

The session's environment is the user's fresh machine, isolated for parallel runs: the venv's
``gpu-agent`` first on PATH, HOME and TMPDIR, ``GPU_AGENT_STATE_DIR``, the agent's socket
(``GPU_AGENT_SOCKET_PATH``) and file cache (``GPU_AGENT_PREWARM__CACHE_DIR``, not the shared
/var/cache/gpu-agent) under the test's temp dir, the metrics listener on a free loopback
port (``GPU_AGENT_METRICS_LISTEN=127.0.0.1:0``) instead of the fixed :9400. No simulated node is
set up for a doc: a doc that drives one says so itself (``export GPU_AGENT_SIMULATE=...``). The
simulator's latency model is off (``GPU_AGENT_SIMULATE_LATENCY=false``): the docs assert what
commands do and exit with, never how long they take, and with it on each MIG apply in a doc
slept a second per GPU.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(\s*)```(.*)$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:(.*?)-->\s*$")
_EXPECT = re.compile(r"#.*\(exit (\d+)\)")
# A safety net: a doc takes 5-45 s here (the sum stays near a minute on an idle machine).
_DOC_TIMEOUT_S = 240


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    lang: str
    body: list[str]
    skip_reason: str | None


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(name: str, text: str) -> list[Block]:
    lines = text.split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group(1), m.group(2).strip()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        marker = _NOT_RUN.match(lines[start - 1]) if start else None
        reason = marker.group(1).strip() if marker else None
        assert reason != "", f"{name}:{start + 1}: '<!-- not run: -->' needs a reason"
        out.append(Block(name, start + 1, info.split()[0] if info else "", body, reason))
        i += 1
    return out


def _complete(text: str) -> bool:
    return subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0


def commands(block: Block) -> list[Command]:
    """The block's commands: one per logical line (continuations and open quotes joined)."""
    lines: list[tuple[int, str]] = []
    for n, raw in enumerate(block.body, start=block.line + 1):
        if block.lang == "console":
            if raw.startswith("$ "):
                lines.append((n, raw[2:]))
            elif lines and lines[-1][1].rstrip().endswith("\\"):
                lines.append((n, raw))
            continue
        lines.append((n, raw))
    out: list[Command] = []
    pending: list[str] = []
    first = 0
    for n, raw in lines:
        if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if not pending:
            first = n
        pending.append(raw)
        text = "\n".join(pending)
        if not text.rstrip().endswith("\\") and _complete(text):
            out.append(Command(block.doc, first, text))
            pending = []
    assert not pending, f"{block.doc}:{first}: incomplete shell command: {pending}"
    return out


def _background(text: str) -> bool:
    code = subprocess.run(
        [
            "bash",
            "-c",
            'shopt -s extglob; c="$1"; c="${c%%#*}"; printf %s "${c%%+([[:space:]])}"',
            "_",
            text,
        ],
        capture_output=True,
        text=True,
    ).stdout
    return code.endswith("&") and not code.endswith("&&")


def script(cmds: list[Command], marks: Path) -> str:
    """One bash session running ``cmds`` in order, stopping at the first unexpected status."""
    out = [
        "set -o pipefail",
        "trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null' EXIT",
        "__wait_socket() { for _ in $(seq 1 300); do",
        '  [ -S "$GPU_AGENT_SOCKET_PATH" ] && return 0; sleep 0.05; done;',
        '  echo "the agent never opened $GPU_AGENT_SOCKET_PATH" >&2; return 1; }',
    ]
    for i, c in enumerate(cmds):
        m = _EXPECT.search(c.text.split("\n")[-1])
        want = int(m.group(1)) if m else 0
        out.append(f"echo {i} $EPOCHREALTIME >> {marks}")
        out.append(c.text)
        if _background(c.text):
            if re.search(r"\bgpu-agent\b.*\bserve\b", c.text):
                out.append(f"__wait_socket || exit {100 + i % 100}")
            continue
        out.append(f'__rc=$?; [ $__rc -eq {want} ] || {{ echo "exit:$__rc" >> {marks}; exit 1; }}')
    out.append(f"echo done $EPOCHREALTIME >> {marks}")
    return "\n".join(out) + "\n"


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AGENT_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(tmp / "home"),
        TMPDIR=str(tmp / "tmp"),
        GPU_AGENT_STATE_DIR=str(tmp / "state"),
        GPU_AGENT_SOCKET_PATH=str(tmp / "run" / "agent.sock"),
        GPU_AGENT_PREWARM__CACHE_DIR=str(tmp / "cache"),
        GPU_AGENT_METRICS_LISTEN="127.0.0.1:0",
        GPU_AGENT_SIMULATE_LATENCY="false",
    )
    (tmp / "home").mkdir()
    (tmp / "tmp").mkdir()
    return env


def _ids() -> list[str]:
    return [p.relative_to(REPO).as_posix() for p in DOCS]


def run_doc(name: str, text: str, tmp: Path, timeout_s: float = _DOC_TIMEOUT_S) -> str | None:
    """Check ``text``'s fences and run its command blocks; the failure, or None when all ran."""
    all_blocks = blocks(name, text)
    for b in all_blocks:
        if not b.lang:
            return f"{name}:{b.line}: a fence without a language: use sh, console, yaml, text…"
        if b.lang not in ("sh", "console") and b.skip_reason is None:
            cmd = next((x for x in b.body if x.lstrip().startswith("gpu-agent ")), None)
            if cmd is not None:
                return f"{name}:{b.line}: a command in a {b.lang} block: {cmd.strip()}"
    runnable = [b for b in all_blocks if b.lang in ("sh", "console")]
    for b in runnable:
        if b.skip_reason:
            print(f"not run: {name}:{b.line}: {b.skip_reason}")
    cmds = [c for b in runnable if b.skip_reason is None for c in commands(b)]
    if not cmds:
        return None  # nothing to run: its fences and markers are checked above
    work = tmp / "work"
    shutil.copytree(REPO / "examples", work / "examples")
    marks = tmp / "marks"
    marks.touch()
    with subprocess.Popen(
        ["bash", "-c", script(cmds, marks)],
        cwd=work,
        env=_env(tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends its background jobs too
    ) as proc:
        try:
            output, timed_out = proc.communicate(timeout=timeout_s)[0], False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, timed_out = proc.communicate()[0], True
    got = [line.split() for line in marks.read_text().splitlines()]
    if got and got[-1][0] == "done" and not timed_out:
        took = sorted(
            ((float(b[1]) - float(a[1]), cmds[int(a[0])]) for a, b in itertools.pairwise(got)),
            key=lambda t: -t[0],
        )
        for seconds, c in took[:5]:
            print(f"{seconds:5.1f} s  {c.where}: {c.text.splitlines()[0]}")
        return None
    started = [x[0] for x in got if x[0].isdigit()]
    failed = cmds[int(started[-1])] if started else cmds[0]
    why = (
        f"still running after {timeout_s:g} s"
        if timed_out
        else (got[-1][0] if got and got[-1][0].startswith("exit:") else "the session ended")
    )
    return f"{failed.where}: {why}: {failed.text}\n--- session output (tail) ---\n{output[-4000:]}"


@pytest.mark.parametrize("doc", _ids())
def test_every_command_block_runs_as_written(
    doc: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A short base: the agent's Unix socket path must stay under the kernel's 108 bytes.
    tmp = Path(tmp_path_factory.mktemp("doc", numbered=True))
    failure = run_doc(doc, (REPO / doc).read_text(), tmp)
    if failure:
        pytest.fail(failure, pytrace=False)


def test_a_failing_command_is_named_by_doc_line_and_text_and_blocks_hold_one_session(
    tmp_path: Path,
) -> None:
    doc = """# A doc

```sh
export GREETING=hello
sleep 30 &
test "$GREETING" = hello   # the export holds in the next command
```

<!-- not run: needs a cluster -->
```sh
kubectl apply -k deploy/kubernetes
```

```console
$ test "$GREETING" = hello
hello
$ false   # refused on purpose (exit 1)
$ echo one \\
  two | grep -q two
$ test -f examples/mig-config.yaml && test "$GREETING" = bye
```
"""
    failure = run_doc("doc.md", doc, tmp_path)
    assert failure is not None
    assert failure.startswith("doc.md:20: exit:1: test -f examples/mig-config.yaml"), failure


def test_a_block_is_never_skipped_silently(tmp_path: Path) -> None:
    bare = run_doc("a.md", "```\ngpu-agent status\n```\n", tmp_path / "a")
    assert bare == "a.md:1: a fence without a language: use sh, console, yaml, text…"
    hidden = run_doc("b.md", "```text\ngpu-agent status\n```\n", tmp_path / "b")
    assert hidden == "b.md:1: a command in a text block: gpu-agent status"
    with pytest.raises(AssertionError, match=r"c.md:2: .* needs a reason"):
        run_doc("c.md", "<!-- not run: -->\n```sh\nfalse\n```\n", tmp_path / "c")


def test_a_doc_past_its_time_is_named_and_its_background_jobs_end(tmp_path: Path) -> None:
    doc = "```sh\nsh -c 'echo $$ > bg.pid; exec sleep 60' &\nsleep 0.2\nsleep 60\n```\n"
    failure = run_doc("slow.md", doc, tmp_path, timeout_s=1)
    assert failure is not None and failure.startswith(
        "slow.md:4: still running after 1 s: sleep 60"
    )
    stat = Path(f"/proc/{int((tmp_path / 'work' / 'bg.pid').read_text())}/stat")
    # Gone, or a zombie that init has not reaped yet: either way it runs no more. SIGKILL is
    # delivered asynchronously: on a loaded machine the job can still read "R" for a moment
    # after the session's leader was reaped, so it is given a few seconds to die.
    deadline = time.monotonic() + 5
    while _alive(stat) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(stat)


def _alive(stat: Path) -> bool:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
