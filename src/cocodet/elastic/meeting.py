"""The ranks of one torchrun attempt meet before Lightning joins them: rank 0 hands the others
its choices (the checkpoint to resume) and the store their process group starts from.

Why: by default torchrun's agents share one TCP store across restarts
(``TORCHELASTIC_USE_AGENT_STORE``: torch 2.14 reuses the first round's store in every round), and
the process group's keys there are the same in every attempt. A restarted rank can read a dead
rank's address from the attempt before and give up (gloo's ``connectFullMesh ... Connection
refused``), and ``--max-restarts`` is spent on a group that never forms. So rank 0 picks a free
port for the process group's store and offers it, with its choices and a fresh token, on the
agents' store; each other rank answers with a nonce of its own, and rank 0 names every nonce it
gathered under the token. A rank that read the offer of an attempt before (its rank 0 is dead)
finds its nonce missing and reads again. Then ``MASTER_PORT`` names the new port and the agents'
store is no longer used, so Lightning's ``init_process_group`` starts from empty keys.

With ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` on the agents (what a node replaced by a new agent
needs, and what deploy/k8s/ sets) each round has a store of its own, served by rank 0 on a new
port: the meeting takes place there, and only hands over rank 0's choices.

Outside torchrun, or with one rank, there is nothing to meet: rank 0's choice is this process's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from datetime import timedelta
from typing import Callable

from cocodet.errors import UserError
from cocodet.ranks import Ranks, elastic_launch, leave_the_agents_store

log = logging.getLogger(__name__)

PREFIX = "cocodet/meeting"
TIMEOUT_S = 1800.0  # torch's default process-group timeout: a rank may still be reading its dataset index
POLL_S = 2.0  # how long a rank waits for rank 0's answer before it reads the offer again


def meet(ranks: Ranks, choose: Callable[[], dict], timeout_s: float = TIMEOUT_S) -> dict:
    """Rank 0's ``choose()``, on every rank of this attempt (JSON-able values)."""
    if ranks.launcher != "torchelastic" or ranks.world_size <= 1 or "MASTER_PORT" not in os.environ:
        return choose()
    from torch.distributed import TCPStore

    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    shared = elastic_launch().shared_store
    if shared and ranks.world_size > ranks.local_world_size and ranks.global_rank == 0:
        log.warning(
            "torchrun's agents share one store across restarts (TORCH_DISABLE_SHARE_RDZV_TCP_STORE is not 1): "
            "a restarted group meets anew, but an agent started in place of a lost node cannot join (torch "
            "2.14 publishes the store's address to the first round only); set "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the agents' environment, as deploy/k8s/ does"
        )
    # Not shared: rank 0 serves this attempt's store (new each round) now; Lightning's
    # init_process_group reuses it (multi_tenant) and the other ranks connect as they start.
    store = TCPStore(
        addr,
        port,
        is_master=not shared and ranks.global_rank == 0,
        multi_tenant=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )
    _SERVED.append(store)  # held for the process's life: Lightning's store is this one
    if ranks.global_rank == 0:
        offer = _offer(store, ranks, choose(), _free_port() if shared else port, timeout_s)
    else:
        offer = _answer(store, ranks, timeout_s)
    # Shared: Lightning's init_process_group (env://) makes rank 0 serve a new store on the new port.
    leave_the_agents_store(offer["port"])
    log.info(
        "rank %d met the %d other rank(s) of this attempt (%s); the process group's store: %s:%d",
        ranks.global_rank,
        ranks.world_size - 1,
        offer["token"][:8],
        addr,
        offer["port"],
    )
    return offer["choice"]


_SERVED: list = []


def _offer(agents, ranks: Ranks, choice: dict, port: int, timeout_s: float) -> dict:
    offer = {"token": uuid.uuid4().hex, "port": port, "choice": choice}
    agents.set(f"{PREFIX}/offer", json.dumps(offer))
    nonces = {}
    for rank in range(1, ranks.world_size):
        key = f"{PREFIX}/{offer['token']}/answer/{rank}"
        try:
            agents.wait([key], timedelta(seconds=timeout_s))
        except Exception as e:  # torch's DistStoreError: a timeout
            raise UserError(
                f"rank {rank} did not join this attempt's meeting within {timeout_s:.0f} s ({e}); the "
                "other nodes' logs say why (a node that cannot reach this one, or one still starting)"
            )
        nonces[str(rank)] = agents.get(key).decode()
    agents.set(f"{PREFIX}/{offer['token']}/met", json.dumps(nonces))
    return offer


def _answer(agents, ranks: Ranks, timeout_s: float) -> dict:
    nonce, deadline = uuid.uuid4().hex, time.monotonic() + timeout_s
    while True:
        offer = json.loads(agents.get(f"{PREFIX}/offer"))  # waits for rank 0's first offer
        agents.set(f"{PREFIX}/{offer['token']}/answer/{ranks.global_rank}", nonce)
        met = f"{PREFIX}/{offer['token']}/met"
        try:
            agents.wait([met], timedelta(seconds=POLL_S))
        except Exception:  # rank 0 still gathering answers, or an offer of an attempt before: read it again
            met = None
        if met is not None and json.loads(agents.get(met)).get(str(ranks.global_rank)) == nonce:
            return offer
        if time.monotonic() > deadline:
            raise UserError(
                f"rank {ranks.global_rank} found no offer of this attempt's rank 0 within {timeout_s:.0f} s "
                "(rank 0's node may have failed to start: its log says why)"
            )
        if met is not None:  # an attempt before met there: this attempt's rank 0 has not offered yet
            time.sleep(POLL_S / 4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
