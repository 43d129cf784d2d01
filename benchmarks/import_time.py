"""Import time: a whole fresh interpreter per measurement, paired with ``import torch`` in the same round."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from benchmarks.common import Section, interleaved, repo_env, run_python, timed_process

STATEMENTS = {
    "import torch": "import torch",
    "import trainer": "import trainer",
    "from trainer import Accelerator": "from trainer import Accelerator",
    "from trainer import Trainer": "from trainer import Trainer",
    "from trainer import Trainer, Accelerator, TrainModule": "from trainer import Trainer, Accelerator, TrainModule",
}
TARGETS = {"from trainer import Trainer, Accelerator, TrainModule": "≤ 1.10", "import trainer": "≤ 1.10"}

# Modules that must stay out of a plain import: optional packages and torch's compiler stack.
FORBIDDEN = (
    "torch._dynamo", "torch._inductor", "tqdm", "yaml", "safetensors", "torchmetrics", "tensorboard", "wandb", "mlflow",
    "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio", "deepspeed", "torch_xla", "lightning", "accelerate",
)


def check_import_contents() -> str:
    """Which optional modules ``from trainer import Trainer, Accelerator, TrainModule`` adds to ``import torch``'s."""
    code = (
        "import json, sys\n"
        "import torch\n"
        "before = set(sys.modules)\n"
        "from trainer import Trainer, Accelerator, TrainModule\n"
        "added = set(sys.modules) - before\n"
        f"print(json.dumps(sorted(m for m in added if any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r}))))\n"
    )
    loaded = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    if loaded:
        return f"CHECK FAILED: `from trainer import Trainer, Accelerator, TrainModule` imports {loaded}; import them lazily."
    return ("`from trainer import Trainer, Accelerator, TrainModule` adds none of these to what `import torch` loads: "
            + ", ".join(FORBIDDEN) + " (checked).")


def import_cost_after_torch(env: dict[str, str] | None = None) -> float:
    """Seconds ``from trainer import Trainer, Accelerator, TrainModule`` takes once torch is imported (``-X importtime``)."""
    code = "import torch; from trainer import Trainer, Accelerator, TrainModule"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env or repo_env(), cwd="/",
                          capture_output=True, text=True, timeout=300, check=True)
    lines = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:") and line.count("|") == 2]
    names = [parts[2].rstrip() for parts in lines]
    after = names.index(" torch") + 1 if " torch" in names else 0
    top_level = [parts for parts in lines[after:] if not parts[2][1:].startswith(" ")]  # one space before a top-level name
    return sum(int(parts[1]) for parts in top_level) / 1e6


def run(*, quick: bool) -> list[Section]:
    rounds = 3 if quick else 5  # full: a multiple of the 5 contenders, so each takes every position equally
    env = {k: v for k, v in repo_env().items() if k != "PYTHONDONTWRITEBYTECODE"}  # cached bytecode, as in a normal install
    run_python("import trainer, trainer.fit.trainer, trainer.accelerator", env=env)  # writes the bytecode caches once
    contenders = {name: (lambda code=code: timed_process([sys.executable, "-c", code], env=env)) for name, code in STATEMENTS.items()}
    rows = interleaved(contenders, "import torch", rounds, unit="s")
    for name, target in TARGETS.items():
        rows[name].target = target
    after_torch = [import_cost_after_torch(env) for _ in range(3)]
    notes = [
        check_import_contents(),
        (f"With torch already imported, `from trainer import Trainer, Accelerator, TrainModule` takes "
        f"{1e3 * statistics.median(after_torch):.0f} ms more (median of 3 `python -X importtime` runs; "
        f"{statistics.median(after_torch) / rows['import torch'].median:.1%} of `import torch`)."),
        (f"{rounds} interleaved rounds; each time is a whole `python -c ...` process (interpreter start included, bytecode "
        "caches written beforehand), so `import torch` is the floor every framework built on torch pays."),
    ]
    return [Section("Import time (whole process)", "`import torch`", list(rows.values()), notes)]
