"""Pipeline stages in the Trainer face on real processes (gloo): 1F1B, Interleaved1F1B and ZBVZeroBubble on 2 processes
and 1F1B on a 2 (pp) × 2 (FSDP) mesh, against one plain process on the same samples: every process's loss for every
batch and the final full weights, with gradient accumulation and clipping; bad settings refused on every process; one
stage's exception failing every process within seconds.

Each job checks several things at once (processes are dear on 2 cores)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed]

DATA, BATCH, LAYERS = 32, 8, 4


def _dataset() -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(DATA, 6, generator=g)
    return torch.utils.data.TensorDataset(x, torch.tanh(x[:, :3] * 2))


def _module(pipelined: bool, fail_at: int | None = None, adam: bool = False) -> Any:
    from trainer import TrainModule

    class Net(TrainModule):
        """An embedding, a ModuleList of layers and a head; its forward skips what its stage does not hold."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Linear(6, 8)
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(LAYERS)])
            self.head = nn.Linear(8, 3)
            self.losses: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.embed is not None:
                x = self.embed(x)
            for layer in self.layers:
                x = torch.tanh(layer(x))
            if fail_at is not None and self.head is not None and self.trainer.global_step >= fail_at:
                raise ValueError("a stage fails on purpose")
            return self.head(x) if self.head is not None else x

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.pipeline_step(x, target=y, loss_fn=F.mse_loss) if pipelined else F.mse_loss(self(x), y)
            self.losses.append(loss.item())
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            loss = self.pipeline_eval(x, target=y, loss_fn=F.mse_loss) if pipelined else F.mse_loss(self(x), y)
            self.log("val_loss", loss)

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.pipeline_forward(batch[0]) if pipelined else self(batch[0])  # the last stage's outputs, everywhere

        def configure_optimizers(self) -> Any:
            if adam:
                return torch.optim.Adam(self.parameters(), lr=0.01)
            return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)

    return Net()


def _fit(strategy: Any, pipelined: bool, accumulate: int = 1, fail_at: int | None = None) -> dict[str, Any]:
    from trainer import Trainer

    module = _module(pipelined, fail_at)
    trainer = Trainer(strategy=strategy, accelerator="cpu", max_epochs=1, log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      accumulate_grad_batches=accumulate, gradient_clip_val=0.5)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=BATCH // trainer.strategy.data_parallel_size)
    trainer.fit(module, loader, loader)
    val_loss = float(trainer.callback_metrics["val_loss"])
    predictions = torch.cat(trainer.predict(module, loader))
    weights = trainer.strategy.module_state_dict(module)
    return {"losses": module.losses, "val_loss": val_loss, "predictions": predictions,
            "weights": {k: v.clone() for k, v in weights.items()} if trainer.is_global_zero else None}


def _pipelined(schedule: str, pp: int, accumulate: int, microbatches: int | None = None) -> dict[str, Any]:
    from strategies import FSDPStrategy, ParallelDims, PipelineConfig

    world = int(os.environ["WORLD_SIZE"])
    strategy = FSDPStrategy(parallel_dims=ParallelDims(world_size=world, pp=pp), cpu=True, timeout=60,
                            pipeline=PipelineConfig(schedule=schedule, microbatches=microbatches))
    out = _fit(strategy, True, accumulate)
    pipeline = strategy.pipeline
    assert pipeline is not None
    out["stages"] = pipeline.stage_indices
    return out


def _assert_matches(single: dict[str, Any], results: list[dict[str, Any]], dp: int = 1, tol: float = 1e-5) -> None:
    """Every process's loss for every batch (with `dp` data-parallel processes, the mean of theirs: each saw its part
    of the batch; processes of one pipeline report the same) and the full weights, against one plain process."""
    for pipeline in range(len(results) // dp):  # processes pp * dp ... pp * dp + dp - 1 hold one stage
        part = results[pipeline * dp:(pipeline + 1) * dp]
        losses = [sum(values) / dp for values in zip(*(r["losses"] for r in part))]
        assert losses == pytest.approx(single["losses"], abs=tol)
        assert sum(r["val_loss"] for r in part) / dp == pytest.approx(single["val_loss"], abs=tol)
    for rank, result in enumerate(results):  # the processes of one pipeline (same data-parallel rank) agree exactly
        assert result["losses"] == results[rank % dp]["losses"]
        if dp == 1 and "predictions" in single:  # Trainer.predict through pipeline_forward: every process, every sample
            assert torch.allclose(result["predictions"], single["predictions"], atol=tol)
    want, got = single["weights"], results[0]["weights"]
    assert want.keys() == got.keys()
    worst = max((want[k] - got[k]).abs().max().item() for k in want)
    assert worst < tol, f"weights differ by {worst}"


CASES = (("1F1B", 1), ("1F1B", 2), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2))  # (schedule, accumulate_grad_batches)


