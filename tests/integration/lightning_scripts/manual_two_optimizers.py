"""Manual optimization with two optimizers (a small GAN): toggle_optimizer, manual_backward, clip_gradients."""
import json

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class GAN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Linear(2, 2)
        self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
        self.backward_calls = 0

    def on_after_backward(self):
        self.backward_calls += 1

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        real = batch[0]
        fake = self.generator(torch.randn_like(real))
        self.toggle_optimizer(opt_d)
        d_loss = nn.functional.softplus(-self.discriminator(real)).mean() + nn.functional.softplus(self.discriminator(fake.detach())).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        self.clip_gradients(opt_d, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.toggle_optimizer(opt_g)
        g_loss = nn.functional.softplus(-self.discriminator(fake)).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, prog_bar=True)

    def configure_optimizers(self):
        return [torch.optim.Adam(self.generator.parameters(), lr=1e-3), torch.optim.Adam(self.discriminator.parameters(), lr=1e-3)]


if __name__ == "__main__":
    pl.seed_everything(0)
    before = None
    model = GAN()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(40, 2) + 3), batch_size=8))
    changed = [not torch.equal(b, p) for b, p in zip(before, model.parameters())]
    print(json.dumps({"global_step": trainer.global_step, "backward_calls": model.backward_calls, "all_changed": all(changed),
                      "metrics": sorted(trainer.callback_metrics)}))
