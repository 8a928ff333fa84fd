"""Demo: train the example GPT with DeepSpeed ZeRO-3, FSDP2 and DDP on 4 CPU ranks (2 emulated nodes x 2),
each with gloo and with pccl, then print a side-by-side table and write a loss and step-time plot.

    python examples/gpt/demo.py                          # all three frameworks: ~2.5 min on 2 cores
    python examples/gpt/demo.py --frameworks deepspeed   # the headline only: ~1 min
    python examples/gpt/demo.py --frameworks moe         # the mixture-of-experts GPT (all-to-alls): ~30 s
    python examples/gpt/demo.py --testbed 1gbit,200mbit --compression all_gather:int8,reduce_scatter:bf16,all_reduce:bf16
    python examples/gpt/demo.py --testbed 200mbit --delay 20ms --frameworks deepspeed   # links with 20 ms round trip

Every run is the ordinary training script under ``mpiexec`` (the same seed, so the loss curves of the
two backends coincide); the demo collects their ``--json`` output into ``--out``. With ``--testbed RATES``
(root: network namespaces) the nodes are testbed namespaces joined by links shaped to each rate in turn,
brought up for the runs and always torn down; ``--compression SPEC`` adds a pccl run with those wire formats
(``pccl+c`` in the table).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from report import comparison_table, plot_runs

from pccl_torch.testbed import launch as testbed_launch
from pccl_torch.testbed import net as testbed_net

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LOG_PREFIX = "gpt: "  # what the scripts' logger writes; everything else (DeepSpeed, builds) goes to the log


@dataclass(frozen=True, slots=True)
class Script:
    file: str
    comm_flag: str
    steps: int
    """Default steps in the demo."""


SCRIPTS = {
    "deepspeed": Script("train_deepspeed.py", "--comm_backend", 50),
    "fsdp": Script("train_fsdp.py", "--comm", 40),
    "ddp": Script("train_ddp.py", "--comm", 40),
    "moe": Script("train_moe.py", "--comm", 40),  # not in the default list: --frameworks moe
}
DEFAULT_FRAMEWORKS = "deepspeed,fsdp,ddp"


def mpiexec() -> str:
    """The mpiexec next to this Python (the MPI wheel's), else the one on PATH."""
    candidate = Path(sys.prefix) / "bin" / "mpiexec"
    found = str(candidate) if candidate.exists() else shutil.which("mpiexec")
    if not found:
        raise SystemExit("no mpiexec found: install the project (make install) so the MPI wheel provides it")
    return found


def environment(local_size: int, device: str = "cpu") -> dict[str, str]:
    env = dict(os.environ)
    env["PCCL_LOCAL_SIZE"] = str(local_size)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))  # DeepSpeed's build, kept
    env.setdefault("DS_ACCELERATOR", device)
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    env.pop("PCCL_ALGO", None)
    return env


COMPRESSED = "pccl+c"
"""The label of the pccl run with ``--compression``."""


