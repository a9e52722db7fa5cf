"""The in-use scan reads the processes of the agent's PID namespace. Where /proc does not say
which namespace that is (no ``self/ns/pid`` link, as under some LSMs and sandboxes, and one pid
in ``NSpid:``), the agent may be in its pod's own: the processes of other pods that map a blob
are not there to see. Such a scan rules out no one, as one without hostPID does, and says why."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from agent.errors import Busy
from agent.prewarm.model import FileRequest, ItemState
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.sharing.pidns_fixtures import a_proc

pytestmark = pytest.mark.integration
MIB = 1024 * 1024
UNREAD = "the agent's PID namespace could not be read"


def test_no_blob_is_evicted_when_the_agent_s_pid_namespace_cannot_be_read(
    tmp_path: Path, origin: Origin
) -> None:
    origin.add("held.bin", hashlib.sha256(b"held").digest() * (MIB // 32))
    origin.add("new.bin", hashlib.sha256(b"new").digest() * (MIB // 32))
    # What the agent sees: its own process, holding nothing; the pod that maps the blob is not
    # in this namespace's /proc, whichever namespace it is.
    proc = a_proc(tmp_path / "proc", None, nspid="7")
    (proc / "7" / "fd").mkdir(parents=True)
    svc = make_service(tmp_path, budget=MIB + MIB // 2, proc_root=proc)
    svc.run(svc.submit(FileRequest(origin.url("held.bin"), name="held")).id)
    with pytest.raises(
        Busy, match=re.escape(f"its scan stopped ({UNREAD} from {proc}/self/ns/pid")
    ):
        svc.evict("held")
    new = svc.run(svc.submit(FileRequest(origin.url("new.bin"), name="new")).id)
    assert new.state is ItemState.FAILED and f"the in-use scan stopped ({UNREAD}" in (
        new.error or ""
    ), new.error
    assert svc.get("held").state is ItemState.READY
    assert svc.store.name_path("held").resolve().exists()
