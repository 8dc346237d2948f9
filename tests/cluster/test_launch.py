"""`llamactx serve --replicas`' flags without starting Ray: their bounds, Ray Serve's scaling options they become,
and the single-process server importing nothing of Ray without them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llamactx.cli.args import CommandError
from llamactx.cli.commands import main
from llamactx.cluster.launch import check_args, parse_flags, scaling_options, thread_env


def test_fixed_and_autoscaled_replicas():
    assert scaling_options(parse_flags("--replicas 3")) == {"num_replicas": 3}
    auto = scaling_options(parse_flags("--replicas 2 --max-replicas 6 -np 8"))["autoscaling_config"]
    assert (auto["min_replicas"], auto["initial_replicas"], auto["max_replicas"]) == (2, 2, 6)
    assert auto["target_ongoing_requests"] == 8  # default: one replica's slots
    target = scaling_options(parse_flags("--replicas 1 --max-replicas 4 --target-ongoing 3"))["autoscaling_config"]
    assert target["target_ongoing_requests"] == 3
    assert parse_flags("").replicas == 1  # `serve run ...:app_builder` without --replicas: one replica


def test_each_replica_gets_its_threads():
    assert thread_env(parse_flags("-t 1"))["NUMBA_NUM_THREADS"] == "1"
    assert thread_env(parse_flags("-t 2 -tb 4"))["NUMBA_NUM_THREADS"] == "4"


@pytest.mark.parametrize("flags, message", [
    ("--replicas 0", "--replicas = 0 must be >= 1"),
    ("--replicas 4 --max-replicas 2", "--max-replicas = 2 must be >= 4"),
    ("--replicas 1 --max-replicas 2 --target-ongoing 0", "--target-ongoing = 0 must be >= 1"),
])
def test_bad_cluster_flags_are_named(flags, message):
    with pytest.raises(CommandError, match=message):
        check_args(parse_flags(flags))


def test_the_command_line_refuses_them_before_starting_anything(capsys):
    assert main(["serve", "--replicas", "0", "--port", "0"]) == 1
    assert "--replicas = 0 must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--routing", "random"]) == 1
    assert "--routing: invalid choice: 'random'" in capsys.readouterr().err


def test_without_replicas_nothing_of_ray_is_imported():
    code = ("import sys\n"
            "from llamactx.cli.commands import build_parser\n"
            "from llamactx.cli.serve import config_from_args\n"
            "from llamactx.server.app import create_app\n"
            "create_app(config_from_args(build_parser().parse_args(['serve', '--port', '0'])))\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
