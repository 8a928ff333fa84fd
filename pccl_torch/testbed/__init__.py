"""Emulated multi-node testbed: Linux network namespaces as nodes, joined by rate-shaped links, with
MPI ranks launched into them (``pccl-testbed``; needs root and iproute2).

    from pccl_torch import testbed
    config = testbed.TestbedConfig(nodes=2, rate="1gbit")
    testbed.up(config)
    command = testbed.mpiexec_command(config, ["python", "train.py"], nprocs=4)   # 2 ranks per node
    subprocess.run(command, env=testbed.run_environment(config))
    testbed.down(config.prefix)
"""

from pccl_torch.testbed.launch import environment, mpiexec_command, run_environment, torchrun_commands
from pccl_torch.testbed.net import (TestbedConfig, TestbedError, check_tools, down, load_config, parse_rate,
                                    status, up)

__all__ = ["TestbedConfig", "TestbedError", "check_tools", "down", "environment", "load_config",
           "mpiexec_command", "parse_rate", "run_environment", "status", "torchrun_commands", "up"]
