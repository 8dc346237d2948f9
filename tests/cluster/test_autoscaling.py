"""`llamactx serve --replicas 1 --max-replicas 2` on a local Ray, live: Ray Serve's autoscaling adds the second
replica while requests queue at the first (more ongoing requests than --target-ongoing), and every request, the
ones queued before the new replica came and those after, is answered."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.cluster.conftest import needs_ray, running_cluster, wait_until

pytestmark = needs_ray

FLAGS = ("-m", "smollm2", "--replicas", "1", "--max-replicas", "2", "--target-ongoing", "1", "-t", "1", "-np", "1",
         "-c", "2048")
N_REQUESTS = 8
N_PREDICT = 384  # ~4 s each on one thread: 8 queued at one slot keep the load up for longer than a scale-up takes


def ready_replicas(cluster) -> list[dict]:
    """The replicas /health lists as ok ([] while it answers 503: no replica answered within its fan-out time)."""
    return [r for r in cluster.health().get("replicas", []) if r["status"] == "ok"]


def test_autoscaling_adds_a_replica_under_load_and_answers_every_request():
    with running_cluster(*FLAGS) as cluster:
        wait_until(lambda: len(ready_replicas(cluster)) == 1, 60, "the first replica ready")
        body = {"prompt": "Once upon a time", "n_predict": N_PREDICT, "temperature": 0, "ignore_eos": True}

        def complete(i: int) -> tuple[int, int, str]:
            with httpx.Client(base_url=cluster.url, timeout=300) as c:
                r = c.post("/completion", json={**body, "prompt": f"{body['prompt']} {i}"})
                n = r.json().get("tokens_predicted", 0) if r.status_code == 200 else 0
                return r.status_code, n, r.headers.get("x-llamactx-replica", "")

        with ThreadPoolExecutor(N_REQUESTS) as pool:
            futures = [pool.submit(complete, i) for i in range(N_REQUESTS)]
            replicas = wait_until(lambda: (rs := ready_replicas(cluster)) and len(rs) == 2 and rs, 120,
                                  "Ray Serve starting a second replica for 8 requests queued at one slot")
            results = [f.result(timeout=600) for f in futures]
        assert len({r["pid"] for r in replicas}) == 2
        assert [(status, n) for status, n, _ in results] == [(200, N_PREDICT)] * N_REQUESTS, results
        served_by = {rid for _, _, rid in results}
        assert len(served_by) == 2, f"every request was served by {served_by}: the new replica took none"
