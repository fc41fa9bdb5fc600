"""Every sentence the bot itself says (to Slack users, console users and operators
reading its logs and errors), in one place. The commands' own text lives in
`commands.messages`, the requests' in `workflows.requests.messages`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from commands.reply import Confirm
from workflows.fleet.findings import format_age
from workflows.kinds import kinds_in_force

# ------------------------------------------------------------------ credentials


def why_bot_token() -> str:
    return "the bot token (Slack app > OAuth & Permissions > Bot User OAuth Token)"


def why_app_token() -> str:
    return ("the app-level token Socket Mode connects with (Slack app > Basic Information > "
            "App-Level Tokens, scope connections:write); or run with --http")


def why_signing_secret() -> str:
    return "the signing secret HTTP mode checks requests with (Slack app > Basic Information)"


def credential_missing(name: str, why: str) -> str:
    return f"{name} is not set: it is {why}. Set {name}, or {name}_FILE to a file holding it."


def credential_twice(name: str) -> str:
    return f"both {name} and {name}_FILE are set; set only one of them."


def credential_file_unreadable(name: str, path: str, why: str) -> str:
    return f"{name}_FILE names {path}, which cannot be read: {why}."


def credential_file_empty(name: str, path: str) -> str:
    return f"{name}_FILE names {path}, which is empty."


def credential_malformed(name: str, prefix: str, found_prefix: str | None) -> str:
    found = f"starts with {found_prefix!r}" if found_prefix else "does not"
    return f"{name} must be a token starting with {prefix!r}, but it {found}. Is it the right token?"


def signing_secret_malformed() -> str:
    return "SLACK_SIGNING_SECRET does not look like a signing secret (too short, or it has spaces)."


def slack_rejected_token(error: str) -> str:
    return (f"Slack refused SLACK_BOT_TOKEN ({error}). Check that it is the current Bot User OAuth "
            "Token of the installed app.")


def slack_unreachable(detail: str) -> str:
    return f"cannot reach Slack to check the bot token: {detail}"


# ------------------------------------------------------------------ the process


def started(mode: str, where: str) -> str:
    return f"gpuops is answering /gpu over {mode} ({where})"


def socket_close_stalled_log(seconds: float) -> str:
    return (f"the Socket Mode connection did not close within {seconds:g} s; stopping without it "
            "(Slack sends its envelopes to the other replicas)")


def stopping() -> str:
    return "gpuops is stopping"


# ------------------------------------------------------------------ the HTTP endpoint (never the body)


def http_rejected(client: str, status: int, why: str) -> str:
    return f"refused a request to /slack/events from {client} with {status}: {why}"


def http_unsigned() -> str:
    return "it has no X-Slack-Signature or X-Slack-Request-Timestamp header"


def http_bad_timestamp() -> str:
    return "X-Slack-Request-Timestamp is not a number of seconds"


def http_stale_timestamp(skew: int, limit: int) -> str:
    return f"it was signed {skew} s away from now (at most {limit} s are allowed; is a clock wrong?)"


def http_bad_signature() -> str:
    return "the signature does not match the body (is SLACK_SIGNING_SECRET the app's current one?)"


def http_unparsable(error: str) -> str:
    return f"the signed body is not a Slack payload ({error})"


def http_slow_clients(server: str, *, late: int, room: int, deadline: float, seconds: float) -> str:
    return (f"slow clients on the {server} port in the last {seconds:g} s: closed {late} connection(s) whose "
            f"request was not in whole within {deadline:g} s of its first byte and {room} waiting longest for a "
            f"whole request to make room for new ones")


def http_failed(path: str) -> str:
    return f"answering a request to {path} failed"


# ------------------------------------------------------------------ buttons


def default_confirm(action: str, label: str) -> Confirm:
    texts = {
        "deny": ("Deny this request?", "The request ends and cannot be approved any more. "
                 "You will be asked for the reason the requester reads.", "Deny"),
        "cancel": ("Cancel this request?", "The request is withdrawn; approvals given so far are lost.",
                   "Cancel request"),
        "abort": ("Abort this run?", "The run stops between steps and leaves nodes as they are.", "Abort run"),
        "rollback": ("Roll back this run?", "A rollback request is made for the nodes this run changed; "
                     "it waits for the pool's approvals like any request.", "Ask for rollback"),
    }
    title, text, confirm = texts.get(action, (f"{label}?", "This cannot be undone.", label))
    return Confirm(title=title, text=text, confirm=confirm, deny="Go back")


def requests_unavailable() -> str:
    return "Requests are not available in this gpuops (no request service)."


def not_a_gpuops_button() -> str:
    return "That button does not belong to a gpuops message this version understands."


def abort_unavailable() -> str:
    return "Runs cannot be aborted here: this gpuops has no run service."


def aborted_by_you(run_id: str) -> str:
    return f"You aborted {run_id}; it stops between steps and leaves nodes as they are."


def approved_by_you(request_id: str, counted: int, required: int) -> str:
    if counted >= required:
        return f"You approved {request_id}: it has all {required} approvals it needs."
    return f"You approved {request_id} ({counted} of {required})."


def denied_by_you(request_id: str) -> str:
    return f"You denied {request_id}; the requester sees your reason."


def cancelled_by_you(request_id: str) -> str:
    return f"You cancelled {request_id}."


def not_done_title() -> str:
    return "Not done"


def done_title() -> str:
    return "Done"


# ------------------------------------------------------------------ the deny modal


DENY_MODAL_TITLE = "Deny request"
DENY_MODAL_SUBMIT = "Deny"
DENY_MODAL_CLOSE = "Go back"


def deny_modal_intro(request_id: str) -> str:
    return f"You are denying *{request_id}*. The requester reads your reason in the request's thread."


def deny_reason_label() -> str:
    return "Why do you deny it?"


def deny_reason_missing() -> str:
    return "Say why you deny it; the requester reads this."


def modal_failed(error: str, *, form: str = "to deny", button: str = "Deny") -> str:
    return (f"Slack did not open the form {form} ({error}); click {button} again. "
            "Slack allows 3 seconds between the click and the form.")


# ------------------------------------------------------------------ the drain form


DRAIN_FORM_TITLE = "Request a drain"
DRAIN_FORM_SUBMIT = "Plan the drain"
DRAIN_FORM_CLOSE = "Cancel"
DRAIN_FORM_FORM = "to request a drain"
WHEN_CHOICES = {"now": "Now", "next-window": "At the pool's next window", "at": "At the time below"}


def drain_form_intro(channel: str | None) -> str:
    """`channel` is a checked channel id (it becomes a channel link)."""
    where = (f"The plan comes back to you in <#{channel}>, and the request's thread is posted there."
             if channel else "Pick the channel for the request's thread below: its progress is posted "
             "there, and the plan comes back to you there too.")
    return ("gpuops plans the drain and checks it against the pool's policy, exactly as `/gpu drain` does. "
            + where)


def drain_channel_label() -> str:
    return "Post the request in"


def drain_channel_hint() -> str:
    return ("The request's thread (approvals, PDB blocks, the window ending, the result) goes here; "
            "gpuops must be a member of the channel.")


def drain_form_no_channel() -> str:
    return "Pick a channel: the request's progress is posted in its thread there."


def drain_targets_label() -> str:
    return "Nodes or pool"


def drain_targets_hint() -> str:
    return "GPU node names separated by spaces, all in one pool; or one pool name for all its nodes."


def drain_when_label() -> str:
    return "Start"


def drain_time_label() -> str:
    return "Time"


def drain_time_hint() -> str:
    return "Only for \"At the time below\". Shown in your Slack time zone."


def drain_duration_label() -> str:
    return "How long"


def drain_duration_hint() -> str:
    return ("Like 2h, 90m or 1h30m. Empty: until the pool's window ends, or on a pool that is always open "
            "until someone says /gpu drain done.")


def drain_reason_label() -> str:
    return "Reason"


def drain_reason_hint() -> str:
    return "Approvers read it, and it stays in the request's record."


def drain_form_no_targets() -> str:
    return "Name at least one GPU node, or a pool."


def drain_form_bad_target(word: str) -> str:
    return f"{word!r} is not a node or pool name; separate names with spaces."


def drain_form_clause_in_targets(word: str) -> str:
    return f"{word!r} belongs in Start or How long, not here: list only node or pool names."


def drain_form_no_time() -> str:
    return "Pick the time the drain starts, or choose another Start."


def drain_form_time_passed() -> str:
    return "That time has passed; pick a later one."


def drain_form_bad_duration(text: str) -> str:
    return f"Write how long like 2h, 90m or 1h30m, not {text!r}."


def drain_form_no_reason() -> str:
    return "Say why the nodes must be drained; approvers read it before they approve."


def drain_form_footer(command: str, footer: str | None) -> str:
    asked = f"From the drain form: `/gpu {command}`"
    return f"{footer} · {asked}" if footer else asked


def drain_form_in_console(usage: str) -> str:
    return f"In Slack this button opens the drain form. Here, type: /gpu {usage}"


UPGRADE_FORM_TITLE = "Request a driver upgrade"
UPGRADE_FORM_SUBMIT = "Plan the upgrade"
UPGRADE_FORM_FORM = "to request a driver upgrade"


def upgrade_form_intro(channel: str | None) -> str:
    """`channel` is a checked channel id (it becomes a channel link)."""
    where = (f"The plan comes back to you in <#{channel}>, and the request's thread is posted there."
             if channel else "Pick the channel for the request's thread below: its progress is posted "
             "there, and the plan comes back to you there too.")
    return ("gpuops finds the object that sets the pool's driver, plans canary and waves and checks them, exactly "
            "as `/gpu upgrade` does; the run starts after the pool's approvals. " + where)


def upgrade_pool_label() -> str:
    return "Pool"


def upgrade_version_label() -> str:
    return "Driver version"


def upgrade_version_hint() -> str:
    return "As NVIDIA writes it, e.g. 580.105.08."


def upgrade_downgrade_label() -> str:
    return "Downgrade"


def upgrade_downgrade_choice() -> str:
    return "I mean an older version than the pool runs"


def upgrade_form_bad_pool(text: str) -> str:
    return f"Name one pool, e.g. serving-a, not {text!r}." if text else "Name the pool to upgrade."


def upgrade_form_no_time() -> str:
    return "Pick the time the upgrade starts, or choose another Start."


def upgrade_form_no_reason() -> str:
    return "Say why the pool's driver changes; approvers read it before they approve."


def upgrade_form_footer(command: str, footer: str | None) -> str:
    asked = f"From the upgrade form: `/gpu {command}`"
    return f"{footer} · {asked}" if footer else asked


def upgrade_form_in_console(usage: str) -> str:
    return f"In Slack this button opens the upgrade form. Here, type: /gpu {usage}"


MIG_FORM_TITLE = "Request a MIG change"
MIG_FORM_SUBMIT = "Plan the change"
MIG_FORM_FORM = "to request a MIG change"


def mig_form_intro(channel: str | None) -> str:
    """`channel` is a checked channel id (it becomes a channel link)."""
    where = (f"The plan comes back to you in <#{channel}>, and the request's thread is posted there."
             if channel else "Pick the channel for the request's thread below: its progress is posted "
             "there, and the plan comes back to you there too.")
    return ("gpuops checks the layout against the MIG manager's config and every node's GPUs, and plans the "
            "capacity change (what each node advertises before and after, who is evicted, who is left without "
            "their resource), exactly as `/gpu mig` does; the run starts after the pool's approvals. " + where)


def mig_targets_label() -> str:
    return "Pool or nodes"


def mig_targets_hint() -> str:
    return "One pool, or nodes of one pool separated by spaces."


def mig_layout_label() -> str:
    return "MIG layout"


def mig_layout_hint() -> str:
    return "A layout of the MIG manager's config, e.g. all-1g.10gb or all-disabled."


def mig_form_bad_targets(text: str) -> str:
    return f"Name one pool or nodes of one pool, not {text!r}." if text else "Name the pool (or nodes) to change."


def mig_form_bad_layout(text: str) -> str:
    return f"Name one layout, e.g. all-1g.10gb, not {text!r}." if text else "Name the MIG layout."


def mig_form_no_time() -> str:
    return "Pick the time the change starts, or choose another Start."


def mig_form_no_reason() -> str:
    return "Say why the pool's MIG layout changes; approvers read it before they approve."


def mig_form_footer(command: str, footer: str | None) -> str:
    asked = f"From the MIG form: `/gpu {command}`"
    return f"{footer} · {asked}" if footer else asked


def mig_form_in_console(usage: str) -> str:
    return f"In Slack this button opens the MIG form. Here, type: /gpu {usage}"


# ------------------------------------------------------------------ request cards


def _kind_title(kind: str) -> str:
    """"Drain": how a card's title names a request of `kind` (workflows/kinds.py)."""
    known = kinds_in_force().get(kind)
    return known.title if known is not None else kind



