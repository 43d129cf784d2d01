"""`LaunchSettings`: everything ``trainer launch`` needs to start a job, checked; the keys of a config file
(`trainer.cli.config` reads and writes the file, `trainer.cli.accelerate_config` reads Accelerate's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

MIXED_PRECISION_ALIASES = {
    "no": "no",
    "32": "no",
    "32-true": "no",
    "fp32": "no",
    "fp16": "fp16",
    "16": "fp16",
    "16-mixed": "fp16",
    "bf16": "bf16",
    "bf16-mixed": "bf16",
    # true precision (strategies.precision holds the same names; a unit test keeps them in step)
    "bf16-true": "bf16-true",
    "fp16-true": "fp16-true",
    "16-true": "fp16-true",
    "fp64-true": "fp64-true",
    "64-true": "fp64-true",
    "64": "fp64-true",
    "fp64": "fp64-true",
    "double": "fp64-true",
}
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")


@dataclass
class LaunchSettings:
    """Everything ``trainer launch`` needs to start a job; the keys of the config file.

    Attributes:
        num_processes: processes in total, over all machines (``None``: one per GPU, or 1 without GPUs).
        num_machines: machines (nodes) taking part.
        machine_rank: this machine's rank, ``0 <= machine_rank < num_machines``.
        main_process_ip: address of machine 0 (``None``: ``127.0.0.1``).
        main_process_port: port on machine 0 (``None``/``0``: a free port on one machine, 29500 on several).
        rdzv_backend: torchrun rendezvous backend: ``static``, ``c10d``, ``etcd`` or ``etcd-v2``.
        rdzv_join_timeout: seconds to wait for every machine to join before failing.
        max_restarts: times torchrun restarts the worker group after a failure.
        min_machines: elastic training: the fewest machines the job runs on (``None``: ``num_machines``). With
            ``max_machines`` it becomes torchrun's ``--nnodes MIN:MAX``; it needs a ``c10d`` or ``etcd`` rendezvous.
            After a machine is lost, torchrun restarts the survivors (``max_restarts``) once at least this many
            machines joined again; ``fit(ckpt_path="last")`` or ``load_state`` then resumes on the new number of
            processes (docs/elastic.md).
        max_machines: elastic training: the most machines the job runs on (``None``: ``num_machines``).
        monitor_interval: seconds between the elastic agent's looks at its workers (Accelerate's ``--monitor_interval``).
        rdzv_conf: more rendezvous settings for torchrun's ``--rdzv-conf``, ``key=value`` pairs separated by commas
            (Accelerate's ``--rdzv_conf``), e.g. ``last_call_timeout=10``; the join timeout is ``rdzv_join_timeout``.
        mixed_precision: ``no``, ``fp16``, ``bf16``, or true precision ``bf16-true``, ``fp16-true``, ``fp64-true``.
        strategy: strategy name (``auto``, ``single``, ``ddp``, ...).
        cpu: run on CPU even where GPUs exist.
        gradient_accumulation_steps: default gradient accumulation steps.
        process_group_timeout: process-group timeout in seconds (``None``: 300).
        gpu_ids: GPUs to use, e.g. ``"0,1"`` (``None``/``"all"``: all of them).
        deepspeed_plugin: `DeepSpeedPlugin` arguments for ``strategy: deepspeed`` (``zero_stage``,
            ``offload_optimizer_device``, ``gradient_clipping``, ``hf_ds_config`` (a DeepSpeed JSON file), ...);
            config files only.
        fsdp_plugin: `FullyShardedDataParallelPlugin` arguments for ``strategy: fsdp`` (an Accelerate config's
            ``fsdp_config``); config files only.
        dynamo_plugin: `TorchDynamoPlugin` arguments (an Accelerate config's ``dynamo_config``): the Accelerator
            compiles prepared models so; config files only.
    """

    num_processes: int | None = None
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    rdzv_join_timeout: int = 600
    max_restarts: int = 0
    min_machines: int | None = None
    max_machines: int | None = None
    monitor_interval: float = 0.1
    rdzv_conf: str | None = None
    mixed_precision: str = "no"
    strategy: str = "auto"
    cpu: bool = False
    gradient_accumulation_steps: int = 1
    process_group_timeout: float | None = None
    gpu_ids: str | None = None
    deepspeed_plugin: dict[str, Any] | None = None
    fsdp_plugin: dict[str, Any] | None = None
    dynamo_plugin: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every value; raise `ValueError` naming the bad one and the fix."""
        _check_int(self, "num_processes", minimum=1, optional=True)
        _check_int(self, "num_machines", minimum=1)
        _check_int(self, "machine_rank", minimum=0)
        _check_int(self, "main_process_port", minimum=0, optional=True)
        _check_int(self, "rdzv_join_timeout", minimum=1)
        _check_int(self, "max_restarts", minimum=0)
        _check_int(self, "min_machines", minimum=1, optional=True)
        _check_int(self, "max_machines", minimum=1, optional=True)
        self._check_elastic()
        _check_int(self, "gradient_accumulation_steps", minimum=1)
        if self.machine_rank >= self.num_machines:
            raise ValueError(
                f"machine_rank={self.machine_rank} must be smaller than num_machines={self.num_machines}; "
                f"number the machines 0..{self.num_machines - 1}"
            )
        if self.main_process_port is not None and self.main_process_port > 65535:
            raise ValueError(f"main_process_port={self.main_process_port} is not a port; use 1..65535, or 0 for a free port")
        if self.num_processes is not None and self.num_processes % self.num_machines:
            raise ValueError(
                f"num_processes={self.num_processes} (the total over all machines) is not divisible by "
                f"num_machines={self.num_machines}; give every machine the same number of processes"
            )
        mp = str(self.mixed_precision).lower()
        if mp not in MIXED_PRECISION_ALIASES:
            raise ValueError(
                f"mixed_precision={self.mixed_precision!r} is not supported; choose one of 'no', 'fp16', 'bf16', 'fp16-true', "
                "'bf16-true', 'fp64-true' (or '32', '16-mixed', 'bf16-mixed', '16-true', '64-true', 'double')"
            )
        self.mixed_precision = MIXED_PRECISION_ALIASES[mp]
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise ValueError(
                f"rdzv_backend={self.rdzv_backend!r} is not supported; choose one of {', '.join(RDZV_BACKENDS)}"
            )
        if not isinstance(self.cpu, bool):
            raise ValueError(f"cpu={self.cpu!r} must be true or false")
        if not isinstance(self.strategy, str) or not self.strategy:
            raise ValueError(f"strategy={self.strategy!r} must be a strategy name such as 'auto', 'ddp' or 'single'")
        # lazy: the CLI imports no torch (trainer.accelerator does)
        from trainer.accelerator.config import DeepSpeedPlugin, FullyShardedDataParallelPlugin, TorchDynamoPlugin

        _check_plugin("deepspeed_plugin", self.deepspeed_plugin, DeepSpeedPlugin, "e.g. {zero_stage: 3}")
        plugin = _check_plugin("fsdp_plugin", self.fsdp_plugin, FullyShardedDataParallelPlugin, "e.g. {fsdp_version: 2}")
        if plugin is not None:
            plugin.strategy_kwargs()  # its own checks of the values
        _check_plugin("dynamo_plugin", self.dynamo_plugin, TorchDynamoPlugin, "e.g. {backend: inductor}")
        if self.process_group_timeout is not None:
            if isinstance(self.process_group_timeout, bool) or not isinstance(self.process_group_timeout, (int, float)):
                raise ValueError(
                    f"process_group_timeout={self.process_group_timeout!r} must be a number of seconds, e.g. 300"
                )
            if self.process_group_timeout <= 0:
                raise ValueError(f"process_group_timeout={self.process_group_timeout!r} must be positive, e.g. 300")

    def machine_range(self) -> tuple[int, int]:
        """``(fewest, most)`` machines the job runs on (both ``num_machines`` unless elastic)."""
        return (self.min_machines or self.num_machines, self.max_machines or self.num_machines)

    def _check_elastic(self) -> None:
        low, high = self.machine_range()
        if not low <= self.num_machines <= high:
            raise ValueError(
                f"min_machines={low}, num_machines={self.num_machines}, max_machines={high}: the job starts on num_machines "
                "machines and may shrink to min_machines or grow to max_machines; give min_machines <= num_machines <= max_machines"
            )
        if low != high and self.rdzv_backend == "static":
            raise ValueError(
                f"min_machines={low} and max_machines={high} (elastic) need a rendezvous that machines can leave and join: "
                "pass --rdzv_backend c10d (or etcd), not static"
            )
        interval = self.monitor_interval
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval < float("inf"):
            raise ValueError(f"monitor_interval={interval!r} must be a number of seconds > 0, e.g. 0.1")
        if self.rdzv_conf is not None:
            pairs = [pair.partition("=") for pair in str(self.rdzv_conf).split(",") if pair.strip()]
            bad = [key + sep + value for key, sep, value in pairs if not (key.strip() and sep and value.strip())]
            if not isinstance(self.rdzv_conf, str) or bad:
                raise ValueError(f"rdzv_conf={self.rdzv_conf!r} must be key=value pairs separated by commas, e.g. 'last_call_timeout=10'")
            if any(key.strip() in ("join_timeout", "timeout") for key, _, _ in pairs):
                raise ValueError(f"rdzv_conf={self.rdzv_conf!r} sets the join timeout; pass it as --rdzv_join_timeout instead")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict, in field order (what the config file holds)."""
        return dataclasses.asdict(self)

    def updated(self, **changes: Any) -> LaunchSettings:
        """A copy with ``changes`` applied (and validated); unknown names raise `ValueError`."""
        unknown = sorted(set(changes) - set(setting_names()))
        if unknown:
            raise ValueError(f"unknown launch setting(s) {unknown}; valid settings are {setting_names()}")
        return dataclasses.replace(self, **changes)


def _check_int(settings: LaunchSettings, name: str, *, minimum: int, optional: bool = False) -> None:
    value = getattr(settings, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def setting_names() -> list[str]:
    """The valid keys of a Trainwright config file."""
    return [f.name for f in fields(LaunchSettings)]


def _check_plugin(name: str, value: Any, plugin: type, example: str) -> Any:
    """A plugin section of a launch config (a mapping of the plugin's fields) built once, so its own checks run now."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name}={value!r} must be a mapping of {plugin.__name__} arguments, {example}")
    known = [f.name for f in fields(plugin)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{name} has unknown key(s) {unknown}; known: {known}")
    return plugin(**value)
