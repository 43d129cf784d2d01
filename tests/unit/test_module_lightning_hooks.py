"""Lightning's module hooks around the optimizer step (``optimizer_step``, ``configure_gradient_clipping``), the export
methods, and `CombinedLoader`; the values were printed by Lightning 2.6.6 running the same code in a side environment.
The end-to-end scripts are tests/integration/lightning_scripts/{optimizer_step_warmup,module_extras,combined_loaders}.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule
from trainer.fit.batch import TrainBatch
from trainer.utilities import CombinedLoader


class LBFGSModel(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)


class LBFGSThroughTheHook(LBFGSModel):
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)


def _fit(module: TrainModule, tmp_path: Path, **args: Any) -> Trainer:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 2, generator=g)
    trainer = Trainer(max_epochs=1, log_with=None, project_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, **args)
    trainer.fit(module, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    return trainer


@pytest.mark.parametrize("cls", [LBFGSModel, LBFGSThroughTheHook])
def test_an_optimizer_that_calls_the_closure_again_runs_as_in_lightning(tmp_path: Path, cls: type[LBFGSModel]) -> None:
    """LBFGS (max_iter=3) evaluates the closure 3 times a step: 6 training_step calls for 2 steps, Lightning's weights."""
    torch.manual_seed(0)
    module = cls()
    trainer = _fit(module, tmp_path)
    assert (trainer.global_step, module.steps) == (2, 6)
    assert module.layer.weight.detach().flatten().tolist() == pytest.approx([1.1265475749969482, 1.4229720830917358], rel=1e-6)


def test_an_optimizer_step_that_never_runs_the_closure_is_an_error(tmp_path: Path) -> None:
    class Forgets(LBFGSModel):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            optimizer.step()  # Lightning: "The closure hasn't been executed"

    with pytest.raises(RuntimeError, match=r"did not run optimizer_closure.*optimizer.step\(closure=optimizer_closure\)"):
        _fit(Forgets(), tmp_path)


def test_without_an_override_the_plain_step_is_chosen_once(tmp_path: Path) -> None:
    """The fast path stays the plain `_automatic` (no closure, no StepOptimizer) unless a hook or the optimizer needs it."""
    chosen: list[Any] = []

    class Plain(LBFGSModel):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_train_epoch_start(self) -> None:
            chosen.append(self.trainer)

    trainer = _fit(Plain(), tmp_path)
    batch = TrainBatch(chosen[0])
    assert batch.automatic == batch._automatic and batch.step_optimizer is None
    assert trainer.global_step == 2


def test_export_methods(tmp_path: Path) -> None:
    module = LBFGSModel()
    with pytest.raises(ValueError, match=r"to_torchscript\(method='trace'\) needs an input.*example_input_array"):
        module.to_torchscript(method="trace")
    module.example_input_array = torch.ones(3, 2)
    scripted = module.to_torchscript(tmp_path / "m.pt")  # method="script"
    assert torch.allclose(scripted(module.example_input_array), module(module.example_input_array)) and (tmp_path / "m.pt").exists()
    assert module.training
    with pytest.raises(ValueError, match="only supports 'script' or 'trace'"):
        module.to_torchscript(method="compile")
    try:
        import onnx  # noqa: F401
    except ImportError:
        with pytest.raises(ModuleNotFoundError, match="to_onnx\\(\\) requires the onnx package; install it with `pip install onnx`"):
            module.to_onnx(tmp_path / "m.onnx")


def test_combined_loader_modes_match_lightning() -> None:
    """Lightning's own docstring example, and `limits` in sequential mode (values printed by Lightning 2.6.6)."""
    iterables = {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}

    def items(mode: str) -> tuple[int, list[Any]]:
        combined = CombinedLoader(iterables, mode)  # type: ignore[arg-type]
        iter(combined)
        return len(combined), [(_plain(batch), batch_idx, dataloader_idx) for batch, batch_idx, dataloader_idx in combined]

    a0, a1, b0, b1, b2 = [0, 1, 2, 3], [4, 5], [0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]
    assert items("max_size_cycle") == (3, [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0), ({"a": a0, "b": b2}, 2, 0)])
    assert items("max_size") == (3, [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0), ({"a": None, "b": b2}, 2, 0)])
    assert items("min_size") == (2, [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0)])
    assert items("sequential") == (5, [(a0, 0, 0), (a1, 1, 0), (b0, 0, 1), (b1, 1, 1), (b2, 2, 1)])
    limited = CombinedLoader([DataLoader(range(6), batch_size=2), DataLoader(range(9), batch_size=3)], "sequential")
    limited.limits = [2, 1]
    assert len(limited) == 3 and [(_plain(b), i, d) for b, i, d in limited] == [([0, 1], 0, 0), ([2, 3], 1, 0), ([0, 1, 2], 0, 1)]
    with pytest.raises(ValueError, match="Unsupported mode 'zip'"):
        CombinedLoader(iterables, "zip")  # type: ignore[arg-type]


def _plain(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    return None if batch is None else batch.tolist()
