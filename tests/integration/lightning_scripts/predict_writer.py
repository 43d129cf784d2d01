"""predict(return_predictions=False) with callbacks that write the predictions to files: a BasePredictionWriter at each
batch and at the epoch's end, and a plain Callback's on_predict_batch_end; the files are read back."""
import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Callback
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self.layer(batch[0])


class Writer(BasePredictionWriter):
    def __init__(self, output_dir, write_interval):
        super().__init__(write_interval)
        self.output_dir = output_dir
        self.epoch_batch_indices = None

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        torch.save(prediction, os.path.join(self.output_dir, f"batch_{dataloader_idx}_{batch_idx}.pt"))

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.epoch_batch_indices = batch_indices
        torch.save(predictions, os.path.join(self.output_dir, f"epoch_rank{trainer.global_rank}.pt"))


class OnBatchEnd(Callback):
    def __init__(self, output_dir):
        self.output_dir = output_dir

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        torch.save(outputs, os.path.join(self.output_dir, f"hook_{batch_idx}.pt"))


def rows(tensors):
    return [[round(v, 6) for v in row] for t in tensors for row in t.tolist()]


if __name__ == "__main__":
    pl.seed_everything(0, verbose=False)
    module = Net()
    data = DataLoader(TensorDataset(torch.randn(10, 3, generator=torch.Generator().manual_seed(1))), batch_size=4)
    for name in ("batches", "epoch", "hook"):
        os.makedirs(name)
    batch_writer, epoch_writer = Writer("batches", "batch"), Writer("epoch", "epoch")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[batch_writer, epoch_writer, OnBatchEnd("hook")])
    returned = trainer.predict(module, data, return_predictions=False)
    two_loaders = trainer.predict(module, [data, data], return_predictions=False)  # a list of predictions per loader
    expected = module.layer(torch.cat([b[0] for b in data])).detach()
    epoch = torch.load("epoch/epoch_rank0.pt")
    print(json.dumps({
        "returned": [returned, two_loaders],
        "files": {name: sorted(os.listdir(name)) for name in ("batches", "epoch", "hook")},
        "batches": rows(torch.load(f"batches/batch_0_{i}.pt") for i in range(3)),
        "hook": rows(torch.load(f"hook/hook_{i}.pt") for i in range(3)),
        "epoch_two_loaders": [len(epoch), [len(p) for p in epoch]],
        "epoch": rows(epoch[0]),
        "expected": rows([expected]),
        "epoch_batch_indices": epoch_writer.epoch_batch_indices,
    }))
