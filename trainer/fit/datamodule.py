"""`DataModule`: Lightning's ``LightningDataModule`` — the data of a run in one object.

    class Digits(DataModule):
        def prepare_data(self): download()                 # once per machine, before setup
        def setup(self, stage): self.train, self.val = split(load())
        def train_dataloader(self): return DataLoader(self.train, batch_size=32, shuffle=True)
        def val_dataloader(self): return DataLoader(self.val, batch_size=64)

    trainer.fit(module, datamodule=Digits())
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.fit.module import AttributeDict, TrainModule


class DataModule:
    """Loaders and their preparation; the `Trainer` calls ``prepare_data`` (local rank 0 of each machine, the
    others wait; with ``prepare_data_per_node = False``, global rank 0 only, for a file system all machines share),
    then ``setup(stage)``, takes the loaders from the ``*_dataloader`` methods, and calls ``teardown(stage)`` at the
    end. ``state_dict``/``load_state_dict`` are saved in checkpoints (JSON data)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Lightning's signature: the arguments are not used
        self.prepare_data_per_node: bool = True
        self.hparams: AttributeDict = AttributeDict()
        self.trainer: Any = None
        self.hparams_to_trackers = True  # `save_hyperparameters(logger=False)` keeps them from the trackers

    save_hyperparameters = TrainModule.save_hyperparameters

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None,
                      predict_dataset: Any = None, batch_size: int = 1, num_workers: int = 0, **datamodule_kwargs: Any) -> Any:
        """A DataModule whose ``*_dataloader`` methods wrap the given data sets (each a ``Dataset``, or a list or dict of
        them) in ``DataLoader(batch_size, num_workers)``, shuffling the training set(s) unless iterable; Lightning's.
        `datamodule_kwargs` (and `batch_size`/`num_workers` where ``__init__`` takes them) build the module."""

        def loaders(data: Any, shuffle: bool = False) -> Any:
            if isinstance(data, Dataset):
                return DataLoader(data, batch_size=batch_size, shuffle=shuffle and not isinstance(data, IterableDataset),
                                  num_workers=num_workers, pin_memory=torch.cuda.is_available())
            if isinstance(data, Mapping):
                return {key: loaders(value, shuffle) for key, value in data.items()}
            if isinstance(data, (list, tuple)):
                return type(data)(loaders(value, shuffle) for value in data)
            return data

        parameters = inspect.signature(cls.__init__).parameters
        special = {"batch_size": batch_size, "num_workers": num_workers}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            special = {k: v for k, v in special.items() if k in parameters}
        datamodule = cls(**datamodule_kwargs, **special)
        for name, data, shuffle in (("train", train_dataset, True), ("val", val_dataset, False), ("test", test_dataset, False),
                                    ("predict", predict_dataset, False)):
            if data is not None:
                setattr(datamodule, f"{name}_dataloader", lambda data=data, shuffle=shuffle: loaders(data, shuffle))
        return datamodule

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

    def on_exception(self, exception: BaseException) -> None:
        """Called when a ``fit``/``validate``/``test``/``predict`` fails, after the callbacks' ``on_exception``."""

    def state_dict(self) -> dict[str, Any]:
        """What to keep in checkpoints (JSON data)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    # Lightning's batch-transfer hooks; the DataModule's win over the module's (see TrainModule.on_before_batch_transfer)
    on_before_batch_transfer = TrainModule.on_before_batch_transfer
    transfer_batch_to_device = TrainModule.transfer_batch_to_device
    on_after_batch_transfer = TrainModule.on_after_batch_transfer