def request_card_title(kind: str, request_id: str, pool: str) -> str:
    return f"{_kind_title(kind)} request {request_id} · pool {pool}"


def plan_line(short_hash: str, nodes: int, waves: int) -> str:
    return f"{short_hash}… · {nodes} node{'s' if nodes != 1 else ''} in {waves} wave{'s' if waves != 1 else ''}"


def approvals_tally(counted: int, required: int, names: list[str]) -> str:
    who = f" ({', '.join(names)})" if names else ""
    if required == 0:
        return "none needed"
    return f"{counted} of {required}{who}"


# ------------------------------------------------------------------ the Home tab


def home_title() -> str:
    return "gpuops: GPU fleet"


def waiting_title(count: int) -> str:
    return f"Waiting for your approval ({count})" if count else "Nothing waits for your approval"


def waiting_line(request_id: str, kind: str, pool: str, requester: str, reason: str, approvals: str,
                 expires: str) -> str:
    return (f"*{request_id}* · {_kind_title(kind)} on {pool}, requested by {requester}: {reason}\n"
            f"Approvals {approvals} · expires {expires}")


def more_waiting(count: int) -> str:
    return f"…and {count} more waiting; `/gpu help` lists the request commands."


def waits_title(count: int) -> str:
    return f"Requests waiting ({count})"


