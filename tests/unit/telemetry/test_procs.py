"""GPU processes map to containers through their cgroup and kubelet's container log links."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.telemetry.procs import ContainerDirectory, container_id, read_container_id
from agent.telemetry.snapshot import PodRef

CID = "4f2a" * 16
UID = "0d6e1c2a-8f3b-4c5d-9e7f-1a2b3c4d5e6f"
SLICE = f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"


@pytest.mark.parametrize(
    "cgroup",
    [
        f"0::/kubepods.slice/kubepods-burstable.slice/{SLICE}/cri-containerd-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
        f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n",
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope\n",
    ],
)
def test_container_id_from_every_cgroup_layout(cgroup: str) -> None:
    assert container_id(cgroup) == CID


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/system.slice/nvidia-persistenced.service\n",
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice\n",  # pod cgroup itself
        f"0::/docker/{CID}\n",  # a container, but not Kubernetes'
        "",
    ],
)
def test_processes_outside_pod_containers_have_no_container(cgroup: str) -> None:
    assert container_id(cgroup) is None


def test_read_container_id_from_a_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    assert read_container_id(tmp_path, 4242) == CID
    with pytest.raises(OSError):  # no such process in this /proc, or no permission: unknown
        read_container_id(tmp_path, 1)
    # A tenant's delegated cgroups naming megabytes of paths: unknown, read no further than
    # 64 KiB (not "not in a pod", which a cut-off id would have read as)
    (tmp_path / "4243").mkdir()
    long = "/".join(["d" * 250] * 4000)
    (tmp_path / "4243" / "cgroup").write_text(f"0::/kubepods/{long}/{CID}\n")
    with pytest.raises(OSError, match="over 65536 bytes"):
        read_container_id(tmp_path, 4243)


def test_directory_names_containers_and_rescans_once_per_tick(tmp_path: Path) -> None:
    (tmp_path / f"trainer-0_ml_main-{CID}.log").touch()
    (tmp_path / "not-a-link.txt").touch()
    directory = ContainerDirectory(tmp_path)
    directory.begin()
    assert directory.lookup(CID) == PodRef("ml", "trainer-0", "main")
    other = "ab" * 32
    (tmp_path / f"nb-7_team-a_jupyter-lab-{other}.log").touch()
    directory.begin()
    assert directory.lookup(other) == PodRef("team-a", "nb-7", "jupyter-lab")
    missing = "cd" * 32
    assert directory.lookup(missing) is None
    (tmp_path / f"late_ns_c-{missing}.log").touch()
    assert directory.lookup(missing) is None, "already re-listed this tick"
    directory.begin()
    assert directory.lookup(missing) == PodRef("ns", "late", "c")


def test_directory_that_does_not_exist_knows_nothing(tmp_path: Path) -> None:
    directory = ContainerDirectory(tmp_path / "absent")
    directory.begin()
    assert directory.lookup(CID) is None


def test_pod_uids_come_from_where_the_log_links_point_and_two_are_none(tmp_path: Path) -> None:
    """kubelet links /var/log/containers/<pod>_<ns>_<c>-<id>.log into
    /var/log/pods/<ns>_<pod>_<uid>/: the link names the UID (the target need not be mounted).
    A pod recreated under its name while the old one's link remains has two: unknown."""
    uid, old, new = (f"{n}{n}{n}{n}{n}{n}{n}{n}-1234-4abc-8def-0123456789ab" for n in "abc")
    (tmp_path / f"train-0_ml_main-{CID}.log").symlink_to(
        f"/var/log/pods/ml_train-0_{uid}/main/0.log"
    )
    (tmp_path / f"web_ml_srv-{'ab' * 32}.log").symlink_to(f"/var/log/pods/ml_web_{old}/srv/0.log")
    (tmp_path / f"web_ml_srv-{'cd' * 32}.log").symlink_to(f"/var/log/pods/ml_web_{new}/srv/1.log")
    (tmp_path / f"odd_ml_c-{'ef' * 32}.log").symlink_to("/var/log/pods/ml_other_x/c/0.log")
    directory = ContainerDirectory(tmp_path)
    directory.begin()
    assert directory.pod_uid(PodRef("ml", "train-0", "main")) == uid
    assert directory.pod_uid(PodRef("ml", "web", "srv")) is None
    assert directory.pod_uid(PodRef("ml", "odd", "c")) is None  # points at another pod's logs
    assert directory.lookup(CID) == PodRef("ml", "train-0", "main")


def test_a_pod_recreated_under_its_name_gets_its_new_uid(tmp_path: Path) -> None:
    """A StatefulSet pod deleted and made again keeps its name, not its UID. The UID read for
    the old pod was kept as long as no unknown container id forced a re-listing: a new pod
    that held its GPU without running on it carried the deleted pod's pod_uid indefinitely."""
    old, new = (f"{n * 8}-1234-4abc-8def-0123456789ab" for n in "ab")
    link = tmp_path / f"train-0_ml_main-{CID}.log"
    link.symlink_to(f"/var/log/pods/ml_train-0_{old}/main/0.log")
    directory = ContainerDirectory(tmp_path)
    directory.begin()
    assert directory.pod_uid(PodRef("ml", "train-0", "main")) == old
    link.unlink()  # kubelet removed the deleted pod's container and its log link
    (tmp_path / f"train-0_ml_main-{'ab' * 32}.log").symlink_to(
        f"/var/log/pods/ml_train-0_{new}/main/0.log"
    )
    directory.begin()
    assert directory.pod_uid(PodRef("ml", "train-0", "main")) == new
