"""Accelerate's own example scripts, run offline under Accelerate and, renamed, under trainwright; their traces compared.

The scripts are in ``tests/fixtures/accelerate_examples/`` as Accelerate ships them (see the README there). Offline
stand-ins replace the network: `build_offline_hub` writes a tiny BERT under the name ``bert-base-cased`` into a
Hugging Face cache (``HF_HOME``, read by ``transformers`` itself with ``HF_HUB_OFFLINE=1``) and a small synthetic
GLUE/MRPC that `tests.helpers.offline_hub` serves as ``datasets.load_dataset`` (with ``evaluate.load``).
`run_case` runs one case with `tests.helpers.accelerate_example_runner`, which records every forward of the model: under
Accelerate in a subprocess (``torchrun`` on two processes); for us in processes forked from the tests' warm server
(`tests.helpers.scripts.run_python`, with the variables ``trainer launch`` and ``torchrun`` set), and for one case
through a real ``trainer launch``.

Recording Accelerate's traces (``tests/fixtures/accelerate_examples/traces.json``) needs Accelerate importable by this
project's Python; from a side venv that has it::

    .venv/bin/python tests/helpers/accelerate_examples.py --record examples \\
        --accelerate-site /path/to/side-venv/lib/python3.11/site-packages

``--record test_utils`` records which of Accelerate's ``test_utils/scripts`` (copied into ``test_utils_scripts/``)
pass under Accelerate itself on two processes here (``accelerate_results.json``).

This module imports neither framework nor ``transformers`` at import time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "tests" / "fixtures" / "accelerate_examples"
TRACES = EXAMPLES / "traces.json"
RUNNER = Path(__file__).with_name("accelerate_example_runner.py")
OFFLINE_HUB = Path(__file__).with_name("offline_hub")
MODEL_NAME = "bert-base-cased"
# log_with="all" starts every tracker installed; the runs see TensorBoard only (these need accounts or servers)
ONLINE_TRACKERS = ("wandb", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "trackio", "swanlab")
REVISION = "0" * 40


def accelerate_to_trainer(source: str) -> str:
    """`source` with ``accelerate`` replaced by ``trainer`` in its import statements, and nothing else.

    Two paths have their documented counterparts: ``accelerate.utils.<file>`` (Accelerate's file layout inside its
    utils) is ``trainer.utils``, and Accelerate's own test helpers ``accelerate.test_utils[.<file>]`` are
    `tests.helpers.accelerate_test_utils`.
    """
    start = r"(?m)^(\s*(?:from|import)\s+)"
    source = re.sub(start + r"accelerate\.test_utils(?:\.\w+)?\b", r"\g<1>tests.helpers.accelerate_test_utils", source)
    source = re.sub(start + r"accelerate\.utils\.\w+\b", r"\g<1>trainer.utils", source)
    return re.sub(start + r"accelerate\b", r"\g<1>trainer", source)


@dataclass(frozen=True)
class Case:
    """One run of one example: `script` (relative to the examples folder) with `args` on `processes` processes."""

    name: str
    script: str
    args: tuple[str, ...] = ()
    processes: int = 1
    files: tuple[str, ...] = field(default=())  # what the run must leave in its working directory
    launched: bool = False  # started by a real ``trainer launch`` (else forked, with the variables it would set)


CASES = [
    Case("nlp_example", "nlp_example.py", ("--cpu",)),
    Case("nlp_example_2proc", "nlp_example.py", ("--cpu",), processes=2, launched=True),
    Case("complete_nlp_example", "complete_nlp_example.py",
         ("--cpu", "--with_tracking", "--checkpointing_steps", "epoch", "--output_dir", "out", "--project_dir", "logs"),
         files=("out/epoch_0", "out/epoch_2", "logs")),
    Case("run_me", "config_yaml_templates/run_me.py"),
    Case("run_me_2proc", "config_yaml_templates/run_me.py", processes=2),
    Case("tracking", "by_feature/tracking.py", ("--cpu", "--with_tracking", "--project_dir", "logs"), files=("logs",)),
    Case("checkpointing", "by_feature/checkpointing.py", ("--cpu", "--checkpointing_steps", "2", "--output_dir", "out"),
         files=("out/step_2", "out/step_10")),
    Case("checkpointing_2proc", "by_feature/checkpointing.py", ("--cpu", "--checkpointing_steps", "epoch", "--output_dir", "out"),
         processes=2, files=("out/epoch_0", "out/epoch_2")),
    Case("gradient_accumulation", "by_feature/gradient_accumulation.py", ("--cpu", "--gradient_accumulation_steps", "2")),
    Case("gradient_accumulation_2proc", "by_feature/gradient_accumulation.py", ("--cpu", "--gradient_accumulation_steps", "2"),
         processes=2),
    Case("cross_validation", "by_feature/cross_validation.py", ("--cpu", "--num_folds", "2")),
    Case("memory", "by_feature/memory.py", ("--cpu",)),
    Case("local_sgd_2proc", "by_feature/local_sgd.py", ("--cpu", "--local_sgd_steps", "2", "--gradient_accumulation_steps", "1"),
         processes=2),
    Case("profiler", "by_feature/profiler.py", ("--cpu", "--output_trace_dir", "traces"), files=("traces",)),
    Case("early_stopping", "by_feature/early_stopping.py", ("--cpu",)),
    Case("automatic_gradient_accumulation", "by_feature/automatic_gradient_accumulation.py", ("--cpu",)),
    Case("multi_process_metrics_2proc", "by_feature/multi_process_metrics.py", ("--cpu",), processes=2),
    Case("ddp_comm_hook_fp16_2proc", "by_feature/ddp_comm_hook.py", ("--cpu", "--ddp_comm_hook", "fp16"), processes=2),
]
CASES_BY_NAME = {case.name: case for case in CASES}

_WORDS = ["the", "company", "said", "shares", "rose", "fell", "percent", "market", "bank", "deal", "year", "quarter",
          "profit", "report", "new", "chief", "officer", "sales", "stock", "price", "analysts", "expected", "billion",
          "million", "government", "court", "week", "plan", "group"]


def _mrpc(rng: random.Random, n: int, start: int) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    for i in range(n):
        first = [rng.choice(_WORDS) for _ in range(rng.randint(4, 11))]
        label = rng.randint(0, 1)
        if label:  # a paraphrase: the same words, two swapped, one replaced
            second = list(first)
            a, b = rng.sample(range(len(second)), 2)
            second[a], second[b] = second[b], second[a]
            second[rng.randrange(len(second))] = rng.choice(_WORDS)
        else:
            second = [rng.choice(_WORDS) for _ in range(rng.randint(4, 11))]
        columns["sentence1"].append(" ".join(first).capitalize() + ".")
        columns["sentence2"].append(" ".join(second).capitalize() + ".")
        columns["label"].append(label)
        columns["idx"].append(start + i)
    return columns


def build_offline_hub(root: Path) -> dict[str, str]:
    """Write the tiny ``bert-base-cased`` (a Hugging Face cache under ``root/hf``) and the synthetic GLUE/MRPC
    (64 train, 40 validation, 24 test pairs) under `root`; return the environment variables that point a script at them.
    Deterministic: the same files every time (weights from ``torch.manual_seed(0)``)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    snapshot = root / "hf" / "hub" / f"models--{MODEL_NAME}" / "snapshots" / REVISION
    if not (snapshot / "model.safetensors").is_file():
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot.parents[1] / "refs").mkdir(exist_ok=True)
        (snapshot.parents[1] / "refs" / "main").write_text(REVISION)
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *sorted(set(_WORDS) | {w.capitalize() for w in _WORDS})]
        (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tokenizer = BertTokenizerFast(vocab_file=str(root / "vocab.txt"), do_lower_case=False, model_max_length=64)
        tokenizer.save_pretrained(str(snapshot))
        config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=64, architectures=["BertModel"])
        torch.manual_seed(0)
        BertModel(config).save_pretrained(str(snapshot))
        rng = random.Random(0)
        splits = {"train": _mrpc(rng, 64, 0), "validation": _mrpc(rng, 40, 1000), "test": _mrpc(rng, 24, 2000)}
        (root / "datasets").mkdir(exist_ok=True)
        (root / "datasets" / "nyu-mll--glue--mrpc.json").write_text(json.dumps(splits))
    return {"HF_HOME": str(root / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "OFFLINE_HUB_DATA": str(root), "TOKENIZERS_PARALLELISM": "false", "DO_NOT_TRACK": "1"}


@dataclass
class Run:
    """What one run left: each process's model forwards, and the lines of output that carry results."""

    ranks: list[list[dict[str, Any]]]
    results: list[str]
    scalars: dict[str, list[list[float]]]
    stdout: str


def _tensorboard_scalars(workdir: Path) -> dict[str, list[list[float]]]:
    """Every scalar the run logged to TensorBoard under `workdir`: ``{"<run folder>/<tag>": [[step, value], ...]}``."""
    files = sorted(workdir.rglob("events.out.tfevents.*"))
    if not files:
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = {}
    for file in files:
        acc = EventAccumulator(str(file))
        acc.Reload()
        folder = file.parent.relative_to(workdir).as_posix()
        for tag in acc.Tags()["scalars"]:
            scalars[f"{folder}/{tag}"] = [[float(e.step), float(e.value)] for e in acc.Scalars(tag)]
    return scalars


def _results(stdout: str) -> list[str]:
    """The output lines that report results (metrics, predictions, the state printed by run_me)."""
    keep = re.compile(r"accuracy|=====|Distributed environment|Num processes|Process index|Mixed precision|fold|epoch \d")
    return [line.strip() for line in stdout.splitlines() if keep.search(line)]


def run_case(case: Case, framework: str, hub_env: dict[str, str], workdir: Path, *, accelerate_site: str | None = None,
             timeout: float = 240) -> Run:
    """Run `case` under `framework` (``"accelerate"``: the script as shipped; ``"trainer"``: renamed) in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / "_trace"
    paths = [str(ROOT), str(OFFLINE_HUB), *([accelerate_site] if accelerate_site else [])]
    env = {**os.environ, **hub_env, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    for name in list(env):
        if name.startswith(("ACCELERATE_", "TRAINWRIGHT_")) or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            del env[name]
    inner = [str(RUNNER), "--framework", framework, "--trace", str(trace), "--without", ",".join(ONLINE_TRACKERS), str(EXAMPLES / case.script), *case.args]
    if framework == "trainer" and not case.launched:  # (what the script does is the subject, not its launch)
        from tests.helpers.scripts import launch_environment, run_python

        launch = ("--num_processes", str(case.processes), "--main_process_port", "0")
        env.update(launch_environment(*launch) if case.processes > 1 else {})
        proc = run_python([sys.executable, *inner], cwd=workdir, env=env, timeout=timeout, nprocs=case.processes)
    else:
        if case.processes == 1:
            cmd = [sys.executable, *inner]
        elif framework == "trainer":
            cmd = [sys.executable, "-m", "trainer", "launch", "--num_processes", str(case.processes), "--main_process_port", "0", *inner]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(case.processes), *inner]
            # what `accelerate launch` sets for a multi-CPU config: without it, an Accelerator(cpu=False) started by torchrun
            # on a machine without GPUs runs each process alone (DistributedType.NO)
            env["ACCELERATE_USE_CPU"] = "true"
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{case.name} under {framework} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    ranks = []
    for rank in range(case.processes):
        lines = (trace / f"rank{rank}.jsonl").read_text().splitlines()
        ranks.append([json.loads(line) for line in lines])
    return Run(ranks, _results(proc.stdout), _tensorboard_scalars(workdir), proc.stdout)


def differences(expected: dict[str, Any], got: Run, rel: float = 1e-5) -> list[str]:
    """How `got` differs from `expected` (a recorded run): per process, every forward's batch and loss, then the results."""
    found = []
    for rank, (want, have) in enumerate(zip(expected["ranks"], got.ranks, strict=True)):
        if len(want) != len(have):
            found.append(f"process {rank}: {len(have)} forwards, expected {len(want)}")
        for i, (w, h) in enumerate(zip(want, have)):
            if (w["train"], w["batch"], w["shapes"]) != (h["train"], h["batch"], h["shapes"]):
                found.append(f"process {rank} forward {i}: batch {h['batch']} {h['shapes']} (train={h['train']}), "
                             f"expected {w['batch']} {w['shapes']} (train={w['train']})")
            elif (w["loss"] is None) != (h["loss"] is None) or (
                    w["loss"] is not None and not math.isclose(w["loss"], h["loss"], rel_tol=rel, abs_tol=rel)):
                found.append(f"process {rank} forward {i}: loss {h['loss']!r}, expected {w['loss']!r}")
    want_scalars = expected.get("scalars", {})
    if sorted(want_scalars) != sorted(got.scalars):
        found.append(f"TensorBoard tags {sorted(got.scalars)}, expected {sorted(want_scalars)}")
    for tag in sorted(set(want_scalars) & set(got.scalars)):
        w_steps, h_steps = [s for s, _ in want_scalars[tag]], [s for s, _ in got.scalars[tag]]
        close = all(math.isclose(w, h, rel_tol=rel, abs_tol=rel) for (_, w), (_, h) in zip(want_scalars[tag], got.scalars[tag]))
        if w_steps != h_steps or not close:
            found.append(f"TensorBoard {tag}: {got.scalars[tag]}, expected {want_scalars[tag]}")
    interleaved = len(expected["ranks"]) > 1  # (lines every process prints reach the output in any order)
    if (sorted if interleaved else list)(expected["results"]) != (sorted if interleaved else list)(got.results):
        found.append(f"printed results differ:\n  got      {got.results}\n  expected {expected['results']}")
    return found


TEST_UTILS_SCRIPTS = EXAMPLES / "test_utils_scripts"
TEST_UTILS_RESULTS = TEST_UTILS_SCRIPTS / "accelerate_results.json"


def run_test_utils_script(name: str, framework: str, workdir: Path, *, processes: int = 2, accelerate_site: str | None = None,
                          timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """Run Accelerate's ``test_utils/scripts/<name>.py`` on `processes` gloo processes (renamed for ``"trainer"``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    paths = [str(ROOT), *([accelerate_site] if accelerate_site else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}
    for var in list(env):
        if var.startswith(("ACCELERATE_", "TRAINWRIGHT_")) or var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            del env[var]
    inner = [str(RUNNER), "--framework", framework, "--trace", str(workdir / "_trace"), str(TEST_UTILS_SCRIPTS / f"{name}.py")]
    if framework == "trainer":  # forked as `trainer launch` would start them (the scripts' checks are the subject)
        from tests.helpers.scripts import launch_environment, run_python

        env.update(launch_environment("--num_processes", str(processes), "--main_process_port", "0"))
        return run_python([sys.executable, *inner], cwd=workdir, env=env, timeout=timeout, nprocs=processes)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), *inner]
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def first_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The first exception line a rank printed (``[rankN]: SomeError: ...``), or the exit status."""
    for line in (proc.stdout + proc.stderr).splitlines():
        if re.match(r"(\[rank\d+\]: )?\w+(Error|Exception): ", line):
            return re.sub(r"^\[rank\d+\]: ", "", line.strip())[:400]
    return f"exit status {proc.returncode}"


def record_test_utils(accelerate_site: str | None, workdir: Path) -> None:
    """Run each of Accelerate's test_utils scripts under Accelerate on two processes; write whether it passed."""
    import importlib.metadata

    sys.path[:0] = [accelerate_site] if accelerate_site else []
    results: dict[str, Any] = {"accelerate": importlib.metadata.version("accelerate"), "processes": 2, "scripts": {}}
    for script in sorted(TEST_UTILS_SCRIPTS.glob("test_*.py")):
        proc = run_test_utils_script(script.stem, "accelerate", workdir / script.stem, accelerate_site=accelerate_site)
        results["scripts"][script.stem] = {"passed": proc.returncode == 0, **({} if proc.returncode == 0 else {"error": first_error(proc)})}
        print(script.stem, results["scripts"][script.stem], flush=True)
    TEST_UTILS_RESULTS.write_text(json.dumps(results, indent=1) + "\n")


def record(accelerate_site: str | None, workdir: Path, names: list[str]) -> None:
    """Run every case (or `names`) under Accelerate and write their traces to `TRACES`."""
    import importlib.metadata

    hub_env = build_offline_hub(workdir / "hub")
    recorded = json.loads(TRACES.read_text()) if TRACES.exists() else {"cases": {}}
    sys.path[:0] = [accelerate_site] if accelerate_site else []
    recorded["versions"] = {pkg: importlib.metadata.version(pkg) for pkg in ("accelerate", "torch", "transformers")}
    for case in CASES:
        if names and case.name not in names:
            continue
        try:
            run = run_case(case, "accelerate", hub_env, workdir / case.name, accelerate_site=accelerate_site)
        except AssertionError as err:  # recorded: the suite expects the same failure of ours
            recorded["cases"][case.name] = {"error": str(err)[-1500:]}
            print(case.name, "FAILED under Accelerate:", str(err)[-300:])
            continue
        recorded["cases"][case.name] = {"ranks": run.ranks, "results": run.results, "scalars": run.scalars}
        print(case.name, [len(r) for r in run.ranks], run.results[-1:] if run.results else "", flush=True)
    TRACES.write_text(json.dumps(recorded, indent=None, separators=(",", ":")) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", choices=["examples", "test_utils"], required=True)
    parser.add_argument("--accelerate-site", default=None, help="a site-packages folder that holds accelerate")
    parser.add_argument("--workdir", default="/tmp/accelerate_examples_record")
    parser.add_argument("cases", nargs="*")
    opts = parser.parse_args()
    if opts.record == "test_utils":
        record_test_utils(opts.accelerate_site, Path(opts.workdir))
    else:
        record(opts.accelerate_site, Path(opts.workdir), opts.cases)


if __name__ == "__main__":
    main()
