"""What the audit log keeps of freezes, field by field: who froze what until when and
why, which freeze a new one replaced, who lifted it and why. The log is what an auditor
reads after an incident: every field here is one they would look for."""

from __future__ import annotations

from test_freezes import gpu, services  # noqa: F401 (the fixture)

from storage import audit


def rows(services):  # noqa: F811
    return [(e.action, e.actor, e.target, e.before, e.after, e.detail)
            for e in reversed(audit.recent(services.database, 100))]


def test_setting_replacing_and_lifting_a_freeze_leave_every_field_in_the_audit_log(services):  # noqa: F811
    assert gpu(services, "U0ERIN", "freeze serve-b until 12:00 first").ok
    assert gpu(services, "U0ERIN", "freeze serve-b until 18:00 --let-running-finish  longer ").ok
    assert gpu(services, "U0ERIN", "unfreeze serve-b  done early ").ok

    first = {"id": 1, "target": "serve-b", "until": "2026-12-02T12:00:00+00:00", "reason": "first",
             "let_running_finish": False, "set_by": "U0ERIN"}
    second = {"id": 2, "target": "serve-b", "until": "2026-12-02T18:00:00+00:00", "reason": "longer",
              "let_running_finish": True, "set_by": "U0ERIN"}
    assert rows(services) == [
        ("freeze.set", "U0ERIN", "serve-b", None, first, {"freeze": 1}),
        ("freeze.lifted", "U0ERIN", "serve-b", first, None,
         {"freeze": 1, "replaced_by": 2, "reason": "replaced by a new freeze"}),
        ("freeze.set", "U0ERIN", "serve-b", first, second, {"freeze": 2}),
        ("freeze.lifted", "U0ERIN", "serve-b", second, None, {"freeze": 2, "reason": "done early"}),
    ]
