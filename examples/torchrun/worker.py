"""A plain gloo DDP worker started by torchrun; flotilla starts one torchrun per node.

With `flotilla.task.ranks: per_node`, flotilla runs the task command once per node and sets
torchrun's own variables (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
PET_MASTER_PORT), so a bare `torchrun worker.py` joins the right world; torchrun then starts
PET_NPROC_PER_NODE workers and gives each RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, ...

Every worker writes worker_rank<R>.json into FLOTILLA_JOB_DIR (the current directory when run
by hand): the variables torchrun gave it, its host and the result of an all_reduce.

By hand (one node): torchrun --nproc-per-node 2 worker.py
"""

import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ENV_VARS = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "NODE_RANK", "FLOTILLA_JOB_DIR", "FLOTILLA_CONFIG",
    "FLOTILLA_JOB_NUM",
]


def main():
    dist.init_process_group("gloo")  # env://, from the variables torchrun set
    rank, world = dist.get_rank(), dist.get_world_size()

    # A collective whose result is known: the sum of the ranks.
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)

    # One DDP step on a tiny model: the gradients are averaged, the weights stay equal.
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.full((4, 3), float(rank + 1))
    model(x).pow(2).mean().backward()
    opt.step()

    out_dir = os.environ.get("FLOTILLA_JOB_DIR", os.getcwd())
    seen = {
        "env": {k: os.environ.get(k) for k in ENV_VARS},
        "host": socket.gethostname(),
        "allreduce_sum": total.item(),
        "weight": model.module.weight.detach().flatten().tolist(),
    }
    with open(os.path.join(out_dir, f"worker_rank{rank}.json"), "w") as f:
        json.dump(seen, f, indent=2)
    print(f"worker {rank}/{world} (node {os.environ.get('GROUP_RANK')}): "
          f"all_reduce sum {total.item():g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
