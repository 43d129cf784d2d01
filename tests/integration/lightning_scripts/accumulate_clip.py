"""Gradient accumulation (4 batches per step) with gradient clipping by norm."""
import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class GradNorms(Callback):
    def __init__(self):
        self.before_step = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.before_step.append(trainer.global_step)


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.clipped_norms = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y) * 100  # large gradients, so clipping bites

    def on_train_batch_end(self, outputs, batch, batch_idx):
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads and ((batch_idx + 1) % 4 == 0 or batch_idx == 9):  # the batches that stepped
            self.clipped_norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    pl.seed_everything(0)
    loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1) * 10), batch_size=4)  # 10 batches per epoch
    norms = GradNorms()
    model = Model()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", accumulate_grad_batches=4, gradient_clip_val=0.5,
                         gradient_clip_algorithm="norm", callbacks=[norms], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False)
    trainer.fit(model, loader)
    print(json.dumps({"global_step": trainer.global_step, "steps_seen": norms.before_step, "max_norm": max(model.clipped_norms),
                      "norms": len(model.clipped_norms), "estimated_stepping_batches": trainer.estimated_stepping_batches}))
