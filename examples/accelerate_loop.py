"""A training loop written for Hugging Face Accelerate, running on Trainwright.

Only the import lines differ from the Accelerate version (``accelerate`` -> ``trainer``).
Run it on one process, or on two with ``trainer launch --num_processes 2 examples/accelerate_loop.py``.
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator  # from accelerate import Accelerator
from trainer.utils import ProjectConfiguration, set_seed  # from accelerate.utils import ProjectConfiguration, set_seed


def get_dataloaders(batch_size: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    train = TensorDataset(x[:1400], y[:1400])
    test = TensorDataset(x[1400:], y[1400:])
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(test, batch_size=batch_size)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--mixed_precision", default=None)
    parser.add_argument("--project_dir", default="runs/accelerate_loop")
    args = parser.parse_args()

    set_seed(42)
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2),
    )
    train_loader, test_loader = get_dataloaders(batch_size=32)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.epochs * len(train_loader))
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, test_loader, scheduler)

    for epoch in range(args.epochs):
        model.train()
        for inputs, targets in train_loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(inputs), targets)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

        model.eval()
        correct = total = 0
        for inputs, targets in test_loader:
            with torch.no_grad():
                predictions = model(inputs).argmax(dim=-1)
            predictions, targets = accelerator.gather_for_metrics((predictions, targets))
            correct += (predictions == targets).sum().item()
            total += targets.numel()
        accelerator.print(f"epoch {epoch}: accuracy {correct / total:.3f} on {total} test samples")
        accelerator.save_state()

    accelerator.wait_for_everyone()
    accelerator.save_model(model, f"{args.project_dir}/model")
    accelerator.end_training()


if __name__ == "__main__":
    main()
