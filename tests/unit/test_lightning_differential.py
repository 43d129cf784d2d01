"""Observables of a fit compared with Lightning 2.6.6 running the same script (in a side environment, with only the
rename of ``tests/helpers/lightning_rename.py`` between the two): the expected values below are Lightning's.

* ``current_epoch`` after a run that ``max_steps`` ended mid-epoch (Lightning counts that epoch);
* ``callback_metrics`` during and after validation (evaluation step values never reach them: no ``val_loss_step``);
* the module's train/eval modes at each epoch start (left as the user set them: no ``.train()`` there);
* the CSV tracker's rows (step, epoch, names) in manual optimization;
* the results table ``validate``/``test(verbose=True)`` print.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from callbacks.trackers import CSVLogger
from trainer import Trainer, TrainModule

QUIET = {"log_with": None, "enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False}


def _data(n: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n * 2.0).reshape(n, 2) / 10), batch_size=2)


class Auto(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[tuple[Any, ...]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean(), on_step=True, on_epoch=True)

    def on_train_epoch_start(self) -> None:
        self.seen.append(("epoch_start", self.current_epoch, self.training, self.layer.training))

    def on_train_epoch_end(self) -> None:
        self.seen.append(("train_epoch_end", self.current_epoch, self.global_step))

    def on_train_end(self) -> None:
        self.seen.append(("train_end", self.current_epoch))

    def on_fit_end(self) -> None:
        self.seen.append(("fit_end", self.current_epoch))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_current_epoch_after_max_steps_ends_an_epoch_early(tmp_path: Path) -> None:
    module = Auto()
    trainer = Trainer(max_steps=6, max_epochs=10, project_dir=tmp_path, limit_val_batches=0, **QUIET)
    trainer.fit(module, _data(8))  # 4 batches an epoch: the sixth step is mid-epoch 1
    assert [s for s in module.seen if s[0] != "epoch_start"] == [
        ("train_epoch_end", 0, 4), ("train_epoch_end", 1, 6), ("train_end", 2), ("fit_end", 2)]
    assert (trainer.current_epoch, trainer.global_step) == (2, 6)
    exact = Trainer(max_steps=8, max_epochs=10, project_dir=tmp_path, limit_val_batches=0, **QUIET)
    exact.fit(Auto(), _data(8))  # at an epoch's end: the same count
    assert (exact.current_epoch, exact.global_step) == (2, 8)


class Peek(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[str, list[str]]] = []

    def on_validation_batch_end(self, trainer: Any, *args: Any) -> None:
        self.seen.append(("batch", sorted(trainer.callback_metrics)))

    def on_validation_epoch_end(self, trainer: Any, module: Any) -> None:
        self.seen.append(("val_epoch_end", sorted(trainer.callback_metrics)))

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        self.seen.append(("val_end", sorted(trainer.callback_metrics)))

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.seen.append(("train_epoch_end", sorted(trainer.callback_metrics)))


def test_evaluation_step_values_never_reach_callback_metrics(tmp_path: Path) -> None:
    peek, module = Peek(), Auto()
    trainer = Trainer(max_epochs=1, project_dir=tmp_path, num_sanity_val_steps=0, callbacks=[peek], **QUIET)
    trainer.fit(module, _data(8), _data(4))
    epoch = ["val_loss", "val_loss_epoch"]
    assert peek.seen == [("batch", []), ("batch", []), ("val_epoch_end", epoch), ("val_end", epoch), ("train_epoch_end", epoch)]
    assert sorted(trainer.callback_metrics) == epoch
    peek.seen.clear()
    trainer.validate(module, _data(4))
    assert peek.seen == [("batch", []), ("batch", []), ("val_epoch_end", epoch), ("val_end", epoch)]
    assert sorted(trainer.callback_metrics) == epoch
    assert "val_loss_step" in trainer.logged_metrics  # the trackers still get the step values


def test_the_modes_the_user_set_are_kept_at_each_epoch_start(tmp_path: Path) -> None:
    class Frozen(Auto):
        def on_fit_start(self) -> None:
            self.layer.eval()

    module = Frozen()
    Trainer(max_epochs=2, project_dir=tmp_path, num_sanity_val_steps=0, limit_val_batches=1, **QUIET).fit(module, _data(8), _data(4))
    assert [s for s in module.seen if s[0] == "epoch_start"] == [("epoch_start", 0, True, False), ("epoch_start", 1, True, False)]


class Manual(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        loss = self.layer(batch[0]).pow(2).mean()
        opt.zero_grad()
        self.manual_backward(loss)
        if batch_idx % 3 == 0:
            opt.step()
        self.log("loss", loss, on_step=True, on_epoch=True)
        self.log("plain", float(batch_idx))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_manual_optimization_csv_rows_are_lightnings(tmp_path: Path) -> None:
    logger = CSVLogger(str(tmp_path), name="m", version=0)
    trainer = Trainer(max_epochs=2, logger=logger, log_every_n_steps=2, project_dir=tmp_path, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, val_check_interval=3)
    trainer.fit(Manual(), _data(14), _data(4))  # 7 batches an epoch, an optimizer step on every third
    with open(tmp_path / "m" / "version_0" / "metrics.csv") as handle:
        rows = [(r["step"], r["epoch"], sorted(k for k, v in r.items() if v != "" and k not in ("step", "epoch")))
                for r in csv.DictReader(handle)]
    step_values = ["loss_step", "plain"]
    assert rows == [
        ("1", "0", step_values), ("2", "0", ["val"]), ("3", "0", step_values), ("5", "0", step_values), ("5", "0", ["val"]),
        ("6", "0", ["loss_epoch"]), ("7", "1", step_values), ("9", "1", step_values), ("9", "1", ["val"]),
        ("11", "1", step_values), ("12", "1", ["val"]), ("13", "1", step_values), ("13", "1", ["loss_epoch"]),
    ]
    assert trainer.global_step == 6


class Evaluated(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())
        self.log("a_rather_long_metric_name_for_the_table", 1.5)

    test_step = validation_step


LIGHTNING_TABLES = """\
{bar}
            Validate metric                         DataLoader 0
{bar}
a_rather_long_metric_name_for_the_table                  1.5
               val_loss                          0.1934804916381836
{bar}
{bar}
              Test metric                           DataLoader 0
{bar}
a_rather_long_metric_name_for_the_table                  1.5
               val_loss                          0.1934804916381836
{bar}
{bar}
              Test metric                           DataLoader 1
{bar}
a_rather_long_metric_name_for_the_table                  1.5
               val_loss                          0.25808873772621155
{bar}
""".format(bar="─" * 100)


def test_validate_and_test_print_lightnings_results_table(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # the table's width follows the terminal's
    trainer = Trainer(project_dir=tmp_path, **QUIET)
    capsys.readouterr()
    trainer.validate(Evaluated(), _data(4))
    trainer.test(Evaluated(), [_data(4), _data(2)])
    trainer.validate(Evaluated(), _data(4), verbose=False)  # verbose=False prints nothing
    out = capsys.readouterr().out
    if "─" not in out:  # a terminal encoding without the box character gets dashes, as in Lightning
        out = out.replace("-" * 100, "─" * 100)
    assert out == LIGHTNING_TABLES
