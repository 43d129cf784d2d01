"""Each attempt of an elastic job builds its process group under a prefix of its own in torchrun's shared store.

Real stores (a TCPStore server in this process), no process group: the keys a dead attempt left must be out of a new
attempt's sight, and the agents of one rendezvous round must agree on the attempt's token.
"""

from __future__ import annotations

import types
from datetime import timedelta

import pytest
import torch.distributed as dist

from strategies.process_group import attempt_id, attempt_store
from trainer.cli.rounds import agree_on_token


@pytest.fixture
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    yield store
    del store


def _torchrun_env(monkeypatch, port: int, *, restart: str, token: str | None = None, agent_store: str = "True") -> None:
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                        "TORCHELASTIC_RESTART_COUNT": restart, "TORCHELASTIC_USE_AGENT_STORE": agent_store}.items():
        monkeypatch.setenv(name, value)
    if token is None:
        monkeypatch.delenv("TRAINWRIGHT_ATTEMPT", raising=False)
    else:
        monkeypatch.setenv("TRAINWRIGHT_ATTEMPT", token)


def test_a_restarted_attempt_does_not_see_the_dead_attempts_keys(monkeypatch, server):
    _torchrun_env(monkeypatch, server.port, restart="0")
    attempt_store(5).set("0//rank_0", "the dead attempt's address")
    assert server.check(["trainwright/attempt/0/0//rank_0"])
    _torchrun_env(monkeypatch, server.port, restart="1")
    assert not attempt_store(5).check(["0//rank_0"])  # torch's own keys would have been the same on every attempt
    _torchrun_env(monkeypatch, server.port, restart="1", token="abc")  # trainer launch's token comes first
    assert attempt_id() == "abc"
    attempt_store(5).set("k", "v")
    assert server.check(["trainwright/attempt/abc/k"])


def test_without_the_agents_store_torch_builds_the_group_as_it_does(monkeypatch, server):
    _torchrun_env(monkeypatch, server.port, restart="1", agent_store="False")  # rank 0 serves a new store every attempt
    assert attempt_store(5) is None
    for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "TRAINWRIGHT_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    assert attempt_id() is None and attempt_store(5) is None  # not under torchrun


def test_the_agents_of_a_round_agree_on_a_token_of_that_round(server):
    def info(rank: int, round_: int) -> types.SimpleNamespace:  # what a RendezvousInfo gives: the round's own store
        return types.SimpleNamespace(rank=rank, store=dist.PrefixStore(f"torch.rendezvous.run.{round_}", server))

    first = [agree_on_token(info(0, 1)), agree_on_token(info(1, 1)), agree_on_token(info(2, 1))]
    assert len(set(first)) == 1
    second = [agree_on_token(info(0, 2)), agree_on_token(info(1, 2))]
    assert len(set(second)) == 1 and second[0] != first[0]
