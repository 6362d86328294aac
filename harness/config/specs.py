"""Frozen dataclasses for protocols, run specifications and run records."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from .pretrain import Pretrain
from .validate import MAX_SEED, Validator
from .vocabulary import Scenario, Status

# 2: run ids cover the method's implementation and the data's content (RunSpec.method_version,
# RunSpec.data_fingerprint); records of schema 1 are foreign to this harness, never re-keyed.
# 3: records carry their training budget, learning checks and warnings; the schema version
# enters the run id, so a record of another schema never shares a file name with a new one.
# 4: class-IL records also carry the task-aware (masked) accuracy matrix, its initial row and its
# metrics (acc_matrix_task_aware, init_acc_task_aware, metrics_task_aware; None in task-IL).
# 5: regimes beyond depth (bitfit, norm, lora-rR, last-k:...); params carry total_shared, adapters and the
# trainable fraction; `pretrain` may be a pretrained backbone (a mapping: Pretrain.as_json); provenance.pretrained.
# 6: class-IL learning checks judge each task within its own classes (checks.task_chance, the task-aware
# matrix; below-probe and trained_acc in class-IL too); budget.memory_samples/memory_bytes per task (MemoryHook).
# 7: continual evaluation (issue 29): an optional `spec.continual` ({every, subsample}; absent when off, and never
# part of the run id: it does not change training) and an optional record field `curve` + `timings.curve_s`
# (absent when off). A schema-6 reader would call such a record corrupt and redo it, losing its curve; with
# the bump it sees a record of another schema instead (kept, never overwritten).
SCHEMA_VERSION = 7
# budget["compute"] (optional, no schema bump: a record without it is "not measured"; run ids are unchanged)
# 1: sample-passes counted at the model, FLOPs, peak memory, seconds per stage (harness/run/compute.py)
COMPUTE_VERSION = 1
# Its keys: counts (integers >= 0), per-task counts, seconds, and the optional merge and CUDA entries.
COMPUTE_COUNTS = ("forward_samples", "backward_samples", "prefix_samples", "flops", "forward_flops",
                  "backward_flops")
COMPUTE_PER_TASK = ("forward_per_task", "backward_per_task", "forward_flops_per_sample", "backward_flops_per_sample")
COMPUTE_MERGE = ("forward_samples", "backward_samples", "flops", "element_ops")
# provenance["memory"] (varies between runs of one spec, like the host): peak host RSS, CUDA peak allocated
MEMORY_PEAKS = ("peak_rss_bytes", "cuda_peak_bytes")


@dataclass(frozen=True)
class ContinualSpec:
    """Continual evaluation during training (protocol `evaluation: {every, subsample}`): every `every`
    optimizer steps of a task, each seen task on a fixed seeded subsample of `subsample` test rows."""

    every: int
    subsample: int = 100


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a protocol: how it is split into tasks and which backbone learns it."""

    name: str
    n_tasks: int
    classes_per_task: int
    model: str


@dataclass(frozen=True)
class TrainingSpec:
    """Optimiser and schedule shared by every method of a protocol."""

    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    epochs: int = 1
    batch_size: int = 32
    # Forward passes in float32, or under bfloat16 autocast (harness/run/precision.py). Left out of a spec's
    # JSON form at its default: every run id made before the setting existed stays as it was.
    precision: str = "fp32"


# `training.precision` values: float32 throughout, or bfloat16 autocast around every forward of the model
PRECISIONS = ("fp32", "bf16")
DEFAULT_PRECISION = "fp32"


@dataclass(frozen=True)
class MethodSpec:
    """A method entry of a protocol: registry name, display label, hyperparameters, and the
    implementation the registry resolved the name to (part of every run id)."""

    name: str
    hparams: dict = field(default_factory=dict)
    label: str = ""
    version: str = ""
    regimes: tuple[str, ...] | None = None  # the protocol regimes it runs on (None: all of them)

    def runs_under(self, regime: str) -> bool:
        """True when the protocol pairs this method with `regime`."""
        return self.regimes is None or regime in self.regimes

    @property
    def display(self) -> str:
        """The name shown in tables: the label if given, else the registry name."""
        return self.label or self.name