def waits_line(request_id: str, kind: str, pool: str, why: str) -> str:
    return f"*{request_id}* · {_kind_title(kind)} on {pool}: {why}"


def more_waits(count: int) -> str:
    return f"…and {count} more; `/gpu requests` lists them and `/gpu request <id>` says why each waits."


def home_updated_at(when: str) -> str:
    return f"Updated {when}. Reopen the tab to refresh."


# ------------------------------------------------------------------ delivery and failures


def full_text_title(title: str) -> str:
    return f"gpuops: {title}"


def timeline_title(run_id: str) -> str:
    return f"gpuops: timeline of {run_id}"


def capacity_title(pool: str) -> str:
    return f"gpuops: capacity of {pool} over the last day"


def picture_saved(path: str) -> str:
    return f"Picture saved to {path}"


def something_failed() -> str:
    return "Something went wrong while answering; the gpuops log says what. Try again in a minute."


def reply_fallback_log(where: str, error: str) -> str:
    return f"could not answer through {where} ({error}); trying the next way"


def duplicate_delivery_log(kind: str, key: str) -> str:
    return f"{kind} {key} was delivered again (a Slack retry); it ran once already"


def delivery_not_kept_log(kind: str, key: str, why: str) -> str:
    return (f"cannot keep {kind} {key} in the inbox before its ack ({why}); handling it and what follows here, "
            "but each is lost if this replica dies before answering it (said once, until keeping works again)")


