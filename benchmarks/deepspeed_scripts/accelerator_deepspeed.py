"""The same ZeRO-2 training written for the Accelerator (run with ``trainer launch --num_processes 2``).

Usage: accelerator_deepspeed.py RESULT.json STEPS FOLDER. The FSDP benchmark's Accelerator script with
`DeepSpeedStrategy`: rank 0 writes the time per step over the steady-state window and the median time of
`save_state` (engine files, full float32 weights, the hashed manifest) and `load_state`.
"""

from benchmarks.fsdp_scripts.accelerator_fsdp import main
from strategies import DeepSpeedStrategy

if __name__ == "__main__":
    main(DeepSpeedStrategy(zero_stage=2, timeout=60))
