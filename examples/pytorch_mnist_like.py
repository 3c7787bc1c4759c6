"""Data-parallel training of a small CNN on synthetic MNIST-shaped data with
hora.torch (a drop-in for horovod.torch). Every rank trains on its own shard,
gradients are averaged by DistributedOptimizer, and every rank prints its loss.

    horarun -np 2 /usr/bin/python3 examples/pytorch_mnist_like.py
    # or by hand: HORA_RANK=r HORA_SIZE=2 HORA_STORE_ADDR=127.0.0.1 HORA_SECRET=s ... (README)

The synthetic task is learnable (labels come from a fixed random teacher), so
the loss falls; rank 0 checks at the end that every rank holds the same weights.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import hora.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, stride=2)
        self.conv2 = nn.Conv2d(8, 16, 5, stride=2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def synthetic_shard(rank, n, seed=0):
    """n images for this rank; labels from a fixed random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(28 * 28, 10, generator=g)
    g.manual_seed(seed + 1000 + rank)
    x = torch.randn(n, 1, 28, 28, generator=g)
    y = (x.flatten(1) @ teacher).argmax(1)
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples-per-rank", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--fp16-allreduce", action="store_true")
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different init per rank: the broadcast below makes them equal
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)

    x, y = synthetic_shard(hvd.rank(), args.samples_per_rank)
    for epoch in range(args.epochs):
        total = 0.0
        for i in range(0, len(x), args.batch_size):
            opt.zero_grad()
            loss = F.cross_entropy(model(x[i:i + args.batch_size]), y[i:i + args.batch_size])
            loss.backward()
            opt.step()
            total += loss.item() * len(x[i:i + args.batch_size])
        local = total / len(x)
        avg = hvd.allreduce(torch.tensor(local), name="epoch_loss").item()
        print("rank %d/%d epoch %d local loss %.4f average loss %.4f" % (hvd.rank(), hvd.size(), epoch, local, avg),
              flush=True)

    # every rank must end with identical parameters
    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
    same = torch.equal(hvd.broadcast(flat, 0, name="final.params"), flat)
    agree = hvd.allreduce(torch.tensor(int(same)), op=hvd.Min, name="final.agree").item()
    if hvd.rank() == 0:
        print("parameters identical on all ranks: %s" % bool(agree), flush=True)
    hvd.shutdown()
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
