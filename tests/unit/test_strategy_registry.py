"""The strategy registry: one entry per name, and every question about a name is answered by it."""

from typing import Any

import pytest

import strategies
from strategies import REGISTRY, STRATEGIES, StrategyEntry, register_strategy, resolve_auto, resolve_strategy
from strategies.environment import detect_environment
from trainer.accelerator.config import DistributedType
from trainer.accelerator.layout import distributed_type
from trainer.cli.accelerate_config import _DISTRIBUTED_TYPES
from trainer.cli.launch import check_strategy_name
from trainer.fit import args as trainer_args

# Lightning's DDP names: the find_unused_parameters presets, and "ddp_spawn"/"ddp_notebook" (run as "ddp", see below)
LIGHTNING_DDP = {"ddp_find_unused_parameters_true", "ddp_find_unused_parameters_false", "ddp_spawn", "ddp_notebook"}
NAMES = {"auto", "single", "single_device", "ddp", "fsdp", "fsdp2", "fsdp1", "deepspeed", "deepspeed_stage_1", "deepspeed_stage_2",
         "deepspeed_stage_2_offload", "deepspeed_stage_3", "deepspeed_stage_3_offload", "xla", "tpu", *LIGHTNING_DDP}
LAUNCHABLE = {"auto", "ddp", "fsdp", "fsdp2", "deepspeed", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload",
              "deepspeed_stage_3", "deepspeed_stage_3_offload", *LIGHTNING_DDP}


def test_every_name_has_one_entry_and_aliases_share_it() -> None:
    assert set(REGISTRY) == set(STRATEGIES) == NAMES
    assert {name for name, entry in REGISTRY.items() if entry.launchable} == LAUNCHABLE
    assert REGISTRY["fsdp2"] is REGISTRY["fsdp"] and REGISTRY["tpu"] is REGISTRY["xla"] and REGISTRY["single_device"] is REGISTRY["single"]
    assert REGISTRY["ddp_spawn"] is REGISTRY["ddp_notebook"] is REGISTRY["ddp_find_unused_parameters_false"] is REGISTRY["ddp"]
    for name, entry in REGISTRY.items():
        assert STRATEGIES[name] is entry.build
        if isinstance(entry.build, type):  # a strategy class: its `name` is the entry's, which `distributed_type` looks up
            assert entry.build.name == entry.name


@pytest.mark.parametrize(("name", "distributed", "xla", "runs_as"), [
    ("auto", False, False, "single"),
    ("auto", True, False, "ddp"),
    ("auto", True, True, "xla"),
    ("auto", False, True, "xla"),
    ("fsdp", True, False, "fsdp"),
    ("single", True, True, "single"),
])
def test_resolve_auto(name: str, distributed: bool, xla: bool, runs_as: str) -> None:
    assert resolve_auto(name, distributed=distributed, xla=xla) == runs_as


def test_auto_builds_what_resolve_auto_names() -> None:
    two = detect_environment({"RANK": "0", "WORLD_SIZE": "2"})
    assert type(resolve_strategy("auto", cluster=two, cpu=True)) is REGISTRY["ddp"].build
    assert type(resolve_strategy("auto", cpu=True)) is REGISTRY["single"].build


def test_fit_launches_ddp_for_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_args, "can_rerun_current_script", lambda: True)  # as from `python script.py`
    launched: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr(trainer_args, "launch_current_script", lambda n, **settings: launched.append((n, settings)))
    for strategy, runs_as in (("auto", "ddp"), ("fsdp2", "fsdp2"), (strategies.DDPStrategy.__new__(strategies.DDPStrategy), "ddp")):
        args = trainer_args.check_arguments(**_trainer_defaults(strategy=strategy, devices=2))
        assert args.launch_processes
        trainer_args.launch_processes(args)
        assert launched.pop() == (2, {"strategy": runs_as, "cpu": True})
    for strategy in ("single", "xla"):
        assert not trainer_args._needs_launch(strategy, 2)


