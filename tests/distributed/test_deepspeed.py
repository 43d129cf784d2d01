"""DeepSpeed ZeRO 1-3 on 2 real processes (gloo, CPU, ``DS_ACCELERATOR=cpu``), through both faces, against
single-process full-batch training; checkpoints through the engine, export of full weights, and the errors.

No C++ op is compiled: the strategy keeps DeepSpeed's CPU backend from building its inference-only shared-memory
all-reduce (`strategies.deepspeed.skip_inference_comm_op`), and torch optimizers are passed, so no Adam op is built.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.distributed.test_fsdp import GLOBAL_BATCH, STEPS, Net, _data, _max_diff, _net, _reference
from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(420),  # (not imported to collect: importing deepspeed takes seconds)
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                 reason="the deepspeed extra is not installed: pip install -e '.[deepspeed]'")]


def _accelerator_run(stage: int, clip: float | None = None, accumulate: int = 1, precision: str = "no", plugin: bool = False):
    from strategies import DeepSpeedStrategy
    from trainer import Accelerator
    from trainer.utils import DeepSpeedPlugin

    if plugin:  # as an Accelerate script configures it; the plugin's accumulation steps become the Accelerator's
        acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_clipping=clip, gradient_accumulation_steps=accumulate))
    else:
        strategy = DeepSpeedStrategy(cpu=True, zero_stage=stage, gradient_clipping=clip, precision=precision)
        acc = Accelerator(strategy=strategy, gradient_accumulation_steps=accumulate)
    x, y = _data()
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # built before prepare, as Accelerate scripts do
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // acc.num_processes // acc.gradient_accumulation_steps)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    norms, losses, lrs = [], [], []
    for xb, yb in loader:
        with acc.accumulate(model):
            loss = nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            losses.append(float(acc.reduce(loss.detach(), "mean")))
            if acc.sync_gradients and clip is not None:
                norms.append(float(acc.clip_grad_norm_(model.parameters(), clip)))
            opt.step()
            sched.step()
            opt.zero_grad()
            lrs.append(opt.param_groups[0]["lr"])
    state = acc.get_state_dict(model)
    from deepspeed.comm import comm

    out = {"state": {k: v.clone() for k, v in state.items()}, "norms": norms, "losses": losses, "lrs": lrs,
           "engine": type(model).__name__, "type": str(acc.distributed_type), "stage3": hasattr(next(model.parameters()), "ds_id"),
           "inference_op": comm.cdb.shm_comm_op is not None}
    acc.end_training()
    return out


def _val_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(7, 4, generator=g), torch.randn(7, 1, generator=g)


def _scheduled_reference(clip: float | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Single process, full global batches, StepLR(2, 0.5) stepped once per optimizer step (the engine's schedule)."""
    x, y = _data()
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    norms = []
    for i in range(0, len(x), GLOBAL_BATCH):
        nn.functional.mse_loss(model(x[i : i + GLOBAL_BATCH]), y[i : i + GLOBAL_BATCH]).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        sched.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def _reference_lrs(batches: int, accumulate: int) -> list[float]:
    """The learning rate after each batch under that schedule."""
    return [0.01 * 0.5 ** (((i + 1) // accumulate) // 2) for i in range(batches)]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_accelerator_deepspeed_stage_matches_single_process_with_clipping(stage: int) -> None:
    reference, ref_norms = _scheduled_reference(clip=0.5)
    out = run_distributed(_accelerator_run, stage, 0.5)
    assert out[0]["engine"] == "DeepSpeedEngine" and out[0]["type"] == "DistributedType.DEEPSPEED"
    assert out[0]["stage3"] is (stage == 3)  # stage 3 really partitions the parameters
    # the inference-only shared-memory all-reduce op was not compiled (a minute or more of gcc on first use)
    assert not out[0]["inference_op"] and not out[1]["inference_op"]
    for rank in (0, 1):  # full float32 weights on every rank
        assert _max_diff(out[rank]["state"], reference) <= 1e-5
        assert out[rank]["state"]["inp.weight"].dtype == torch.float32
    # the engine's clipping norm is the global one, the same as one process's over the full batch
    assert out[0]["norms"] == out[1]["norms"]
    assert max(abs(a - b) for a, b in zip(out[0]["norms"], ref_norms)) <= 1e-5
    assert out[0]["lrs"] == pytest.approx(_reference_lrs(len(out[0]["lrs"]), 1))


def test_accelerator_deepspeed_gradient_accumulation_matches_single_process() -> None:
    reference, _ = _scheduled_reference()
    out = run_distributed(_accelerator_run, 2, None, 2)
    assert _max_diff(out[0]["state"], reference) <= 1e-5
    assert out[0]["lrs"] == pytest.approx(_reference_lrs(len(out[0]["lrs"]), 2))


def test_accelerate_deepspeed_plugin_drives_the_strategy() -> None:
    reference, ref_norms = _scheduled_reference(clip=0.5)
    out = run_distributed(_accelerator_run, 3, 0.5, 2, "no", True)
    assert out[0]["stage3"] and out[0]["type"] == "DistributedType.DEEPSPEED"
    assert _max_diff(out[0]["state"], reference) <= 1e-5
    assert max(abs(a - b) for a, b in zip(out[0]["norms"], ref_norms)) <= 1e-5


def test_accelerator_deepspeed_bf16_is_close_by_loss_with_fp32_master_weights() -> None:
    fp32 = run_distributed(_accelerator_run, 3, None)
    bf16 = run_distributed(_accelerator_run, 3, None, 1, "bf16")
    assert bf16[0]["state"]["inp.weight"].dtype == torch.float32  # the consolidated weights are the fp32 masters
    assert bf16[0]["losses"] != fp32[0]["losses"]  # bf16 really ran
    assert max(abs(a - b) for a, b in zip(bf16[0]["losses"], fp32[0]["losses"])) <= 0.05 * max(fp32[0]["losses"])


def _trainer_run(strategy: str, tmp: str, accumulate: int, clip: float | None):
    from trainer import Trainer, TrainModule

    class Regressor(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            return nn.functional.mse_loss(self.net.out(self.net.blocks(self.net.inp(xb))), yb)  # submodules, not self(x)

        def validation_step(self, batch, batch_idx):
            xb, yb = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(xb), yb), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    x, y = _data()
    vx, vy = _val_data()
    trainer = Trainer(strategy=strategy, accelerator="cpu", max_epochs=1, default_root_dir=tmp, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, accumulate_grad_batches=accumulate, gradient_clip_val=clip,
                      val_check_interval=4)  # validation mid-epoch too: training resumes after it
    module = Regressor()
    # 7 validation samples, one per batch: one process runs 4 batches, the other 3 (stage 3 gathers the parameters once)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2 // accumulate), DataLoader(TensorDataset(vx, vy), batch_size=1))
    state = trainer.strategy.module_state_dict(module)
    return {"state": {k.removeprefix("net."): v.clone() for k, v in state.items()}, "global_step": trainer.global_step,
            "val_loss": float(trainer.callback_metrics["val_loss"]),
            "config": {k: trainer.strategy.engine.config[k] for k in ("gradient_accumulation_steps", "gradient_clipping")}}


@pytest.mark.parametrize("strategy", ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_trainer_deepspeed_matches_single_process_with_accumulation_and_clipping(strategy: str, tmp_path: Path) -> None:
    reference, _ = _reference(clip=0.5)
    out = run_distributed(_trainer_run, strategy, str(tmp_path), 2, 0.5)
    assert out[0]["config"] == {"gradient_accumulation_steps": 2, "gradient_clipping": 0.5}  # the Trainer's settings reached the engine
    assert out[0]["global_step"] == STEPS
    assert _max_diff(out[0]["state"], reference) <= 1e-5
    # every validation sample counted once, though the processes ran unequal batch counts
    model = Net()
    model.load_state_dict(reference)
    vx, vy = _val_data()
    expected = float(torch.stack([nn.functional.mse_loss(model(vx[i : i + 1]), vy[i : i + 1]) for i in range(len(vx))]).mean())
    assert out[0]["val_loss"] == out[1]["val_loss"] == pytest.approx(expected, abs=1e-5)


def _save_resume_export(root: str, stage: int, load: bool, export_weights: bool = True):
    """3 steps (or a load of them), save_state, 3 more steps; export the weights with save_model."""
    from strategies import DeepSpeedStrategy
    from trainer import Accelerator

    acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True, zero_stage=stage, export_weights=export_weights))
    x, y = _data()
    torch.manual_seed(5 if load else 0)  # a resumed run starts from other weights, which load_state replaces
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    batches = iter(loader)

    def steps(n: int) -> None:
        for _ in range(n):
            xb, yb = next(batches)
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            opt.step()
            opt.zero_grad()

    if load:
        acc.load_state(f"{root}/state")
        batches = iter(loader)  # the restored loader resumes after the batches already seen
    else:
        steps(3)
        acc.save_state(f"{root}/state")
    steps(3)
    final = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    acc.save_model(model, f"{root}/export{int(load)}")
    acc.end_training()
    return final


def _load_weights_only(root: str, stage: int):
    """Prepare the model alone (evaluation: an engine only at stage 3) and load the checkpoint's weights into it,
    as the Trainer does for ``test(ckpt_path=...)``."""
    from strategies import DeepSpeedStrategy
    from strategies.checkpoint_io import load_weights
    from trainer import Accelerator

    acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True, zero_stage=stage))
    torch.manual_seed(9)
    model = acc.prepare(Net())
    load_weights(Path(root) / "state", model, load_full=acc.strategy.load_module_state_dict)
    state = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    acc.end_training()
    return state


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_save_state_resumes_bitwise_and_exports_plain_weights(stage: int, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from strategies.checkpoint_io import read_manifest

    straight = run_distributed(_save_resume_export, str(tmp_path), stage, False)
    manifest = read_manifest(tmp_path / "state")
    names = set(manifest["files"])
    assert "model.safetensors" in names and manifest["world_size"] == 2
    assert {n for n in names if n.startswith("deepspeed/") and "optim_states" in n} == {
        f"deepspeed/state/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)
    }  # each rank's partition, hashed by the rank that wrote it
    weights_only = run_distributed(_load_weights_only, str(tmp_path), stage)
    assert _max_diff(weights_only[0], load_file(str(tmp_path / "state" / "model.safetensors"))) == 0.0
    resumed = run_distributed(_save_resume_export, str(tmp_path), stage, True)
    assert [k for k in straight[0] if not torch.equal(straight[0][k], resumed[0][k])] == []
    plain = Net()
    plain.load_state_dict(load_file(str(tmp_path / "export1" / "model.safetensors")))  # a plain model loads the export
    assert _max_diff(plain.state_dict(), resumed[0]) == 0.0


def _weights_alone_error(root: str) -> str:
    from strategies.checkpoint_io import load_weights

    try:
        load_weights(Path(root) / "state", Net())
    except FileNotFoundError as err:
        return str(err)
    return "loaded"


def _checked_loads(root: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], str]:
    """Load root/state twice on a fresh engine: with the engine's files hashed in the pass that parses them (the
    DeepSpeed classes they hold allowed), then as for files holding other objects (checked whole, then unpickled); then
    once more after process 0 flipped a byte in the middle of process 1's optimizer file. Returns both loads' weights
    and the last load's error."""
    from strategies import DeepSpeedStrategy
    from strategies import deepspeed as deepspeed_strategy
    from strategies.checkpoint_io import CheckpointError
    from trainer import Accelerator

    acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True, zero_stage=2, export_weights=False))
    net = Net()
    model, _ = acc.prepare(net, torch.optim.AdamW(net.parameters(), lr=0.01))
    state = Path(root) / "state"
    loaded = []
    allowed = deepspeed_strategy._saved_classes
    for classes in (allowed, list):
        deepspeed_strategy._saved_classes = classes  # (list: none allowed)
        try:
            acc.load_state(state)
        finally:
            deepspeed_strategy._saved_classes = allowed
        loaded.append({k: v.clone() for k, v in acc.get_state_dict(model).items()})
    acc.wait_for_everyone()
    if acc.is_main_process:
        damaged = state / "deepspeed/state/zero_pp_rank_1_mp_rank_00_optim_states.pt"
        data = bytearray(damaged.read_bytes())
        data[len(data) // 2] ^= 0xFF
        damaged.write_bytes(bytes(data))
    acc.wait_for_everyone()
    try:
        acc.load_state(state)
        error = "loaded"
    except CheckpointError as err:
        error = str(err)
    acc.end_training()
    return loaded[0], loaded[1], error


def test_deepspeed_checkpoint_without_exported_weights_hashes_the_engine_files_as_written_and_resumes(tmp_path: Path) -> None:
    import xxhash

    from strategies.checkpoint_io import read_manifest

    straight = run_distributed(_save_resume_export, str(tmp_path), 2, False, False)
    state = tmp_path / "state"
    files = read_manifest(state)["files"]
    assert "model.safetensors" not in files and not (state / "model.safetensors").exists()
    engine = {name for name in files if name.startswith("deepspeed/")}
    assert {f"deepspeed/state/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= engine
    assert "deepspeed/zero_to_fp32.py" in engine  # (copied by the engine itself: read back once to hash it)
    for name in engine:  # the digests of the bytes on disk, each computed while the engine wrote the file
        assert files[name]["digest"] == xxhash.xxh3_128((state / name).read_bytes()).hexdigest(), name
    resumed = run_distributed(_save_resume_export, str(tmp_path), 2, True, False)
    assert [k for k in straight[0] if not torch.equal(straight[0][k], resumed[0][k])] == []
    assert "export_weights=False" in _weights_alone_error(str(tmp_path))
    for in_pass, checked_whole, error in run_distributed(_checked_loads, str(tmp_path)):  # (every process)
        assert [k for k in in_pass if not torch.equal(in_pass[k], checked_whole[k])] == []
        assert "zero_pp_rank_1_mp_rank_00_optim_states.pt was modified" in error, error


def _bad_use(case: str):
    from strategies import DeepSpeedStrategy
    from trainer import Accelerator

    acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True))
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    try:
        if case == "separate":
            model = acc.prepare(model)
            acc.prepare(opt)
        elif case == "two_optimizers":
            acc.prepare(model, opt, torch.optim.SGD(model.parameters(), lr=0.1))
        elif case == "clip_mismatch":
            model, opt = acc.prepare(model, opt)
            acc.backward(model(torch.randn(2, 4)).sum())
            acc.clip_grad_norm_(model.parameters(), 1.0)
        elif case == "clip_value":
            model, opt = acc.prepare(model, opt)
            acc.clip_grad_value_(model.parameters(), 1.0)
    except ValueError as err:
        return str(err)
    finally:
        acc.end_training()
    return None


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("separate", r"pass both to the same prepare\(\) call"),
        ("two_optimizers", r"steps one optimizer, got 2"),
        ("clip_mismatch", r"gradient_clipping=0.0 .* clip_grad_norm_\(max_norm=1.0\) cannot apply; pass DeepSpeedStrategy\(gradient_clipping=1.0\)"),
        ("clip_value", r"not by value"),
    ],
)
def test_deepspeed_misuse_gets_a_clear_error(case: str, message: str) -> None:
    import re

    (got,) = run_distributed(_bad_use, case, nprocs=1)
    assert got is not None and re.search(message, got), got