def deliveries_kept_again_log() -> str:
    return "deliveries are kept in the inbox before their ack again"


def delivery_taken_over(kind: str, key: str, dead: str, replica: str) -> str:
    return f"{dead} acknowledged {kind} {key} and fell silent before answering it: {replica} runs it again"


def delivery_abandoned(kind: str, key: str, dead: str, *, received_at: dt.datetime, takeovers: int,
                       too_old: bool) -> str:
    why = ("it came more than half an hour ago, and Slack no longer takes its answer" if too_old
           else f"it was taken over {takeovers} times already and each replica running it fell silent")
    return (f"{dead} acknowledged {kind} {key} at {received_at:%Y-%m-%d %H:%M:%S} UTC and fell silent before "
            f"answering it; it is not run again: {why}")


def heartbeat_failed(replica: str, error: str) -> str:
    return (f"{replica} could not write its heartbeat or look for deliveries left by silent replicas ({error}); "
            "trying again every beat (said once, until it works again). Silent for longer than the dead-after, "
            "its unanswered deliveries are run again by another replica")


def heartbeat_working_again(replica: str) -> str:
    return f"{replica} writes its heartbeat again"


def group_lookup_failed_log(group: str, error: str) -> str:
    return f"could not read the members of user group {group} ({error}); its roles are not granted"


