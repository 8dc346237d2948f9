"""`llamactx serve --replicas`' flags without starting Ray: their bounds, Ray Serve's scaling options they become,
and the single-process server importing nothing of Ray without them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llamactx.cli.commands import main
from llamactx.cli.serve import parse_flags
from llamactx.cluster.launch import REPLICA_SESSION_RAM_MIB, replica_config, scaling_options, thread_env
from llamactx.cluster.options import ClusterError, ClusterOptions


def scaling(flags: str) -> dict:
    config, options = parse_flags(flags)
    return scaling_options(options, config.runtime.n_slots)


def test_fixed_and_autoscaled_replicas():
    assert scaling("--replicas 3") == {"num_replicas": 3}
    auto = scaling("--replicas 2 --max-replicas 6 -np 8")["autoscaling_config"]
    assert (auto["min_replicas"], auto["initial_replicas"], auto["max_replicas"]) == (2, 2, 6)
    assert auto["target_ongoing_requests"] == 8  # default: one replica's slots
    assert scaling("--replicas 1 --max-replicas 4")["autoscaling_config"]["target_ongoing_requests"] == 4  # -np's
    target = scaling("--replicas 1 --max-replicas 4 --target-ongoing 3")["autoscaling_config"]
    assert target["target_ongoing_requests"] == 3
    assert parse_flags("")[1] == ClusterOptions()  # `serve run ...:app_builder` without --replicas: one replica


def test_each_replica_gets_its_threads():
    assert thread_env(parse_flags("-t 1")[0].runtime)["NUMBA_NUM_THREADS"] == "1"
    assert thread_env(parse_flags("-t 2 -tb 4")[0].runtime)["NUMBA_NUM_THREADS"] == "4"


def test_each_replica_keeps_histories_beyond_its_slots():
    """A RAM session tier by default (the histories it was routed beyond its slots); the flags' tier as given."""
    config, _ = parse_flags("--replicas 2")
    assert config.runtime.session is None  # the single-process server's default is unchanged
    assert replica_config(config).runtime.session.ram_bytes == REPLICA_SESSION_RAM_MIB << 20
    assert replica_config(config).runtime.n_slots == config.runtime.n_slots
    given, _ = parse_flags("--replicas 2 --session-ram 64")
    assert replica_config(given).runtime.session.ram_bytes == 64 << 20
    cache_ram, _ = parse_flags("--replicas 2 --cache-ram 256")  # llama-server's own RAM cache: no second one
    assert replica_config(cache_ram).runtime.session is None


@pytest.mark.parametrize("flags, message", [
    ("--replicas 0", "--replicas = 0 must be an integer >= 1"),
    ("--replicas 4 --max-replicas 2", "--max-replicas = 2 must be an integer >= 4"),
    ("--replicas 1 --max-replicas 2 --target-ongoing 0", "--target-ongoing = 0 must be an integer >= 1"),
])
def test_bad_cluster_flags_are_named(flags, message):
    with pytest.raises(ClusterError, match=message):
        parse_flags(flags)


def test_options_refuse_what_the_flags_cannot_say():
    with pytest.raises(ClusterError, match="--routing = 'random' must be one of affinity, round-robin"):
        ClusterOptions(routing="random")
    with pytest.raises(ClusterError, match="--replicas = True must be an integer >= 1"):
        ClusterOptions(replicas=True)


def test_the_command_line_refuses_them_before_starting_anything(capsys):
    assert main(["serve", "--replicas", "0", "--port", "0"]) == 1
    assert "--replicas = 0 must be an integer >= 1" in capsys.readouterr().err
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


def test_replicas_receive_the_built_config():
    """The ingress and every replica get the ServerConfig the command line built (pickled to Ray's actors), not
    flags to parse again."""
    import pickle

    config, options = parse_flags("--replicas 2 -np 3 -c 2048 --temp 0.5 --api-key k")
    shipped = pickle.loads(pickle.dumps(replica_config(config)))
    assert shipped.runtime == replica_config(config).runtime
    assert (shipped.runtime.n_slots, shipped.api_keys, shipped.request_defaults["temperature"]) == (3, ["k"], 0.5)
    assert pickle.loads(pickle.dumps(options)) == options
