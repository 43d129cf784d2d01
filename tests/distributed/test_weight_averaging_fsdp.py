"""`EMAWeightAveraging` under FSDP2 on 2 real processes (gloo, CPU): the average is sharded like the module (DTensors
with its placements), equals a hand-computed EMA of the gathered weights after every step and the same run under
DDP, and a run stopped at a checkpoint and resumed continues it bit for bit; also on a tiny `transformers` Llama."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks.base import Callback
from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]

TOTAL_STEPS, STOP, DECAY = 8, 4, 0.75


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (gathered from the shards under FSDP: a collective), on CPU."""
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().cpu().clone()


class GatheredStepWeights(Callback):
    """The module's whole weights (gathered from every process's shards) after each optimizer step, and what
    validation sees (this runs after the averaging callback has swapped the average in)."""

    def __init__(self) -> None:
        self.after_step: list[dict[str, torch.Tensor]] = []
        self.in_validation: list[tuple[int, dict[str, torch.Tensor]]] = []
        self._seen = 0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step > self._seen:
            self._seen = trainer.global_step
            self.after_step.append({k: _full(v) for k, v in module.state_dict().items()})

    def on_validation_epoch_start(self, trainer: Any, module: Any) -> None:
        if not trainer.sanity_checking:
            self.in_validation.append((trainer.global_step, {k: _full(v) for k, v in module.state_dict().items()}))


def _placements(module: torch.nn.Module) -> dict[str, Any]:
    return {name: (tuple(p.placements), tuple(p.shape), tuple(p.to_local().shape)) for name, p in module.named_parameters()}


def _fit_on_each_rank(root: str, strategy: str, max_steps: int, ckpt_path: str | None, every: int | None, init_seed: int) -> dict[str, Any]:
    from callbacks.weight_averaging import EMAWeightAveraging
    from tests.unit.test_checkpoint_resume import run_fit
    from tests.unit.test_weight_averaging import hand_ema

    ema, record = EMAWeightAveraging(decay=DECAY), GatheredStepWeights()
    module, trainer, _ = run_fit(Path(root), max_steps, ckpt_path=ckpt_path, every_n_train_steps=every, init_seed=init_seed,
                                 extra_callbacks=(ema, record), validate_every=3, process_group_timeout=60, strategy=strategy,
                                 precision="32-true")
    assert trainer.world_size == 2 and ema.average_model is not None
    average = ema.average_model
    out: dict[str, Any] = {
        "average": {k: _full(v) for k, v in average.module.state_dict().items()},
        "n_averaged": int(average.n_averaged),
        "weights": {k: _full(v) for k, v in module.state_dict().items()},
        "expected": hand_ema(record.after_step, DECAY)[-1] if ckpt_path is None else None,
        "losses": module.losses,
    }
    if ckpt_path is None:  # validation saw the average of the steps so far
        emas = hand_ema(record.after_step, DECAY)
        out["validated"] = [(step, _equal(seen, emas[step - 1])) for step, seen in record.in_validation]
    if strategy == "fsdp":
        out["placements"] = (_placements(average.module), _placements(module))
        out["local_average"] = {k: v.to_local().detach().clone() for k, v in average.module.state_dict().items()}
    return out


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fsdp_ema_is_sharded_hand_computed_matches_ddp_and_resumes_bit_exactly(tmp_path: Path) -> None:
    straight = run_distributed(_fit_on_each_rank, str(tmp_path / "straight"), "fsdp", TOTAL_STEPS, None, None, 1)
    for rank in range(2):
        avg_placements, module_placements = straight[rank]["placements"]
        assert avg_placements == module_placements and avg_placements, "the average is not sharded like the module"
        assert all("Shard" in str(p[0]) for p in avg_placements.values())
        assert straight[rank]["n_averaged"] == TOTAL_STEPS
        assert len(straight[rank]["validated"]) >= 2 and all(step >= 1 for step, _ in straight[rank]["validated"])
        assert all(same for _, same in straight[rank]["validated"]), f"rank {rank}: validation did not see the average"
        assert _equal(straight[rank]["average"], straight[rank]["expected"]), f"rank {rank}: not the hand-computed EMA"
        # at the end of fit the module holds the average
        assert _equal(straight[rank]["weights"], straight[rank]["average"])
    assert _equal(straight[0]["average"], straight[1]["average"])
    # each process holds only its own half of the first layer's averaged weight
    halves = [straight[rank]["local_average"]["net.0.weight"] for rank in range(2)]
    assert torch.equal(torch.cat(halves), straight[0]["average"]["net.0.weight"])

    ddp = run_distributed(_fit_on_each_rank, str(tmp_path / "ddp"), "ddp", TOTAL_STEPS, None, None, 1)
    assert ddp[0]["losses"].keys() == straight[0]["losses"].keys()
    for key, value in ddp[0]["average"].items():
        torch.testing.assert_close(straight[0]["average"][key], value, rtol=1e-5, atol=1e-6)

    run_distributed(_fit_on_each_rank, str(tmp_path / "run"), "fsdp", STOP, None, STOP, 1)
    ckpt = next((tmp_path / "run" / "ckpts").iterdir())
    saved = torch.load(ckpt / "averaged_model.bin", weights_only=True)  # the whole average, gathered by process 0
    assert int(saved["n_averaged"]) == STOP
    assert {k: v.shape for k, v in saved.items() if k != "n_averaged"} == {f"module.{k}": v.shape for k, v in straight[0]["average"].items()}
    resumed = run_distributed(_fit_on_each_rank, str(tmp_path / "run"), "fsdp", TOTAL_STEPS, "last", STOP, 99)
    for rank in range(2):
        assert resumed[rank]["n_averaged"] == TOTAL_STEPS
        assert _equal(resumed[rank]["average"], straight[rank]["average"]), f"rank {rank}: the average differs after resume"
        assert _equal(resumed[rank]["local_average"], straight[rank]["local_average"])
        assert _equal(resumed[rank]["weights"], straight[rank]["weights"])