def test_distributed_type_reads_the_entry() -> None:
    single = resolve_strategy("single", cpu=True)
    assert distributed_type(single) is DistributedType.NO
    for name, kind in (("fsdp", "FSDP"), ("deepspeed", "DEEPSPEED"), ("xla", "XLA")):
        assert REGISTRY[name].distributed_type == kind and DistributedType(kind).value == kind


def test_accelerate_config_names_registry_strategies() -> None:
    """The CLI reads Accelerate configs without importing torch, so its table is its own; it must agree with the registry."""
    for kind, (strategy, _cpu) in _DISTRIBUTED_TYPES.items():
        entry = REGISTRY[strategy]
        assert entry.distributed_type in (None, kind), (kind, strategy)
    declared = {entry.distributed_type for entry in REGISTRY.values()} - {None, "XLA"}  # Accelerate's TPU configs are refused
    assert declared <= set(_DISTRIBUTED_TYPES)


def test_cli_checks_names_against_the_registry() -> None:
    assert check_strategy_name("TPU") == "xla" and check_strategy_name("fsdp2") == "fsdp"
    with pytest.raises(ValueError, match="strategy='dpp' is not known; choose one of auto, ddp"):
        check_strategy_name("dpp")


def test_register_strategy() -> None:
    entry = StrategyEntry("mine", strategies.SingleDeviceStrategy, aliases=("my_alias",), launchable=True)
    register_strategy(entry)
    try:
        assert isinstance(resolve_strategy("MY_ALIAS", cpu=True), strategies.SingleDeviceStrategy)
        assert STRATEGIES["mine"] is strategies.SingleDeviceStrategy and REGISTRY["my_alias"] is entry
        with pytest.raises(ValueError, match=r"strategy name\(s\) \['ddp'\] are registered already"):
            register_strategy(StrategyEntry("ddp", strategies.DDPStrategy))
    finally:
        del REGISTRY["mine"], REGISTRY["my_alias"]
    with pytest.raises(TypeError):
        STRATEGIES["mine"] = strategies.SingleDeviceStrategy  # type: ignore[index]


def _trainer_defaults(**given: Any) -> dict[str, Any]:
    import inspect

    from trainer import Trainer

    kw = {name: p.default for name, p in inspect.signature(Trainer.__init__).parameters.items() if name != "self"}
    return {**kw, "accelerator": "cpu", "logger": False, **given}


@pytest.mark.parametrize(("name", "find_unused"), [
    ("ddp_find_unused_parameters_true", True), ("ddp_find_unused_parameters_false", False), ("ddp_spawn", False),
    ("ddp_notebook", False),
])
def test_lightnings_ddp_names(name: str, find_unused: bool) -> None:
    one = detect_environment({})
    strategy = resolve_strategy(name.upper(), cluster=one, cpu=True)
    assert isinstance(strategy, strategies.DDPStrategy) and strategy.name == "ddp"
    assert strategy.ddp_kwargs["find_unused_parameters"] is find_unused
    assert check_strategy_name(name) == REGISTRY[name].name


def test_a_launch_from_a_notebook_names_notebook_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's "ddp_notebook" forks the kernel; here `fit` re-runs the script, so a notebook gets `notebook_launcher`."""
    monkeypatch.setattr(trainer_args, "can_rerun_current_script", lambda: False)
    with pytest.raises(RuntimeError, match=r"strategy='ddp_notebook', devices=2.*notebook_launcher\(train, num_processes=2\)"):
        trainer_args.check_arguments(**_trainer_defaults(strategy="ddp_notebook", devices=2))
    assert not trainer_args.check_arguments(**_trainer_defaults(strategy="ddp_notebook", devices=1)).launch_processes
    monkeypatch.setattr(trainer_args, "can_rerun_current_script", lambda: True)  # as from `python script.py`
    assert trainer_args.check_arguments(**_trainer_defaults(strategy="ddp_spawn", devices=2)).launch_processes
