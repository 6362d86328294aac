"""A plain PyTorch process doing the same runs as a `cl-bench run` of naive on digits (the reference
of benchmarks/small_grid.py): python benchmarks/_plain_process.py RUNS.json

Imports only torch, NumPy and scikit-learn (for the digits, as the harness loads them) — nothing of
the harness or Avalanche — so that its process time is what a researcher's own script would take:
the same data (scikit-learn digits, the harness's fixed stratified 75/25 split, standardised with
training statistics), split into tasks by each run's class order with task-local labels; the same
model (the harness's `mlp-bn`: 4 blocks Linear-BatchNorm-ReLU of width 100, one linear head per
task); the first task trains everything, later ones the regime's last blocks and the heads (frozen
blocks in eval mode); SGD per task; the accuracy matrix (every task before training and after every
task) and the continual-evaluation points (each seen task's fixed test subsample every `every`
steps and at each task's end), as the protocol asks. Not bitwise the harness's runs (its own seeds
and minibatch order): the same work, written plainly.

RUNS.json: {"runs": [{"class_order": [...], "trainable_blocks": k, "seed": s}, ...],
            "n_tasks": 5, "classes_per_task": 2, "lr", "momentum", "epochs", "batch_size",
            "eval_batch_size", "every", "subsample"}   (benchmarks/small_grid.py writes it)
Prints one JSON line: epoch seconds when the imports were done, when the first run ended, at the end.
"""
import json
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

IMPORTED = time.time()


def digits():
    bunch = load_digits()
    x = bunch.data.astype(np.float32) / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(x, bunch.target, test_size=0.25, random_state=0,
                                              stratify=bunch.target)
    mean, std = x_tr.mean(), x_tr.std()
    return [torch.as_tensor(a) for a in ((x_tr - mean) / std, y_tr.astype(np.int64),
                                         (x_te - mean) / std, y_te.astype(np.int64))]


def tasks_of(data, order, n_tasks, cpt):
    x_tr, y_tr, x_te, y_te = data
    out = []
    for t in range(n_tasks):
        classes = order[t * cpt:(t + 1) * cpt]
        parts = []
        for x, y in ((x_tr, y_tr), (x_te, y_te)):
            keep = torch.isin(y, torch.tensor(classes))
            local = torch.tensor([classes.index(int(c)) for c in y[keep]], dtype=torch.long)
            parts += [x[keep].contiguous(), local]
        out.append(parts)
    return out


class Net(nn.Module):
    def __init__(self, n_in, n_tasks, cpt, width=100, depth=4):
        super().__init__()
        dims = [n_in] + [width] * depth
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dims[i], dims[i + 1]), nn.BatchNorm1d(dims[i + 1]),
                                                  nn.ReLU()) for i in range(depth))
        self.heads = nn.ModuleList(nn.Linear(width, cpt) for _ in range(n_tasks))
        self.frozen = []

    def forward(self, x, t):
        for block in self.blocks:
            x = block(x)
        return self.heads[t](x)

    def train(self, mode=True):
        super().train(mode)
        for block in self.frozen:
            block.eval()
        return self


@torch.no_grad()
def accuracy(model, x, y, t, batch_size):
    model.eval()
    correct = sum(int((model(x[i:i + batch_size], t).argmax(1) == y[i:i + batch_size]).sum())
                  for i in range(0, len(y), batch_size))
    model.train()
    return correct / len(y)


def one_run(cfg, run, data):
    torch.manual_seed(run["seed"])
    n_tasks, cpt, bs = cfg["n_tasks"], cfg["classes_per_task"], cfg["batch_size"]
    tasks = tasks_of(data, run["class_order"], n_tasks, cpt)
    gen = torch.Generator().manual_seed(run["seed"])
    picks = [torch.randperm(len(y_te), generator=gen)[:cfg["subsample"]] for _, _, _, y_te in tasks]
    subsets = [(x_te[i], y_te[i]) for (_, _, x_te, y_te), i in zip(tasks, picks)]
    model = Net(data[0].shape[1], n_tasks, cpt)
    loss_fn = nn.CrossEntropyLoss()
    rows = [[accuracy(model, x_te, y_te, t, cfg["eval_batch_size"])
             for t, (_, _, x_te, y_te) in enumerate(tasks)]]
    curve = []
    for t, (x, y, _, _) in enumerate(tasks):
        k = len(model.blocks) if t == 0 else run["trainable_blocks"]
        trainable = list(model.blocks)[len(model.blocks) - k:]
        model.frozen = [b for b in model.blocks if b not in trainable]
        for p in model.parameters():
            p.requires_grad_(False)
        for module in [*trainable, *model.heads]:
            for p in module.parameters():
                p.requires_grad_(True)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"],
                              momentum=cfg["momentum"])
        model.train()
        step = 0
        def point(seen=t + 1):
            return [accuracy(model, xs, ys, s, cfg["eval_batch_size"]) for s, (xs, ys) in enumerate(subsets[:seen])]

        curve.append(point())
        for _ in range(cfg["epochs"]):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), bs):
                idx = order[start:start + bs]
                loss = loss_fn(model(x[idx], t), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if step % cfg["every"] == 0:
                    curve.append(point())
        curve.append(point())
        rows.append([accuracy(model, x_te, y_te, s, cfg["eval_batch_size"])
                     for s, (_, _, x_te, y_te) in enumerate(tasks)])
    return rows, curve


def main():
    torch.set_num_threads(1)
    cfg = json.loads(open(sys.argv[1]).read())
    data = digits()
    data = [data[0].reshape(len(data[0]), -1), data[1], data[2].reshape(len(data[2]), -1), data[3]]
    first = None
    finals = []
    for run in cfg["runs"]:
        rows, _ = one_run(cfg, run, data)
        finals.append(float(np.mean(rows[-1])))
        first = first or time.time()
    print(json.dumps({"imported": IMPORTED, "first": first, "end": time.time(), "final_acc": finals}))


if __name__ == "__main__":
    main()