# ---------------------------------------------------------------- a tiny Hugging Face model
LLAMA_STEPS, VOCAB, SEQ = 4, 128, 8


def _llama_on_each_rank(root: str) -> dict[str, Any]:
    import transformers
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks.weight_averaging import EMAWeightAveraging
    from tests.unit.test_weight_averaging import hand_ema
    from trainer import Trainer, TrainModule

    class Causal(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2)
            self.model = transformers.LlamaForCausalLM(config)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (ids,) = batch
            return self.model(input_ids=ids, labels=ids).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    module = Causal()
    ids = torch.randint(0, VOCAB, (LLAMA_STEPS * 4, SEQ), generator=torch.Generator().manual_seed(3))
    ema, record = EMAWeightAveraging(decay=DECAY), GatheredStepWeights()
    trainer = Trainer(strategy="fsdp", max_steps=LLAMA_STEPS, callbacks=[ema, record], log_with=None, project_dir=root,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, seed=1,
                      process_group_timeout=60)
    trainer.fit(module, DataLoader(TensorDataset(ids), batch_size=2))
    assert ema.average_model is not None
    return {
        "average": {k: _full(v) for k, v in ema.average_model.module.state_dict().items()},
        "expected": hand_ema(record.after_step, DECAY)[-1],
        "steps": len(record.after_step),
        "sharded": sorted({type(p).__name__ for p in ema.average_model.module.parameters()}),
    }


def test_fsdp_ema_on_a_tiny_llama_is_the_hand_computed_ema(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    results = run_distributed(_llama_on_each_rank, str(tmp_path))
    for result in results:
        assert result["steps"] == LLAMA_STEPS and result["sharded"] == ["DTensor"]
        assert _equal(result["average"], result["expected"])
    assert _equal(results[0]["average"], results[1]["average"])


# ---------------------------------------------------------------- the default average (SWA) and the refusals
def _swa_on_each_rank(root: str, foreach: bool) -> dict[str, Any]:
    from torch.optim.swa_utils import get_swa_multi_avg_fn

    from callbacks.weight_averaging import WeightAveraging
    from tests.unit.test_checkpoint_resume import run_fit

    # the foreach form is what AveragedModel uses by default on GPUs: given here, it runs on the CPU too
    swa, record = WeightAveraging(**({"multi_avg_fn": get_swa_multi_avg_fn()} if foreach else {})), GatheredStepWeights()
    run_fit(Path(root), 5, extra_callbacks=(swa, record), process_group_timeout=60, strategy="fsdp", precision="32-true")
    assert swa.average_model is not None
    return {"average": {k: _full(v) for k, v in swa.average_model.module.state_dict().items()}, "steps": record.after_step}


@pytest.mark.parametrize("foreach", [False, True], ids=["per-tensor", "foreach"])
def test_fsdp_default_average_is_the_mean_of_the_gathered_weights(tmp_path: Path, foreach: bool) -> None:
    results = run_distributed(_swa_on_each_rank, str(tmp_path), foreach)
    for result in results:
        assert len(result["steps"]) == 5
        mean = {k: torch.stack([step[k] for step in result["steps"]]).mean(0) for k in result["average"]}
        assert result["average"].keys() == mean.keys()
        for key, value in mean.items():
            torch.testing.assert_close(result["average"][key], value, rtol=1e-6, atol=1e-6)
            assert not torch.equal(value, result["steps"][-1][key])  # (an average, not the last weights)


def test_fsdp_takes_no_device_for_the_average_and_deepspeed_stays_refused() -> None:
    from callbacks.weight_averaging import EMAWeightAveraging
    from strategies.fsdp import FSDPStrategy

    class View:
        strategy = FSDPStrategy(cpu=True)

    with pytest.raises(ValueError, match=r"device='cpu'.*leave device out"):
        EMAWeightAveraging(device="cpu").setup(View(), None, "fit")  # type: ignore[arg-type]

    from strategies.deepspeed import DeepSpeedStrategy

    View.strategy = DeepSpeedStrategy()  # type: ignore[assignment]
    with pytest.raises(NotImplementedError, match=r"DeepSpeedStrategy: it shards or owns the parameters.*use FSDP"):
        EMAWeightAveraging().setup(View(), None, "fit")  # type: ignore[arg-type]