def group_lookup_paced_log(group: str, per_minute: int) -> str:
    return (f"did not read the members of user group {group}: {per_minute} reads of user groups in the last "
            f"minute already (Slack's rate limit); its roles are not granted to this action")


# ------------------------------------------------------------------ the console


def console_exit_runs_in_flight(runs: list[str]) -> str:
    listed = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
    return (f"Runs still in flight: {listed}. Their engine stops with this console; nothing is lost: "
            "they go on where they stopped when a gpuops engine (`gpuops run`, or this console again) "
            "holds the lease.")


def console_intro(name: str, user_id: str, roles: str) -> str:
    return (f"gpuops console as {name} ({user_id}, {roles}). Type /gpu commands; a number clicks "
            "that button; :as USER switches identity; :quit ends.")


def console_now_as(name: str, user_id: str, roles: str) -> str:
    return f"Now acting as {name} ({user_id}, {roles})."


def console_no_such_button(number: str, count: int) -> str:
    if count == 0:
        return f"There is no button {number}: the last reply has none."
    return f"There is no button {number}: choose 1 to {count}."


def text_heading(title: str, ok: bool) -> str:
    """A reply's title in text: one that did not work says so, unless its title does already
    ("Refused", "Not allowed", "... refused (code)")."""
    said = any(word in title.lower() for word in ("refused", "not allowed", "failed", "not found", "not done"))
    return title if ok or said else f"{title} (failed)"


def console_confirm(title: str, text: str, confirm: str) -> str:
    return f"{title} {text} Type yes to {confirm.lower()}, anything else to go back."


def console_went_back() -> str:
    return "Nothing done."


def console_reason_prompt(request_id: str) -> str:
    return f"Why do you deny {request_id}? (one line; the requester reads it)"


def console_usage() -> str:
    return ("Console commands: /gpu <command> (or just <command>) · N clicks button N of the last reply · "
            ":as USER_ID · :help · :quit")


def console_unknown(line: str) -> str:
    return f"Unknown console command {line!r}. " + console_usage()


# ------------------------------------------------------------------ audit


def audit_intact(count: int, *, head: str, expected: str | None = None) -> str:
    published = f" It holds the published head {expected}." if expected else ""
    return (f"The audit log is intact: {count} entr{'y' if count == 1 else 'ies'}, every hash chains.{published}"
            f"\nIts head now: {head} (keep it; `gpuops audit verify --expected {head}` checks it later).")


def audit_head_log(head: str) -> str:
    return f"audit chain head {head}"


def audit_broken(checked: int, first_bad: int | None, problem: str) -> str:
    where = f" at entry {first_bad}" if first_bad is not None else ""
    return f"The audit log is BROKEN{where}: {problem} ({checked} entries before it check out)."


def audit_exported(count: int, where: str) -> str:
    return f"Exported {count} audit entr{'y' if count == 1 else 'ies'} to {where}."


def database_password_on_command_line(shown_url: str, variable: str) -> str:
    return (f"{shown_url} carries its password, which the command line would show in `ps` and the shell's history: "
            f"leave it out (PGPASSWORD or ~/.pgpass supplies it), or give the whole URL in {variable} or in a "
            f"file named by {variable}_FILE.")


