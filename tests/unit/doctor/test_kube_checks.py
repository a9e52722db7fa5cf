"""The Kubernetes checks against a real HTTP API stand-in: one SelfSubjectAccessReview per
verb the agent's ClusterRole grants, a denied verb named with the fix, discovery read."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from agent.doctor import kube_checks
from agent.kube import InClusterKubeClient
from agent.wire.doctor import Check, CheckState
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.api.support import wait_for
from tests.unit.doctor.support import facts

REPO = Path(__file__).resolve().parents[3]


class Api:
    """Answers /version, /apis and SelfSubjectAccessReviews; ``denied`` holds (verb, resource,
    subresource, group) the service account may not do. Every review is recorded."""

    def __init__(self) -> None:
        self.denied: set[tuple[str, str, str, str]] = set()
        self.reviews: list[dict] = []
        #: every call answers this code (an API server in trouble)
        self.code = 200
        self.calls = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the test reads the requests, not the server's log."""

            def _send(self, obj: object) -> None:
                api.calls += 1
                if api.code != 200:
                    obj = {"kind": "Status", "code": api.code, "message": "injected"}
                body = json.dumps(obj).encode()
                self.send_response(api.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/version":
                    self._send({"gitVersion": "v1.34.1"})
                else:
                    versions = [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}]
                    self._send({"groups": [{"name": "resource.k8s.io", "versions": versions}]})

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if api.code == 200:
                    api.reviews.append(review)
                a = review["spec"]["resourceAttributes"]
                key = (a["verb"], a["resource"], a.get("subresource", ""), a["group"])
                self._send({**review, "status": {"allowed": key not in api.denied}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.client = InClusterKubeClient(
            f"http://127.0.0.1:{self.server.server_address[1]}", None, token="t", timeout=5
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[Api]:
    server = Api()
    yield server
    server.close()


def test_the_verbs_asked_are_the_ones_the_agents_cluster_role_grants() -> None:
    docs = yaml.safe_load_all((REPO / "deploy/kubernetes/base/agent-rbac.yaml").read_text())
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpu-agent"
    )
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    asked = {(g, r, v) for g, r, verbs in kube_checks.AGENT_VERBS for v in verbs}
    assert asked == granted


def test_every_verb_allowed_is_ok(api: Api, tmp_path: Path) -> None:
    f = facts(tmp_path, kube=api.client)
    check = kube_checks.kube_rbac(f)
    assert check.state is CheckState.OK
    count = sum(len(v) for _, _, v in kube_checks.AGENT_VERBS)
    assert f"all {count} verbs" in check.evidence and len(api.reviews) == count
    assert kube_checks.kube_reachable(f).evidence.endswith("version v1.34.1")
    assert "resource.k8s.io v1" in kube_checks.kube_api_versions(f).evidence


def test_a_denied_verb_fails_naming_it_and_the_manifest_that_grants_it(
    api: Api, tmp_path: Path
) -> None:
    api.denied = {
        ("patch", "nodes", "status", ""),
        ("watch", "resourceslices", "", "resource.k8s.io"),
    }
    check = kube_checks.kube_rbac(facts(tmp_path, kube=api.client))
    assert check.state is CheckState.FAILED
    assert "denied 2 of" in check.evidence
    assert "patch nodes/status" in check.evidence
    assert "watch resourceslices.resource.k8s.io" in check.evidence
    assert "kubectl apply -k deploy/kubernetes" in check.fix


def test_an_api_server_that_does_not_answer_fails_reachable(tmp_path: Path) -> None:
    gone = InClusterKubeClient("http://127.0.0.1:9", None, token="t", timeout=2)
    check = kube_checks.kube_reachable(facts(tmp_path, kube=gone))
    assert check.state is CheckState.FAILED and "does not answer" in check.evidence


@pytest.mark.parametrize("code", [500, 503])
def test_an_api_server_in_trouble_is_not_blamed_on_rbac(
    api: Api, tmp_path: Path, code: int
) -> None:
    """Any failed call got the RBAC fix: with the API server down or timing out, the doctor
    told the operator to grant verbs the agent already has. Only a refusal (403) is RBAC."""
    api.code = code
    f = facts(tmp_path, kube=api.client)
    for check in (kube_checks.kube_rbac(f), kube_checks.kube_api_versions(f)):
        assert check.state is CheckState.FAILED
        assert check.fix == "the API server does not answer: see kubernetes/reachable"
    api.code = 403
    for check in (kube_checks.kube_rbac(f), kube_checks.kube_api_versions(f)):
        assert check.state is CheckState.FAILED and "kubectl apply -k" in check.fix


def test_the_allocation_mode_unknown_for_want_of_an_answer_is_not_blamed_on_rbac(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], tmp_path: Path
) -> None:
    """mig/allocation-mode said "grant the agent list/watch on resourceslices" whatever kept
    the slices unread: an API server away got an RBAC fix. Refused (403): RBAC; else not."""
    from agent.doctor.gpu_checks import mig_allocation_mode
    from agent.dra.watch import SLICES_PATH, AllocationWatch

    api, _ = kube_api

    def checked(code: str) -> Check:
        watch = AllocationWatch(kube, NODE, "gpu.nvidia.com")
        watch.start()
        try:
            wait_for(lambda: code in watch.current().evidence, "the slices' failure said")
            return mig_allocation_mode(facts(tmp_path, allocation=watch.current))
        finally:
            watch.stop()

    api.unavailable.add(SLICES_PATH)  # 503
    down = checked("503")
    assert down.state is CheckState.FAILED and "rbac" not in down.fix
    assert down.fix.startswith("the API server does not answer: see kubernetes/reachable")
    api.unavailable.clear()
    api.forbidden.add(("GET", SLICES_PATH))
    refused = checked("403")
    assert refused.state is CheckState.FAILED
    assert refused.fix.startswith("grant the agent list/watch on resourceslices")


def test_outside_a_cluster_the_kubernetes_checks_are_ok_saying_so(tmp_path: Path) -> None:
    for check in (kube_checks.kube_reachable, kube_checks.kube_rbac, kube_checks.kube_api_versions):
        found = check(facts(tmp_path))
        assert found.state is CheckState.OK and found.evidence.startswith("not in a cluster")


def test_reload_restart_pod_is_ok_only_when_the_agent_may_delete_the_plugin_pods(
    api: Api, tmp_path: Path
) -> None:
    """sharing/reload said "ok: reload restart-pod through the Kubernetes API" as soon as there
    was an API client, while the base role does not grant deleting pods: the first `share set`
    then wrote the file and failed its reload with a 403. The check now asks, in the plugin's
    namespace, for the two verbs the reload uses, and fails naming the one denied and the
    overlay that grants it (docs/troubleshooting.md, sharing/reload)."""
    import dataclasses

    from agent.doctor import node_checks

    made = facts(tmp_path, kube=api.client)
    sharing = dataclasses.replace(made.config.sharing, reload="restart-pod")
    f = dataclasses.replace(made, config=dataclasses.replace(made.config, sharing=sharing))
    assert node_checks.sharing_reload(f).state is CheckState.OK
    asked = [r["spec"]["resourceAttributes"] for r in api.reviews]
    assert {(a["verb"], a["resource"], a.get("namespace")) for a in asked} == {
        ("list", "pods", "gpu-operator"),
        ("delete", "pods", "gpu-operator"),
    }
    api.denied = {("delete", "pods", "", "")}
    check = node_checks.sharing_reload(f)
    assert check.state is CheckState.FAILED, check
    assert "delete pods in namespace gpu-operator" in check.evidence
    assert "overlays/sharing-restart-pod" in check.fix


def test_the_hourly_run_keeps_the_api_checks_answers_and_a_doctor_call_asks_again(
    api: Api, tmp_path: Path
) -> None:
    """About 26 SelfSubjectAccessReviews an agent an hour: some 40 requests a second from a
    5,000-node fleet, from nodes where nothing changed. The first run (the agent's start) and
    every `Doctor` call ask; the hourly refresh keeps those checks' last answers."""
    from agent.doctor.service import Doctor

    doctor = Doctor(facts(tmp_path, kube=api.client))
    doctor.refresh()  # the start: asks
    asked = len(api.reviews)
    assert asked == sum(len(v) for _, _, v in kube_checks.AGENT_VERBS)
    doctor.refresh()  # an hour on: nothing sent, the same answers
    assert len(api.reviews) == asked
    report = doctor.latest
    assert report is not None
    rbac = next(c for c in report.checks if (c.duty, c.name) == ("kubernetes", "rbac"))
    assert rbac.state is CheckState.OK
    doctor.run()  # `gpu-agent doctor`: asks again
    assert len(api.reviews) == 2 * asked


def test_the_hourly_run_keeps_every_answer_that_asked_the_api_and_reruns_the_others(
    api: Api, tmp_path: Path
) -> None:
    """What the hourly run keeps is what asked the API server at the last run, whatever its
    duty: sharing/reload with restart-pod asks for two verbs in the plugin's namespace, and is
    kept with the kubernetes checks; a check that asked nothing is read again."""
    import dataclasses

    from agent.doctor.service import Doctor

    made = facts(tmp_path, kube=api.client)
    sharing = dataclasses.replace(made.config.sharing, reload="restart-pod")
    config = dataclasses.replace(made.config, sharing=sharing)
    doctor = Doctor(dataclasses.replace(made, config=config))
    doctor.refresh()  # the start: asks
    asked = len(api.reviews)
    assert asked == sum(len(v) for _, _, v in kube_checks.AGENT_VERBS) + 2
    api.denied = {("delete", "pods", "", "")}  # would fail sharing/reload if it were asked again
    (tmp_path / "cache").mkdir()  # prewarm/cache-volume asks no API: read again, it changes
    first = doctor.latest
    doctor.refresh()
    assert len(api.reviews) == asked
    report = doctor.latest
    assert first is not None and report is not None
    by_name = {(c.duty, c.name): c for c in report.checks}
    assert by_name[("sharing", "reload")].state is CheckState.OK
    cache = ("prewarm", "cache-volume")
    assert by_name[cache] != {(c.duty, c.name): c for c in first.checks}[cache]
    again = doctor.run()  # `gpu-agent doctor`: asks again, and sees the denial
    reload = next(c for c in again.checks if (c.duty, c.name) == ("sharing", "reload"))
    assert reload.state is CheckState.FAILED and len(api.reviews) == 2 * asked


def test_an_agent_started_in_an_api_outage_asks_again_once_its_watches_are_current(
    api: Api, tmp_path: Path
) -> None:
    """The hourly run kept the start's answers: an agent started while the API server was away
    said kubernetes/reachable failed (gauge 2) until someone ran `gpu-agent doctor`, its
    watches long current again. They are asked again once the watches are current; nothing
    is sent while they are away, nor when the kept answers are all ok."""
    from agent.doctor.service import Doctor

    current = False
    doctor = Doctor(facts(tmp_path, kube=api.client), kube_current=lambda: current)

    def states() -> dict[str, CheckState]:
        report = doctor.latest
        assert report is not None
        return {c.name: c.state for c in report.checks if c.duty == "kubernetes"}

    api.code = 503
    doctor.refresh()  # the start, in the outage
    assert states()["reachable"] is CheckState.FAILED
    api.code = 200
    sent = api.calls
    doctor.refresh()  # an hour on: kept
    assert not doctor.recheck()  # the watches still away: nothing asked
    assert api.calls == sent and states()["reachable"] is CheckState.FAILED
    current = True
    assert doctor.recheck()
    assert set(states().values()) == {CheckState.OK} and api.calls > sent
    sent = api.calls
    assert not doctor.recheck()  # asked once: kept while nothing changes
    doctor.refresh()
    assert api.calls == sent

    # Started with the watches away but every answer ok: a recovery changes none of them.
    current = False
    quiet = Doctor(facts(tmp_path, kube=api.client), kube_current=lambda: current)
    quiet.refresh()
    sent, current = api.calls, True
    assert not quiet.recheck() and api.calls == sent