def run(framework: str, comm: str, args: argparse.Namespace, testbed: testbed_net.TestbedConfig | None = None,
        tag: str = "") -> dict:
    """One training run under mpiexec (in the testbed's namespaces with ``testbed``); echoes its step lines,
    keeps the rest in ``<out>/<name>.log``."""
    script = SCRIPTS[framework]
    name = f"{framework}-{comm}{tag}"
    out_json, out_log = args.out / f"{name}.json", args.out / f"{name}.log"
    steps = args.steps or script.steps
    program = [sys.executable, str(HERE / script.file), script.comm_flag, "pccl" if comm == COMPRESSED else comm,
               "--steps", str(steps), "--log-every", str(max(1, steps // 4)), "--json", str(out_json),
               "--device", args.device, *args.model,
               *(["--compression", args.compression] if comm == COMPRESSED else [])]
    env = environment(args.local_size, args.device)
    if testbed is None:
        command = [mpiexec(), "-n", str(args.ranks), *program]
    else:
        command = testbed_launch.mpiexec_command(testbed, program, nprocs=args.ranks, per_node=args.local_size)
        env = testbed_launch.run_environment(testbed, env)
    print(f"\n== {name}: {' '.join(program[1:])}", flush=True)
    started = time.perf_counter()
    with out_log.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if line.startswith(LOG_PREFIX):
                print("  " + line[len(LOG_PREFIX):], end="", flush=True)
        code = proc.wait()
    if code != 0 or not out_json.exists():
        tail = "".join(out_log.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"{name} failed (exit {code}); the end of {out_log}:\n{tail}")
    result = json.loads(out_json.read_text())
    result["comm"] = comm
    training = sum(s["seconds"] for s in result["steps"])
    print(f"  ({time.perf_counter() - started:.0f} s, of which {training:.0f} s training steps)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=DEFAULT_FRAMEWORKS,
                        help=f"comma-separated, from {', '.join(SCRIPTS)} (default: {DEFAULT_FRAMEWORKS})")
    parser.add_argument("--comms", default="gloo,pccl", help="backends to compare; the first is the baseline")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--local-size", type=int, default=2, help="ranks per emulated node (PCCL_LOCAL_SIZE)")
    parser.add_argument("--steps", type=int, help="steps of every run (default: 50 DeepSpeed, 40 the others)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "gpt", help="JSON, logs and the plot")
    parser.add_argument("--compression", help="also run pccl with these wire formats (PCCL_COMPRESSION syntax)")
    parser.add_argument("--testbed", metavar="RATES",
                        help="run across testbed namespaces (root), once per link rate (comma list: 1gbit,200mbit)")
    parser.add_argument("--delay", metavar="RTT",
                        help="with --testbed: round-trip time added between two nodes (20ms: pccl-testbed up --delay)")
    parser.add_argument("--n-layer", type=int, help="model layers (the scripts' default otherwise)")
    parser.add_argument("--n-embd", type=int, help="model width (the scripts' default otherwise)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="train on host tensors, or each rank on its GPU (local rank modulo the GPUs); with "
                             "cuda, --comms nccl,pccl puts torch's NCCL beside pccl")
    args = parser.parse_args()
    args.out = args.out.resolve()  # the ranks' working directory is not ours under the testbed: absolute --json paths
    frameworks, comms = args.frameworks.split(","), args.comms.split(",")
    if unknown := set(frameworks) - set(SCRIPTS):
        parser.error(f"unknown frameworks {sorted(unknown)}; choose from {', '.join(SCRIPTS)}")
    if args.compression:
        comms.append(COMPRESSED)
    args.model = [f for flag, value in (("--n-layer", args.n_layer), ("--n-embd", args.n_embd)) if value
                  for f in (flag, str(value))]
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    settings: list[tuple[str, testbed_net.TestbedConfig | None]] = [("", None)]
    if args.delay and not args.testbed:
        parser.error("--delay needs --testbed")
    if args.testbed:
        delayed = f"-rtt{args.delay}" if args.delay else ""
        settings = [(f"-{rate}{delayed}", testbed_net.TestbedConfig(nodes=args.ranks // args.local_size, rate=rate,
                                                                    delay=args.delay, prefix="pccldemo",
                                                                    subnet="10.78.0.0/24"))
                    for rate in args.testbed.split(",")]
    for tag, testbed in settings:
        try:
            if testbed is not None:
                testbed_net.down(testbed.prefix)
                testbed_net.up(testbed)
            runs = [run(framework, comm, args, testbed, tag) for framework in frameworks for comm in comms]
        except testbed_net.TestbedError as exc:
            raise SystemExit(f"demo: the testbed cannot run here: {exc}") from exc
        finally:
            if testbed is not None:
                testbed_net.down(testbed.prefix)
        plot = args.out / f"demo{tag}.png"
        plot_runs(runs, plot)
        where = (f"testbed: {args.ranks // args.local_size} namespaces x {args.local_size} ranks, links "
                 f"{testbed.rate}" + (f", round trip {testbed.delay}" if testbed.delay else "") if testbed else None)
        table = comparison_table(runs, baseline=comms[0], where=where)
        (args.out / f"demo{tag}.txt").write_text(table + "\n")
        print("\n" + table)
        print(f"\nplot: {plot.relative_to(ROOT) if plot.is_relative_to(ROOT) else plot}; table: demo{tag}.txt, "
              f"runs: {args.out}/*{tag}.json")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
