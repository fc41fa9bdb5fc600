"""`/gpu drain ...` as a person types it: read into a request, checked against the
pool's policy (windows, max_unavailable, min_ready_gpus, overlapping requests) and
planned in waves with a preview of what will be evicted and what capacity is left."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pytest
import yaml
from freezegun import freeze_time

from commands.drain_grammar import read_drain_words
from storage import codec
from workflows.config import ConfigError, GpuopsConfig, load_config
from workflows.drain.plan import DrainRefused, DrainRequestError, drain_spec, plan_drain
from workflows.fleet.pods import group_pods_by_node
from workflows.fleet.summary import Fleet
from workflows.kube.objects import DisruptionBudget, NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave, plan_hash

UTC = dt.timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
HOUR = dt.timedelta(hours=1)
# Wednesday 2 December 2026, 11:00 in Berlin.
NOW_TEXT = "2026-12-02 10:00:00"

POOLS = {
    "train-a": {
        "kind": "training",
        "windows": [{"days": ["sat", "sun"], "start": "02:00", "end": "06:00",
                     "timezone": "Europe/Berlin"}],
        "max_unavailable": 2,
        "min_ready_gpus": 8,
        "drain_timeout": "30m",
        "pdb_timeout_action": "halt",
        "wait_for": {"selector": "gpuops.io/must-finish=true", "timeout": "6h"},
    },
    "serve-b": {"kind": "serving", "windows": "always", "max_unavailable": "50%"},
    "no-win": {"kind": "training"},
}
PDBS = (
    DisruptionBudget(namespace="serve", name="api-pdb", selector={"app": "api"}, disruptions_allowed=0),
    DisruptionBudget(namespace="ml", name="unrelated", selector={"app": "nothing"}, disruptions_allowed=1),
)


def berlin(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=BERLIN)


def config(**changes) -> GpuopsConfig:
    pools = {name: dict(policy) for name, policy in POOLS.items()}
    for name, policy in changes.items():
        pools[name.replace("_", "-")].update(policy)
    return GpuopsConfig.model_validate({"pools": pools})


@pytest.fixture
def now():
    # freezegun scans every loaded module; the kubernetes client imports lazily on
    # attribute access, so it is left out of the scan.
    with freeze_time(NOW_TEXT, ignore=["kubernetes"]):
        yield dt.datetime.now(UTC)


@dataclass
class Cluster:
    fleet: Fleet
    pods_by_node: dict


@pytest.fixture
def cluster(make):
    return build_cluster(make)


def build_cluster(make, **node_changes) -> Cluster:
    nodes = [make.node(f"gpu-a-{n:02d}", **{"pool": "train-a", **node_changes.get(f"gpu-a-{n:02d}", {})})
             for n in range(1, 5)]
    nodes += [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in range(1, 3)]
    nodes += [make.node("gpu-c-01", pool="lab-c"), make.node("gpu-u-01", pool=None),
              make.node("gpu-n-01", pool="no-win")]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    pods += [
        make.workload("gpu-a-01", gpus=4, name="trainer-0", labels={"app": "trainer"}),
        make.workload("gpu-a-01", gpus=2, name="must-finish-0",
                      labels={"gpuops.io/must-finish": "true"}),
        make.workload("gpu-a-02", gpus=8, name="api-0", namespace="serve", owner_kind="ReplicaSet",
                      labels={"app": "api"}),
        make.workload("gpu-a-03", gpus=8, name="done-0", phase="Succeeded"),
    ]
    return Cluster(fleet=make.fleet(nodes, pods), pods_by_node=group_pods_by_node(pods))


def parse(text: str, cluster: Cluster, now: dt.datetime, cfg: GpuopsConfig | None = None):
    pools = (cfg or config()).pools
    ask = read_drain_words(text.split(), fleet=cluster.fleet, pools=pools, now=now)
    return drain_spec(ask, fleet=cluster.fleet, pools=pools, now=now)


def plan(text: str, cluster: Cluster, now: dt.datetime, *, cfg: GpuopsConfig | None = None,
         open_requests=(), pdbs=PDBS):
    cfg = cfg or config()
    spec = parse(text, cluster, now, cfg)
    return plan_drain(spec, fleet=cluster.fleet, pods_by_node=cluster.pods_by_node,
                      policy=cfg.pools[spec.pool], open_requests=open_requests, now=now,
                      requested_by="U0ADA", pdbs=pdbs)


def refusal(text: str, cluster: Cluster, now: dt.datetime, **kwargs) -> DrainRefused:
    with pytest.raises(DrainRefused) as refused:
        plan(text, cluster, now, **kwargs)
    return refused.value


def parse_error(text: str, cluster: Cluster, now: dt.datetime) -> DrainRequestError:
    with pytest.raises(DrainRequestError) as refused:
        parse(text, cluster, now)
    return refused.value


# ------------------------------------------------------------------ reading the request


def test_a_drain_at_a_date_and_time_is_read_in_the_zone_of_the_pools_window(cluster, now):
    spec = parse("gpu-a-01 gpu-a-02 at 2026-12-05 02:00 for 2h replace fans", cluster, now)

    assert (spec.pool, spec.nodes, spec.whole_pool) == ("train-a", ("gpu-a-01", "gpu-a-02"), False)
    assert spec.start == berlin("2026-12-05 02:00")
    assert spec.end == berlin("2026-12-05 04:00")
    assert (spec.start_from, spec.reason) == ("at", "replace fans")


@pytest.mark.parametrize(
    ("words", "start"),
    [
        ("at 2026-12-05 02:00 UTC", dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)),
        ("at 2026-12-04 20:00 America/New_York", berlin("2026-12-05 02:00")),
        ("at 2026-12-05T03:30", berlin("2026-12-05 03:30")),
        ("at sat 03:00", berlin("2026-12-05 03:00")),
        ("at Sunday 02:00", berlin("2026-12-06 02:00")),
        ("at wed 10:00", berlin("2026-12-09 10:00")),  # today's 10:00 has passed
        ("at wed 12:00", berlin("2026-12-02 12:00")),  # today's 12:00 is ahead
        ("at tomorrow 03:00", berlin("2026-12-03 03:00")),
        ("at today 23:00", berlin("2026-12-02 23:00")),
        ("at 02:00", berlin("2026-12-03 02:00")),  # the next time the clock shows 02:00
    ],
)
def test_start_times_are_read_as_people_write_them(cluster, now, words, start):
    assert parse(f"gpu-a-01 {words}", cluster, now).start == start


def test_next_window_starts_at_the_next_window_and_lasts_until_it_ends(cluster, now):
    spec = parse("train-a next-window kernel update", cluster, now)

    assert spec.whole_pool and spec.nodes == ("gpu-a-01", "gpu-a-02", "gpu-a-03", "gpu-a-04")
    assert (spec.start, spec.end) == (berlin("2026-12-05 02:00"), berlin("2026-12-05 06:00"))
    assert (spec.start_from, spec.reason) == ("next-window", "kernel update")


def test_no_at_means_now_and_pool_equals_names_the_pool(cluster, now):
    spec = parse("pool=serve-b for 3h", cluster, now)

    assert (spec.start, spec.end) == (now, now + 3 * HOUR)
    assert spec.nodes == ("gpu-b-01", "gpu-b-02")


def test_a_time_in_the_past_is_refused(cluster, now):
    error = parse_error("gpu-a-01 at 2026-11-28 02:00 for 1h", cluster, now)

    assert error.code == "past-time"
    assert str(error) == ("Sat 2026-11-28 02:00 CET is in the past (it is now Wed 2026-12-02 "
                          "11:00 CET); pick a later time, or next-window.")


def test_an_unknown_node_is_refused_with_the_closest_names(cluster, now):
    error = parse_error("gpu-a-1 at sat 02:00", cluster, now)

    assert error.code == "unknown-target"
    assert str(error).startswith("There is no GPU node or pool named gpu-a-1; did you mean gpu-a-01")


def test_a_misspelt_second_node_is_refused_rather_than_read_as_the_reason(cluster, now):
    error = parse_error("gpu-a-01 gpu-a-0x at sat 02:00", cluster, now)

    assert error.code == "unknown-target"
    assert "gpu-a-0x" in str(error)


def test_words_that_name_no_node_start_the_reason(cluster, now):
    assert parse("gpu-a-01 swap the PSU", cluster, now).reason == "swap the PSU"
    assert parse("gpu-a-01 for fan replacement", cluster, now).reason == "for fan replacement"


def test_nodes_of_two_pools_are_refused_naming_each_pool(cluster, now):
    error = parse_error("gpu-a-01 gpu-b-01 at sat 02:00", cluster, now)

    assert error.code == "mixed-pools"
    assert str(error) == ("A drain covers one pool, but these nodes are in 2 pools: gpu-b-01 in "
                          "serve-b; gpu-a-01 in train-a. Send one request per pool.")


@pytest.mark.parametrize(
    ("words", "code", "says"),
    [
        ("gpu-c-01", "unconfigured-pool", "Pool lab-c is not in the gpuops configuration"),
        ("gpu-u-01", "unconfigured-pool", "gpu-u-01 is in no pool"),
        ("gpu-a-01 for 2x", "bad-duration", "like 2h, 90m or 1h30m, not '2x'"),
        ("gpu-a-01 at noon", "bad-time", "Cannot read the time 'noon'"),
        # Digits other than 0-9 (Arabic-Indic here) are words, not numbers.
        ("gpu-a-01 for 2h\u0663\u0660m", "bad-duration", "not '2h\u0663\u0660m'"),
        ("gpu-a-01 at \u0660\u0662:\u0660\u0660", "bad-time", "Cannot read the time"),
        ("gpu-a-01 at 2026-13-05 02:00", "bad-time", "Cannot read the time"),
        ("gpu-a-01 at sat 02:00 at sun 02:00", "repeated-clause", "Say `at` once"),
        ("gpu-a-01 at sat 02:00 Mars/Olympus", "unknown-zone", "'Mars/Olympus' is not an IANA time zone"),
        ("at sat 02:00", "missing-target", "Say which nodes or pool to drain"),
        ("pool=train-b", "unknown-target", "There is no pool named train-b; did you mean train-a?"),
    ],
)
def test_unreadable_requests_are_refused_with_the_word_that_is_wrong(cluster, now, words, code, says):
    error = parse_error(words, cluster, now)

    assert error.code == code
    assert says in str(error)


# ------------------------------------------------------------------ policy gates


def test_a_request_outside_the_allowed_window_is_refused_with_the_next_window_that_fits(cluster, now):
    refused = refusal("gpu-a-01 at 2026-12-05 10:00 for 2h", cluster, now)

    assert refused.code == "outside-window"
    assert refused.fits_at == berlin("2026-12-06 02:00")
    assert refused.reason == (
        "windows: Sat 2026-12-05 10:00 CET is outside pool train-a's maintenance windows "
        "(sat,sun 02:00-06:00 Europe/Berlin), so a 2h drain cannot start then. The first time it "
        "fits is Sun 2026-12-06 02:00 CET: ask with `at 2026-12-06 02:00 Europe/Berlin`.")


def test_a_drain_running_past_the_window_end_is_refused_with_the_next_that_fits(cluster, now):
    refused = refusal("gpu-a-01 at 2026-12-05 05:00 for 2h", cluster, now)

    assert refused.code == "window-too-short"
    assert refused.fits_at == berlin("2026-12-06 02:00")
    assert "would run past the end of pool train-a's window at Sat 2026-12-05 06:00 CET" in refused.reason


def test_a_drain_longer_than_every_window_finds_no_next_window(cluster, now):
    with pytest.raises(DrainRefused) as refused:
        parse("gpu-a-01 next-window for 5h", cluster, now)

    assert refused.value.code == "window-too-short"
    assert "long enough for a 5h drain (the longest is 4h)" in refused.value.reason


def test_a_node_that_left_the_pool_since_the_request_was_read_is_refused(make, cluster, now):
    spec = parse("gpu-a-01 gpu-a-02 at sat 02:00", cluster, now)
    relabelled = build_cluster(make, **{"gpu-a-02": {"pool": "serve-b"}})

    with pytest.raises(DrainRefused) as refused:
        plan_drain(spec, fleet=relabelled.fleet, pods_by_node=relabelled.pods_by_node,
                   policy=config().pools["train-a"], open_requests=(), now=now, requested_by="U0ADA")

    assert refused.value.code == "unknown-node"
    assert "gpu-a-02 is no longer a GPU node of pool train-a" in refused.value.reason


def test_a_pool_without_windows_allows_no_drain_and_says_how_to_configure_one(cluster, now):
    refused = refusal("gpu-n-01 for 1h", cluster, now)

    assert refused.code == "windows"
    assert "pool no-win has no maintenance windows configured" in refused.reason
    assert "windows: always" in refused.reason and 'start: "02:00"' in refused.reason


def test_a_drain_that_breaks_min_ready_gpus_is_refused_with_the_numbers(cluster, now):
    refused = refusal("gpu-a-01 at sat 02:00 for 1h", cluster, now,
                      cfg=config(train_a={"min_ready_gpus": 30}))

    assert refused.code == "min_ready_gpus"
    assert refused.fits_at is None
    assert refused.reason.startswith(
        "min_ready_gpus: draining gpu-a-01 would leave 24 Ready GPUs in pool train-a (of 32 now), "
        "below its floor of 30 (min_ready_gpus).")
    assert "Nothing in the next 4 weeks fits" in refused.reason


@dataclass(frozen=True)
class OpenRequest:
    id: str
    pool: str
    state: str
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    plan: Plan


def approved_drain(*nodes: str, start: dt.datetime, end: dt.datetime, id_: str = "req-1111") -> OpenRequest:
    wave = tuple(NodeName(n) for n in nodes)
    return OpenRequest(id_, "train-a", "approved", start, end,
                       Plan(kind="drain", pool="train-a", created_for="U0BOB", summary=PlanSummary(),
                            waves=(Wave(0, wave, tuple(NodeStep("cordon", n) for n in wave)),)))


def test_a_drain_overlapping_an_approved_one_beyond_max_unavailable_is_refused_with_what_fits(cluster, now):
    saturday = approved_drain("gpu-a-01", "gpu-a-02", start=berlin("2026-12-05 02:00"),
                              end=berlin("2026-12-05 06:00"))

    refused = refusal("gpu-a-03 at sat 03:00 for 1h", cluster, now, open_requests=[saturday])

    assert refused.code == "max_unavailable"
    assert refused.fits_at == berlin("2026-12-06 02:00")
    assert "would leave 3 of 4 nodes in pool train-a unavailable" in refused.reason
    assert "up to 2 held by overlapping request req-1111" in refused.reason
    assert refused.reason.endswith("ask with `at 2026-12-06 02:00 Europe/Berlin`.")


def test_a_drain_after_an_overlapping_one_ends_fits_then(cluster, now):
    early = approved_drain("gpu-a-01", "gpu-a-02", start=berlin("2026-12-05 02:00"),
                           end=berlin("2026-12-05 03:00"))

    refused = refusal("gpu-a-03 at sat 02:30 for 1h", cluster, now, open_requests=[early])

    assert refused.fits_at == berlin("2026-12-05 03:00")


# ------------------------------------------------------------------ waves and steps


def test_plan_waves_respect_max_unavailable(cluster, now):
    drain = plan("train-a at sat 02:00 kernel update", cluster, now)

    assert [w.nodes for w in drain.plan.waves] == [("gpu-a-01", "gpu-a-02"), ("gpu-a-03", "gpu-a-04")]
    assert [w.unavailable_nodes for w in drain.preview.waves] == [2, 2]


def test_a_human_cordoned_node_in_the_pool_shrinks_every_wave(make, now):
    cluster = build_cluster(make, **{"gpu-a-04": {"unschedulable": True}})

    drain = plan("gpu-a-01 gpu-a-02 gpu-a-03 at sat 02:00", cluster, now)

    assert [w.nodes for w in drain.plan.waves] == [("gpu-a-01",), ("gpu-a-02",), ("gpu-a-03",)]


def test_draining_a_human_cordoned_node_leaves_it_cordoned(make, now):
    cluster = build_cluster(make, **{"gpu-a-04": {"unschedulable": True}})

    drain = plan("gpu-a-04 gpu-a-01 at sat 02:00", cluster, now)

    assert [w.nodes for w in drain.plan.waves] == [("gpu-a-04", "gpu-a-01")]
    steps = drain.plan.waves[0].steps_for("gpu-a-04")
    assert steps[0].params == {"was_cordoned": True}
    assert steps[-1] == NodeStep("uncordon", NodeName("gpu-a-04"), {"leave_cordoned": True})
    assert ("gpu-a-04 was already cordoned (not by gpuops) and stays cordoned after the drain."
            in drain.plan.summary.notes)


def test_an_approved_drain_overlapping_in_time_shrinks_the_waves(cluster, now):
    other = approved_drain("gpu-a-04", start=berlin("2026-12-05 02:00"), end=berlin("2026-12-05 06:00"))

    drain = plan("gpu-a-01 gpu-a-02 gpu-a-03 at sat 02:00", cluster, now, open_requests=[other])

    assert [w.nodes for w in drain.plan.waves] == [("gpu-a-01",), ("gpu-a-02",), ("gpu-a-03",)]


def test_each_node_is_cordoned_evicted_held_validated_and_uncordoned(cluster, now):
    drain = plan("gpu-a-02 at sat 02:00", cluster, now)

    steps = drain.plan.waves[0].steps_for("gpu-a-02")
    assert [s.kind for s in steps] == ["cordon", "evict", "hold", "validate", "uncordon"]
    evict, hold, validate = steps[1], steps[2], steps[3]
    assert evict.params == {"scope": "all-non-daemonset", "pdb_timeout_s": 1800,
                            "pdb_timeout_action": "halt"}
    assert hold.params == {"until": codec.time_to_text(berlin("2026-12-05 06:00")),
                           "released_by": "drain done"}
    assert validate.params == {"node_ready": True, "device_plugin_ready": True,
                               "validator_ready": True, "advertised_gpus": 8, "timeout_s": 600}


def test_jobs_matching_wait_for_are_waited_for_before_eviction(cluster, now):
    drain = plan("gpu-a-01 gpu-a-03 at sat 02:00", cluster, now)

    assert [s.kind for s in drain.plan.waves[0].steps_for("gpu-a-01")] == [
        "cordon", "wait-for-jobs", "evict", "hold", "validate", "uncordon"]
    assert drain.plan.waves[0].steps_for("gpu-a-01")[1].params == {
        "selector": "gpuops.io/must-finish=true", "timeout_s": 6 * 3600}
    assert "wait-for-jobs" not in [s.kind for s in drain.plan.waves[0].steps_for("gpu-a-03")]


# ------------------------------------------------------------------ the preview


def test_the_preview_lists_the_workloads_each_node_will_lose(cluster, now):
    drain = plan("gpu-a-01 gpu-a-02 gpu-a-03 at sat 02:00", cluster, now)

    by_node = {n.node: [(w.ref, w.gpus, w.waited_for) for w in n.workloads] for n in drain.preview.nodes}
    # Operand DaemonSet pods stay; the finished pod on gpu-a-03 is not evicted.
    assert by_node == {
        "gpu-a-01": [("ml/must-finish-0", 2, True), ("ml/trainer-0", 4, False)],
        "gpu-a-02": [("serve/api-0", 8, False)],
        "gpu-a-03": [],
    }
    assert drain.plan.summary.evictions_expected == 3


def test_the_preview_lists_the_pdbs_that_apply_and_warns_when_one_may_block(cluster, now):
    drain = plan("gpu-a-01 gpu-a-02 at sat 02:00", cluster, now)

    assert [(p.ref, p.disruptions_allowed, p.pods, p.may_block) for p in drain.preview.pdbs] == [
        ("serve/api-pdb", 0, ("serve/api-0",), True)]
    assert drain.preview.nodes[1].workloads[0].pdbs == ("serve/api-pdb",)
    assert ("PDB serve/api-pdb allows 0 disruptions now but a wave evicts 1 of its pods: eviction "
            "retries for up to 30m, then halts the run with the node cordoned, for a person to decide.") in drain.plan.summary.notes


def test_the_preview_shows_the_capacity_left_during_each_wave(make, now):
    # A node of 6 GPUs (its labels say so too: no finding leaves it out of the drain).
    cluster = build_cluster(make, **{"gpu-a-04": {"capacity": {"nvidia.com/gpu": "6"},
                                                  "labels": {"nvidia.com/gpu.count": "6"}}})

    drain = plan("train-a at sat 02:00", cluster, now)

    assert (drain.preview.ready_gpus_now, drain.preview.advertised_gpus_now) == (30, 30)
    assert [(w.nodes, w.gpus_out, w.ready_gpus, w.advertised_gpus) for w in drain.preview.waves] == [
        (("gpu-a-01", "gpu-a-02"), 16, 14, 14),
        (("gpu-a-03", "gpu-a-04"), 14, 16, 16),
    ]
    assert drain.plan.summary.max_gpus_unavailable == 16


def test_the_plan_summary_carries_the_window_and_how_waves_are_released(cluster, now):
    drain = plan("train-a at sat 02:00", cluster, now)

    summary = drain.plan.summary
    assert (summary.window_start, summary.window_end) == (berlin("2026-12-05 02:00"),
                                                          berlin("2026-12-05 06:00"))
    assert summary.notes[0] == (
        "2 waves of at most 2 nodes, one after another: each stays drained until someone says "
        "`drain done` or the window ends at Sat 2026-12-05 06:00 CET, and is validated and "
        "uncordoned before the next starts.")
    assert (drain.plan.kind, drain.plan.pool, drain.plan.created_for) == ("drain", "train-a", "U0ADA")


def test_the_same_request_plans_to_the_same_hash_and_another_window_to_another(cluster, now):
    saturday = plan("train-a at sat 02:00", cluster, now)

    assert plan_hash(plan("train-a at sat 02:00", cluster, now).plan) == saturday.plan_hash
    assert plan("train-a at sun 02:00", cluster, now).plan_hash != saturday.plan_hash


def test_a_drain_on_an_always_pool_without_for_holds_until_drain_done(cluster, now):
    drain = plan("gpu-b-01 disk swap", cluster, now)

    assert (drain.spec.start, drain.spec.end) == (now, None)
    assert drain.preview.window is None
    assert drain.plan.waves[0].steps_for("gpu-b-01")[2].params == {"until": None,
                                                                   "released_by": "drain done"}
    assert drain.plan.summary.window_end is None
    assert "until someone says `drain done`, then" in drain.plan.summary.notes[0]


def test_an_open_ended_drain_on_a_pool_with_open_drain_max_says_its_limit_in_the_plan(cluster, now):
    drain = plan("gpu-b-01 disk swap", cluster, now, cfg=config(serve_b={"open_drain_max": "3d"}))

    assert drain.plan.waves[0].steps_for("gpu-b-01")[2].params == {"until": None, "released_by": "drain done",
                                                                   "at_most_s": 259200}
    assert ("until someone says `drain done` or 3d have passed (the pool's open_drain_max), then"
            in drain.plan.summary.notes[0])


# ------------------------------------------------------------------ the pool policy


def test_a_pool_policy_has_fail_closed_defaults():
    pool = GpuopsConfig.model_validate({"pools": {"p": {"kind": "serving"}}}).pools["p"]

    assert pool.window_set.never
    assert (str(pool.unavailable_budget), pool.min_ready_gpus) == ("1", 0)
    assert pool.drain_timeout == dt.timedelta(minutes=30)
    assert (pool.pdb_timeout_action, pool.allow_delete, pool.wait_for) == ("halt", False, None)


def test_pdb_timeout_action_wait_is_read_as_halt_what_it_does():
    pool = GpuopsConfig.model_validate({"pools": {"p": {"kind": "serving", "pdb_timeout_action": "wait"}}}).pools["p"]
    assert pool.pdb_timeout_action == "halt"


@pytest.mark.parametrize(
    ("policy", "key", "says"),
    [
        ({"pdb_timeout_action": "delete"}, "pdb_timeout_action", "set allow_delete: true"),
        ({"windows": "sometimes"}, "windows", "or the word always"),
        ({"windows": [{"days": ["sat"], "start": 1350, "end": "04:00", "timezone": "UTC"}]},
         "windows.0.start", 'quote the time, e.g. "22:30"'),
        ({"max_unavailable": "two"}, "max_unavailable", 'or a percent'),
        ({"wait_for": {"selector": "", "timeout": "1h"}}, "wait_for.selector", "would wait for every pod"),
        ({"min_ready_gpus": -1}, "min_ready_gpus", "greater than or equal to 0"),
    ],
)
def test_a_bad_pool_policy_stops_the_start_naming_the_key(tmp_path, policy, key, says):
    path = tmp_path / "gpuops.yaml"
    path.write_text(yaml.safe_dump({"pools": {"p": {"kind": "serving", **policy}}}))
    with pytest.raises(ConfigError) as stopped:
        load_config(path)

    assert f"pools.p.{key}: " in str(stopped.value)
    assert says in str(stopped.value)


def test_delete_is_allowed_where_the_pool_says_so():
    pool = GpuopsConfig.model_validate(
        {"pools": {"p": {"kind": "serving", "allow_delete": True, "pdb_timeout_action": "delete"}}}).pools["p"]

    assert pool.pdb_timeout_action == "delete"


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("gpuops.io/must-finish=true", {"gpuops.io/must-finish": "true"}, True),
        ("gpuops.io/must-finish==true", {"gpuops.io/must-finish": "false"}, False),
        ("app=trainer,tier!=batch", {"app": "trainer"}, True),
        ("app=trainer,tier!=batch", {"app": "trainer", "tier": "batch"}, False),
        ("team in (vision, nlp)", {"team": "nlp"}, True),
        ("team notin (vision,nlp)", {"team": "nlp"}, False),
        ("checkpointing", {"checkpointing": ""}, True),
        ("!preemptible", {"preemptible": "yes"}, False),
    ],
)
def test_wait_for_selectors_match_pods_as_kubectl_does(selector, labels, matches):
    pool = GpuopsConfig.model_validate({"pools": {"p": {
        "kind": "training", "wait_for": {"selector": selector, "timeout": "1h"}}}}).pools["p"]

    assert pool.wait_for_selector.matches(labels) is matches


def test_a_pool_that_skips_nodes_a_pdb_blocks_writes_skip_into_the_evict_step_and_says_so_in_the_plan(
        cluster, now):
    drain = plan("gpu-a-02 at sat 02:00", cluster, now, cfg=config(train_a={"pdb_timeout_action": "skip"}))

    evict = drain.plan.waves[0].steps_for("gpu-a-02")[1]
    assert evict.params["pdb_timeout_action"] == "skip"
    assert any("serve/api-pdb" in note and "leaves the node out of the drain" in note
               for note in drain.plan.summary.notes)


def test_a_pools_diag_check_runs_after_a_drain_before_the_node_is_given_back(cluster, now):
    from workflows.pools.config import GpuCheck

    cfg = config()
    pool = cfg.pools["train-a"].model_copy(update={"gpu_check": GpuCheck.model_validate({"diag": 2})})
    cfg = cfg.model_copy(update={"pools": {**cfg.pools, "train-a": pool}})

    steps = plan("gpu-a-02 at sat 02:00", cluster, now, cfg=cfg).plan.waves[0].steps_for("gpu-a-02")

    assert [s.kind for s in steps] == ["cordon", "evict", "hold", "validate", "gpu-check", "uncordon"]
    assert (steps[4].params["diag"], steps[4].params["count"], steps[4].params["timeout_s"]) == (2, "all", 15 * 60)


def test_a_pools_burn_in_makes_its_check_and_the_burn_in_run_after_a_drain_and_a_plain_check_does_not(cluster, now):
    from workflows.pools.config import GpuCheck

    def steps_with(check):
        cfg = config()
        pool = cfg.pools["train-a"].model_copy(update={"gpu_check": GpuCheck.model_validate(check)})
        cfg = cfg.model_copy(update={"pools": {**cfg.pools, "train-a": pool}})
        return [(s.kind, s.params.get("purpose")) for s in
                plan("gpu-a-02 at sat 02:00", cluster, now, cfg=cfg).plan.waves[0].steps_for("gpu-a-02")]

    assert steps_with({"command": ["nvidia-smi"], "burn_in": {"image": "nccl", "command": ["all_reduce_perf"]}})[-3:] == [
        ("gpu-check", None), ("gpu-check", "burn-in"), ("uncordon", None)]
    assert "gpu-check" not in [k for k, _ in steps_with({"command": ["nvidia-smi"]})]
