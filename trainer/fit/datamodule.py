"""`DataModule`: Lightning's ``LightningDataModule`` — the data of a run in one object.

    class Digits(DataModule):
        def prepare_data(self): download()                 # once per machine, before setup
        def setup(self, stage): self.train, self.val = split(load())
        def train_dataloader(self): return DataLoader(self.train, batch_size=32, shuffle=True)
        def val_dataloader(self): return DataLoader(self.val, batch_size=64)

    trainer.fit(module, datamodule=Digits())
"""

from __future__ import annotations

from typing import Any

from trainer.fit.module import AttributeDict, TrainModule


class DataModule:
    """Loaders and their preparation; the `Trainer` calls ``prepare_data`` (local rank 0 of each machine, the
    others wait), then ``setup(stage)``, takes the loaders from the ``*_dataloader`` methods, and calls
    ``teardown(stage)`` at the end. ``state_dict``/``load_state_dict`` are saved in checkpoints (JSON data)."""

    def __init__(self) -> None:
        self.hparams: AttributeDict = AttributeDict()
        self.trainer: Any = None

    save_hyperparameters = TrainModule.save_hyperparameters

    def prepare_data(self) -> None:
        """Download or write data to disk: runs once per machine, before `setup`; do not set state here."""

    def setup(self, stage: str) -> None:
        """Build the data sets for `stage` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``), on every process."""

    def teardown(self, stage: str) -> None:
        """Release what `setup` built."""

    def train_dataloader(self) -> Any:
        return None

    def val_dataloader(self) -> Any:
        return None

    def test_dataloader(self) -> Any:
        return None

    def predict_dataloader(self) -> Any:
        return None

    def state_dict(self) -> dict[str, Any]:
        """What to keep in checkpoints (JSON data)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    # Lightning's batch-transfer hooks; the DataModule's win over the module's (see TrainModule.on_before_batch_transfer)
    on_before_batch_transfer = TrainModule.on_before_batch_transfer
    transfer_batch_to_device = TrainModule.transfer_batch_to_device
    on_after_batch_transfer = TrainModule.on_after_batch_transfer
