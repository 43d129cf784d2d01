"""Replica groups on torchft: the settings, their checks, and how a step's global batch is dealt to the live groups.

A job of N replica groups (each its own torchrun job of P processes) keeps training while a group is down: torchft's
lighthouse forms a quorum of the live groups for each step, the groups average their gradients through torchft's
``Manager``, and a group that comes back heals from a live one. Trainwright keeps the data exact through it: the global
batch G stays constant and each committed step's G is dealt to the live groups' processes as one job of ``live * P``
processes would deal it (`replica_shard`), from the same global order, so every committed step trains on the samples an
uninterrupted run trained on at that step (torchft's own sampler gives each group a fixed shard, and a dead group's
shard goes untrained).

What is built: the settings (`FaultTolerance`), their checks against the launch (`check_replica_groups`,
`check_global_batch`), the deal (`replica_shard`) and torchft's import (`import_torchft`). Training across replica
groups in the step path is not built yet: ``DDPStrategy(fault_tolerance=...)`` checks its inputs and then says so
(`not_built`); docs/fault-tolerance.md says what works today (restart-based elastic training).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

EXTRA = "fault-tolerance"  # setup.cfg's extra that installs torchft


@dataclasses.dataclass(frozen=True)
class FaultTolerance:
    """Train across torchft replica groups, going on while a group is down.

    Args:
        min_replica_groups: the fewest live groups a step commits with (torchft's ``min_replica_size``); a step with
            fewer waits for a group to come back.
        lighthouse: ``HOST:PORT`` of torchft's lighthouse (default: ``TORCHFT_LIGHTHOUSE``, which ``trainer launch``
            sets).
        timeout: seconds a collective, a commit or a healing transfer may take before the step fails and is retried.
        quorum_timeout: seconds to wait for a quorum of at least ``min_replica_groups`` groups.
    """

    min_replica_groups: int = 1
    lighthouse: str | None = None
    timeout: float = 60.0
    quorum_timeout: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.min_replica_groups, bool) or not isinstance(self.min_replica_groups, int) or self.min_replica_groups < 1:
            raise ValueError(f"FaultTolerance(min_replica_groups={self.min_replica_groups!r}): give a whole number of groups, 1 or more")
        for name in ("timeout", "quorum_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"FaultTolerance({name}={value!r}): give a positive number of seconds")
        if self.lighthouse is not None:
            _check_address(self.lighthouse, "FaultTolerance(lighthouse=...)")


def _check_address(address: Any, what: str) -> None:
    host, _, port = str(address).rpartition(":")
    if not isinstance(address, str) or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what}={address!r}: give the lighthouse's address as 'HOST:PORT', e.g. 'localhost:29510'")


def import_torchft() -> Any:
    """torchft, imported; an `ImportError` naming the extra that installs it when it is missing."""
    try:
        import torchft
    except ImportError as error:
        raise ImportError(
            f"fault_tolerance=FaultTolerance(...) needs torchft, which is not installed: pip install 'trainwright[{EXTRA}]'"
        ) from error
    return torchft


def replica_groups_from_environment(environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """``(group, groups)``: this process's replica group and how many the job was launched with, from
    ``REPLICA_GROUP_ID`` / ``NUM_REPLICA_GROUPS`` (torchft's examples' names); None when neither is set."""
    env = os.environ if environ is None else environ
    group, groups = env.get("REPLICA_GROUP_ID"), env.get("NUM_REPLICA_GROUPS")
    if group is None and groups is None:
        return None
    if group is None or groups is None or not group.isdigit() or not groups.isdigit() or not int(group) < int(groups):
        raise ValueError(
            f"REPLICA_GROUP_ID={group!r} and NUM_REPLICA_GROUPS={groups!r}: a replica group's processes need both, "
            "0 <= REPLICA_GROUP_ID < NUM_REPLICA_GROUPS (trainer launch --replica_groups sets them)"
        )
    return int(group), int(groups)


def check_replica_groups(settings: FaultTolerance, groups: int) -> None:
    """A `ValueError` when the job was launched with fewer groups than ``settings.min_replica_groups``: no step
    could ever commit, and every group would wait for a quorum that cannot form."""
    if settings.min_replica_groups > groups:
        raise ValueError(
            f"FaultTolerance(min_replica_groups={settings.min_replica_groups}) but the job has {groups} replica group(s): "
            f"no step could commit; launch at least {settings.min_replica_groups} groups (trainer launch --replica_groups) "
            f"or lower min_replica_groups"
        )


def check_global_batch(global_batch: int, settings: FaultTolerance, groups: int, processes_per_group: int) -> None:
    """A `ValueError` unless every number of live groups a step can commit with (``min_replica_groups`` to
    ``groups``) deals the global batch evenly to its processes: an uneven deal would weigh samples unequally in the
    averaged gradient, and the step would no longer be the uninterrupted run's."""
    check_replica_groups(settings, groups)
    uneven = [live for live in range(settings.min_replica_groups, groups + 1) if global_batch % (live * processes_per_group)]
    if uneven:
        counts = ", ".join(str(live * processes_per_group) for live in uneven)
        whole = math.lcm(*(live * processes_per_group for live in range(settings.min_replica_groups, groups + 1)))
        raise ValueError(
            f"a global batch of {global_batch} samples cannot be dealt evenly to {counts} processes (the live groups' "
            f"processes when {', '.join(map(str, uneven))} of {groups} group(s) of {processes_per_group} are up); "
            f"use a multiple of {whole}, or raise min_replica_groups"
        )


