"""LightningModule extras: toggled_optimizer, configure_callbacks, the evaluation model hooks, example_input_array with
to_torchscript, strict_loading, LightningDataModule.from_datasets."""
import json
import os

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

CALLS = []


class Recorder(Callback):
    def on_fit_start(self, trainer, pl_module):
        CALLS.append("Recorder.on_fit_start")


class Model(LightningModule):
    def __init__(self, hidden=4):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        self.frozen = torch.nn.BatchNorm1d(1)
        self.example_input_array = torch.ones(3, 2)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        CALLS.append(f"validation_step training={self.training} frozen={self.frozen.training}")
        self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def configure_callbacks(self):
        CALLS.append("configure_callbacks")
        return [EarlyStopping(monitor="val_loss", patience=5), Recorder()]

    def setup(self, stage):
        CALLS.append("setup")

    def on_validation_model_eval(self):
        CALLS.append("on_validation_model_eval")
        super().on_validation_model_eval()

    def on_validation_start(self):
        CALLS.append("on_validation_start")

    def on_validation_end(self):
        CALLS.append("on_validation_end")

    def on_validation_model_train(self):
        CALLS.append("on_validation_model_train")
        self.train()
        self.frozen.eval()

    def on_test_model_eval(self):
        CALLS.append("on_test_model_eval")
        super().on_test_model_eval()

    def test_step(self, batch, batch_idx):
        CALLS.append(f"test_step training={self.training}")

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def on_predict_model_eval(self):
        CALLS.append("on_predict_model_eval")
        super().on_predict_model_eval()


class TwoOptimizers(Model):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.head = torch.nn.Linear(1, 1)
        self.toggled = []

    def configure_callbacks(self):
        return []

    def training_step(self, batch, batch_idx):
        first, _ = self.optimizers()
        with self.toggled_optimizer(first):
            self.toggled.append([p.requires_grad for p in self.parameters()])
            loss = torch.nn.functional.mse_loss(self.head(self(batch[0])), batch[1])
            self.manual_backward(loss)
            first.step()
            first.zero_grad()
        self.toggled.append([p.requires_grad for p in self.parameters()])

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.01), torch.optim.SGD(self.head.parameters(), lr=0.01)


class Partial(Model):
    def __init__(self, hidden=4):
        super().__init__(hidden)
        self.extra = torch.nn.Linear(1, 1)  # not in the checkpoint
        self.strict_loading = False


def data(n=8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


if __name__ == "__main__":
    seed_everything(0, verbose=False)
    out = {}
    dm = LightningDataModule.from_datasets(train_dataset=data(), val_dataset=[data(4), data(6)], test_dataset=data(), batch_size=4)
    out["from_datasets"] = [dm.train_dataloader().batch_size, isinstance(dm.train_dataloader().sampler, RandomSampler),
                            len(dm.val_dataloader()), [len(v) for v in dm.val_dataloader()], isinstance(dm.test_dataloader().sampler, RandomSampler)]
    model = Model()
    model.frozen.eval()
    trainer = Trainer(max_epochs=1, callbacks=[EarlyStopping(monitor="other"), Recorder()], logger=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, default_root_dir=".")
    trainer.fit(model, DataLoader(data(), batch_size=4), DataLoader(data(4), batch_size=4))
    out["early_stopping_monitors"] = [cb.monitor for cb in trainer.callbacks if isinstance(cb, EarlyStopping)]
    out["recorders"] = sum(type(cb).__name__ == "Recorder" for cb in trainer.callbacks)
    out["after_fit"] = [model.training, model.frozen.training]
    trainer.test(model, DataLoader(data(4), batch_size=4))
    out["after_test"] = [model.training, model.frozen.training]
    trainer.predict(model, DataLoader(data(4), batch_size=4))
    out["after_predict"] = [model.training, model.frozen.training]
    out["calls"] = CALLS
    trainer.save_checkpoint("model.ckpt")
    partial = Partial.load_from_checkpoint("model.ckpt")
    out["partial_loaded"] = torch.equal(partial.net[0].weight, model.net[0].weight)
    try:
        Partial.load_from_checkpoint("model.ckpt", strict=True)
        out["strict_conflict"] = False
    except ValueError:  # strict=True against strict_loading=False
        out["strict_conflict"] = True
    scripted = model.to_torchscript(method="trace", file_path="model.pt")
    out["traced"] = [torch.allclose(scripted(model.example_input_array), model(model.example_input_array)), os.path.exists("model.pt"), model.training]
    two = TwoOptimizers()
    Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            accelerator="cpu").fit(two, DataLoader(data(4), batch_size=4))
    out["toggled"] = two.toggled
    print(json.dumps(out))
