"""`llamactx serve --replicas 1 --max-replicas 2` on a local Ray, live: Ray Serve's autoscaling adds the second
replica while requests queue at the first (more ongoing requests than --target-ongoing), the requests still waiting
then go to both, and every request is answered in full."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.cluster.conftest import needs_ray, running_cluster, wait_until

pytestmark = needs_ray

FLAGS = ("-m", "smollm2", "--replicas", "1", "--max-replicas", "2", "--target-ongoing", "1", "-t", "1", "-np", "1",
         "-c", "2048")
N_PREDICT = 128  # ~1.5 s per request on one thread
QUEUED = 4  # requests kept in flight until the second replica is up: the load the autoscaler sees
SCALE_UP_TIMEOUT_S = 120
MAX_REQUESTS = 200  # the loop's bound: ~1.5 s each, far more than SCALE_UP_TIMEOUT_S needs


def ready_replicas(cluster) -> list[dict]:
    """The replicas /health lists as ok ([] while it answers 503: no replica answered within its fan-out time)."""
    return [r for r in cluster.health().get("replicas", []) if r["status"] == "ok"]


def test_autoscaling_adds_a_replica_under_load_and_answers_every_request():
    with running_cluster(*FLAGS) as cluster:
        wait_until(lambda: len(ready_replicas(cluster)) == 1, 60, "the first replica ready")

        def complete(i: int) -> tuple[int, int, str]:
            with httpx.Client(base_url=cluster.url, timeout=300) as c:
                r = c.post("/completion", json={"prompt": f"Once upon a time {i}", "n_predict": N_PREDICT,
                                                "temperature": 0, "ignore_eos": True})
                n = r.json().get("tokens_predicted", 0) if r.status_code == 200 else 0
                return r.status_code, n, r.headers.get("x-llamactx-replica", "")

        with ThreadPoolExecutor(2 * QUEUED) as pool:
            futures = []
            deadline = time.monotonic() + SCALE_UP_TIMEOUT_S
            while len(futures) < MAX_REQUESTS and time.monotonic() < deadline:
                while sum(not f.done() for f in futures) < QUEUED and len(futures) < MAX_REQUESTS:
                    futures.append(pool.submit(complete, len(futures)))
                if len(replicas := ready_replicas(cluster)) == 2:
                    break
                time.sleep(0.5)
            assert len(replicas) == 2, f"no second replica within {SCALE_UP_TIMEOUT_S} s of load"
            futures += [pool.submit(complete, len(futures) + i) for i in range(QUEUED)]  # waiting: both serve them
            results = [f.result(timeout=300) for f in futures]
        assert len({r["pid"] for r in replicas}) == 2
        assert [(status, n) for status, n, _ in results] == [(200, N_PREDICT)] * len(results), results
        served_by = {rid for _, _, rid in results}
        assert len(served_by) == 2, f"every request was served by {served_by}: the new replica took none"
