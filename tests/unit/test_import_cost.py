"""`import trainer` must stay cheap: no optional package and no torch._dynamo at import."""

import json
import subprocess
import sys

HEAVY = ["tqdm", "torchmetrics", "tensorboard", "wandb", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "trackio",
         "swanlab", "deepspeed", "torch_xla", "torchft", "torch._dynamo", "sklearn", "yaml", "ray"]


def _modules_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nimport json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _added(code: str) -> list[str]:
    baseline = _modules_after("import torch")  # torch itself may pull some of them in (torch.hub imports tqdm)
    loaded = _modules_after(code)
    return sorted(m for m in HEAVY if m in loaded and m not in baseline)


def test_import_trainer_does_not_even_import_torch():
    loaded = _modules_after("import trainer")
    assert "torch" not in loaded


def test_both_faces_load_no_optional_package():
    assert _added("import trainer, callbacks, strategies; from trainer import Accelerator, Trainer, TrainModule") == []