@dataclass(frozen=True)
class Protocol:
    """A loaded, validated protocol file."""

    name: str
    version: str
    description: str
    scenario: Scenario
    pretrain: Pretrain  # as parsed: `dataset: same` is resolved per data set when specs are expanded
    datasets: tuple[DatasetSpec, ...]
    regimes: tuple[str, ...]
    methods: tuple[MethodSpec, ...]
    task_orders: tuple[tuple[int, ...] | None, ...]  # None: derive from order seed
    order_seed: int
    seeds: tuple[int, ...]
    training: TrainingSpec
    eval_batch_size: int
    source: str = ""
    continual: ContinualSpec | None = None  # `evaluation: {every, subsample}`; None: off
    resources: dict = field(default_factory=dict)
    # npz data sets: the name as the protocol file wrote it -> the resolved name (for --datasets)
    written_names: dict = field(default_factory=dict)
    # plug-in files of the protocol's `plugins:` (absolute paths): every run of it registers them
    plugin_files: tuple[str, ...] = ()
    # warnings of the loader, one line each (e.g. another protocol file of the same name): shown with the plan
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines one run; its hash is the run id.

    Beyond the protocol's settings, the identity covers what else changes a result: the
    protocol version, `method_version` (a built-in adapter's declared version, or the content
    hash of the file or module that defines the method) and `data_fingerprint` (the content
    hash of the loaded data). The planner fills both; a spec made by hand may leave them
    empty, and the engine then checks nothing against them.
    """

    protocol: str
    protocol_version: str
    dataset: DatasetSpec
    regime: str
    method: str
    label: str
    hparams: dict
    order: int
    class_order: tuple[int, ...]
    seed: int
    scenario: Scenario
    pretrain: Pretrain  # resolved for the spec's data set (no `dataset: same`)
    training: TrainingSpec
    eval_batch_size: int
    method_version: str = ""
    data_fingerprint: str = ""
    # The plug-ins the run uses (`backbone:NAME`, `dataset:NAME`, `regime:FAMILY`) -> their file's
    # content hash (harness/api/plugins.py). Left out of the JSON form when empty: a run of
    # built-ins keeps the id it always had.
    plugins: dict = field(default_factory=dict)
    # Continual evaluation (a curve in the record). Not part of the run id (run_id_of): it changes nothing
    # the run trains (tests/test_continual_eval.py); the sweep counts a record done only when it carries
    # the curve its spec asks for (`satisfies`). Left out of the JSON form when off.
    continual: ContinualSpec | None = None

    def to_dict(self) -> dict:
        """Plain-JSON form (tuples become lists, `pretrain` its canonical JSON form; no `plugins` key for a
        run of built-ins, no `continual` key without continual evaluation)."""
        data = json.loads(json.dumps({**asdict(self), "pretrain": self.pretrain.as_json()}))
        if not data["plugins"]:
            del data["plugins"]
        if data["continual"] is None:
            del data["continual"]
        if data["training"]["precision"] == DEFAULT_PRECISION:
            del data["training"]["precision"]
        return data

    def satisfied_by(self, record: RunRecord) -> bool:
        """True when `record` (of this run id) answers this spec: it carries the curve the spec asks for
        (a record with a curve answers a spec that asks for none: training is the same)."""
        return self.continual is None or record.spec.continual == self.continual

    @property
    def display(self) -> str:
        """The method name shown in tables: the label if given, else the registry name."""
        return self.label or self.method

    @property
    def run_id(self) -> str:
        """Short hash of the canonical JSON of the spec (protocol version included) and the schema."""
        return run_id_of(self.to_dict())

    @staticmethod
    def from_dict(d: dict) -> RunSpec:
        """Rebuild a spec from its JSON form (unknown or missing keys raise TypeError or KeyError, a
        pretrain value that is not canonical ValueError)."""
        d = dict(d)
        d["dataset"] = DatasetSpec(**d["dataset"])
        d["training"] = TrainingSpec(**d["training"])
        d["class_order"] = tuple(d["class_order"])
        d["scenario"] = Scenario(d["scenario"])
        d["pretrain"] = Pretrain.from_json(d["pretrain"])
        if d.get("continual") is not None:
            d["continual"] = ContinualSpec(**d["continual"])
        return RunSpec(**d)


SPEC_TEXT = ("protocol", "protocol_version", "regime", "method", "label", "method_version", "data_fingerprint")


def check_spec_json(d) -> None:
    """Raise ValueError naming the field unless a record's spec (its JSON form) has exactly the types
    and ranges a protocol gives: an integer is an int, never a float or a bool, so `seed: 0.0`
    cannot hash to a second run id for the cell of `seed: 0`."""
    v = Validator("spec", ValueError)
    keys = [f.name for f in fields(RunSpec)]
    v.mapping(d, "spec", keys, [k for k in keys if k not in ("plugins", "continual")])
    for key in SPEC_TEXT:
        v.string(d[key], key)
    v.choice(d["scenario"], "scenario", tuple(Scenario))
    v.integer(d["order"], "order", 0)
    v.integer(d["seed"], "seed", 0, MAX_SEED)
    v.integer(d["eval_batch_size"], "eval_batch_size", 1)
    if not isinstance(d["class_order"], list):
        v.fail("class_order", "expected a list of class indices")
    for i, c in enumerate(d["class_order"]):
        v.integer(c, f"class_order[{i}]", 0)
    if not isinstance(d["hparams"], dict):
        v.fail("hparams", "expected a mapping")
    v.plain(d["hparams"], "hparams")
    _check_dataset(v, d["dataset"])
    _check_training(v, d["training"])
    plugins = d.get("plugins", {})
    if not isinstance(plugins, dict) or not all(isinstance(h, str) for h in plugins.values()):
        v.fail("plugins", "expected a mapping of plug-in names to content hashes")
    if "continual" in d:
        _check_continual(v, d["continual"])


def _check_continual(v: Validator, d) -> None:
    keys = [f.name for f in fields(ContinualSpec)]
    v.mapping(d, "continual", keys, keys)
    v.integer(d["every"], "continual.every", 1)
    v.integer(d["subsample"], "continual.subsample", 1)


def _check_dataset(v: Validator, d) -> None:
    keys = [f.name for f in fields(DatasetSpec)]
    v.mapping(d, "dataset", keys, keys)
    v.string(d["name"], "dataset.name")
    v.string(d["model"], "dataset.model")
    v.integer(d["n_tasks"], "dataset.n_tasks", 1)
    v.integer(d["classes_per_task"], "dataset.classes_per_task", 1)


def _check_training(v: Validator, d) -> None:
    keys = [f.name for f in fields(TrainingSpec)]
    v.mapping(d, "training", keys, [k for k in keys if k != "precision"])
    v.string(d["optimizer"], "training.optimizer")
    v.within(d["lr"], "training.lr", float, "a finite number > 0", lambda x: x > 0)
    v.number(d["momentum"], "training.momentum", 0.0, below=1.0)
    v.number(d["weight_decay"], "training.weight_decay", 0.0)
    v.integer(d["epochs"], "training.epochs", 1)
    v.integer(d["batch_size"], "training.batch_size", 1)
    if "precision" in d:  # written only when not the default (RunSpec.to_dict)
        v.choice(d["precision"], "training.precision", PRECISIONS[1:])


def spec_hash(spec_dict: dict) -> str:
    """12 hex digits of sha256 over sorted-key compact JSON."""
    canon = json.dumps(spec_dict, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


# Spec keys that change what a run records but not what it trains: outside the run id.
NOT_IN_RUN_ID = ("continual",)


def run_id_of(spec_dict: dict) -> str:
    """The run id of a spec's JSON form under this schema (what measures a run is part of it; continual
    evaluation is not, see RunSpec.continual)."""
    kept = {k: v for k, v in spec_dict.items() if k not in NOT_IN_RUN_ID}
    return spec_hash({**kept, "schema_version": SCHEMA_VERSION})


@dataclass(frozen=True)
class RunRecord:
    """The single result of one run, as written and as read back (`to_dict`/`from_dict` are
    the on-disk JSON schema; `spec` is parsed once into a RunSpec).

    acc_matrix[i][j]: accuracy on task j after training task i (all tasks, every row);
    rows may be fewer than T when the run failed part-way.
    update_norms: {"shared": [None, u_2..u_T], "relative": [...], "per_block": {block: [...]},
                   "drift": float|None, "step_forgetting": [None, f_2..f_T]}; blocks include a method's
                   `prompts`/`prototypes` (harness/run/norms.py, docs/update-norms.md).
    budget: {"optimizer_steps", "samples_seen", "steps_per_task": [...], "samples_per_task": [...],
             "epochs_per_stage": [[epochs of each training stage] per task]} (HarnessPlugin.budget in
             run/plugins.py), and where the method declares what it keeps between tasks (api.contract.
             MemoryHook) "memory_samples" (stored examples) and "memory_bytes" (bytes of every kept tensor),
             one entry per trained task, taken after it (null after a task where nothing declared it);
             both absent for a method that declares nothing; "compute" (COMPUTE_VERSION, optional: absent in
             older records, shown "not measured"): {"version", forward/backward/prefix sample-passes, FLOPs
             (total, forward, backward), per-task passes and FLOPs per sample, "peak_rss_bytes",
             "merge": {passes, flops, element_ops} (methods that evaluate a merged model)}
             (harness/run/compute.py); what varies between runs of one spec is elsewhere: timings.merge_s and
             accounting_s, provenance.memory {"peak_rss_bytes", "cuda_peak_bytes" (CUDA runs)}.
    checks: what the learning checks measured (chance level of the head, in class-IL also the
            within-task chance `task_chance`; linear-probe accuracy, the trained model's accuracy
            where another model is evaluated, and first/last training loss per task; see
            run/checks.py); warnings: [{"code", "task", "message"}], one per failed check, exactly
            run_warnings(acc_matrix, checks, scenario, acc_matrix_task_aware); a record with
            warnings is *flagged*.
    acc_matrix_task_aware, init_acc_task_aware, metrics_task_aware (class-IL only, None in task-IL,
            whose acc_matrix is task-aware already): the same model and test sets, the prediction
            the argmax over task j's own classes (task id given at test time); shaped like
            acc_matrix, init_acc and metrics, the metrics computed from this matrix and row.
    curve (only with spec.continual; absent from the JSON otherwise): the continual-evaluation curve,
            {"every", "subsample": the spec's setting; "n_rows": [test rows evaluated per task];
             "steps": [the run's optimizer steps so far, per point]; "task": [the task training at the
             point, 0-based]; "end": [true for a task's end point]; "acc": [[accuracy per task, null for
             a task after the point's task] per point]; class-IL also "acc_task_aware" shaped alike}.
            Points: the initial model (step 0, task 0), then in task t every `every` of its optimizer
            steps the trained model (strategy.model), then its end point: the evaluated model, as the
            accuracy matrix's row t (harness/run/evaluation.py ContinualEvaluator).
    """

    run_id: str
    status: Status
    error: str | None
    spec: RunSpec
    acc_matrix: list
    init_acc: list
    metrics: dict
    update_norms: dict
    diagnostics: dict
    params: dict
    regime_depth: int | None  # None (as n_blocks) when a run failed before its model was built
    n_blocks: int | None
    timings: dict
    provenance: dict
    schema_version: int = SCHEMA_VERSION
    budget: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    acc_matrix_task_aware: list | None = None
    init_acc_task_aware: list | None = None
    metrics_task_aware: dict | None = None
    curve: dict | None = None

    def to_dict(self) -> dict:
        """Plain-JSON form (no `curve` key without continual evaluation)."""
        data = {**asdict(self), "spec": self.spec.to_dict()}
        if data["curve"] is None:
            del data["curve"]
        return data

    @staticmethod
    def from_dict(d: dict) -> RunRecord:
        """Rebuild from JSON; unknown or missing keys raise TypeError (the caller validates)."""
        return RunRecord(**{**d, "status": Status(d["status"]), "spec": RunSpec.from_dict(d["spec"])})

    @property
    def method(self) -> str:
        """The method as tables show it: the spec's label, else its registry name."""
        return self.spec.display

    @property
    def dataset(self) -> str:
        """The data set's name."""
        return self.spec.dataset.name

    @property
    def submission(self) -> dict | None:
        """{"file", "sha256"} for a record of a submitted method file, else None."""
        return (self.provenance or {}).get("submission")

    @property
    def ok(self) -> bool:
        """True when the run finished with status ok."""
        return self.status == Status.OK

    @property
    def flagged(self) -> bool:
        """True when a learning check failed (the record carries warnings)."""
        return bool(self.warnings)


def failed_record(spec: RunSpec, error: str, status: Status = Status.FAILED, provenance: dict | None = None,
                  **measured) -> RunRecord:
    """The record of a run that did not finish: whatever was measured (`measured`), else nothing."""
    empty = dict(acc_matrix=[], init_acc=[], metrics={}, update_norms={}, diagnostics={}, params={},
                 regime_depth=None, n_blocks=None, timings={}, **_no_task_aware(spec.scenario))
    return RunRecord(run_id=spec.run_id, status=status, error=error, spec=spec,
                     provenance=provenance or {}, **{**empty, **measured})


def _no_task_aware(scenario: Scenario) -> dict:
    """The task-aware fields of a record that measured nothing: empty in class-IL, None in task-IL."""
    if scenario == Scenario.TASK_IL:
        return dict(acc_matrix_task_aware=None, init_acc_task_aware=None, metrics_task_aware=None)
    return dict(acc_matrix_task_aware=[], init_acc_task_aware=[], metrics_task_aware={})
