"""Resume from a checkpoint file Lightning wrote: ``write OUT`` trains 2 epochs and keeps the epoch-end checkpoint as
OUT; ``write-mid OUT`` keeps the one saved at step 6, inside the second epoch; ``resume CKPT`` continues a new run to 3
epochs from CKPT (Lightning reads its .ckpt as it is; here the file is converted first with ``trainer
convert-checkpoint CKPT DST`` and DST passed instead) and prints what it continued to; ``straight -`` runs the 3 epochs
uninterrupted."""
import json
import shutil
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self, lr=0.1, hidden=3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def loader():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 4, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1] - x[:, 1:2]), batch_size=4)


def trainer(root, epochs, every_n_train_steps=None):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", default_root_dir=root, enable_progress_bar=False,
                      logger=False, enable_model_summary=False,
                      callbacks=[ModelCheckpoint(dirpath=f"{root}/ckpts", every_n_train_steps=every_n_train_steps)])


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    pl.seed_everything(7)
    if mode in ("write", "write-mid"):
        run = trainer("first", 2, every_n_train_steps=6 if mode == "write-mid" else None)
        run.fit(Model(lr=0.05, hidden=3), loader())
        shutil.copyfile(run.checkpoint_callback.best_model_path, path)
        print(json.dumps({"global_step": run.global_step}))
    else:
        model = Model(lr=0.05, hidden=3)  # fresh weights: the checkpoint replaces them
        run = trainer("resumed", 3)
        run.fit(model, loader(), ckpt_path=None if mode == "straight" else path)
        optimizer = run.optimizers[0]
        momentum = [optimizer.state[p]["momentum_buffer"].flatten().tolist() for p in model.parameters()]
        print(json.dumps({"global_step": run.global_step, "epoch": run.current_epoch, "lr": optimizer.param_groups[0]["lr"],
                          "weights": {k: v.flatten().tolist() for k, v in model.state_dict().items()}, "momentum": momentum,
                          "hparams": dict(model.hparams)}))
