"""Rotations in the configuration file: a bad cron rule, time zone or checklist template
stops the start with the file, the key and the reason; a good template override changes
what the checklist says."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from commands.handover import render_checklist
from workflows.config import ConfigError, load_config
from workflows.handover.layout import sample_checklist


def write_config(tmp_path: Path, **rotation_changes) -> Path:
    rotation = {
        "name": "gpu-oncall",
        "team": "GPU platform",
        "channel": "C0GPU",
        "timezone": "Europe/Berlin",
        "shifts": [
            {"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE", "group:S0DAY"]},
            {"name": "night", "starts": "0 20 * * *", "members": ["U0BOB"]},
        ],
        "ack_timeout": "20m",
        "escalate_after": "40m",
        "escalation": "group:S0LEADS",
    }
    rotation.update(rotation_changes)
    path = tmp_path / "gpuops.yaml"
    path.write_text(yaml.safe_dump({"rotations": [rotation]}))
    return path


def config_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


def test_a_rotation_is_read_with_its_shifts_timeouts_and_escalation_target(tmp_path):
    config = load_config(write_config(tmp_path))

    (rotation,) = config.rotations
    assert [s.name for s in rotation.shifts] == ["day", "night"]
    assert rotation.ack_timeout == dt.timedelta(minutes=20)
    assert rotation.escalate_after == dt.timedelta(minutes=40)
    assert rotation.escalation == "group:S0LEADS"
    assert rotation.shifts[0].includes("U0CAROL", groups=("S0DAY",))
    assert not rotation.shifts[1].includes("U0CAROL", groups=("S0DAY",))


def test_a_bad_cron_rule_names_the_file_the_key_and_the_reason(tmp_path):
    path = write_config(tmp_path, shifts=[{"name": "day", "starts": "61 8 * * *", "members": ["U0A"]}])

    error = config_error(path)

    assert str(path) in error
    assert "rotations.0.shifts.0.starts" in error
    assert "'61 8 * * *' is not a cron rule" in error and "higher than the maximum value (59)" in error


def test_a_cron_rule_with_the_wrong_number_of_fields_says_how_to_write_one(tmp_path):
    path = write_config(tmp_path, shifts=[{"name": "day", "starts": "0 8 * *", "members": ["U0A"]}])

    assert 'write 5 fields, minute hour day-of-month month day-of-week, e.g. "0 8 * * mon-fri"' in config_error(path)


def test_a_numbered_day_of_week_is_refused_because_cron_and_apscheduler_disagree(tmp_path):
    path = write_config(tmp_path, shifts=[{"name": "day", "starts": "0 8 * * 1-5", "members": ["U0A"]}])

    assert "write the day of week with names (mon-fri, sat,sun), not numbers" in config_error(path)


def test_a_rule_that_never_fires_is_refused(tmp_path):
    path = write_config(tmp_path, shifts=[{"name": "day", "starts": "0 8 30 2 *", "members": ["U0A"]}])

    assert "'0 8 30 2 *' never fires" in config_error(path)


def test_an_unknown_time_zone_is_refused_with_the_closest_names(tmp_path):
    error = config_error(write_config(tmp_path, timezone="Europe/Berln"))

    assert "rotations.0.timezone" in error
    assert "'Europe/Berln' is not an IANA time zone; did you mean Europe/Berlin" in error


def test_a_shift_without_members_is_refused_because_no_ack_could_count(tmp_path):
    path = write_config(tmp_path, shifts=[{"name": "day", "starts": "0 8 * * *", "members": []}])

    assert "a shift needs at least one member" in config_error(path)


def test_a_rotation_cannot_be_called_like_the_history_subcommand(tmp_path):
    assert "'history' is a /gpu handover subcommand" in config_error(write_config(tmp_path, name="history"))


def test_a_template_with_a_syntax_error_fails_at_load_with_its_file_and_line(tmp_path):
    template = tmp_path / "handover.j2"
    template.write_text("# Handover\n## Needs action\n{% for item in checklist.needs_action %}\n- {{ item.text }\n")

    error = config_error(write_config(tmp_path, template=str(template)))

    assert "rotations.0.template" in error
    assert f"template {template}, line 4:" in error


def test_a_template_using_a_field_the_checklist_lacks_fails_at_load_with_its_line(tmp_path):
    template = tmp_path / "handover.j2"
    template.write_text("# Handover\n\n{{ checklist.pager_duty_link }}\n")

    error = config_error(write_config(tmp_path, template=str(template)))

    assert f"template {template}, line 3:" in error
    assert "has no attribute 'pager_duty_link'" in error


def test_a_template_that_does_not_exist_fails_at_load(tmp_path):
    missing = tmp_path / "nowhere.j2"

    assert f"template {missing}: no such file" in config_error(write_config(tmp_path, template=str(missing)))


def test_a_good_template_override_changes_the_checklist(tmp_path):
    template = tmp_path / "handover.j2"
    template.write_text(
        "# {{ checklist.team }}: over to {{ checklist.shift }}\n"
        "Read the runbook first.\n"
        "## Fix first\n"
        "{% for item in checklist.needs_action %}\n"
        "* {{ item.severity }}: {{ item.subject }} | {{ item.command }}\n"
        "{% endfor %}\n"
    )
    rotation = load_config(write_config(tmp_path, template=str(template))).rotations[0]
    default = load_config(write_config(tmp_path)).rotations[0]

    reply = render_checklist(sample_checklist(), rotation.checklist_template)

    assert reply.title == "Sample team: over to day"
    assert reply.summary == "Read the runbook first."
    assert [s.title for s in reply.sections] == ["Fix first"]
    assert [(n.severity, n.text, n.command) for n in reply.sections[0].notices] == [
        ("critical", "gpu-01", "/gpu node gpu-01"), ("warning", "gpu-02", "/gpu node gpu-02")]
    assert render_checklist(sample_checklist(), default.checklist_template).title != reply.title


def test_a_relative_template_path_is_read_from_the_configuration_folder_when_given(tmp_path):
    from workflows.handover.rotations import RotationConfig

    (tmp_path / "handover.j2").write_text("# Custom\n")
    raw = yaml.safe_load(write_config(tmp_path, template="handover.j2").read_text())["rotations"][0]

    rotation = RotationConfig.model_validate(raw, context={"config_dir": str(tmp_path)})

    assert rotation.checklist_template.path == tmp_path / "handover.j2"


@pytest.mark.parametrize("escape", [
    "{{ checklist.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ checklist.shift_start.__class__.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
])
def test_a_template_cannot_reach_python_internals(tmp_path, escape):
    template = tmp_path / "handover.j2"
    template.write_text("# Handover\n" + escape + "\n")

    error = config_error(write_config(tmp_path, template=str(template)))

    assert f"template {template}, line 2:" in error and "unsafe" in error


def test_a_rotations_own_template_is_given_every_name_its_contract_documents(tmp_path):
    # What ChecklistTemplate's docstring (and the README) promise a team's template.
    template = tmp_path / "handover.j2"
    template.write_text(
        "# {{ checklist.team }} ({{ checklist.rotation }}): over to {{ checklist.shift }}\n"
        "{{ checklist.shift_start | when }} to {{ checklist.shift_end | when }} ({{ checklist.timezone }}),"
        " made {{ checklist.shift_start | ago }} after the change; late {{ checklist.late }},"
        " missed {{ checklist.missed }}, all clear {{ checklist.all_clear }}\n"
        "## Items\n"
        "{% for list in [checklist.needs_action, checklist.failures, checklist.in_flight, checklist.coming_up,"
        " checklist.for_information] %}{% for item in list %}\n"
        "* {{ item.severity }}: {{ item.kind }} {{ item.subject }} {{ item.code }} {{ item.text }} | {{ item.command }}\n"
        "{% endfor %}{% endfor %}\n"
        "{% for drain in checklist.last_drains %}\n- {{ drain.pool }} {{ drain.text }} {{ drain.command }}\n{% endfor %}\n"
        "{% if checklist.changes is not none %}\n- since {{ checklist.changes.since | when }}:"
        " {{ checklist.changes.new | length }} new, {{ checklist.changes.resolved | length }} resolved\n{% endif %}\n"
        "- {{ checklist.cluster.operator }} {{ checklist.cluster.cluster_policy }} {{ checklist.cluster.owner }}\n"
        "~ {{ checklist.history_command }}\n"
    )
    rotation = load_config(write_config(tmp_path, template=str(template))).rotations[0]

    reply = render_checklist(sample_checklist(), rotation.checklist_template)

    assert reply.title == "Sample team (sample): over to day"
    assert reply.summary == ("Sat 07 Jun 06:00 UTC to Sat 07 Jun 18:00 UTC (UTC), made 7m after the change; "
                             "late True, missed 1, all clear False")
    assert len(reply.all_notices()) == 6 and reply.footer == "/gpu handover history sample"


def test_a_template_failing_on_a_checklist_unlike_the_sample_shows_it_in_gpuops_layout_saying_why(tmp_path):
    import dataclasses

    template = tmp_path / "handover.j2"
    template.write_text("# Over to {{ checklist.shift }}\nFirst: {{ checklist.needs_action[0].text }}\n")
    rotation = load_config(write_config(tmp_path, template=str(template))).rotations[0]  # the sample has one
    quiet = dataclasses.replace(sample_checklist(), needs_action=())

    reply = render_checklist(quiet, rotation.checklist_template)

    warning, *rest = reply.sections
    (notice,) = warning.notices
    assert notice.severity == "warning"
    assert notice.text.startswith(f"This rotation's own checklist template failed (template {template}, line 2: ")
    assert "fix the template, or remove `template:` from the rotation" in notice.text
    own = render_checklist(quiet)
    assert (reply.title, reply.summary, tuple(rest), reply.footer) == (own.title, own.summary, own.sections, own.footer)
