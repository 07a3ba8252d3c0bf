"""Which commands run on several processes, and the refusal of the others when a launcher starts several.

``grpo``, ``rloo`` and ``ppo`` train on several processes (``accelerate launch``, ``torchrun``): each process rolls
out its own prompts and one of them writes the outputs. Every other command that loads a model has no such path:
under a launcher each process ran the whole command, N copies writing the same files (rft's and dpo's round log
and evaluate-policy's trials log got every row N times, and a CPU budget crossed in different rounds left a process
in a collective its peer had left), so it is refused before anything loads. ``prepare-models`` is not: it builds
each shipped model once under a file lock, which several processes share safely.
"""

from __future__ import annotations

import os

__all__ = ["MULTI_PROCESS", "SIZE_VARIABLES", "launched_processes", "single_process"]

MULTI_PROCESS = ("grpo", "rloo", "ppo")

# where a launcher says how many processes it started, read in accelerate's order: torchrun's (also accelerate
# launch's for GPUs and multi_cpu.yaml), then MPI's (accelerate's own MULTI_CPU type launches through mpirun)
SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_processes() -> tuple[int, str | None]:
    """How many processes the launcher started, and the variable that says so: (1, None) without a launcher. The
    first of ``SIZE_VARIABLES`` that holds an integer counts, as accelerate reads them."""
    for name in SIZE_VARIABLES:
        try:
            return int(os.environ[name]), name
        except (KeyError, ValueError):
            continue
    return 1, None


def single_process(command: str) -> None:
    """Refuse ``command`` (one with no multi-process path) when a launcher started several processes; called first
    by such a command's ``main``, before any option, file or model is read. Its ``SystemExit`` message becomes
    ``pmi-reward``'s one-line error and exit code 2. A process started by a launched one (a reward server spawned by
    a training script under torchrun) inherits the variable: the message says to remove it there."""
    processes, name = launched_processes()
    if processes > 1:
        raise SystemExit(
            f"{command} runs on one process, but {name}={processes} says a launcher (accelerate launch, torchrun, "
            f"mpirun) started {processes}: run it without one (started from a launched process, with {name} removed "
            f"from its environment); {', '.join(MULTI_PROCESS[:-1])} and {MULTI_PROCESS[-1]} run on several processes"
        )