def _each_case() -> list[dict[str, Any]]:
    """One job: the four fits in turn, then Lightning's spelling, ModelParallelStrategy(pipeline_parallel_size=2)."""
    from strategies import ModelParallelStrategy

    results = [_pipelined(schedule, 2, accumulate) for schedule, accumulate in CASES]
    strategy = ModelParallelStrategy(pipeline_parallel_size=2, cpu=True, timeout=60)
    return [*results, {**_fit(strategy, True), "repr": repr(strategy)}]


@pytest.mark.timeout(300)
def test_schedules_on_2_processes_match_one_process() -> None:
    plain = {accumulate: _fit("single", False, accumulate) for accumulate in (1, 2)}
    results = run_distributed(_each_case, nprocs=2, timeout=200)
    stages = {"1F1B": [(0,), (1,)], "Interleaved1F1B": [(0, 2), (1, 3)], "ZBVZeroBubble": [(0, 3), (1, 2)]}
    for case, (schedule, accumulate) in enumerate(CASES):
        assert [r[case]["stages"] for r in results] == stages[schedule]
        _assert_matches(plain[accumulate], [r[case] for r in results])
    _assert_matches(plain[1], [r[-1] for r in results])
    assert results[0][-1]["repr"].startswith("ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=2")


def _on_4_processes() -> list[dict[str, Any]]:
    """One job: 1F1B on 2 (pp) × 2 (FSDP), then 1F1B on 2 (pp) × 2 (tensor parallel: each layer's output columns split)."""
    from strategies import FSDPStrategy, ParallelDims, PipelineConfig

    fsdp = _pipelined("1F1B", 2, 2)
    strategy = FSDPStrategy(parallel_dims=ParallelDims(world_size=4, pp=2, dp_shard=1, tp=2), cpu=True, timeout=60,
                            tp_plan={"layers.*": "colwise_rep"}, pipeline=PipelineConfig(schedule="1F1B"))
    tp = _fit(strategy, True, 2)
    assert strategy.pipeline is not None and strategy.pipeline.model is not None
    split = {name for name, p in strategy.pipeline.model.named_parameters() if type(p).__name__ == "DTensor"}
    return [fsdp, {**tp, "split": sorted(split)}, _accelerator_run("1F1B")]  # then the Accelerator on 2 (pp) × 2 (FSDP)


@pytest.mark.timeout(400)
def test_1f1b_on_2x2_pp_x_fsdp_and_pp_x_tp_meshes_matches_one_process() -> None:
    plain = _fit("single", False, 2)
    results = run_distributed(_on_4_processes, nprocs=4, timeout=300)
    fsdp, tp = [r[0] for r in results], [r[1] for r in results]
    assert [r["stages"] for r in fsdp] == [(0,), (0,), (1,), (1,)]  # pp outermost: processes 0, 1 hold stage 0
    _assert_matches(plain, fsdp, dp=2)
    _assert_matches(plain, tp)  # one data-parallel process: every process sees the whole batch
    accelerator_plain = _accelerator_run(None)
    accelerated = [r[2] for r in results]
    _assert_matches(accelerator_plain, accelerated, dp=2)
    assert all(r["norms"] == pytest.approx(accelerator_plain["norms"], rel=1e-5) for r in accelerated)
    assert tp[0]["split"] == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]  # the plan applied
    assert tp[2]["split"] == ["layers.2.bias", "layers.2.weight", "layers.3.bias", "layers.3.weight"]