def test_deepspeed_config_conflicts_and_auto_values(tmp_path: Path) -> None:
    from strategies import DeepSpeedStrategy, resolve_strategy

    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                               "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}}))
    strategy = DeepSpeedStrategy(cpu=True, config=str(cfg), gradient_clipping=1.0, precision="bf16")
    assert strategy.zero_stage == 3 and strategy.sharded
    assert strategy.agree_accumulation(4) == 4
    final = strategy.engine_config(batch_size=8)
    assert final["gradient_accumulation_steps"] == 4 and final["gradient_clipping"] == 1.0 and final["bf16"] == {"enabled": True}
    assert final["train_micro_batch_size_per_gpu"] == 8 and "train_batch_size" not in final
    # the config decides where the face kept its default; two different values are an error naming both
    assert DeepSpeedStrategy(cpu=True, config={"gradient_accumulation_steps": 3}).agree_accumulation(1) == 3
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps is 2 here but 3 in the DeepSpeed config"):
        DeepSpeedStrategy(cpu=True, config={"gradient_accumulation_steps": 3}).agree_accumulation(2)
    with pytest.raises(ValueError, match=r"zero_stage is 2 here but 3 in the DeepSpeed config"):
        DeepSpeedStrategy(cpu=True, zero_stage=2, config={"zero_optimization": {"stage": 3}})
    with pytest.raises(ValueError, match=r"gradient_clip_val is 2.0 but .* gradient_clipping=1.0"):
        DeepSpeedStrategy(cpu=True, gradient_clipping=1.0).agree_clipping(2.0)
    with pytest.raises(ValueError, match=r"mixed_precision is 'bf16' here but the DeepSpeed config enables 'fp16'"):
        DeepSpeedStrategy(cpu=True, precision="bf16", config={"fp16": {"enabled": True}})
    with pytest.raises(ValueError, match=r"DeepSpeed runs fp16 only on GPUs; on CPU use mixed_precision='bf16'"):
        DeepSpeedStrategy(cpu=True, precision="fp16")
    with pytest.raises(ValueError, match=r"offload_parameters needs zero_stage=3"):
        DeepSpeedStrategy(cpu=True, zero_stage=2, offload_parameters=True)
    with pytest.raises(ValueError, match=r"zero_stage=4 is not a ZeRO stage"):
        DeepSpeedStrategy(cpu=True, zero_stage=4)
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        DeepSpeedStrategy(cpu=True, config=str(tmp_path / "missing.json"))
    with pytest.raises(TypeError, match=r"unsupported arguments \['logging_level'\]"):
        DeepSpeedStrategy(cpu=True, logging_level=10)
    assert DeepSpeedStrategy(cpu=True, stage=3).zero_stage == 3  # Lightning's argument name
    offload = resolve_strategy("deepspeed_stage_3_offload", cpu=True)
    assert isinstance(offload, DeepSpeedStrategy)
    assert offload.config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}


