"""DCGM's diagnostics as the check: what `dcgmi diag -j` output says, read from the
captured samples (testenv/dcgm_diag_samples.py says where each came from), in DCGM 4's
shape and DCGM 3's, and what output that is not a report says."""

from __future__ import annotations

import json

import pytest

from testenv import dcgm_diag_samples as samples
from workflows.engine import dcgm_diag


def test_dcgm3s_captured_level_1_output_reads_as_every_test_passing_on_its_eight_gpus():
    report = dcgm_diag.parse(samples.DCGM3_R1_PASS)
    assert report.shape == "dcgm3" and report.version == "3.1.0"
    assert report.passed and report.failures == ()
    assert {r.test for r in report.results} >= {"Denylist", "Inforom", "software"}
    assert {r.gpu for r in report.results if r.test == "software"} == {str(g) for g in range(8)}
    # Some tests run once over all eight and name them together: still eight GPUs.
    assert any("," in r.gpu for r in report.results)
    assert report.gpus == {str(g) for g in range(8)}


def test_dcgm4_output_reads_per_test_and_per_gpu_and_passes_when_every_result_passes():
    report = dcgm_diag.parse(samples.dcgm4_text(gpus=8, level=3))
    assert report.shape == "dcgm4" and report.version == samples.DCGM4_VERSION
    assert report.passed
    assert {r.gpu for r in report.results if r.test == "diagnostic"} == {str(g) for g in range(8)}
    assert [r.test for r in report.results if r.gpu == "0"] == [
        "software", "pcie", "memory", "diagnostic", "targeted_stress", "targeted_power"]


def test_a_memory_test_failing_on_gpu_3_is_the_one_failure_with_dcgms_own_words():
    report = dcgm_diag.parse(samples.dcgm4_text(gpus=8, level=2, failing={3: "memory"}))
    assert not report.passed
    (failure,) = report.failures
    assert (failure.category, failure.test, failure.gpu, failure.status) == ("Hardware", "memory", "3", "Fail")
    assert "GPU 3 had 1 memory miscompares" in failure.warnings[0]
    assert report.failed_tests() == ("memory",)


def test_a_runtime_error_instead_of_tests_is_a_failure_not_a_pass():
    text = json.dumps({"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"},
                       "metadata": {"version": "4.3.1"}})
    report = dcgm_diag.parse(text)
    assert not report.passed and report.runtime_error == "Unable to connect to the host engine"


def test_a_test_with_only_its_summary_still_says_it_failed():
    text = json.dumps({"DCGM Diagnostic": {"test_categories": [
        {"category": "Stress", "tests": [{"name": "targeted_power", "results": [], "test_summary": {"status": "Fail"}}]}]}})
    report = dcgm_diag.parse(text)
    assert [(f.test, f.gpu) for f in report.failures] == [("targeted_power", "all")]


@pytest.mark.parametrize(("output", "says"), [
    (None, "no JSON"),
    ("", "no JSON"),
    ("Error: unable to establish a connection to the specified host: localhost", "no JSON"),
    (samples.dcgm4_text(gpus=8, level=3)[:4096], "cut short"),
    (samples.DCGM3_R1_PASS[:900], "cut short"),
    ('{"DCGM Diagnostic": {"test_categories": [}', "not JSON"),
    ("[1, 2, 3]", "no JSON"),
    ('{"DCGM Diagnostic": 3}', "not an object"),
    ('{"DCGM Diagnostic": {"test_categories": "many"}}', "no test_categories"),
    ('{"DCGM Diagnostic": {"test_categories": []}}', "no test result"),
    ('{"Diagnostics v5": {"tests": []}}', "neither 'DCGM Diagnostic' (DCGM 4) nor 'DCGM GPU Diagnostic' (DCGM 3)"),
    (b"\xff\xfe{\x00garbage", "not JSON"),
    ("{" * 100_000, "not JSON"),
])
def test_output_that_is_no_report_is_a_clear_unreadable_never_a_crash_or_a_pass(output, says):
    with pytest.raises(dcgm_diag.DiagUnreadable, match=None) as raised:
        dcgm_diag.parse(output)
    assert says in str(raised.value)


def test_the_command_starts_a_host_engine_in_the_pod_and_runs_the_level_with_json_output():
    command = dcgm_diag.command(3)
    assert command[:2] == ("/bin/sh", "-c")
    script = command[2]
    assert "nv-hostengine -n" in script and "dcgmi diag -r 3 -j" in script
    # The exit code is dcgmi's, and its JSON reaches both the log and the termination message.
    assert script.rstrip().endswith("exit $rc") and "/dev/termination-log" in script
