"""One token per rendezvous round, agreed by every machine's agent and handed to its workers (``TRAINWRIGHT_ATTEMPT``).

The workers of one attempt build their process group under a prefix of the attempt's own in the store torchrun shares
with them (`strategies.process_group.attempt_store`): the keys a dead attempt left there cannot mislead a restarted
worker. torchrun's restart count alone does not name an attempt across machines: an agent restarts its workers without
counting a restart when a machine joins (its count stays k; the new machine's is 0), and on a failure each agent counts
its own. The rendezvous round does: after each round, the agent of rank 0 writes a fresh token in the round's own store
and every agent reads it before it starts its workers, which inherit it from the agent's environment.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

# strategies.process_group.ATTEMPT_VARIABLE (the CLI imports no torch at module level)
ATTEMPT_VARIABLE = "TRAINWRIGHT_ATTEMPT"
_KEY = "trainwright/attempt"


def agree_on_token(info: Any) -> str:
    """The token of the round `info` (a ``RendezvousInfo``) describes: rank 0's agent makes it, the others wait for it
    in the round's store (a store of that round only, so never a past round's token)."""
    if info.rank == 0:
        info.store.set(_KEY, uuid.uuid4().hex)
    return bytes(info.store.get(_KEY)).decode()


def _tagged(handler: Any) -> Any:
    """`handler` (a rendezvous handler) setting ``TRAINWRIGHT_ATTEMPT`` after each round it joins, when its rounds have
    stores of their own (torchrun's dynamic rendezvous: c10d, etcd-v2); any other handler as it is."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    if not isinstance(handler, DynamicRendezvousHandler):
        return handler
    join = handler.next_rendezvous

    def next_rendezvous() -> Any:
        info = join()
        os.environ[ATTEMPT_VARIABLE] = agree_on_token(info)
        return info

    handler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]
    return handler


@contextlib.contextmanager
def tokens_per_round() -> Iterator[None]:
    """Within the block, the rendezvous handlers torchrun's launcher makes tag each round (see `_tagged`)."""
    import torch.distributed.launcher.api as launcher

    registry: Any = getattr(launcher, "rdzv_registry", None)
    make = getattr(registry, "get_rendezvous_handler", None)
    if make is None:  # another torch's launcher: the workers fall back to torchrun's restart count
        yield
        return

    def tagged_handler(params: Any) -> Any:
        return _tagged(make(params))

    registry.get_rendezvous_handler = tagged_handler
    try:
        yield
    finally:
        registry.get_rendezvous_handler = make
        os.environ.pop(ATTEMPT_VARIABLE, None)
