"""A learning-rate warm-up in optimizer_step (Lightning's recipe), with accumulation, and a configure_gradient_clipping
override that clips by value with its own threshold."""
import json

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset


class WarmUp(LightningModule):
    def __init__(self, lr=0.1, warmup=4):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < self.hparams.warmup:
            scale = min(1.0, float(self.trainer.global_step + 1) / self.hparams.warmup)
            for group in optimizer.param_groups:
                group["lr"] = scale * self.hparams.lr
        self.seen.append([epoch, batch_idx, self.trainer.global_step, optimizer.param_groups[0]["lr"]])


class Clipping(WarmUp):
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.seen.append([gradient_clip_val, gradient_clip_algorithm == "value", float(self.layer.weight.grad.abs().max())])
        self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm="value")


def run(cls, **trainer_args):
    seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, generator=g)
    y = x.sum(1, keepdim=True) * 3
    module = cls()
    trainer = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu", **trainer_args)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=2))
    return {"global_step": trainer.global_step, "epoch": trainer.current_epoch, "seen": module.seen,
            "weight": module.layer.weight.detach().flatten().tolist(), "bias": module.layer.bias.detach().tolist()}


if __name__ == "__main__":
    out = {"warmup": run(WarmUp), "warmup_accumulate": run(WarmUp, accumulate_grad_batches=4),
           "clipping": run(Clipping), "clipping_trainer_value": run(Clipping, gradient_clip_algorithm="value")}
    print(json.dumps(out))
