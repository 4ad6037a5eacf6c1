"""The ranks of one torchrun attempt meet before Lightning joins them: rank 0 hands the others
its choices (the checkpoint to resume) and a store of this attempt's own.

Why: torchrun's agents share one TCP store across restarts (``TORCHELASTIC_USE_AGENT_STORE``:
every rendezvous round of torch 2.14 reuses the store of the first), and the process group's
keys there are the same in every attempt. A restarted rank can read a dead rank's address from
the attempt before and give up (gloo's ``connectFullMesh ... Connection refused``), and
``--max-restarts`` is spent on a group that never forms. So rank 0 picks a free port for the
process group's store and offers it, with its choices and a fresh token, on the agents' store;
each other rank answers with a nonce of its own, and rank 0 names every nonce it gathered under
the token. A rank that read the offer of an attempt before (its rank 0 is dead) finds its nonce
missing and reads again. Then ``MASTER_PORT`` names the new port and the agents' store is no
longer used, so Lightning's ``init_process_group`` starts from empty keys, rank 0 serving them.

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
from cocodet.ranks import Ranks

log = logging.getLogger(__name__)

PREFIX = "cocodet/meeting"
TIMEOUT_S = 1800.0  # torch's default process-group timeout: a rank may still be reading its dataset index
POLL_S = 2.0  # how long a rank waits for rank 0's answer before it reads the offer again


def meet(ranks: Ranks, choose: Callable[[], dict], timeout_s: float = TIMEOUT_S) -> dict:
    """Rank 0's ``choose()``, on every rank of this attempt (JSON-able values)."""
    if ranks.launcher != "torchelastic" or ranks.world_size <= 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return choose()
    from torch.distributed import TCPStore

    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agents = TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    offer = _offer(agents, ranks, choose(), timeout_s) if ranks.global_rank == 0 else _answer(agents, ranks, timeout_s)
    # Lightning's init_process_group (env://) now makes rank 0 serve a store on the new port.
    os.environ.update(MASTER_PORT=str(offer["port"]), TORCHELASTIC_USE_AGENT_STORE="False")
    log.info("rank %d met the %d other rank(s) of this attempt (%s); the process group's store: %s:%d",
             ranks.global_rank, ranks.world_size - 1, offer["token"][:8], addr, offer["port"])
    return offer["choice"]


def _offer(agents, ranks: Ranks, choice: dict, timeout_s: float) -> dict:
    offer = {"token": uuid.uuid4().hex, "port": _free_port(), "choice": choice}
    agents.set(f"{PREFIX}/offer", json.dumps(offer))
    nonces = {}
    for rank in range(1, ranks.world_size):
        key = f"{PREFIX}/{offer['token']}/answer/{rank}"
        try:
            agents.wait([key], timedelta(seconds=timeout_s))
        except Exception as e:  # torch's DistStoreError: a timeout
            raise UserError(f"rank {rank} did not join this attempt's meeting within {timeout_s:.0f} s ({e}); the "
                            "other nodes' logs say why (a node that cannot reach this one, or one still starting)")
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
            raise UserError(f"rank {ranks.global_rank} found no offer of this attempt's rank 0 within {timeout_s:.0f} s "
                            "(rank 0's node may have failed to start: its log says why)")
        if met is not None:  # an attempt before met there: this attempt's rank 0 has not offered yet
            time.sleep(POLL_S / 4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
