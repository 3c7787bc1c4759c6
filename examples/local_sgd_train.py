"""Local SGD / DiLoCo-style training with hora.torch: each rank steps on its
own data and the ranks synchronize parameters every --sync-every steps
instead of allreducing gradients every step.

    horarun -np 2 /usr/bin/python3 examples/local_sgd_train.py
    horarun -np 2 /usr/bin/python3 examples/local_sgd_train.py --outer-momentum 0.9 --outer-lr 0.7 --nesterov

Prints the loss, the bytes each rank sent for synchronization against what
per-step gradient allreduce would have sent, and whether every rank ends on
the same parameters.
"""
import argparse

import torch

import hora.torch as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sync-every", type=int, default=4)
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.0)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(0)  # the same start everywhere
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    teacher = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), sync_every=args.sync_every,
                       outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, nesterov=args.nesterov,
                       module=model)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for step in range(args.steps):
        x = torch.randn(32, 16, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x @ teacher)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step + 1) % 10 == 0:
            print("step %d loss %.4f" % (step + 1, loss.item()), flush=True)
    opt.synchronize()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    same = all(torch.equal(flat, t) for t in hvd.allgather_object(flat))
    if rank == 0:
        print("bytes sent per rank: %d for %d synchronizations; per-step gradient allreduce would send %d (%.1fx more)"
              % (opt.bytes_communicated, opt.syncs, opt.bytes_every_step,
                 opt.bytes_every_step / max(opt.bytes_communicated, 1)), flush=True)
        print("parameters identical on all ranks: %s" % same, flush=True)
    hvd.shutdown()
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