def test_without_deepspeed_the_strategy_names_the_install_command() -> None:
    code = (
        "import sys; sys.modules['deepspeed'] = None\n"  # as if the package were not installed
        "from trainer import Accelerator\n"
        "try:\n    Accelerator(strategy='deepspeed', cpu=True)\n"
        "except ImportError as err:\n    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'trainwright[deepspeed]'" in out.stdout, out.stderr[-2000:]



def test_accelerate_config_deepspeed_section_reaches_the_strategy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`accelerate config`'s DeepSpeed answers, through `trainer launch`'s worker environment, configure the engine."""
    from trainer import Accelerator
    from trainer.cli.accelerate_config import settings_from_accelerate
    from trainer.cli.launch import worker_environment

    ds_file = tmp_path / "ds.json"
    ds_file.write_text(json.dumps({"gradient_clipping": 0.5}))
    settings = settings_from_accelerate({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_processes": 1, "use_cpu": True,
        "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none",
                             "gradient_accumulation_steps": 2, "zero3_init_flag": False, "deepspeed_multinode_launcher": "standard",
                             "deepspeed_config_file": str(ds_file)},
    })
    assert settings.strategy == "deepspeed"
    for key, value in worker_environment(settings).items():
        if key != "TRAINWRIGHT_LAUNCHED":
            monkeypatch.setenv(key, value)
    acc = Accelerator()
    try:
        strategy = acc.strategy
        assert acc.distributed_type == "DEEPSPEED" and acc.gradient_accumulation_steps == 2
        assert strategy.zero_stage == 3 and strategy.config["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
        assert strategy.config["gradient_clipping"] == 0.5  # from the DeepSpeed file the section names
    finally:
        acc.end_training()
    with pytest.raises(ValueError, match=r"deepspeed_plugin has unknown key\(s\) \['zero_stages'\]"):
        settings.updated(deepspeed_plugin={"zero_stages": 3})


def _two_runs_in_one_process() -> list[float]:
    """A DeepSpeed run torn down (its process group destroyed), then a second one in the same process (a notebook)."""
    from strategies import DeepSpeedStrategy
    from trainer import Accelerator
    from trainer.state import AcceleratorState

    losses = []
    for _ in range(2):
        acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True, zero_stage=2))
        model = _net()
        model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        x, y = _data()
        loss = nn.functional.mse_loss(model(x[:4]), y[:4])
        acc.backward(loss)
        opt.step()
        losses.append(float(loss))
        acc.end_training()
        acc.teardown()
        AcceleratorState._reset_state(reset_partial_state=True)
    return losses


def test_a_second_deepspeed_run_after_teardown_in_the_same_process() -> None:
    """DeepSpeed keeps its own handles of the groups; the teardown lets them go, so the second engine does not use a
    destroyed group ("Group ... is not registered"). One process: its group needs no port (a second group of several
    processes on the port of the first races the first store's shutdown, which is not what this is about)."""
    [(first, second)] = run_distributed(_two_runs_in_one_process, nprocs=1, fresh=True)
    assert first == second


def _group_timeouts(stage: int) -> dict[str, list[float]]:
    import torch.distributed as dist

    from strategies import DeepSpeedStrategy
    from trainer import Accelerator

    acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True, zero_stage=stage, timeout=3))
    with acc.init_module():  # stage 3: deepspeed.zero.Init partitions the parameters as they are built
        model = _net()
    model, _ = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01))
    groups = dist.distributed_c10d._world.pg_names
    return {"timeouts": [g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in groups],
            "groups": [len(groups)]}


@pytest.mark.parametrize("stage", [2, 3])
def test_the_groups_deepspeed_makes_time_out_as_the_runs_process_group_does(stage: int) -> None:
    # DeepSpeed makes its own data-parallel group, which torch gives the backend's default timeout (30 minutes for
    # gloo): before, a rank hung in one of its collectives held the others that long, whatever the run's timeout
    for result in run_distributed(_group_timeouts, stage):
        assert result["groups"][0] >= 2 and result["timeouts"] == [3.0] * result["groups"][0], result
