"""Prefix affinity for conversations sent one request at a time (#48): eight conversations over two replicas, three
turns each, turn by turn (every conversation's first turn, then every second turn...), each request waiting for
the previous one's answer, so that no request is ever in flight when the next is routed. New conversations spread
over the replicas (four each), each later turn goes back to its conversation's replica, and that replica still
holds the history although it has two slots for its four conversations (its RAM session tier): at least 80% of
the history each turn resends is served from cache (usage.prompt_tokens_details.cached_tokens). Before the third
turns the test waits for the replicas' routing stats to reach the router (affinity.GRACE_S past the second turns):
a report that did not list the histories the replicas hold would send the third turns elsewhere."""

from __future__ import annotations

import time

from llamactx.cluster.affinity import GRACE_S
from llamactx.cluster.launch import ROUTING_STATS_PERIOD_S
from tests.cluster.conftest import needs_ray, running_cluster

pytestmark = needs_ray

FLAGS = ("-m", "smollm2", "--replicas", "2", "-t", "1", "-np", "2", "-c", "2048", "--temp", "0")
SYSTEM = ("You are the assistant of a travel agency. Answer briefly. Quote prices in euros, taxes included; "
          "offer travel insurance once; prefer trains to planes under six hundred kilometres; book hotel rooms "
          "with free cancellation; check visas for trips outside the Schengen area.")
PLACES = ["Lisbon", "Kyoto", "Oslo", "Marrakesh", "Vienna", "Lima", "Hanoi", "Dublin"]
QUESTIONS = ["I would like to travel to {} next month. How should I get there?", "What does a hotel cost there?",
             "Do I need a visa for it?"]
MAX_TOKENS = 12
MIN_CACHED_SHARE = 0.8


def test_sequential_conversations_spread_and_keep_their_histories():
    conversations = [[{"role": "system", "content": SYSTEM}] for _ in PLACES]
    replica_of: dict[int, str] = {}
    history = [0] * len(PLACES)  # each conversation's tokens so far: its last prompt and answer
    resent = cached = 0
    with running_cluster(*FLAGS) as cluster, cluster.client() as client:
        for turn, question in enumerate(QUESTIONS):
            if turn == 2:  # the routing stats of a time after every second turn (+ GRACE_S) reach the router
                time.sleep(GRACE_S + 2 * ROUTING_STATS_PERIOD_S + 1)
            for i, place in enumerate(PLACES):
                messages = conversations[i]
                messages.append({"role": "user", "content": question.format(place)})
                r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": MAX_TOKENS})
                assert r.status_code == 200, r.text
                body, replica = r.json(), r.headers["x-llamactx-replica"]
                usage = body["usage"]
                if turn:
                    assert replica == replica_of[i], f"conversation {i}, turn {turn + 1}: went to another replica"
                    resent += history[i]
                    cached += usage["prompt_tokens_details"]["cached_tokens"]
                replica_of[i] = replica
                messages.append(body["choices"][0]["message"])
                history[i] = usage["prompt_tokens"] + usage["completion_tokens"]
    per_replica = sorted(list(replica_of.values()).count(r) for r in set(replica_of.values()))
    assert per_replica == [4, 4], f"conversations per replica: {per_replica}"
    assert resent > 0
    share = cached / resent
    print(f"resent history served from cache: {cached} of {resent} tokens ({share:.0%})")
    assert share >= MIN_CACHED_SHARE, f"{cached} of {resent} resent history tokens cached ({share:.0%})"
