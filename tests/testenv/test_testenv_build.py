"""The first build of the test control plane says it is alive: which binary, how long so
far, how many packages compiled (read from `go build -v` and `go mod` in its log)."""

from __future__ import annotations

from testenv.build import progress_line

LOG = """\
$ go mod tidy -e
go: downloading k8s.io/kubernetes v1.37.2
go: downloading k8s.io/apimachinery v0.37.2
$ go build -v -ldflags -s -w -o /x/ k8s.io/kubernetes/cmd/kube-apiserver
internal/goarch
k8s.io/apimachinery/pkg/util/sets
k8s.io/kubernetes/cmd/kube-apiserver
"""


def test_the_progress_line_names_the_step_the_time_and_what_the_log_shows_done():
    line = progress_line("kube-apiserver, kube-controller-manager, kube-scheduler", LOG, 312.4)
    assert line == ("testenv: still building kube-apiserver, kube-controller-manager, kube-scheduler: 5m12s so far, "
                    "3 packages compiled, 2 modules downloaded")


def test_a_step_that_has_written_nothing_yet_still_says_it_is_alive():
    assert progress_line("etcd", "", 30) == "testenv: still building etcd: 0m30s so far, 0 packages compiled, " \
                                            "0 modules downloaded"


def test_the_heartbeat_prints_while_a_step_runs_and_stops_with_it(tmp_path, capsys):
    from testenv.build import _Heartbeat
    from testenv.install import wait_until

    log = tmp_path / "build.log"
    log.write_text("$ earlier step\nold/package\n")
    seen: list[str] = []
    heartbeat = _Heartbeat("etcd", log, every=0.01)  # the step starts here: what was logged before is not its
    log.write_text(log.read_text() + "go.etcd.io/etcd/server/v3\n")
    with heartbeat:
        wait_until(lambda: seen.extend(capsys.readouterr().err.splitlines()) or seen, timeout=5,
                   what="a progress line")
    assert seen[-1].startswith("testenv: still building etcd: 0m00s so far")
    assert "1 packages compiled" in seen[-1]
