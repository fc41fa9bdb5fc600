"""`gpuops config check`: a configuration read as the bot reads it at start, every
problem named with its file, line and column and key, exit 1; a good one summarized, exit
0. The bot stops at start on the same messages (`load_config`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot import engine_process
from bot.cli import main
from testenv.fakeslack import FakeSlackWebApi
from workflows import config
from workflows.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]

BAD = """\
cluster:
  pool_label: gpuops.io/pool
pools:
  serving-a:
    kind: serving
    windows:
      - {days: [sat], start: "02:00", end: "06:00", timezone: Mars/Olympus}
    max_unavailable: two
  training-a:
    kind: training
    colour: blue
upgrades:
  gpu_check: {resource: cpu}
"""


def test_every_problem_is_named_with_its_line_column_and_key(tmp_path):
    path = tmp_path / "gpuops.yaml"
    path.write_text(BAD)
    with pytest.raises(ConfigError) as stopped:
        load_config(path)
    lines = str(stopped.value).splitlines()
    assert [line.split(": ", 2)[:2] for line in lines] == [
        [f"{path}:7:63", "pools.serving-a.windows.0.timezone"],
        [f"{path}:8:22", "pools.serving-a.max_unavailable"],
        [f"{path}:11:13", "pools.training-a.colour"],
        [f"{path}:13:25", "upgrades.gpu_check.resource"],
    ]
    assert "gpu_check.resource must be a GPU resource" in lines[3] and "Value error" not in lines[3]


def test_config_check_exits_1_with_the_errors_and_0_with_a_summary(tmp_path, capsys):
    path = tmp_path / "gpuops.yaml"
    path.write_text(BAD)
    assert main(["config", "check", str(path)]) == 1
    assert f"{path}:8:22: pools.serving-a.max_unavailable:" in capsys.readouterr().err

    example = ROOT / "deploy" / "config.example.yaml"
    assert main(["config", "check", str(example)]) == 0
    assert capsys.readouterr().out.startswith(f"{example}: ok: 3 pools (inference-mig, serving-a, training-a)")


def test_the_several_clusters_example_is_valid_and_names_each_pool_with_its_cluster(capsys):
    example = ROOT / "deploy" / "config.clusters.example.yaml"
    assert main(["config", "check", str(example)]) == 0
    assert capsys.readouterr().out.startswith(f"{example}: ok: 2 pools (east/serving-a, west/training-a)")


def test_yaml_that_does_not_parse_is_named_where_it_breaks(tmp_path, capsys):
    path = tmp_path / "gpuops.yaml"
    path.write_text("pools:\n  serving-a: {kind: serving\n")
    assert main(["config", "check", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"{path}:3:1: not valid YAML:")


# ------------------------------------------------------------------ hostile files
#
# Each is refused in one line, `file:line:column: reason`, exit 1, before it costs memory
# or time (the YAML is bounded while it is composed, the file's size before it is read).


def billion_laughs() -> bytes:
    """Ten anchors, each a list of ten aliases of the one before: 12 lines standing for
    ten billion values."""
    lines = ["access:", "  names:", "    x0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    x{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    return "\n".join(lines).encode() + b"\n"


def fifty_megabytes() -> bytes:
    header = b"access:\n  names:\n"
    line = b"    U0: someone\n"
    return header + line * ((50 * 1024 * 1024 - len(header)) // len(line))


HOSTILE = {
    # The tenth value of x4 (the fourth alias of *l3, each 1,111 values) passes 50,000.
    "billion laughs": (billion_laughs(), "7:29", "the alias *l3 takes the configuration past 50,000 values"),
    # 5,000 mappings inside each other: the key of the 30th (level 33) is one too deep.
    "5,000 levels deep": (b"pools:\n  a: " + b"{a: " * 5000 + b"1" + b"}" * 5000 + b"\n", "2:123",
                          "values nested more than 32 levels deep"),
    "a value holding itself": (b"pools:\n  a: &a {kind: serving, x: [*a]}\n", "2:29",
                               "the alias *a is inside the value its anchor names"),
    "Latin-1, not UTF-8": ("pools:\n  serving-a: {kind: serving}\n# café\n".encode("latin-1"), "3:6",
                           "not UTF-8 (byte 0xe9: invalid continuation byte)"),
    "50 MB": (fifty_megabytes(), "1:1", "the file is 50.0 MiB, past the 1 MiB gpuops reads as its configuration"),
    "a date that is no date": (b"database: 2025-13-45\n", "1:11",
                               "not valid YAML: '2025-13-45' cannot be read as timestamp (month must be in 1..12)"),
    "a raw escape character": (b"pools:\n  serving-a:\n    red\x1b[31m: 1\n", "3:8",
                               "not valid YAML: the character '\\x1b' may not be written in a YAML file"),
    "terminal escapes in a key": (b'pools:\n  serving-a:\n    kind: serving\n    "\\e]0;owned\\a\\e[2J": yes\n',
                                  "4:26", "pools.serving-a.\\x1b]0;owned\\x07\\x1b[2J: Extra inputs are not permitted"),
    "10,000 characters quoted": (b"pools:\n  a:\n    kind: serving\n    windows:\n      - {days: [sat], start: '02:00',"
                                 b" end: '06:00', timezone: " + b"Z" * 10_000 + b"}\n", "5:63",
                                 "pools.a.windows.0.timezone: '" + "Z" * 40 + "…' (10,000 characters) is not an "
                                 "IANA time zone"),
}


def refusal(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `gpuops config check` refuses `path` with (exit 1)."""
    assert main(["config", "check", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err[:2000]
    return lines[0]


@pytest.fixture(params=["libyaml", "python"])
def yaml_parser(request, monkeypatch):
    """PyYAML's parser in C (libyaml, as its wheels are built) or in Python (without it)."""
    if request.param == "python":
        monkeypatch.setattr(config, "_Loader", config._PythonLoader)
    else:
        assert config._Loader.__name__ == "_LibyamlLoader"
    return request.param


@pytest.mark.parametrize("content, where, says", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_file_is_refused_in_one_line_where_it_goes_wrong(tmp_path, capsys, yaml_parser, content, where,
                                                                   says):
    path = tmp_path / "gpuops.yaml"
    path.write_bytes(content)
    line = refusal(path, capsys)
    assert line.startswith(f"{path}:{where}: {says}"), line
    # Short, and nothing in it a terminal would act on.
    assert len(line) < len(str(path)) + 400 and line.isprintable()


def test_a_file_of_exactly_the_size_cap_is_read_and_one_byte_more_is_not(tmp_path, capsys):
    example = (ROOT / "deploy" / "config.example.yaml").read_bytes()
    filler = b"# " + b"x" * 77 + b"\n"
    mib = 1024 * 1024
    padded = example + filler * ((mib - len(example)) // len(filler))
    padded += b"#" * (mib - len(padded) - 1) + b"\n"
    path = tmp_path / "gpuops.yaml"
    path.write_bytes(padded)
    assert len(padded) == mib
    assert main(["config", "check", str(path)]) == 0
    assert ": ok: 3 pools" in capsys.readouterr().out

    path.write_bytes(padded + b"\n")
    assert refusal(path, capsys) == (f"{path}:1:1: the file is 1.0 MiB, past the 1 MiB gpuops reads as its "
                                     "configuration (a configuration is a few kilobytes: is this the right file?)")


def test_a_megabyte_of_tiny_values_is_refused_at_the_value_past_the_bound(tmp_path, capsys):
    path = tmp_path / "gpuops.yaml"
    path.write_bytes(b"access:\n  cli_roles: [" + b",".join([b"1"] * 500_000) + b"]\n")
    # The root mapping, access (a key is a value too), its mapping, cli_roles and the list are
    # five values: the 49,996th item, at column 15 + 2 * 49,995, is one too many.
    assert refusal(path, capsys).startswith(f"{path}:2:{15 + 2 * 49_995}: more than 50,000 values")


@pytest.mark.parametrize("name, quoted", [
    ("a b", "'a b'"),
    ("<!channel>", "'<!channel>'"),
    ("x" * 10_000, "'" + "x" * 40 + "…' (10,000 characters)"),
    ("gpu\x1b[2Jpool", "'gpu\\x1b[2Jpool'"),
    ("\u202eabc", "'\\u202eabc'"),  # right-to-left override
    ("zero\u200bwidth", "'zero\\u200bwidth'"),
    ("café", "'café'"),
    ("-serving", "'-serving'"),
    ("serving.", "'serving.'"),
    ("a" * 64, "'" + "a" * 40 + "…' (64 characters)"),
    ("", "''"),
])
def test_a_pool_name_no_label_value_can_carry_is_refused_at_its_key(tmp_path, capsys, name, quoted):
    path = tmp_path / "gpuops.yaml"
    # Quoted with YAML's escapes, and an explicit key (a plain one is at most 1,024 characters).
    written = name.encode("unicode_escape").decode()
    path.write_text(f'pools:\n  ? "{written}"\n  : {{kind: serving}}\n')
    line = refusal(path, capsys)
    assert line.startswith(f"{path}:2:5: pools."), line
    assert (f"pool name {quoted} could never have a node: a node's pool is the value of its node label "
            "(cluster.pool_label), and a label value is at most 63 letters") in line
    assert len(line) < len(str(path)) + 400 and line.isprintable()


@pytest.mark.parametrize("name, says", [
    ("unpooled", "'unpooled' is reserved for GPU nodes that match no pool"),
    ("east/serving", "pool name 'east/serving' has a '/', which separates a cluster from a pool"),
])
def test_a_pool_name_gpuops_gives_a_meaning_of_its_own_is_refused_with_it(tmp_path, capsys, name, says):
    path = tmp_path / "gpuops.yaml"
    path.write_text(f"pools:\n  {name}: {{kind: serving}}\n")
    assert refusal(path, capsys) == f"{path}:2:3: pools.{name}: {says}"


def test_a_pool_name_of_each_cluster_is_checked_too_and_a_label_value_is_accepted(tmp_path, capsys):
    path = tmp_path / "gpuops.yaml"
    path.write_text("clusters:\n  east:\n    home: true\n    pools:\n      '<!here>': {kind: serving}\n")
    assert refusal(path, capsys).startswith(f"{path}:5:7: clusters.east.pools.<!here>: pool name '<!here>'")

    longest = "a" * 63
    path.write_text(f"pools:\n  {longest}: {{kind: serving}}\n  Serving_A.1-x: {{kind: training}}\n")
    assert main(["config", "check", str(path)]) == 0
    assert f"2 pools (Serving_A.1-x, {longest})" in capsys.readouterr().out


def test_a_thousand_problems_are_listed_twenty_and_counted(tmp_path, capsys):
    path = tmp_path / "gpuops.yaml"
    path.write_text("pools:\n" + "".join(f"  p{i}: {{kind: nope}}\n" for i in range(1000)))
    assert main(["config", "check", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"{path}:2:14: pools.p0.kind: Input should be")
    assert lines[19].startswith(f"{path}:21:15: pools.p19.kind:")
    assert lines[20:] == [f"{path}: and 980 more problems (fix these and check again)"]


@pytest.mark.parametrize("case", ["billion laughs", "5,000 levels deep", "Latin-1, not UTF-8", "50 MB",
                                  "terminal escapes in a key"])
def test_the_bot_and_the_engine_refuse_to_start_on_a_hostile_file_with_the_same_line(
        tmp_path, capsys, monkeypatch, case):
    content, where, says = HOSTILE[case]
    path = tmp_path / "gpuops.yaml"
    path.write_bytes(content)
    with FakeSlackWebApi() as slack:  # the bot asks Slack who it is before it reads its configuration
        for name, value in (("SLACK_BOT_TOKEN", slack.bot_token), ("SLACK_APP_TOKEN", slack.app_token),
                            ("SLACK_API_URL", slack.base_url)):
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("SLACK_SIGNING_SECRET", raising=False)
        assert main(["run", "--config", str(path), "--database", str(tmp_path / "gpuops.db")]) == 2
    said, refused = capsys.readouterr().err.splitlines()[-2:]
    assert said == "gpuops: configuration error:" and refused.startswith(f"{path}:{where}: {says}")
    assert refused.isprintable() and not (tmp_path / "gpuops.db").exists()

    assert engine_process.main(["--config", str(path), "--db", str(tmp_path / "engine.db")]) == 2
    assert capsys.readouterr().err.startswith(f"{path}:{where}: {says}")
