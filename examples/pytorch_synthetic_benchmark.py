"""Synthetic training throughput with hora.torch, modelled on Horovod's
examples/pytorch/pytorch_synthetic_benchmark.py: same flags and output
(img/sec per rank, mean +- 1.96 sigma), so numbers compare directly.

    horarun -np 2 /usr/bin/python3 examples/pytorch_synthetic_benchmark.py --model cnn

--model: any torchvision.models name when torchvision is installed (Debian:
python3-torchvision), else one of the built-in small models: mlp, cnn.
--image-size defaults to 224 for torchvision models and 32 for built-ins
(2-core machines: keep it small).
"""
import argparse
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hora.torch as hvd


class SmallCNN(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.fc = nn.Linear(64 * 16, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


class MLP(nn.Module):
    def __init__(self, image_size, num_classes=1000):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, 512), nn.ReLU(),
                                 nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, num_classes))

    def forward(self, x):
        return self.net(x)


def build_model(name, image_size):
    if name == "cnn":
        return SmallCNN()
    if name == "mlp":
        return MLP(image_size)
    try:
        from torchvision import models
    except ImportError:
        raise SystemExit("model %r needs torchvision (apt-get install python3-torchvision); built-ins: mlp, cnn" % name)
    return getattr(models, name)()


def main():
    parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark (hora)",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="cnn", help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=True, help="accepted for compatibility; hora runs on CPU")
    parser.add_argument("--use-adasum", action="store_true", default=False, help="not supported by hora")
    parser.add_argument("--image-size", type=int, default=None, help="input height/width (default 224 for torchvision, 32 for built-ins)")
    parser.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads per rank")
    args = parser.parse_args()
    if args.use_adasum:
        raise SystemExit("hora does not implement Adasum")
    image_size = args.image_size or (32 if args.model in ("cnn", "mlp") else 224)

    hvd.init()
    torch.set_num_threads(args.num_threads)
    model = build_model(args.model, image_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, image_size, image_size)
    target = torch.LongTensor(args.batch_size).random_() % 1000

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(s, nl=True):
        if hvd.rank() != 0:
            return
        print(s, end="\n" if nl else "", flush=True)

    device = "CPU"
    log("Model: %s" % args.model)
    log("Batch size: %d" % args.batch_size)
    log("Number of %ss: %d" % (device, hvd.size()))
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f" % (hvd.size(), device, hvd.size() * img_sec_mean,
                                                    hvd.size() * img_sec_conf))
    hvd.shutdown()


if __name__ == "__main__":
    main()
