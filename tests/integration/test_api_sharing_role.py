"""The sharing role changes sharing, not the rest of the device plugin's settings
(docs/security.md). A whole agent on a simulated node, the sharing role over mTLS, the node's
admin on its Unix socket."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from agent._proto.gpuagent.v1 import sharing_pb2, sharing_pb2_grpc
from tests.unit.api.support import (
    COORDINATOR,
    InProcessAgent,
    Pki,
    agent_config,
    unix_channel,
)

pytestmark = pytest.mark.integration

SHARER = "spiffe://cluster/ns/gpu-system/sa/sharing"
# Hardened as NVIDIA advises: a pod cannot ask for GPUs through NVIDIA_VISIBLE_DEVICES.
HARDENED = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: volume-mounts\n"
TIME_SLICED = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


@contextlib.contextmanager
def _sharer_and_admin(
    tmp_path: Path, plugin_file: str
) -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    """An agent whose plugin file starts as ``plugin_file``: a channel of the sharing role
    (mTLS) and one of the node's admin (the Unix socket)."""
    pki = Pki(tmp_path / "pki")
    sharer = pki.issue("sharer", f"URI:{SHARER}")
    root = tmp_path / "agent"
    config = agent_config(root, pki, roles={"admin": [COORDINATOR], "sharing": [SHARER]})
    (root / "plugin" / "config.yaml").write_text(plugin_file)
    with (
        InProcessAgent(root, config) as agent,
        grpc.secure_channel(
            f"localhost:{agent.node.ports.tcp}", sharer.credentials(pki.ca)
        ) as channel,
        unix_channel(agent.socket) as admin,
    ):
        yield channel, admin


def test_the_sharing_role_may_not_change_the_plugin_s_other_settings(tmp_path: Path) -> None:
    plugin_file = tmp_path / "agent" / "plugin" / "config.yaml"
    with _sharer_and_admin(tmp_path, HARDENED) as (channel, admin):
        theirs = sharing_pb2_grpc.SharingServiceStub(channel)
        weakened = TIME_SLICED + "flags:\n  plugin:\n    deviceListStrategy: envvar\n"
        for text in (weakened, TIME_SLICED + "resources:\n  gpus:\n    - pattern: '*'\n"):
            with pytest.raises(grpc.RpcError) as refused:
                theirs.SetSharing(sharing_pb2.SetSharingRequest(config_yaml=text), timeout=20)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "admin" in (refused.value.details() or "")
        assert plugin_file.read_text() == HARDENED

        # Sharing itself, and the plugin's settings as they are, are the sharing role's.
        same = TIME_SLICED + "flags:\n  plugin:\n    deviceListStrategy: volume-mounts\n"
        theirs.SetSharing(sharing_pb2.SetSharingRequest(config_yaml=same), timeout=20)
        written = yaml.safe_load(plugin_file.read_text())
        assert written["flags"]["plugin"] == {"deviceListStrategy": "volume-mounts"}
        assert written["sharing"]["timeSlicing"]["resources"][0]["replicas"] == 4

        # The node's admin may change them.
        mine = sharing_pb2_grpc.SharingServiceStub(admin)
        mine.SetSharing(sharing_pb2.SetSharingRequest(config_yaml=weakened), timeout=20)
        written = yaml.safe_load(plugin_file.read_text())
        assert written["flags"]["plugin"] == {"deviceListStrategy": "envvar"}


def test_the_sharing_role_may_not_roll_back_an_admins_plugin_settings(tmp_path: Path) -> None:
    """A rollback restores the previous file whole: when that would also undo an admin's change
    of the plugin's other settings (the hardening here), the sharing role is refused."""
    plugin_file = tmp_path / "agent" / "plugin" / "config.yaml"
    with _sharer_and_admin(
        tmp_path, "version: v1\nflags:\n  plugin:\n    deviceListStrategy: envvar\n"
    ) as (channel, admin):
        mine = sharing_pb2_grpc.SharingServiceStub(admin)
        mine.SetSharing(sharing_pb2.SetSharingRequest(config_yaml=HARDENED), timeout=20)
        hardened = plugin_file.read_text()
        theirs = sharing_pb2_grpc.SharingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            theirs.RollbackSharing(sharing_pb2.RollbackSharingRequest(), timeout=20)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "flags.plugin" in (refused.value.details() or "")
        assert plugin_file.read_text() == hardened

        # A rollback of sharing alone is the sharing role's.
        theirs.SetSharing(sharing_pb2.SetSharingRequest(config_yaml=TIME_SLICED), timeout=20)
        theirs.RollbackSharing(sharing_pb2.RollbackSharingRequest(), timeout=20)
        assert plugin_file.read_text() == hardened
        mine.RollbackSharing(sharing_pb2.RollbackSharingRequest(), timeout=20)
