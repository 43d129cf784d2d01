import importlib.util

import pytest

import strategies
from strategies.environment import detect_environment, process_group_timeout


def test_no_environment_is_single_process():
    env = detect_environment({})
    assert env.world_size == 1 and not env.is_distributed and env.source == "none"


def test_torchrun_variables():
    env = detect_environment({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                              "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert (env.world_size, env.rank, env.local_rank, env.local_world_size, env.master_port, env.source) == (4, 1, 1, 2, 1234, "torchrun")


RAY_WORKER = {"RAY_RAYLET_PID": "123", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
              "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "4321", "ACCELERATE_TORCH_DEVICE": "cuda:1"}  # what Ray Train sets


def test_a_ray_train_worker_is_its_own_environment():
    env = detect_environment(RAY_WORKER)
    assert (env.source, env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank, env.device) == (
        "ray", 3, 4, 1, 2, 1, "cuda:1")
    assert env.several_machines and env.master_addr == "10.0.0.2"
    # torchrun started inside a Ray task is torchrun's (GROUP_RANK, its elastic run id)
    assert detect_environment({**RAY_WORKER, "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "x"}).source == "torchrun"
    assert detect_environment({k: v for k, v in RAY_WORKER.items() if k != "RAY_RAYLET_PID"}).source == "torchrun"


def test_the_device_ray_assigned_is_the_strategys():
    from strategies.base import best_device

    assert str(best_device(local_rank=0, assigned="cpu")) == "cpu"
    assert str(best_device(local_rank=0, assigned="cuda:3")) == "cuda:3"  # Ray's choice, not the local rank's
    assert str(best_device(cpu=True, local_rank=0, assigned="cuda:3")) == "cpu"


def test_our_launcher_is_named():
    env = detect_environment({"RANK": "0", "WORLD_SIZE": "2", "TRAINWRIGHT_LAUNCHED": "1"})
    assert env.source == "trainwright" and env.world_size == 2


def test_slurm():
    env = detect_environment({"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
                              "SLURM_NTASKS_PER_NODE": "4", "SLURM_NODELIST": "gpu[07-08]", "SLURM_JOB_NAME": "train"})
    assert (env.world_size, env.rank, env.local_rank, env.node_rank, env.master_addr, env.source) == (8, 5, 1, 2, "gpu07", "slurm")


def test_openmpi_and_pmi():
    ompi = detect_environment({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    assert (ompi.world_size, ompi.rank, ompi.source) == (2, 1, "openmpi")
    pmi = detect_environment({"PMI_SIZE": "3", "PMI_RANK": "2"})
    assert (pmi.world_size, pmi.rank, pmi.source) == (3, 2, "pmi")


def test_bad_integer_is_named():
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        detect_environment({"RANK": "0", "WORLD_SIZE": "two"})


def test_single_strategy_refuses_a_distributed_environment():
    cluster = detect_environment({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(RuntimeError, match="cannot run the 2 processes"):
        strategies.resolve_strategy("single", cluster=cluster, cpu=True)


def test_auto_picks_ddp_when_distributed():
    cluster = detect_environment({"RANK": "0", "WORLD_SIZE": "2"})
    assert isinstance(strategies.resolve_strategy("auto", cluster=cluster, cpu=True), strategies.DDPStrategy)
    assert isinstance(strategies.resolve_strategy("auto", cpu=True), strategies.SingleDeviceStrategy)


def test_unknown_and_unavailable_strategies():
    with pytest.raises(ValueError, match="strategy='dpp' is not known"):
        strategies.resolve_strategy("dpp")
    with pytest.raises(NotImplementedError, match="FSDP1"):
        strategies.resolve_strategy("fsdp1")


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="checks the error of a machine without torch_xla")
def test_xla_without_torch_xla_names_the_fix(monkeypatch):
    """torch_xla is not installed here (it needs its own torch build): every way of asking for XLA says what to install."""
    from strategies.xla import xla_device_present
    from trainer import Accelerator, Trainer

    for name in ("xla", "tpu"):
        with pytest.raises(ImportError, match=r"strategy='xla' needs torch_xla built for torch .*torch_xla\[tpu\]"):
            strategies.resolve_strategy(name)
    with pytest.raises(ImportError, match=r"needs torch_xla"):
        Accelerator(strategy="xla")
    with pytest.raises(ImportError, match=r"needs torch_xla"):
        Trainer(accelerator="tpu", logger=False)
    with pytest.raises(ValueError, match=r"accelerator='tpu' runs strategy='xla', but strategy='ddp' was passed"):
        Trainer(accelerator="tpu", strategy="ddp", logger=False)
    # "auto" picks XLA only when a device is announced *and* torch_xla is importable
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert not xla_device_present()
    assert isinstance(strategies.resolve_strategy("auto", cpu=True), strategies.SingleDeviceStrategy)
    assert xla_device_present({}) is False


def test_xla_cpu_runtime_refuses_several_processes_before_any_starts(monkeypatch):
    """torch_xla's CPU runtime cannot meet across processes (tests/xla runs the real refusals on it)."""
    from strategies.xla import check_xla_processes
    from trainer.cli.config import LaunchSettings
    from trainer.cli.launch import run_xla

    for ok in ((1, "CPU"), (None, "CPU"), (8, "TPU"), (2, None)):
        check_xla_processes(*ok)
    with pytest.raises(ValueError, match=r"runs one process, but 2 were asked for.*pytorch/xla#9496.*strategy='ddp'"):
        check_xla_processes(2, "cpu")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    with pytest.raises(ValueError, match=r"runs one process, but 2 were asked for"):  # before torch_xla is imported
        run_xla(LaunchSettings(num_processes=2, strategy="xla"), "train.py")


def test_distributed_type_keeps_accelerates_tpu_alias():
    from trainer.utils import DistributedType

    assert DistributedType.TPU is DistributedType.XLA and DistributedType("XLA") is DistributedType.TPU


def test_timeout(monkeypatch):
    assert process_group_timeout() == 300
    monkeypatch.setenv("TRAINWRIGHT_PG_TIMEOUT", "12")
    assert process_group_timeout() == 12
    assert process_group_timeout(5) == 5
    with pytest.raises(ValueError, match="positive"):
        process_group_timeout(0)