def database_url_file_unreadable(named_by: str, path: str, why: str) -> str:
    return f"{named_by} names {path}, which cannot be read: {why}."


def database_url_file_empty(named_by: str, path: str) -> str:
    return f"{named_by} names {path}, which is empty: it should hold the postgresql:// URL."


def copy_source_not_sqlite(shown_url: str) -> str:
    return f"the source is a gpuops SQLite file's path, not {shown_url}."


def copy_table_done(table: str, rows: int) -> str:
    return f"{table}: {rows:,} row{'' if rows == 1 else 's'}"


def copy_done(source: str, target: str, *, checked: int, head: str) -> str:
    return (f"Copied {source} into {target}; its audit chain verifies ({checked:,} entries), "
            f"head {head}, the source's.")


def database_unreachable(problem: str) -> str:
    return f"database: cannot be used: {problem}"


def database_lost(problem: str) -> str:
    return f"the database cannot be used ({problem})"


def database_lost_standing_down(identity: str, problem: str) -> str:
    return (f"{identity} cannot use its database ({problem}): it runs none of the leader's work and gives the "
            "engine Lease up for a replica that can; it answers Slack as far as it can, and is not ready")


def database_back(identity: str) -> str:
    return f"{identity} reaches its database again: it competes for the engine Lease again"


def no_database(path: str) -> str:
    return f"There is no gpuops database at {path}; pass --database or set `database` in the configuration."


def upgrade_only_dry_run() -> str:
    return ("the command line only previews an upgrade (add --dry-run); ask for it with /gpu upgrade in Slack, "
            "where its approvers are")


def config_check_needs_file() -> str:
    return "name the file to check (gpuops config check FILE), or set --config or GPUOPS_CONFIG"


def config_check_ok(path: str, *, pools: list[str], rotations: int, users: int) -> str:
    listed = ", ".join(pools) if pools else "none"
    return (f"{path}: ok: {len(pools)} pool{'s' if len(pools) != 1 else ''} ({listed}), {rotations} "
            f"rotation{'s' if rotations != 1 else ''}, {users} user{'s' if users != 1 else ''} with roles")


def pod_delete_not_granted(pools: Sequence[str], identity: str) -> str:
    return (f"{identity} may not delete pods in every namespace, but pool{'s' if len(pools) > 1 else ''} "
            f"{', '.join(pools)} set{'' if len(pools) > 1 else 's'} pdb_timeout_action: delete. Grant it "
            "(kubectl apply -f deploy/rbac-pod-delete.yaml, or the chart's rbac.allowPodDelete=true) or change "
            "the pool's pdb_timeout_action")


def health_serving(health_url: str, metrics_url: str) -> str:
    return f"health: {health_url}/healthz and /readyz; metrics: {metrics_url}/metrics"


def cluster_readiness(name: str, *, state: str, since: dt.datetime | None, now: dt.datetime,
                      reason: str | None) -> str:
    """/readyz's line for a cluster other than the home one (it never makes the replica unready)."""
    if state == "up":
        return f"cluster {name}: answering"
    age = f" for {format_age(now - since)}" if since is not None else ""
    what = f"not reached yet, trying{age}" if state == "connecting" else f"not answering{age}"
    return f"cluster {name}: {what}{f' ({reason})' if reason else ''}; this replica stays ready"


def health_port_unavailable(port: int, error: str) -> str:
    return f"cannot serve /healthz and /readyz on port {port} ({error}): free it or pass --health-port"


def metrics_port_unavailable(port: int, error: str) -> str:
    return f"cannot serve /metrics on port {port} ({error}): free it or pass --metrics-port"


def cluster_kubeconfig_unusable(cluster: str, why: str) -> str:
    return f"clusters.{cluster}: its kubeconfig cannot be used: {why}"


def unnamed_rows_named(count: int, home: str) -> str:
    return (f"{count} requests and freezes from before clusters: was configured now name {home}, the home "
            "cluster, whose nodes they are about")


def runbook_link(url: str) -> str:
    """Appended to a halted run's thread message when `docs_url` is configured."""
    return f"\nWhat to check and do: <{url}|the runbook>"
