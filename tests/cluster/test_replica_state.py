"""What each replica keeps for itself, seen through the cluster's front door: GET /slots lists every replica's slots
(each with its "replica"), a slot action runs on the replica the request names (and a slot saved on one replica
restores on the other through a shared --slot-save-path), and POST /lora-adapters sets the scales on every
replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import needs_ray, running_cluster

pytestmark = needs_ray

ADAPTER = Path(__file__).parents[1] / "data" / "lora" / "smollm2-lora.gguf"
MAX_CALLS = 40  # GET /lora-adapters sent until both replicas have answered one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    saves = tmp_path_factory.mktemp("slots")
    flags = ("-m", "smollm2", "--replicas", "2", "-t", "1", "-np", "2", "-c", "1024", "--slot-save-path", str(saves),
             "--lora-scaled", f"{ADAPTER}:0.25")
    with running_cluster(*flags) as running:
        running.saves = saves
        yield running


def replica_ids(cluster) -> list[str]:
    return sorted(r["replica"] for r in cluster.health()["replicas"])


def test_slots_lists_every_replicas_slots(cluster):
    with cluster.client() as c:
        r = c.post("/completion", json={"prompt": "The bookshop opens at", "n_predict": 4, "id_slot": 1})
        assert r.status_code == 200, r.text
        served = r.headers["x-llamactx-replica"]
        slots = c.get("/slots").json()
    ids = replica_ids(cluster)
    assert sorted((s["replica"], s["id"]) for s in slots) == [(rid, i) for rid in ids for i in (0, 1)]
    used = {(s["replica"], s["id"]): s["n_tokens"] for s in slots}
    assert used[(served, 1)] > 0 and used[(served, 0)] == 0


def test_a_slot_saved_on_one_replica_restores_on_the_other(cluster):
    with cluster.client() as c:
        r = c.post("/completion", json={"prompt": "Gift cards never expire and", "n_predict": 4, "id_slot": 0})
        assert r.status_code == 200, r.text
        first = r.headers["x-llamactx-replica"]
        other = next(rid for rid in replica_ids(cluster) if rid != first)
        saved = c.post("/slots/0", params={"action": "save", "replica": first}, json={"filename": "turn.bin"})
        assert saved.status_code == 200, saved.text
        assert saved.headers["x-llamactx-replica"] == first and saved.json()["n_saved"] > 0
        assert (cluster.saves / "turn.bin").stat().st_size == saved.json()["n_written"]
        restored = c.post("/slots/1", params={"action": "restore", "replica": other}, json={"filename": "turn.bin"})
        assert restored.status_code == 200, restored.text
        assert restored.json()["n_restored"] == saved.json()["n_saved"]
        slots = {(s["replica"], s["id"]): s["n_tokens"] for s in c.get("/slots").json()}
        assert slots[(other, 1)] == saved.json()["n_saved"]


@pytest.mark.parametrize("params, status, message", [
    ({"action": "erase"}, 400, "replica: required while 2 replicas run"),
    ({"action": "erase", "replica": "no-such-replica"}, 404, "'no-such-replica' is not running"),
    ({"action": "explode", "replica": None}, 400, "action: 'explode' is not one of save, restore, erase"),
])
def test_slot_action_errors_name_the_field(cluster, params, status, message):
    if "replica" in params and params["replica"] is None:
        params = {**params, "replica": replica_ids(cluster)[0]}
    with cluster.client() as c:
        r = c.post("/slots/0", params=params)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]


def lora_scales_by_replica(c) -> dict[str, list[float]]:
    """GET /lora-adapters (forwarded to one replica each time) until both replicas have answered."""
    seen = {}
    for _ in range(MAX_CALLS):
        r = c.get("/lora-adapters")
        seen[r.headers["x-llamactx-replica"]] = [a["scale"] for a in r.json()]
        if len(seen) == 2:
            break
    assert len(seen) == 2, f"{MAX_CALLS} GET /lora-adapters reached only {sorted(seen)}"
    return seen


def test_lora_adapters_post_reaches_every_replica(cluster):
    with cluster.client() as c:
        assert all(v == [0.25] for v in lora_scales_by_replica(c).values())  # --lora-scaled on both
        bad = c.post("/lora-adapters", json={"id": 0, "scale": 1})
        assert bad.status_code == 400 and "must be an array" in bad.json()["error"]["message"]
        assert all(v == [0.25] for v in lora_scales_by_replica(c).values())  # nothing changed anywhere
        ok = c.post("/lora-adapters", json=[{"id": 0, "scale": 0.5}])
        assert ok.status_code == 200 and ok.json() == {"success": True}
        assert all(v == [0.5] for v in lora_scales_by_replica(c).values())
