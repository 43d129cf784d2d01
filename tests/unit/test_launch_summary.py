"""The first line of `trainer launch`'s failure summary names the rank that caused the failure, what happened to it and
what to do, from the agent's failure records and the waiting ranks' reports (``strategies.process_group``); no processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

from strategies.process_group import _exited
from trainer.cli.launch import describe_failure


def _failure(rank: int, exitcode: int) -> Any:
    return SimpleNamespace(exitcode=exitcode, pid=4000 + rank, local_rank=rank, error_file="<N/A>", message="", timestamp=0)


def _report(*, alive: list[int], gone: list[int], timed_out: bool) -> dict[str, Any]:
    return {"waiting": 0, "missing": [1], "alive": alive, "gone": gone, "remote": [], "timeout": 300.0, "timed_out": timed_out}


def test_a_rank_killed_while_the_others_wait_is_named_with_its_signal_not_as_hung() -> None:
    # kill -9 of rank 1 mid-training: rank 0's all-reduce fails ("Connection closed by peer") and it reports rank 1 as
    # missing and already exited; before, the summary said rank 1 "never reached the collective" and the job exited 1
    error = SimpleNamespace(failures={0: _failure(0, 1), 1: _failure(1, -9)})
    code, message = describe_failure(error, hung=[_report(alive=[], gone=[1], timed_out=False)])
    lines = message.splitlines()
    assert lines[0].startswith("trainer launch: rank 1 (local rank 1, pid 4001) was killed by SIGKILL, often the out-of-memory killer")
    assert lines[1].startswith("  what to do: look for 'Out of memory: Killed process <pid>' in `dmesg`")
    assert "never reached" not in message and "also failed: rank 0 (failed with exit code 1)" in message
    assert code == 137  # 128 + SIGKILL, as a shell reports it


def test_a_rank_that_raised_while_the_others_wait_is_the_cause() -> None:
    error = SimpleNamespace(failures={0: _failure(0, -15), 1: _failure(1, 3)})
    code, message = describe_failure(error, hung=[_report(alive=[], gone=[1], timed_out=False)])
    assert message.startswith("trainer launch: rank 1 (local rank 1, pid 4001) failed with exit code 3; rank 0 failed in the collective")
    assert "what to do: see the traceback of the failing rank above" in message and code == 3


def test_a_rank_alive_and_hung_is_still_reported_as_hung() -> None:
    error = SimpleNamespace(failures={0: _failure(0, 1), 1: _failure(1, -15)})  # the agent stopped rank 1 after rank 0 failed
    code, message = describe_failure(error, hung=[_report(alive=[1], gone=[], timed_out=True)])
    assert message.startswith("trainer launch: rank 1 (pid 4001) never reached the collective rank 0 waited in for 300 s")
    assert code == 1


def test_a_killed_rank_without_a_report_is_named_with_its_signal() -> None:
    error = SimpleNamespace(failures={0: _failure(0, -15), 1: _failure(1, -9)})
    code, message = describe_failure(error)
    assert message.startswith("trainer launch: rank 1 (local rank 1, pid 4001) was killed by SIGKILL, often the out-of-memory killer")
    assert code == 137


def test_an_unreaped_process_counts_as_exited() -> None:
    # a rank killed a moment ago is a zombie until the agent reaps it; a signal still reaches it, so os.kill called it alive
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _exited(child.pid):
            time.sleep(0.05)
        assert _exited(child.pid)
    finally:
        child.wait()
    assert _exited(child.pid)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _exited(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_collective_called_on_one_rank_only_fails_at_once_and_says_so() -> None:
    # rank 1 ended (exit 0, so not a failure) without the collective rank 0 called: rank 0 failed at once ("Connection
    # reset by peer"); before, the summary said rank 0 "waited in for 6 s (the process-group timeout)"
    error = SimpleNamespace(failures={0: _failure(0, 1)})
    code, message = describe_failure(error, hung=[_report(alive=[], gone=[1], timed_out=False)])
    lines = message.splitlines()
    assert lines[0] == "trainer launch: rank 1 had ended when rank 0 called a collective, which failed at once: a collective called on some ranks only?"
    assert lines[1].startswith("  what to do: call each collective (reduce, gather, wait_for_everyone, ...) on every rank")
    assert "waited in for" not in message and "PG_TIMEOUT" not in message
    assert code == 1


def test_gloos_raw_text_is_shortened_under_the_report() -> None:
    import torch.utils._pytree as pytree

    from strategies.process_group import _shortened

    def fail(_: Any) -> None:
        raise RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:6560: "
                           "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.")

    try:
        pytree.tree_map(fail, [1])  # a frame of torch's own between this test and the error, as in dist.all_reduce
    except RuntimeError as err:
        error, tb = err, err.__traceback__
    short = _shortened(error, tb)
    assert error.__traceback__ is short  # Python's default hook prints the error's own traceback
    assert str(error) == "gloo: Read error [127.0.0.1]:6560: Connection reset by peer (what it means: the trainwright line above)"
    files = []
    while short is not None:
        files.append(short.tb_frame.f_code.co_filename)
        short = short.tb_next
    assert files and all("torch" + os.sep not in f for f in files) and files[-1] == __file__