def _refusals() -> list[str]:
    """Each bad setting, tried in turn on this process: the message of the ValueError it raised (or what else happened)."""
    from strategies import FSDPStrategy, ParallelDims, PipelineConfig

    world = int(os.environ["WORLD_SIZE"])
    attempts = {
        "layers": lambda: _fit(FSDPStrategy(parallel_dims=ParallelDims(world_size=world, pp=2), cpu=True, timeout=60,
                                            pipeline=PipelineConfig(schedule="Interleaved1F1B", stages_per_rank=3)), True),
        "microbatches": lambda: _fit(FSDPStrategy(parallel_dims=ParallelDims(world_size=world, pp=2), cpu=True, timeout=60,
                                                  pipeline=PipelineConfig(microbatches=1)), True),
        "batch": lambda: _fit(FSDPStrategy(parallel_dims=ParallelDims(world_size=world, pp=2), cpu=True, timeout=60,
                                           pipeline=PipelineConfig(microbatches=3)), True),
        "v": lambda: PipelineConfig(schedule="ZBVZeroBubble", stages_per_rank=3),
        "sizes": lambda: ParallelDims(world_size=world, pp=2, dp_shard=2),
    }
    messages = []
    for name, attempt in attempts.items():
        try:
            attempt()
            messages.append(f"{name}: accepted")
        except ValueError as err:
            messages.append(f"{name}: {err}")
    return messages


@pytest.mark.timeout(200)
def test_bad_settings_are_refused_on_every_process_before_any_step() -> None:
    results = run_distributed(_refusals, nprocs=2, timeout=120)
    assert results[0] == results[1]  # the same refusal on every process
    layers, microbatches, batch, v, sizes = results[0]
    assert "4 layers (layers) do not divide into 6 pipeline stages" in layers
    assert "microbatches=1) is fewer than the 2 processes" in microbatches
    assert "a batch of 8 samples does not split into 3 pipeline microbatches" in batch
    assert "stages_per_rank=3; use stages_per_rank=2" in v
    assert "pp=2 × dp_replicate=1 × dp_shard=2 × tp=1 = 4, but there are 2 processes" in sizes


def _failing_fit() -> tuple[str, float]:
    from strategies import FSDPStrategy, ParallelDims, PipelineStageError

    strategy = FSDPStrategy(parallel_dims=ParallelDims(world_size=2, pp=2), cpu=True, timeout=60)
    start = time.monotonic()
    try:
        _fit(strategy, True, fail_at=2)
    except PipelineStageError as err:
        return str(err), time.monotonic() - start
    return "no failure", time.monotonic() - start


@pytest.mark.timeout(200)
def test_a_stage_exception_fails_every_process_within_seconds() -> None:
    results = run_distributed(_failing_fit, nprocs=2, timeout=120, fresh=True)
    for message, seconds in results:  # the process-group timeout is 60 s: a process left waiting would take that long
        assert "pipeline stage [1] on process 1 failed: ValueError: a stage fails on purpose" in message
        assert seconds < 30


