"""A finished sweep beside the published figures of its settings (docs/published.md).

python benchmarks/published.py --results DIR [--protocol vit-sweep] [--version V]
python benchmarks/published.py            (no sweep: lists the published figures; what `make bench` runs)

Reads the sweep's records through the library (harness.service.records.paper_records: every record
verified on read, one protocol version), and per (data set, method, regime) computes from each record's
class-IL accuracy matrix R (R[t][j]: accuracy on task j's test set after training task t):

  A_last = accuracy over the test samples of all classes after the last task
         = sum_j n_j R[T-1][j] / sum_j n_j
  A-bar  = mean over t of the accuracy over the test samples of the classes seen after task t
         = (1/T) sum_t (sum_{j<=t} n_j R[t][j] / sum_{j<=t} n_j)

with n_j the test samples of task j (the record's checks.n_test; equal weights where a record has none).
Sample-weighted, as the published code computes its accuracy (one pass over all seen classes' test
images): on CIFAR-100 (100 test images a class) it equals the record's ACC and AIA; on ImageNet-R,
whose classes differ in size, it does not. Mean and standard deviation (n-1) over task orders and seeds.

A third metric, A_last_tasks = (1/T) sum_j R[T-1][j] (tasks weighted equally), is the one the L2P and
DualPrompt code reports ("Acc@1", the mean of the per-task accuracies after the last task).

A cl-bench cell is set beside a published row only where CELLS says they are the same method: `ncm`
under `head` is the frozen-backbone nearest-class-mean baseline (RanPAC's "NCM only"); `naive` under
`full` is sequential fine-tuning; `simplecil` under `head`; `aper` under `prompt-lL` / `prompt-deep-lL`
(APER with VPT-shallow / VPT-deep) and under a LoRA regime (nearest to APER's AdaptFormer adapter);
`ranpac` under `head` (RanPAC without its first-session adaptation, "No Phase 1") and under a PEFT
regime (RanPAC with it, "Algorithm 1"); `l2p`, `dualprompt`, `coda-prompt` under the prompt family; `slca` under
any regime; `magmax` under `full`. Every other cell is printed without a figure. The published figures
were run with other hyperparameters, augmentation and (mostly) one class order: a difference is a
pointer, not a verdict. docs/published.md lists each figure's source and what was not found.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Published:
    """One published figure: where it is from and what it measures (percent)."""

    setting: str  # a SETTINGS value
    method: str
    metric: str  # "A_last", "A_bar" or "A_last_tasks" (METRICS)
    value: float
    weights: str
    source: str


RANPAC = "github.com/RanPAC/RanPAC paper_tables/Table_data_main_{}.csv (McDonnell et al., NeurIPS 2023, Table 1/2)"
PUBLISHED = (
    Published("CIFAR-100 B0Inc10", "NCM (frozen backbone)", "A_last", 83.4,
              "ViT-B/16 ImageNet-21k (timm, RanPAC convnet_type pretrained_vit_b16_224_in21k)",
              RANPAC.format("cifar224") + ', row "NCM only"'),
    Published("ImageNet-R B0Inc20", "NCM (frozen backbone)", "A_last", 61.2,
              "ViT-B/16 ImageNet-21k, fine-tuned on ImageNet-1k (timm, RanPAC convnet_type pretrained_vit_b16_224)",
              RANPAC.format("imagenetr") + ', row "NCM only"'),
    Published("CIFAR-100 B0Inc10", "RanPAC", "A_last", 92.2,
              "ViT-B/16 ImageNet-21k (+ AdaptFormer adapters trained on task 1)",
              RANPAC.format("cifar224") + ', row "Algorithm 1"'),
    Published("ImageNet-R B0Inc20", "RanPAC", "A_last", 77.9,
              "ViT-B/16 ImageNet-21k, fine-tuned on ImageNet-1k (+ SSF trained on task 1)",
              RANPAC.format("imagenetr") + ', row "Algorithm 1"'),
    Published("CIFAR-100 B0Inc10", "NMC (Janson et al.)", "A_last", 83.70,
              "the pre-trained transformer of the methods it is compared with (the abstract names no weights)",
              "arXiv:2210.04428 abstract (Janson et al., 'A Simple Baseline that Questions the Use of "
              "Pretrained-Models in Continual Learning')"),
)

PUBLISHED += (
    Published("CIFAR-100 B0Inc10", "RanPAC (no Phase 1)", "A_last", 89.0, "ViT-B/16 ImageNet-21k, frozen",
              RANPAC.format("cifar224") + ', row "No Phase 1"'),
    Published("ImageNet-R B0Inc20", "RanPAC (no Phase 1)", "A_last", 71.8,
              "ViT-B/16 ImageNet-21k, fine-tuned on ImageNet-1k, frozen",
              RANPAC.format("imagenetr") + ', row "No Phase 1"'),
)
IN21K = "ViT-B/16 ImageNet-21k"
L2P_PORT = ("github.com/JH-LEE-KR/l2p-pytorch README.md, Result, Split-CIFAR100 (10 tasks, configs/cifar100_l2p.py), "
            "row ")
DUAL_PORT = "github.com/JH-LEE-KR/dualprompt-pytorch README.md, Result, {} (10 tasks), row "
PORT_WEIGHTS = IN21K + " (the ports' vision_transformer.py: imagenet21k/ViT-B_16.npz)"
SLCA_IMAGE = ("github.com/GengDavid/SLCA slca_performance.jpg (the repository's results figure, "
              "'Averaged Accuracy (%)'; exps/slca/slca_{}.json: B0Inc{}, vit-b-p16, 3 seeds), bar ")
DUAL_PAPER = "as the DualPrompt paper (not read here)"
L2P_RUNS = "as L2P's runs (the figure does not say)"
SLCA_WEIGHTS = IN21K + " (SLCA's vit-b-p16: vit_base_patch16_224_in21k)"
PILOT_LOG = ("github.com/zhoudw-zdw/RevisitingCIL logs/{}/{}/{} (init_cls 5, increment 5, seed 1993), "
             "last 'CNN top1 curve' entry / 'Average Accuracy (CNN)'")
PUBLISHED += (
    Published("CIFAR-100 B0Inc10", "L2P (paper)", "A_last_tasks", 83.83, "as the L2P paper (not read here)",
              L2P_PORT + '"Paper Results" (Acc@1: average accuracy over the tasks after the last task)'),
    Published("CIFAR-100 B0Inc10", "L2P (PyTorch port run)", "A_last_tasks", 83.77, PORT_WEIGHTS,
              L2P_PORT + '"Pytorch-Implementation"'),
    Published("CIFAR-100 B0Inc10", "DualPrompt (paper)", "A_last_tasks", 86.51, DUAL_PAPER,
              DUAL_PORT.format("Split-CIFAR100") + '"Paper Results"'),
    Published("CIFAR-100 B0Inc10", "DualPrompt (PyTorch port run)", "A_last_tasks", 86.13, PORT_WEIGHTS,
              DUAL_PORT.format("Split-CIFAR100") + '"Pytorch-Implementation"'),
    Published("ImageNet-R B0Inc20", "DualPrompt (paper)", "A_last_tasks", 68.13, DUAL_PAPER,
              DUAL_PORT.format("Split-ImageNet-R") + '"Paper Results"'),
    Published("ImageNet-R B0Inc20", "DualPrompt (PyTorch port run)", "A_last_tasks", 68.23, PORT_WEIGHTS,
              DUAL_PORT.format("Split-ImageNet-R") + '"Pytorch-Implementation"'),
    Published("CIFAR-100 B0Inc10", "L2P (in SLCA's figure)", "A_last_tasks", 83.86, L2P_RUNS,
              SLCA_IMAGE.format("cifar", 10) + '"L2P"'),
    Published("ImageNet-R B0Inc20", "L2P (in SLCA's figure)", "A_last_tasks", 61.57, L2P_RUNS,
              SLCA_IMAGE.format("imgnetr", 20) + '"L2P"'),
    Published("CIFAR-100 B0Inc10", "sequential fine-tuning", "A_last", 33.61, SLCA_WEIGHTS,
              SLCA_IMAGE.format("cifar", 10) + '"Seq FT"'),
    Published("ImageNet-R B0Inc20", "sequential fine-tuning", "A_last", 28.87, SLCA_WEIGHTS,
              SLCA_IMAGE.format("imgnetr", 20) + '"Seq FT"'),
    Published("CIFAR-100 B0Inc10", "SLCA", "A_last", 91.53, SLCA_WEIGHTS,
              SLCA_IMAGE.format("cifar", 10) + '"Seq FT w/ SLCA"'),
    Published("ImageNet-R B0Inc20", "SLCA", "A_last", 77.00, SLCA_WEIGHTS,
              SLCA_IMAGE.format("imgnetr", 20) + '"Seq FT w/ SLCA"'),
)
_PILOT = (  # (method, log folder, log file, CIFAR-100 A_last, A-bar, ImageNet-R A_last, A-bar)
    ("SimpleCIL", "simplecil", "exp_1993_pretrained_vit_b16_224_in21k.log", 81.28, 87.57, 54.55, 62.57),
    ("APER (adapter)", "aper_adapter", "exp_1993_pretrained_vit_b16_224_in21k_adapter.log", 85.14, 90.61, 63.73, 71.90),
    ("APER (VPT-deep)", "aper_vpt", "exp_vpt-deep_1993_pretrained_vit_b16_224_in21k_vpt.log",
     82.65, 88.91, 60.22, 68.68),
    ("APER (VPT-shallow)", "aper_vpt", "exp_vpt-shallow_1993_pretrained_vit_b16_224_in21k_vpt.log",
     81.80, 88.23, 56.70, 64.72),
)
PUBLISHED += tuple(
    Published(setting, method, metric, value, IN21K + " (convnet_type pretrained_vit_b16_224_in21k*)",
              PILOT_LOG.format(folder, data, log))
    for method, folder, log, c_last, c_bar, r_last, r_bar in _PILOT
    for setting, data, last, bar in (("CIFAR-100 B0Inc5", "cifar224", c_last, c_bar),
                                     ("ImageNet-R B0Inc5", "imagenetr", r_last, r_bar))
    for metric, value in (("A_last", last), ("A_bar", bar)))
METRICS = ("A_last", "A_bar", "A_last_tasks")

PEFT_FAMILIES = ("prompt", "prompt-deep", "lora", "bitfit", "norm")  # a first session trains these (RanPAC's Phase 1)
PROMPT_PUBLISHED = {"l2p": ("L2P (paper)", "L2P (PyTorch port run)", "L2P (in SLCA's figure)"),
                    "dualprompt": ("DualPrompt (paper)", "DualPrompt (PyTorch port run)"),
                    "coda-prompt": ("CODA-Prompt",)}
# (cl-bench method, regime rule) -> the published methods it is; a rule is a regime name, "family:F" (any
# regime of family F) or "*" (any regime)
CELLS = {("ncm", "head"): ("NCM (frozen backbone)", "NMC (Janson et al.)"),
         ("naive", "full"): ("sequential fine-tuning",),
         ("simplecil", "head"): ("SimpleCIL",),
         ("aper", "family:prompt"): ("APER (VPT-shallow)",),
         ("aper", "family:prompt-deep"): ("APER (VPT-deep)",),
         ("aper", "family:lora"): ("APER (adapter)",),
         ("ranpac", "head"): ("RanPAC (no Phase 1)",),
         **{("ranpac", f"family:{f}"): ("RanPAC",) for f in PEFT_FAMILIES},
         **{(m, "family:prompt"): names for m, names in PROMPT_PUBLISHED.items()},
         ("slca", "*"): ("SLCA",),
         ("magmax", "full"): ("MagMax",)}
# (data set name, n_tasks, classes per task) -> the published setting
SETTINGS = {("cifar100", 10, 10): "CIFAR-100 B0Inc10", ("cifar100-pixels", 10, 10): "CIFAR-100 B0Inc10",
            ("imagenet-r", 10, 20): "ImageNet-R B0Inc20",
            ("cifar100", 20, 5): "CIFAR-100 B0Inc5", ("cifar100-pixels", 20, 5): "CIFAR-100 B0Inc5",
            ("imagenet-r", 40, 5): "ImageNet-R B0Inc5"}


def a_last(R, n=None) -> float:
    """Accuracy over all test samples after the last task (sample-weighted mean of R's last row)."""
    T = len(R)
    w = list(n) if n else [1] * T
    return sum(w[j] * R[T - 1][j] for j in range(T)) / sum(w)


def a_last_tasks(R) -> float:
    """Mean over tasks of their accuracy after the last task (tasks weighted equally: L2P's "Acc@1")."""
    return statistics.fmean(R[-1])


def a_bar(R, n=None) -> float:
    """Mean over tasks t of the accuracy over the test samples of the tasks seen after t."""
    T = len(R)
    w = list(n) if n else [1] * T
    return statistics.fmean(sum(w[j] * R[t][j] for j in range(t + 1)) / sum(w[:t + 1]) for t in range(T))


@dataclass(frozen=True)
class Cell:
    """One (data set, method, regime) of a sweep: A_last and A-bar (percent) over its runs."""

    setting: str
    method: str
    regime: str
    runs: int
    a_last: float
    a_last_std: float
    a_bar: float
    a_bar_std: float
    a_last_tasks: float = math.nan

    def value(self, metric: str) -> float:
        """The cell's mean of `metric` (one of METRICS)."""
        return {"A_last": self.a_last, "A_bar": self.a_bar, "A_last_tasks": self.a_last_tasks}[metric]


def _std(values: list) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def cells(records) -> list[Cell]:
    """Per (data set, method, regime): mean and std of A_last and A-bar (percent) over the ok records."""
    groups: dict = {}
    for r in records:
        if r.status != "ok" or not r.acc_matrix:
            continue
        d = r.spec.dataset
        setting = SETTINGS.get((d.name, d.n_tasks, d.classes_per_task), f"{d.name} {d.n_tasks}x{d.classes_per_task}")
        n = (r.checks or {}).get("n_test") or None
        groups.setdefault((setting, r.spec.display, r.spec.regime), []).append(
            (100 * a_last(r.acc_matrix, n), 100 * a_bar(r.acc_matrix, n), 100 * a_last_tasks(r.acc_matrix)))
    out = []
    for (setting, method, regime), values in sorted(groups.items()):
        last, bar = [v[0] for v in values], [v[1] for v in values]
        out.append(Cell(setting, method, regime, len(values), statistics.fmean(last), _std(last),
                        statistics.fmean(bar), _std(bar), statistics.fmean(v[2] for v in values)))
    return out


def _matches(rule: str, regime: str) -> bool:
    """Whether `regime` is what a CELLS rule names (a regime, "family:F" or "*")."""
    if rule == "*" or rule == regime:
        return True
    if not rule.startswith("family:"):
        return False
    from harness.config.vocabulary import written_family

    return str(written_family(regime)) == rule.partition(":")[2]


def published_names(method: str, regime: str) -> tuple:
    """The published methods a cl-bench (method, regime) cell is (CELLS), in CELLS order."""
    return tuple(name for (m, rule), names in CELLS.items() if m == method and _matches(rule, regime)
                 for name in names)


def published_for(cell: Cell) -> list[Published]:
    """The published figures of the method a cell is (CELLS) in its setting."""
    names = published_names(cell.method, cell.regime)
    return [p for p in PUBLISHED if p.method in names and p.setting == cell.setting]


def comparison_lines(found: list[Cell]) -> list[str]:
    """The printed table: every cell, its published figure (if any) and the difference (cl-bench - published)."""
    lines = [f"{'setting':<20} {'method':<12} {'regime':<10} {'runs':>4} {'A_last':>13} {'A-bar':>13}  published"]
    for c in found:
        head = (f"{c.setting:<20} {c.method:<12} {c.regime:<10} {c.runs:>4} "
                f"{c.a_last:6.2f} ±{c.a_last_std:5.2f} {c.a_bar:6.2f} ±{c.a_bar_std:5.2f}")
        rows = published_for(c)
        if not rows:
            lines.append(f"{head}  -")
        for p in rows:
            mine = c.value(p.metric)
            lines.append(f"{head}  {p.method} {p.metric} {p.value:.2f} (diff {mine - p.value:+.2f}; {p.source})")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="the sweep's results folder (none: list the published figures)")
    ap.add_argument("--protocol", help="the protocol (needed where the folder holds several)")
    ap.add_argument("--version", help="the protocol version (default: the newest)")
    args = ap.parse_args(argv)
    if args.results is None:
        for p in PUBLISHED:
            print(f"{p.setting:<20} {p.method:<30} {p.metric:<12} {p.value:6.2f}  {p.weights}; {p.source}")
        return 0
    from harness.config.errors import UserError
    from harness.service.records import paper_records

    try:
        records = paper_records(args.results, args.protocol, args.version, log=lambda line: None)
    except UserError as exc:
        print(f"benchmarks/published.py: {exc}", file=sys.stderr)
        return 2
    from harness.config.text import terminal_safe

    found = cells(records)
    for line in comparison_lines(found):
        print(terminal_safe(line))  # labels come from record files
    unmatched = sorted({c.setting for c in found if c.setting not in SETTINGS.values()})
    if unmatched:
        print(f"no published figures for: {', '.join(unmatched)} (docs/published.md lists the settings)")
    return 0 if all(math.isfinite(c.a_last) for c in found) else 1


if __name__ == "__main__":
    sys.exit(main())
