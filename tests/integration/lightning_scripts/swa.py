"""StochasticWeightAveraging: the learning rate per epoch (SWALR), the weights the module ends with, with and
without BatchNorm. Prints the JSON of both runs."""
import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, StochasticWeightAveraging
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self, batch_norm=False):
        super().__init__()
        layers = [nn.Linear(4, 8)] + ([nn.BatchNorm1d(8)] if batch_norm else []) + [nn.Tanh(), nn.Linear(8, 1)]
        self.net = nn.Sequential(*layers)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(1), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)]


class LRs(Callback):
    def __init__(self):
        self.lrs = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.lrs.append(round(trainer.optimizers[0].param_groups[0]["lr"], 8))


def run(batch_norm, strategy):
    pl.seed_everything(5)
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0])), batch_size=12)
    model, lrs = Net(batch_norm), LRs()
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=0.6, annealing_epochs=2, annealing_strategy=strategy)
    trainer = pl.Trainer(max_epochs=5, callbacks=[swa, lrs], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(model, loader)
    state = {k: [round(float(v), 5) for v in t.flatten()] for k, t in model.state_dict().items() if t.is_floating_point()}
    return {"lrs": lrs.lrs[:5], "state": state, "n_averaged": int(swa.n_averaged)}


if __name__ == "__main__":
    print(json.dumps({"plain_cos": run(False, "cos"), "plain_linear": run(False, "linear"), "batch_norm": run(True, "cos")}))
