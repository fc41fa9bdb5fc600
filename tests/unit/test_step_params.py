"""Step params as typed records: every step kind reads the rows today's databases hold
(times as text, optional keys missing, keys of older plans), a row of the wrong shape is
refused naming the step kind and the key, and a run in flight whose rows were written that
way is read and finished by the engine.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from storage import runs as stored_runs
from storage.step_params import (
    ContinuesMark,
    HandConfirmation,
    HoldExtension,
    HoldParams,
    HoldRelease,
    StepParams,
    TakesOverMark,
    decode,
    encode,
)
from workflows.engine.steps.contract import StepParamsError, params_of
from workflows.engine.steps.table import logic_for
from workflows.kinds import KINDS

from tests.unit.test_engine_extension import NOW, Drain

UTC = dt.timezone.utc

# The params of one step of every kind, as today's code writes them: the plans (drain,
# upgrade, MIG, migrate), and the controls written into a step while it runs (`drain
# done`, an extension, a person's confirmation of a host driver).
TODAYS_ROWS: dict[str, list[str]] = {
    "cordon": ['{"was_cordoned":false}', '{"takes_over":"run-7","was_cordoned":true}', "{}"],
    "evict": ['{"pdb_timeout_action":"wait","pdb_timeout_s":3600,"scope":"all-non-daemonset"}',
              '{"evict_retries":3,"pdb_timeout_action":"skip","pdb_timeout_s":600,"scope":"gpu"}'],
    "drain": ["{}", '{"timeout_seconds":120}'],
    "wait-for": ['{"conditions":["operator-driver-ready","validator-ready"],"timeout_s":300}',
                 '{"condition":"node-ready"}'],
    "validate": ['{"advertised_gpus":8,"device_plugin_ready":true,"node_ready":true,"timeout_s":600,'
                 '"validator_ready":true}', '{"timeout_s":600}'],
    "wait-for-jobs": ['{"selector":"app=train","timeout_s":3600}'],
    "gpu-check": ['{"command":["nvidia-smi"],"image":"nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",'
                  '"namespace":"gpuops","resource":"nvidia.com/gpu","timeout_s":300}'],
    "hold": ['{"released_by":"drain done","until":"2025-06-07T12:30:00.000000Z"}',
             '{"released_by":"drain done","until":null}',
             '{"at_most_s":86400,"released_by":"drain done","until":null}',
             '{"seconds":600}',
             '{"extended_at":"2025-06-07T12:20:00.000000Z","extended_by":"U0ADA",'
             '"extended_until":"2025-06-07T13:00:00.000000Z","released_by":"drain done",'
             '"until":"2025-06-07T12:30:00.000000Z"}',
             '{"released_at":"2025-06-07T12:10:00.000000Z","released_by":"drain done","released_by_user":"U0ADA",'
             '"until":"2025-06-07T12:30:00Z"}'],
    "uncordon": ['{"leave_cordoned":false}', "{}"],
    "driver": ['{"timeout_s":600,"version":"580.95.05"}'],
    "driver-version": ['{"name":"cluster-policy","object":"ClusterPolicy","version":"580.95.05"}',
                       '{"name":"cluster-policy","object":"ClusterPolicy","on_failure":true,"set_back":true,'
                       '"version":"580.95.05"}'],
    "operator-hold": ['{"nodes":["gpu-01","gpu-02"]}', '{"nodes":["gpu-01"],"release":true}'],
    "operator-upgrade": ['{"timeout_s":4200,"version":"580.95.05"}'],
    "mig": ['{"config":"all-1g.10gb","expect":{"nvidia.com/mig-1g.10gb":56},"timeout_s":1800}'],
    "snapshot": ["{}"],
    "host-driver-removed": ['{"evidence":false,"timeout_s":28800}',
                            '{"confirmed_at":"2025-06-07T12:10:00.000000Z","confirmed_by":"U0ADA",'
                            '"confirmed_by_name":"Ada","evidence":false,"timeout_s":28800}'],
    "host-driver-installed": ['{"evidence":true,"timeout_s":28800}'],
    "node-labels": ['{"labels":{"nvidia.com/gpu.deploy.driver":"true","nvidia.com/gpu.present":null}}'],
    "restore": ['{"keys":["nvidia.com/gpu.deploy.driver"],"labels":{"nvidia.com/gpu.deploy.driver":"false"},'
                '"taints":[{"effect":"NoSchedule","key":"gpu","value":"host"}]}'],
}


def test_every_step_kind_has_rows_of_today_to_read():
    assert set(TODAYS_ROWS) == set(KINDS.step_kinds)


@pytest.mark.parametrize("kind, row", [(k, r) for k, rows in TODAYS_ROWS.items() for r in rows])
def test_every_row_today_holds_reads_as_its_kinds_record_and_gives_its_timeout(kind, row):
    logic = logic_for(kind)
    params = decode(logic.params, json.loads(row), kind=kind)
    assert isinstance(params, logic.params)
    ctx = _Ctx(kind=kind, params=params)
    assert params_of(ctx, logic.params) is params
    logic.timeout(ctx)  # type: ignore[arg-type]  # what the engine asks first: no StepParamsError


@pytest.mark.parametrize("kind, row", [(k, r) for k, rows in TODAYS_ROWS.items() for r in rows
                                       if "timeout_seconds" not in r and "released_by_user" not in r
                                       and "extended_by" not in r and '"12:30:00Z"' not in r])
def test_a_record_writes_back_exactly_the_row_it_was_read_from(kind, row):
    # What makes plan hashes (and the approvals bound to them) the same with records.
    params = decode(logic_for(kind).params, json.loads(row), kind=kind)
    assert encode(params) == json.loads(row)


def test_times_are_read_from_text_once_by_the_codec():
    hold = decode(HoldParams, json.loads(TODAYS_ROWS["hold"][5]), kind="hold")
    assert hold.until == dt.datetime(2025, 6, 7, 12, 30, tzinfo=UTC)
    assert hold.released_at == dt.datetime(2025, 6, 7, 12, 10, tzinfo=UTC)
    open_ended = decode(HoldParams, {"until": None, "at_most_s": 86400}, kind="hold")
    assert open_ended.open_ended and open_ended.until is None and open_ended.at_most_s == 86400


def test_an_older_plans_timeout_seconds_reads_as_timeout_s():
    params = decode(StepParams, {"timeout_seconds": 120}, kind="drain")
    assert params.timeout(600) == dt.timedelta(seconds=120)


@pytest.mark.parametrize("kind, raw, key", [
    ("evict", {"timeout_s": "soon"}, "timeout_s"),
    ("evict", {"evict_retries": True}, "evict_retries"),
    ("hold", {"until": "tomorrow"}, "until"),
    ("hold", {"until": "2025-06-07T12:30:00"}, "until"),  # no zone: which noon?
    ("mig", {"config": "all-1g.10gb", "expect": {"nvidia.com/mig-1g.10gb": "56"}}, "expect.nvidia.com/mig-1g.10gb"),
    ("operator-hold", {"nodes": "gpu-01"}, "nodes"),
    ("node-labels", {"labels": ["nvidia.com/gpu.deploy.driver"]}, "labels"),
])
def test_a_row_of_the_wrong_shape_is_refused_naming_the_step_kind_and_the_key(kind, raw, key):
    with pytest.raises(StepParamsError) as refused:
        decode(logic_for(kind).params, raw, kind=kind)
    assert str(refused.value).startswith(f"{kind} step: params.{key} must be ")


def test_params_that_are_not_an_object_are_refused_naming_the_step_kind():
    with pytest.raises(StepParamsError, match="^hold step: params must be a JSON object"):
        decode(HoldParams, ["until"], kind="hold")


def test_a_timeout_of_zero_is_refused_naming_the_step_kind():
    logic = logic_for("wait-for-jobs")
    with pytest.raises(StepParamsError, match="^wait-for-jobs step: params.timeout_s must be more than 0"):
        logic.timeout(_Ctx(kind="wait-for-jobs", params={"selector": "app=x", "timeout_s": 0}))  # type: ignore[arg-type]


class _Ctx:
    def __init__(self, *, kind: str, params: object) -> None:
        self.kind, self.params = kind, params
        self.now, self.window_end = NOW, None


# --- what is written into a step's params besides its plan's keys -----------------------

AT = dt.datetime(2025, 6, 7, 12, 10, tzinfo=UTC)
HOLD = {"released_by": "drain done", "until": "2025-06-07T12:30:00.000000Z"}


@pytest.mark.parametrize("control, kind, row", [
    # each control as today's code writes it into a step row, over the plan's own keys
    (HoldRelease(released_at=AT, released_by_user="U0ADA"), "hold",
     '{"released_at":"2025-06-07T12:10:00.000000Z","released_by":"drain done","released_by_user":"U0ADA",'
     '"until":"2025-06-07T12:30:00.000000Z"}'),
    (HoldExtension(extended_until=dt.datetime(2025, 6, 7, 13, tzinfo=UTC), extended_at=AT, extended_by="U0ADA"),
     "hold", '{"extended_at":"2025-06-07T12:10:00.000000Z","extended_by":"U0ADA",'
             '"extended_until":"2025-06-07T13:00:00.000000Z","released_by":"drain done",'
             '"until":"2025-06-07T12:30:00.000000Z"}'),
])
def test_a_control_writes_the_row_todays_databases_hold_and_reads_it_back(control, kind, row):
    assert control.written_into(HOLD) == json.loads(row)
    assert type(control).read_from(json.loads(row), kind=kind) == control


def test_a_hosts_drivers_confirmation_reads_from_todays_row_and_the_step_reads_what_it_wrote():
    row = json.loads(TODAYS_ROWS["host-driver-removed"][1])
    confirmed = HandConfirmation.read_from(row, kind="host-driver-removed")
    assert confirmed == HandConfirmation(confirmed_by="U0ADA", confirmed_by_name="Ada", confirmed_at=AT)
    written = confirmed.written_into({"evidence": False, "timeout_s": 28800})
    assert written == row
    params = decode(logic_for("host-driver-removed").params, written, kind="host-driver-removed")
    assert (params.confirmed_by, params.confirmed_by_name, params.confirmed_at) == ("U0ADA", "Ada", AT)


def test_the_hold_step_reads_the_controls_written_into_it():
    written = HoldExtension(extended_until=dt.datetime(2025, 6, 7, 13, tzinfo=UTC), extended_at=AT,
                            extended_by="U0ADA").written_into(HOLD)
    written = HoldRelease(released_at=AT, released_by_user="U0BOB").written_into(written)
    hold = decode(HoldParams, written, kind="hold")
    assert hold.released_at == AT and hold.extended_until == dt.datetime(2025, 6, 7, 13, tzinfo=UTC)
    assert hold.until == dt.datetime(2025, 6, 7, 12, 30, tzinfo=UTC)


def test_params_without_a_control_hold_none_and_a_control_of_the_wrong_shape_is_refused():
    assert HoldRelease.read_from(HOLD, kind="hold") is None
    assert HoldExtension.read_from({**HOLD, "extended_until": None}, kind="hold") is None
    with pytest.raises(StepParamsError, match="^hold step: params.released_at must be a time"):
        HoldRelease.read_from({**HOLD, "released_at": "after lunch"}, kind="hold")


def test_a_continuations_marks_read_from_todays_plan_rows_and_one_is_left_out_of_the_next_plan():
    # A continuation's cordon, as today's plans store it: the halted run it continues and
    # whose cordon mark it takes over.
    row = json.loads('{"continues":"run-7","takes_over":"run-7","was_cordoned":false}')
    assert ContinuesMark.read_from(row, kind="cordon") == ContinuesMark(continues="run-7")
    assert TakesOverMark.read_from(row, kind="cordon") == TakesOverMark(takes_over="run-7")
    assert decode(logic_for("cordon").params, row, kind="cordon").takes_over == "run-7"
    again = ContinuesMark(continues="run-9").written_into(ContinuesMark.left_out_of(row))
    assert again == {"takes_over": "run-7", "was_cordoned": False, "continues": "run-9"}
    assert ContinuesMark.read_from({"was_cordoned": False}, kind="cordon") is None


# --- a run in flight, its rows as today's code writes them ------------------------------


def test_a_drain_in_flight_whose_rows_are_written_as_today_is_read_and_finished_by_the_engine(db, cluster):
    drain = Drain(db, cluster, "gpu-01 gpu-02 for 30m firmware")
    drain.drive(lambda: drain.step("gpu-01", "hold") == "running")
    # Every unfinished step's params, as the JSON text today's code stores: optional keys
    # missing, an older plan's key, and `drain done` written into the running hold.
    released = NOW + dt.timedelta(minutes=5)
    rows = {
        ("gpu-01", "hold"): '{"released_at":"2025-06-07T12:05:00.000000Z","released_by":"drain done",'
                            '"released_by_user":"U0ADA","until":"2025-06-07T12:30:00.000000Z"}',
        ("gpu-01", "validate"): '{"advertised_gpus":8,"device_plugin_ready":true,"node_ready":true,'
                                '"timeout_s":60,"validator_ready":true}',
        ("gpu-01", "uncordon"): "{}",
        ("gpu-02", "cordon"): '{"was_cordoned":false}',
        ("gpu-02", "evict"): '{"pdb_timeout_action":"wait","pdb_timeout_s":3600,"scope":"all-non-daemonset"}',
        ("gpu-02", "hold"): '{"until":"2025-06-07T12:30:00.000000Z"}',
        ("gpu-02", "validate"): '{"timeout_seconds":60}',
        ("gpu-02", "uncordon"): '{"leave_cordoned":false}',
    }
    for step in drain.view().steps:
        row = rows.get((step.node, step.kind))
        if row is not None:
            stored = db.query("SELECT detail FROM steps WHERE id = ?", (step.id,))[0]["detail"]
            intent = json.loads(stored).get("intent")
            detail = '{"params":' + row + (',"intent":' + json.dumps(intent) if intent is not None else "") + "}"
            db.execute("UPDATE steps SET detail = ? WHERE id = ?", (detail, step.id))
    drain.drive(drain.finished, step_s=30)

    run = stored_runs.get(db, id=drain.run_id)
    assert run is not None and run.state == "succeeded", run.halted_reason if run else None
    # `drain done`, read from its text, ended gpu-01's hold before the window's end.
    assert released <= drain.ended("gpu-01", "hold") < NOW + dt.timedelta(minutes=10)
    assert drain.ended("gpu-02", "hold") >= NOW + dt.timedelta(minutes=30)
    assert not cluster.node("gpu-01").unschedulable and not cluster.node("gpu-02").unschedulable


@pytest.fixture
def cluster(fake_cluster, make):
    for node in ("gpu-01", "gpu-02"):
        fake_cluster.add_node(make.node(node, pool="train-a"))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    return fake_cluster


def test_a_step_whose_params_are_another_kinds_record_is_refused_naming_both():
    ctx = _Ctx(kind="evict", params=HoldParams())
    with pytest.raises(StepParamsError) as refused:
        params_of(ctx, logic_for("evict").params)  # type: ignore[arg-type]
    assert str(refused.value) == "evict step: params are HoldParams, not EvictParams"


def test_stored_params_read_through_a_context_are_refused_naming_the_contexts_step_kind():
    with pytest.raises(StepParamsError, match="^evict step: params.evict_retries must be "):
        params_of(_Ctx(kind="evict", params={"evict_retries": "3"}), logic_for("evict").params)  # type: ignore[arg-type]