def _accelerator_run(schedule: str | None, pp: int = 2, accumulate: int = 2, save_to: str | None = None) -> dict[str, Any]:
    """The Accelerator's loop (None: one plain process): per-batch losses, clip norms and the full weights."""
    from strategies import PipelineConfig
    from trainer import Accelerator, ParallelismConfig

    dp = int(os.environ.get("WORLD_SIZE", "1")) // pp
    config = ParallelismConfig(pp_size=pp, dp_shard_size=dp, pp_handler=PipelineConfig(schedule=schedule)) if schedule else None
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate, parallelism_config=config)
    model = _module(False)  # the optimizer is built on the whole model, before prepare
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=BATCH // accelerator.strategy.data_parallel_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, norms = [], []
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = accelerator.pipeline_step(model, x, target=y, loss_fn=F.mse_loss) if schedule else F.mse_loss(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    x, y = next(iter(loader))
    val = accelerator.pipeline_eval(model, x, target=y, loss_fn=F.mse_loss) if schedule else F.mse_loss(model(x), y)
    out = accelerator.pipeline_forward(model, x) if schedule else model(x)
    weights = accelerator.get_state_dict(model)
    result = {"losses": losses, "norms": norms, "val_loss": val.item(), "out": out.detach(),
              "weights": {k: v.clone() for k, v in weights.items()} if accelerator.is_main_process else None}
    if schedule and save_to is not None:  # save_state, the state spoiled, load_state: the saved weights and optimizer come back
        accelerator.save_state(save_to)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        momentum = {id(p): optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
                optimizer.state[p]["momentum_buffer"].zero_()
        accelerator.load_state(save_to)
        result["restored"] = all(torch.equal(v, saved[k]) for k, v in model.state_dict().items()) and all(
            torch.equal(optimizer.state[p]["momentum_buffer"], momentum[id(p)]) for p in model.parameters())
    accelerator.end_training()
    return result


def _accelerator_runs(root: str) -> list[dict[str, Any]]:
    return [_accelerator_run(schedule, save_to=f"{root}/{schedule}") for schedule in ("1F1B", "ZBVZeroBubble")]  # one job


@pytest.mark.timeout(300)
def test_accelerator_pipeline_step_matches_one_process(tmp_path: Path) -> None:
    plain = _accelerator_run(None)
    runs = run_distributed(_accelerator_runs, str(tmp_path), nprocs=2, timeout=120)
    assert all(run[case]["restored"] for run in runs for case in range(2))  # save_state / load_state
    for case in range(2):
        results = [run[case] for run in runs]
        _assert_matches(plain, results)
        for result in results:
            assert result["norms"] == pytest.approx(plain["norms"], rel=1e-5)  # clipping over the whole pipeline
            assert torch.allclose(result["out"], plain["out"], atol=1e-6)


def _llama_stages() -> tuple[nn.Module, nn.Module]:
    """A tiny `transformers` Llama (4 decoder layers, built from its config) and the same parts in a module whose forward
    skips what its stage does not hold: the model contract of pipeline stages."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.masking_utils import create_causal_mask

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=32)
    llama = LlamaForCausalLM(config)

    class LlamaStages(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens, self.layers, self.norm = llama.model.embed_tokens, llama.model.layers, llama.model.norm
            self.rotary_emb, self.lm_head = llama.model.rotary_emb, llama.lm_head  # (rotary_emb: no parameters, on every stage)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed_tokens(x) if self.embed_tokens is not None else x
            positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            mask = create_causal_mask(config=config, inputs_embeds=h, attention_mask=None, cache=None, position_ids=positions)
            rotary = self.rotary_emb(h, position_ids=positions)
            for layer in self.layers:
                h = layer(h, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
            if self.lm_head is None:
                return h
            return self.lm_head(self.norm(h))

    return llama, LlamaStages()


def _llama_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def _llama_run(pipelined: bool) -> dict[str, Any]:
    from strategies import PipelineConfig
    from trainer import Accelerator, ParallelismConfig

    config = ParallelismConfig(pp_size=2, pp_handler=PipelineConfig(schedule="Interleaved1F1B")) if pipelined else None
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    _, model = _llama_stages()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    tokens = torch.randint(0, 64, (16, 10), generator=torch.Generator().manual_seed(3))
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for step in range(4):
        batch = tokens[4 * (step % 2):4 * (step % 2) + 4]  # two batches, each seen twice
        step_loss = accelerator.pipeline_step(model, batch, target=batch, loss_fn=_llama_loss) if pipelined else None
        loss = step_loss if step_loss is not None else _llama_loss(model(batch), batch)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    weights = accelerator.get_state_dict(model)
    result = {"losses": losses, "held": sorted({k.split(".")[0] + ("." + k.split(".")[1] if k.startswith("layers") else "")
                                               for k in model.state_dict()}),
              "weights": {k: v.clone() for k, v in weights.items()} if accelerator.is_main_process else None}
    accelerator.end_training()
    return result


@pytest.mark.timeout(300)
def test_a_tiny_llama_splits_and_trains_as_one_process() -> None:
    pytest.importorskip("transformers")
    llama, stages = _llama_stages()
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    assert torch.allclose(stages(tokens), llama(input_ids=tokens).logits, atol=1e-6)  # the same model
    plain = _llama_run(False)
    results = run_distributed(_llama_run, True, nprocs=2, timeout=120)
    assert results[0]["held"] == ["embed_tokens", "layers.0", "layers.2"]  # Interleaved1F1B: stages 0 and 2
    assert results[1]["held"] == ["layers.1", "layers.3", "lm_head", "norm"]
    _assert_matches({**plain, "val_loss": 0.0}, [{**r, "val_loss": 0.0} for r in results])
    assert plain["losses"][2] < plain["losses"][0] and plain["losses"][3] < plain["losses"][1]  # it trains