def replica_shard(live_groups: list[int], group: int, processes_per_group: int, process_in_group: int) -> tuple[int, int]:
    """``(process_index, num_processes)``: where this process stands when a step's global batch is dealt to the live
    groups, as `strategies.sharding` deals a step to ``num_processes`` processes (process ``r`` takes positions
    ``[r * per_process, (r + 1) * per_process)`` of the step). Groups are taken in the order of their ids, so the
    live groups agree without talking; with every group live it is the deal of one job of ``groups * P`` processes.

    Two groups of two processes, a global batch of 8 (``[0..7]``)::

        both live:      group 0: [0,1] [2,3]    group 1: [4,5] [6,7]
        group 0 alone:  group 0: [0,1,2,3] [4,5,6,7]
    """
    if processes_per_group < 1 or not 0 <= process_in_group < processes_per_group:
        raise ValueError(f"process {process_in_group} of a group of {processes_per_group}: give 0 <= process < processes_per_group")
    live = sorted(set(live_groups))
    if group not in live:
        raise ValueError(f"replica group {group} is not among the live groups {live}: only a group in the quorum draws data")
    return live.index(group) * processes_per_group + process_in_group, len(live) * processes_per_group


def not_built(where: str) -> NotImplementedError:
    """The error for a replica-group entry point whose training path is not built yet."""
    return NotImplementedError(
        f"{where}(fault_tolerance=FaultTolerance(...)): training across torchft replica groups is not built yet (its "
        "settings, checks and data deal are: strategies.fault_tolerance). What recovers from a failure today is "
        "restart-based elastic training: trainer launch --max_restarts R (--min_machines/--max_machines for machines), "
        "with fit(ckpt_path='last') or Accelerator.load_state resuming on the same samples (docs/fault-tolerance.md)"
    )


def check_fault_tolerance(settings: Any, where: str) -> None:
    """What ``where(fault_tolerance=settings)`` checks, in order: the settings' type, the launch
    (``NUM_REPLICA_GROUPS`` against ``min_replica_groups``), torchft's presence; then, as training across replica
    groups is not built yet, a `NotImplementedError` saying what recovers from failures today."""
    if not isinstance(settings, FaultTolerance):
        raise TypeError(
            f"{where}(fault_tolerance={settings!r}): give a strategies.FaultTolerance(min_replica_groups=..., ...) or None"
        )
    launched = replica_groups_from_environment()
    if launched is not None:
        check_replica_groups(settings, launched[1])
    import_torchft()
    raise not_built(where)
