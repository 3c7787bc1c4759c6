"""Elastic training with hora.torch: Horovod's ``pytorch_mnist_elastic.py`` shape on
synthetic data (no download). Workers may be lost or added while it runs; the job
re-forms at the next commit and carries on from the last commit (docs/elastic.md).

    printf 'localhost:4\\n' > hosts.txt
    build/launcher/horarun -np 2 --min-np 2 --max-np 4 --host-discovery-file hosts.txt \\
        /usr/bin/python3 examples/elastic_train.py
    # or with a script that prints host:slots lines, re-run every second:
    build/launcher/horarun -np 2 --min-np 2 --max-np 4 --host-discovery-script ./discover_hosts.sh \\
        /usr/bin/python3 examples/elastic_train.py

(``PYTHONPATH=bindings/python`` unless ``scripts/install_python.sh`` was run.) Raise the
slots in hosts.txt while it runs and newcomers join at the next commit; kill a worker
and the others restore the last commit, re-form and go on (horarun starts a
replacement after the host's blacklist cool-down, ``--blacklist-cooldown-range``).

Every worker prints ``rank r/size s epoch e batch b loss`` lines, one line per reset
(``reset: rank r/size s ...``), one each time training (re)starts (``start: ...``: a
newcomer's first line at the job's size) and at the end ``DONE rank=r size=s ... checksum=c``: the
checksum of the model's parameters, the same on every worker.
"""
import argparse
import os
import sys
import time
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import hora.torch as hvd

parser = argparse.ArgumentParser(description="hora elastic example (synthetic MNIST-shaped data)")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per worker")
parser.add_argument("--epochs", type=int, default=3, help="number of epochs")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker (scaled by size)")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--num-samples", type=int, default=4096, help="synthetic training samples")
parser.add_argument("--batches-per-commit", type=int, default=5, help="commit the state every N batches")
parser.add_argument("--log-interval", type=int, default=10, help="print progress every N batches")
parser.add_argument("--batch-sleep", type=float, default=0.0,
                    help="sleep this many seconds after each batch (stands in for more compute; tests)")
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(args.seed)
worker = os.environ.get("HORA_WORKER_ID", "-")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=5)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)
        self.fc1 = nn.Linear(256, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


# Synthetic MNIST-shaped data, the same on every worker (fixed generator seed):
# the label is a function of the image, so the loss goes down.
gen = torch.Generator().manual_seed(1234)
images = torch.randn(args.num_samples, 1, 28, 28, generator=gen)
labels = (images[:, 0, 10:18, 10:18].sum(dim=(1, 2)) * 2).long().clamp(-4, 5) + 4
dataset = torch.utils.data.TensorDataset(images, labels)

sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def on_reset():
    # The job re-formed with a new size: scale the learning rate to it, as Horovod's example does.
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()
    print("reset: rank %d/size %d worker %s epoch %d batch %d lr %.4f"
          % (hvd.rank(), hvd.size(), worker, state.epoch, state.batch, args.lr * hvd.size()), flush=True)


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    # Called again after every reset, with the state synchronized from rank 0:
    # the sampler deals the rest of the epoch over the current workers.
    print("start: rank %d/size %d worker %s epoch %d batch %d"
          % (hvd.rank(), hvd.size(), worker, state.epoch, state.batch), flush=True)
    while state.epoch < args.epochs:
        model.train()
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            sampler.record_batch(state.batch, args.batch_size)
            state.batch += 1
            if state.batch % args.log_interval == 0:
                print("rank %d/size %d worker %s epoch %d batch %d loss %.4f"
                      % (hvd.rank(), hvd.size(), worker, state.epoch, state.batch, loss.item()), flush=True)
            if args.batch_sleep:
                time.sleep(args.batch_sleep)
            if state.batch % args.batches_per_commit == 0:
                state.commit()  # saves; raises HostsUpdatedInterrupt on every rank when a worker waits to join
        # End of the epoch: the sampler starts a new order with nothing processed.
        state.epoch, state.batch = state.epoch + 1, 0
        sampler.set_epoch(state.epoch)
        state.commit()


start = time.time()
train(state)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print("DONE rank=%d size=%d worker=%s epochs=%d time=%.1fs checksum=%08x"
      % (hvd.rank(), hvd.size(), worker, state.epoch, time.time() - start, zlib.crc32(flat.numpy().tobytes())),
      flush=True)
hvd.shutdown()
sys.exit(0)
