"""The doctor's report on the wire and back: the same records, one line each and bounded, and
a state this client does not know read as failed, never as ok."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import agent_pb2
from agent.wire.doctor import MAX_TEXT, Check, CheckState, DoctorReport, doctor_pb, report_from


def test_a_report_comes_back_as_it_went() -> None:
    report = DoctorReport(
        "node-1",
        (
            Check("telemetry", "nvml", CheckState.OK, "NVML 12.550"),
            Check("prewarm", "containerd", CheckState.DEGRADED, "no CRI socket", "mount it"),
            Check("api", "socket-dir", CheckState.FAILED, "mode 0777", "chmod 0700 /run/x"),
        ),
    )
    back = report_from(doctor_pb(report))
    assert back == report
    assert back.worst is CheckState.FAILED
    assert DoctorReport("n", ()).worst is CheckState.OK


def test_evidence_is_one_bounded_line() -> None:
    long = Check("d", "n", CheckState.FAILED, "a\nb " + "x" * 5000, "fix\tit")
    pb = doctor_pb(DoctorReport("n", (long,))).checks[0]
    assert "\n" not in pb.evidence and len(pb.evidence) <= MAX_TEXT
    assert pb.evidence.startswith("a b xxx") and pb.evidence.endswith("x …(cut)")
    assert pb.fix == "fix it"


def test_an_unknown_state_reads_as_failed() -> None:
    pb = agent_pb2.DoctorResponse(
        node="n", checks=[agent_pb2.DoctorCheck(duty="d", name="n", state=99, evidence="e")]
    )
    assert report_from(pb).checks[0].state is CheckState.FAILED
    unset = agent_pb2.DoctorResponse(checks=[agent_pb2.DoctorCheck(duty="d", name="n")])
    assert report_from(unset).checks[0].state is CheckState.FAILED
